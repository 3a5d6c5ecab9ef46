"""The ``Model`` protocol: one streaming entry point every provider implements."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, runtime_checkable

from loom.errors import ModelResponseError
from loom.messages import Message, ModelResponse, ToolSpec

__all__ = [
    "Model",
    "ModelSettings",
    "OutputSchema",
    "ReasoningDelta",
    "RetryNotice",
    "StreamPart",
    "TextDelta",
    "complete",
    "reports_real_usage",
]


@dataclass(frozen=True, slots=True)
class OutputSchema:
    """The shape a final answer must have (an agent's ``output_type``), for the provider.

    ``schema`` is always a JSON schema of an *object* (a type that is not one, such as a list
    or a union, arrives wrapped as ``{"response": ...}``), so every provider's native
    mechanism can take it: the embedded model decodes under it, OpenAI-style servers get it as
    ``response_format``, Anthropic as a forced output tool named ``name``. The provider's
    answer text is then that object as JSON; the loop validates it and unwraps it.
    """

    name: str
    schema: dict[str, Any]
    description: str = ""


@dataclass(slots=True)
class ModelSettings:
    """Per-call options. Providers ignore what they do not support.

    ``tool_choice`` is ``"auto"`` (the default), ``"none"``, ``"required"`` (the model must
    call some tool) or a tool's name (it must call that tool). Every provider enforces it
    natively: OpenAI's ``tool_choice``, Anthropic's ``{"type": "any"}`` / ``{"type": "tool"}``,
    and the embedded model's grammar, which then admits only calls of the allowed tools. A
    forced choice holds until the model has called a tool in the turn; the loop then asks with
    ``"auto"`` so the model can answer from the result (``reset_tool_choice=False`` keeps it
    forced on every call, for a turn that a tool ends).

    ``output`` is set by the loop for an agent with an ``output_type``: a provider that can
    constrain its answer to that schema does so (see :class:`OutputSchema`).

    ``thinking_budget`` (tokens) turns on a reasoning model's thinking where the provider
    takes a budget: Anthropic's ``thinking={"type": "enabled", "budget_tokens": N}`` (its
    minimum is 1024; ``max_tokens`` is raised above the budget when it is not, and
    ``temperature`` is not sent, as the API requires). ``reasoning_effort`` (``"low"``,
    ``"medium"``, ``"high"``, ...) is OpenAI's setting of the same name, sent as is to
    OpenAI-style servers.

    Prompt caching (docs/observability.md, "Prompt caching"): ``prompt_cache`` (on by default)
    lets a provider cache the stable prefix of the context. ``cache_points`` are indices into
    the call's messages, each ending a segment that the next request is expected to repeat
    (the system prompt, the Kernel, the part of the history the previous request also sent,
    the last message); the loop sets them from ``AssembledContext.cache_points`` and
    Anthropic puts a ``cache_control`` breakpoint on each (at most 4). ``cache_key`` is sent
    as OpenAI's ``prompt_cache_key`` (the loop sets a stable one per session when it is
    unset); ``cache_retention`` as OpenAI's ``prompt_cache_retention`` (``"in_memory"`` or
    ``"24h"``), only when set. ``prompt_cache=False`` sends none of them.
    """

    temperature: float | None = None
    max_tokens: int | None = None
    timeout: float | None = None
    tool_choice: str | None = None  # "auto" | "required" | "none" | a tool name
    reset_tool_choice: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    output: OutputSchema | None = None
    thinking_budget: int | None = None
    reasoning_effort: str | None = None
    prompt_cache: bool = True
    cache_points: tuple[int, ...] = ()
    cache_key: str | None = None
    cache_retention: Literal["in_memory", "24h"] | None = None

    def for_messages(self, messages: Sequence[Message]) -> ModelSettings:
        """These settings for a call on ``messages``: a forced ``tool_choice`` becomes
        ``"auto"`` once the model has called a tool since the last user message (unless
        ``reset_tool_choice`` is off), so a forced first call cannot become an endless loop."""
        if not self.reset_tool_choice or self.tool_choice in (None, "auto", "none"):
            return self
        for m in reversed(messages):
            if m.role == "user":
                return self
            if m.role == "assistant" and m.tool_calls:
                return replace(self, tool_choice="auto")
        return self


@dataclass(slots=True)
class TextDelta:
    """A chunk of assistant text, as the model produced it."""

    text: str


@dataclass(slots=True)
class ReasoningDelta:
    """A chunk of the model's reasoning (Anthropic's thinking, an OpenAI-compatible server's
    ``reasoning_content``), as it streams: never part of the answer's text. The whole
    reasoning arrives in the final response's ``parts`` (``loom.content.Reasoning``)."""

    text: str


