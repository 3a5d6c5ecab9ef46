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

``TestModel`` needs no script: it calls every offered tool once, with arguments built from the
tool's JSON schema, then answers with an object built from the output schema (for an agent
with an ``output_type``) or with text. ``Agent(..., model=TestModel())`` smoke-tests any agent.

They report no token counts of their own: a response's usage is what the script or function
gave, else ``Usage(requests=1)`` (one request, zero tokens). They set
``reports_real_usage = False``, so Loom's token estimator never calibrates itself from them.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from loom.errors import InputError, ModelResponseError
from loom.messages import Message, ModelResponse, ToolCall, ToolSpec, Usage
from loom.models.base import ModelSettings, StreamPart, TextDelta

__all__ = ["FunctionModel", "ModelCall", "ScriptedModel", "TestModel", "demo_model"]

_WORDS = re.compile(r"\S+\s*|\s+")


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


def _parts(response: ModelResponse) -> list[StreamPart]:
    """What a test model streams for ``response``: word deltas, then the response."""
    parts: list[StreamPart] = [TextDelta(chunk) for chunk in _WORDS.findall(response.text)]
    if response.usage is None:
        # A request was made, but no tokens were counted: inventing a count (it was once
        # characters / 4) let the token estimator calibrate itself from fiction.
        response = ModelResponse.trusted(  # the caller's response, untouched, plus usage
            text=response.text,
            tool_calls=response.tool_calls,
            usage=Usage.trusted(
                input_tokens=0,
                output_tokens=0,
                requests=1,
                cache_read_tokens=0,
                cache_write_tokens=0,
                cost=None,
            ),
            finish_reason=response.finish_reason,
            model=response.model,
            parts=response.parts,
        )
    parts.append(response)
    return parts


async def _stream_response(response: ModelResponse) -> AsyncIterator[StreamPart]:
    for part in _parts(response):
        yield part


class ScriptedModel:
    """Answers with a fixed list of responses, one per call, in order.

    Entries may be ``ModelResponse`` objects or plain strings (a text answer). When the list runs
    out, the next call fails with ``ModelResponseError``.
    """

    reports_real_usage = False  # scripted usage is not a tokenizer's count

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
        return _stream_response(response)


ModelFunction = Callable[
    [list[Message], list[ToolSpec]], "ModelResponse | str | Awaitable[ModelResponse | str]"
]


class FunctionModel:
    """Answers by calling ``fn(messages, tools)`` (sync or async) for each model call.

    ``fn`` returns a ``ModelResponse`` or a ``str``.
    """

    reports_real_usage = False  # a function's usage is not a tokenizer's count

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
        for part in _parts(out):
            yield part


class TestModel:
    """Answers from schemas alone, to smoke-test an agent with no script.

    On each call it calls, in one response, every offered tool it has not called since the last
    user message (arguments built from the tool's JSON schema by :func:`loom.sample.sample`);
    once they are all called it answers: an object built from the output schema when the loop
    asks for one (``ModelSettings.output``), else ``text``.

    Args:
        call_tools: ``"all"`` (default), or the names of the only tools to call.
        text: The text answer (default: ``"success"`` and the tools it called).
        output: A fixed typed answer (JSON data) instead of one built from the schema.
    """

    __test__ = False  # not a pytest test class, whatever its name says
    reports_real_usage = False

    def __init__(
        self,
        *,
        call_tools: Sequence[str] | str = "all",
        text: str | None = None,
        output: object = None,
        name: str = "test",
        record: bool = True,
    ) -> None:
        if isinstance(call_tools, str) and call_tools != "all":
            raise InputError(
                f"call_tools must be 'all' or a list of tool names, got {call_tools!r}"
            )
        self.name = name
        self.call_tools = call_tools
        self.text, self.output = text, output
        self._recorder = _Recorder(record)

    @property
    def calls(self) -> list[ModelCall]:
        return self._recorder.calls

    def respond(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], s: ModelSettings | None
    ) -> ModelResponse:
        """The response to one call (what ``stream`` streams)."""
        from loom.sample import sample

        called: set[str] = set()
        for m in reversed(messages):
            if m.role == "user" and not m.metadata:  # corrections are user messages too
                break
            if m.role == "assistant":
                called.update(c.name for c in m.tool_calls)
        wanted = [t for t in tools if self.call_tools == "all" or t.name in self.call_tools]
        todo = [t for t in wanted if t.name not in called]
        if todo:
            return ModelResponse(
                tool_calls=[
                    ToolCall(name=t.name, arguments=_arguments(sample(t.parameters or {})))
                    for t in todo
                ]
            )
        if s is not None and s.output is not None:
            value = self.output if self.output is not None else sample(s.output.schema)
            return ModelResponse(text=json.dumps(value, ensure_ascii=False))
        if self.text is not None:
            return ModelResponse(text=self.text)
        return ModelResponse(text="success" + (f" ({', '.join(sorted(called))})" if called else ""))

    def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        settings: ModelSettings | None = None,
    ) -> AsyncIterator[StreamPart]:
        self._recorder.add(messages, tools, settings)
        return _stream_response(self.respond(messages, tools, settings))


def _arguments(value: object) -> dict[str, object]:
    return value if isinstance(value, dict) else {}


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
