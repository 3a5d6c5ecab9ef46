"""Test models that ship with Loom, so agents can be tested without an LLM.

```python
from loom.testing import ScriptedModel, FunctionModel

model = ScriptedModel([ModelResponse(tool_calls=[ToolCall(name="add", arguments={"a": 1})]),
                       ModelResponse(text="done")])
...
model.assert_all_consumed()
model.calls[0].messages   # what the loop sent on the first call
```
Both stream their text in word-sized deltas, like a real model, and record every call.
"""

from __future__ import annotations

import inspect
import operator
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from loom.errors import InputError, ModelResponseError
from loom.messages import Message, ModelResponse, ToolCall, ToolSpec, Usage
from loom.models.base import ModelSettings, StreamPart, TextDelta, ToolCallDelta

__all__ = ["FunctionModel", "ModelCall", "ScriptedModel", "demo_model"]

_WORDS = re.compile(r"\S+\s*|\s+")
_CONTENT = operator.attrgetter("content")


@dataclass(slots=True)
class ModelCall:
    """One call a test model received."""

    messages: list[Message]
    tools: list[ToolSpec]
    settings: ModelSettings | None = None


@dataclass(slots=True)
class _Recorder:
    record: bool = True
    calls: list[ModelCall] = field(default_factory=list)

    def add(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], s: ModelSettings | None
    ) -> None:
        if self.record:
            self.calls.append(ModelCall(list(messages), list(tools), s))


def _estimate_usage(messages: Sequence[Message], response: ModelResponse) -> Usage:
    # Rough on purpose: test models have no tokenizer; ~4 characters a token. map() keeps the
    # O(history) sum in C, so the double stays out of loop-overhead benchmarks.
    chars_in = sum(map(len, map(_CONTENT, messages)))
    chars_out = len(response.text) + sum(len(str(c.arguments)) for c in response.tool_calls)
    return Usage(input_tokens=chars_in // 4 + 1, output_tokens=chars_out // 4 + 1, requests=1)


def _parts(response: ModelResponse, messages: Sequence[Message]) -> list[StreamPart]:
    """What a test model streams for ``response``: word deltas, call deltas, the response."""
    parts: list[StreamPart] = [TextDelta(chunk) for chunk in _WORDS.findall(response.text)]
    parts.extend(
        ToolCallDelta(index=i, id=call.id, name=call.name)
        for i, call in enumerate(response.tool_calls)
    )
    if response.usage is None:
        response = response.model_copy(update={"usage": _estimate_usage(messages, response)})
    parts.append(response)
    return parts


async def _stream_response(
    response: ModelResponse, messages: Sequence[Message]
) -> AsyncIterator[StreamPart]:
    for part in _parts(response, messages):
        yield part


class ScriptedModel:
    """Answers with a fixed list of responses, one per call, in order.

    Entries may be ``ModelResponse`` objects or plain strings (a text answer). When the list runs
    out, the next call fails with ``ModelResponseError``.
    """

    def __init__(
        self,
        responses: Sequence[ModelResponse | str],
        *,
        name: str = "scripted",
        record: bool = True,
    ) -> None:
        if isinstance(responses, (str, ModelResponse)):
            raise InputError("ScriptedModel takes a list of responses, not a single one")
        self.name = name
        self.responses = [ModelResponse(text=r) if isinstance(r, str) else r for r in responses]
        self._next = 0
        self._recorder = _Recorder(record)

    @property
    def calls(self) -> list[ModelCall]:
        return self._recorder.calls

    @property
    def remaining(self) -> int:
        return len(self.responses) - self._next

    def assert_all_consumed(self) -> None:
        """Fail if some scripted responses were never asked for."""
        if self.remaining:
            raise AssertionError(
                f"ScriptedModel: {self.remaining} of {len(self.responses)} responses unused"
            )

    def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        settings: ModelSettings | None = None,
    ) -> AsyncIterator[StreamPart]:
        self._recorder.add(messages, tools, settings)
        if self._next >= len(self.responses):
            raise ModelResponseError(
                f"ScriptedModel ran out of responses after {len(self.responses)} calls; "
                "add more responses to the script"
            )
        response = self.responses[self._next]
        self._next += 1
        return _stream_response(response, messages)


ModelFunction = Callable[
    [list[Message], list[ToolSpec]], "ModelResponse | str | Awaitable[ModelResponse | str]"
]


class FunctionModel:
    """Answers by calling ``fn(messages, tools)`` (sync or async) for each model call.

    ``fn`` returns a ``ModelResponse`` or a ``str``.
    """

    def __init__(self, fn: ModelFunction, *, name: str = "function", record: bool = True) -> None:
        if not callable(fn):
            raise InputError(f"FunctionModel needs a callable, got {type(fn).__name__}")
        self.name = name
        self.fn = fn
        self._is_async = inspect.iscoroutinefunction(fn)
        self._recorder = _Recorder(record)

    @property
    def calls(self) -> list[ModelCall]:
        return self._recorder.calls

    async def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        settings: ModelSettings | None = None,
    ) -> AsyncIterator[StreamPart]:
        self._recorder.add(messages, tools, settings)
        out = self.fn(list(messages), list(tools))
        if inspect.isawaitable(out):
            out = await out
        if isinstance(out, str):
            out = ModelResponse(text=out)
        if not isinstance(out, ModelResponse):
            raise ModelResponseError(
                f"FunctionModel function returned {type(out).__name__}; return a ModelResponse "
                "or a str"
            )
        # Parts built eagerly and yielded here: one async generator per call, not two nested.
        for part in _parts(out, messages):
            yield part


def _demo(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse | str:
    """A tiny rule-based model for trying the CLI without any LLM installed."""
    last = messages[-1]
    if last.role == "tool":
        return f"The tool {last.name} returned: {last.content}"
    text = last.content
    numbers = [int(n) for n in re.findall(r"-?\d+", text)]
    if len(numbers) >= 2 and any(t.name == "add" for t in tools) and "+" in text:
        return ModelResponse(
            tool_calls=[ToolCall(name="add", arguments={"a": numbers[0], "b": numbers[1]})]
        )
    return f"(demo model) You said: {text}"


def demo_model(_: str = "") -> FunctionModel:
    """``model="demo"``: a rule-based stand-in that echoes and can call an ``add`` tool."""
    return FunctionModel(_demo, name="demo")