@dataclass(slots=True)
class RetryNotice:
    """A failed attempt that will be retried after ``delay`` seconds (the loop emits LLM_RETRY).

    Providers yield it only before their first delta: once output has streamed, a failure ends
    the call instead, so nothing is ever shown twice.
    """

    attempt: int
    delay: float
    error: str


StreamPart = TextDelta | ReasoningDelta | RetryNotice | ModelResponse
"""What ``Model.stream`` yields. The last item must be the complete ``ModelResponse``.

Tool calls arrive only in the final response: nothing consumes partial call arguments, so
providers assemble them and do not stream them."""


@runtime_checkable
class Model(Protocol):
    """A language model. Implement ``stream``; ``loom.models.complete`` gives the one-shot form.

    ``stream`` yields ``TextDelta`` parts as they arrive (``ReasoningDelta`` for a reasoning
    model's thinking, ``RetryNotice`` before a retry) and finally exactly one
    ``ModelResponse`` holding the whole answer (text, tool calls, usage, reasoning parts). A
    stream that ends without a ``ModelResponse`` was cut off, and the loop treats it as a
    failed call.

    A model may say which kinds of media it reads with ``accepts_media`` (a set of
    ``"image"``, ``"file"``, ``"audio"``; see ``loom.content.check_parts``): a run whose new
    message holds another kind is refused with ``UnsupportedContent`` before it starts. A
    model that does not say is sent every kind, and its provider answers.

    A model may set ``reports_real_usage = False`` (the test models do): the usage it reports,
    if any, is then not the provider's token count, and token estimators must not learn from
    it (see :func:`reports_real_usage`).
    """

    name: str

    def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        settings: ModelSettings | None = None,
    ) -> AsyncIterator[StreamPart]:
        """Stream one answer to ``messages`` with ``tools`` available."""
        ...


def reports_real_usage(model: object) -> bool:
    """Whether ``model``'s reported usage is a real token count that estimators may learn from.

    ``False`` for models that say so with ``reports_real_usage = False`` (``ScriptedModel``,
    ``FunctionModel``); ``True`` otherwise, so a model class need not declare it.
    """
    return bool(getattr(model, "reports_real_usage", True))


class CallWatcher(Protocol):
    """Told of each model call made through :func:`complete` (summariser and judge calls):
    a tracer (``loom.observability``) sets one for the run it traces, in ``CALL_WATCHER``."""

    def started(self, model: Model) -> Any:
        """A call to ``model`` starts; the value returned is handed to ``ended``."""
        ...

    def ended(
        self, token: Any, response: ModelResponse | None, error: BaseException | None
    ) -> None:
        """The call ended with ``response``, or failed with ``error``."""
        ...


CALL_WATCHER: ContextVar[CallWatcher | None] = ContextVar("loom_call_watcher", default=None)
"""The watcher of the run this task runs (set by a tracer at the run's start, reset at its end)."""


async def complete(
    model: Model,
    messages: Sequence[Message],
    tools: Sequence[ToolSpec] = (),
    settings: ModelSettings | None = None,
) -> ModelResponse:
    """Run ``model.stream`` to the end and return the final response."""
    watcher = CALL_WATCHER.get()
    token = watcher.started(model) if watcher is not None else None
    final: ModelResponse | None = None
    try:
        async for part in model.stream(messages, tools, settings):
            if isinstance(part, ModelResponse):
                final = part
        if final is None:
            raise ModelResponseError(f"model {model.name!r} ended its stream without a response")
    except BaseException as exc:
        if watcher is not None:
            watcher.ended(token, None, exc)
        raise
    if watcher is not None:
        watcher.ended(token, final, None)
    return final
