"""The default context builder (``FullHistoryBuilder``) counts media by the same rules as the
memory layer (``loom.content_tokens``, re-exported as ``loom.memory.media``), not as the few
characters of their caption."""

from __future__ import annotations

import io

import pytest

from loom import Agent, EventType, Message
from loom.content import Image, Reasoning
from loom.content_tokens import anthropic_image_tokens, openai_image_tokens
from loom.context import ContextRequest, FullHistoryBuilder, text_tokens
from loom.testing import FunctionModel

pytest.importorskip("PIL")


def png(width: int, height: int) -> bytes:
    from PIL import Image as PILImage

    buf = io.BytesIO()
    PILImage.new("RGB", (width, height), (10, 120, 200)).save(buf, format="PNG")
    return buf.getvalue()


async def estimate(history: list[Message], model: object) -> int:
    agent = Agent("a", instructions="You help.", model=FunctionModel(lambda m, t: "ok"))
    request = ContextRequest(agent, history, "s", "r", 1, "u", tool_specs=[], model=model)
    return (await FullHistoryBuilder().build(request)).token_estimate


@pytest.mark.parametrize(
    ("model", "figure"),
    [
        ("openai:gpt-4o", openai_image_tokens(1024, 768)),  # 4 tiles: 765
        ("anthropic:claude-sonnet-4-5", anthropic_image_tokens(1024, 768)),  # 1049
        ("vllm-served-model", anthropic_image_tokens(1024, 768)),  # default: the larger
    ],
)
async def test_an_image_adds_its_rules_figure_to_the_estimate(model: str, figure: int) -> None:
    image = Image.from_bytes(png(1024, 768), name="chart.png")
    plain = await estimate([Message.user("what is this?")], model)
    with_image = await estimate(
        [Message(role="user", content="what is this?", parts=[image])], model
    )
    assert with_image - plain == figure
    # a stored part (its reference and size, no bytes) costs the same as the bytes did
    stored = image.model_copy(update={"data": None})
    assert stored.data is None and stored.width == 1024
    kept = await estimate([Message(role="user", content="what is this?", parts=[stored])], model)
    assert kept == with_image


async def test_reasoning_counts_its_text() -> None:
    thought = Reasoning(text="x" * 400, provider="anthropic", signature="sig")
    plain = await estimate([Message.assistant("done")], "anthropic:claude-sonnet-4-5")
    answer = Message(role="assistant", content="done", parts=[thought])
    assert await estimate([answer], "anthropic:claude-sonnet-4-5") - plain == text_tokens("x" * 400)


async def test_a_run_with_an_image_reports_the_larger_estimate() -> None:
    """Through a whole turn: the context event's estimate holds the image, on the first call
    (bytes in hand) and after a tool round trip (the part read back as a reference)."""
    from loom import ModelResponse, ToolCall, tool

    @tool
    def noop() -> str:
        """Does nothing."""
        return "ok"

    def model(messages: list[Message], tools: object) -> ModelResponse | str:
        if messages[-1].role == "user":
            return ModelResponse(tool_calls=[ToolCall(name="noop", arguments={})])
        return "done"

    async def estimates(message: object) -> list[int]:
        agent = Agent(
            "a",
            model=FunctionModel(model),
            tools=[noop],
            context_builder=FullHistoryBuilder(),
        )
        events = [e async for e in agent.stream(message)]  # type: ignore[arg-type]
        return [
            e.data["token_estimate"]
            for e in events
            if e.type == EventType.CONTEXT_ASSEMBLY_COMPLETE
        ]

    image = Image.from_bytes(png(1024, 768), name="chart.png")
    plain = await estimates("what is this?")
    with_image = await estimates(["what is this?", image])
    figure = anthropic_image_tokens(1024, 768)  # a test model: the default rule
    assert len(plain) == len(with_image) == 2
    assert [b - a for a, b in zip(plain, with_image, strict=True)] == [figure, figure]
