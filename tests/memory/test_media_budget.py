"""Media in the token budget: each provider's rule, placeholders for older media before any
text is summarised, parts never cut, and (hypothesis) no request over its budget."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from loom import Agent, EventType, Message, ToolCall
from loom.content import Audio, File, Image, Media, describe
from loom.context import ContextRequest
from loom.errors import ContextTooLong
from loom.memory import MemoryConfig, SegmentedContextBuilder
from loom.memory.media import (
    anthropic_image_tokens,
    media_rule_for,
    openai_image_tokens,
    part_tokens,
)
from loom.memory.tokens import EstimateCounter, MessageCounter, TiktokenCounter
from loom.messages import ToolResult
from loom.testing import FunctionModel

E = EventType
COUNTER = TiktokenCounter("cl100k_base")


def png(width: int, height: int) -> bytes:
    from PIL import Image as PILImage

    buf = io.BytesIO()
    PILImage.new("RGB", (width, height), (10, 120, 200)).save(buf, format="PNG")
    return buf.getvalue()


def image(width: int | None, height: int | None, name: str = "pic.png", **kw: Any) -> Image:
    """An image of that size without its bytes (as read back from the store: a reference)."""
    return Image(
        ref=f"sha256:{name}{width}x{height}",
        media_type="image/png",
        name=name,
        width=width,
        height=height,
        size=1000,
        **kw,
    )


# -- the rules ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("size", "detail", "tokens"),
    [
        ((1024, 1024), None, 765),  # OpenAI's worked example: 768x768, 4 tiles
        ((2048, 4096), None, 1105),  # OpenAI's worked example: 768x1536, 6 tiles
        ((4096, 8192), "low", 85),
        ((500, 300), "auto", 255),  # under the limits: 1 tile
        ((None, None), None, 1445),  # unknown: the most any image costs (2 x 4 tiles)
        ((None, None), "low", 85),
    ],
)
def test_openai_image_tokens(size: tuple[Any, Any], detail: str | None, tokens: int) -> None:
    assert openai_image_tokens(*size, detail) == tokens


@pytest.mark.parametrize(
    ("size", "tokens"),
    [
        ((1000, 1000), 1334),  # Anthropic's table: 1000x1000 is ~1333 tokens
        ((200, 200), 54),
        ((2000, 1000), 1640),  # scaled to 1568x784 first
        ((None, None), 3279),  # unknown: 1568x1568, the largest
    ],
)
def test_anthropic_image_tokens(size: tuple[Any, Any], tokens: int) -> None:
    assert anthropic_image_tokens(*size) == tokens


def test_the_rule_comes_from_the_model_by_a_table() -> None:
    assert media_rule_for("anthropic:claude-sonnet-4-5") == "anthropic"
    assert media_rule_for("openai:gpt-4o") == "openai"
    assert media_rule_for("openai-responses:o4-mini") == "openai"
    assert media_rule_for("local") == "local"
    assert media_rule_for("openai-compatible:http://h/v1#qwen") == "default"
    assert media_rule_for(FunctionModel(lambda m, t: "x")) == "default"
    assert media_rule_for(FunctionModel(lambda m, t: "x", name="anthropic:claude-x")) == (
        "anthropic"
    )


def test_files_audio_and_the_local_model() -> None:
    count = COUNTER.count
    pdf = File(ref="sha256:p", media_type="application/pdf", size=120_000, name="r.pdf")
    assert part_tokens(pdf, "openai", count) == 3 * 2_500  # 3 pages guessed from the size
    csv = File(ref="sha256:c", media_type="text/csv", size=4_000, name="d.csv")
    assert part_tokens(csv, "anthropic", count) == 1_000
    wav = Audio(ref="sha256:a", media_type="audio/wav", size=320_000)  # ~10 s
    assert part_tokens(wav, "openai", count) == 100
    assert part_tokens(wav, "default", count) == 320
    big = image(4000, 3000)
    # the local model is shown the placeholder text, so that is what the image costs
    assert part_tokens(big, "local", count) == count(describe(big))
    assert part_tokens(big, "default", count) == max(
        openai_image_tokens(4000, 3000), anthropic_image_tokens(4000, 3000)
    )


def test_a_message_counts_its_media_and_the_cache_tells_sizes_apart() -> None:
    mc = MessageCounter(COUNTER, media="openai")
    text = Message.user("what is this?")
    small = Message(role="user", content="what is this?", parts=[image(500, 300)])
    large = Message(role="user", content="what is this?", parts=[image(2048, 4096)])
    assert mc.message(small) == mc.message(text) + 255
    assert mc.message(large) == mc.message(text) + 1105
    # an image with its bytes (sized by Pillow) costs what its stored reference costs
    real = Image.from_bytes(png(500, 300))
    assert (real.width, real.height) == (500, 300)
    assert mc.message(Message(role="user", content="what is this?", parts=[real])) == (
        mc.message(small)
    )


# -- placeholders before summaries ---------------------------------------------------------------
def agent_for(window: int, model: Any = None, **cfg: Any) -> Agent:
    config = MemoryConfig(counter=COUNTER, retry_delays=(0.0,), memory_file=None, **cfg)

    def summarise(messages: list[Message], tools: Any) -> str:
        return "## Task Overview\nsummary"

    return Agent(
        "m",
        "You look at pictures.",
        model=model or FunctionModel(summarise, name="openai:gpt-4o"),
        context_window=window,
        reserved_output_tokens=200,
        memory=config,
    )


async def build(agent: Agent, history: list[Message]) -> Any:
    builder = agent.runtime.builder_for(agent)
    assert isinstance(builder, SegmentedContextBuilder)
    return await builder.build(
        ContextRequest(agent, history, "s", "r", 1, "u", tool_specs=[], model=agent.model)
    )


async def test_older_media_become_placeholders_before_any_text_is_summarised() -> None:
    agent = agent_for(3000)
    old = [image(2048, 4096, name=f"old{i}.png") for i in range(2)]  # 1105 tokens each
    new = image(1024, 1024, name="new.png")
    history = [
        Message(role="user", content="look at these", parts=old),
        Message.assistant("two charts of sales"),
        Message(role="user", content="and this one?", parts=[new]),
    ]
    ctx = await build(agent, history)
    sent = {m.content: m for m in ctx.messages if m.role == "user"}
    first = next(m for m in ctx.messages if m.content.startswith("look at these"))
    assert first.parts == []  # whole parts replaced, never cut
    assert first.content == "look at these\n" + "\n".join(describe(p) for p in old)
    assert sent["and this one?"].parts == [new]  # the newest user message's media stay
    assert "two charts of sales" in [m.content for m in ctx.messages]  # no text dropped
    kinds = [k for k, _ in ctx.notes]
    assert E.COMPRESSION_START not in kinds  # nothing summarised: the placeholders sufficed
    assert ctx.token_estimate <= 3000 - 200
    # with room to spare, nothing is replaced
    roomy = await build(agent_for(20_000), history)
    assert next(m for m in roomy.messages if m.content == "look at these").parts == old


async def test_a_description_is_quoted_in_the_placeholder() -> None:
    agent = agent_for(1400)  # 1105 tokens of image in 1200: over 92 %
    old = image(2048, 4096, name="plot.png")
    history = [
        Message(
            role="user",
            content="see",
            parts=[old],
            metadata={"media_descriptions": {old.ref: "a rising line"}},
        ),
        Message.assistant("ok"),
        Message.user("summarise what you saw"),
    ]
    ctx = await build(agent, history)
    first = next(m for m in ctx.messages if m.content.startswith("see"))
    assert first.parts == [] and first.content.endswith("; described as: a rising line]")


async def test_a_tool_results_media_in_the_current_turn_go_before_its_text_is_cut() -> None:
    agent = agent_for(3000)
    call = ToolCall(id="c1", name="export", arguments={})
    huge = File(ref="sha256:r", media_type="application/pdf", size=200_000, name="r.pdf")
    result = ToolResult(tool_call_id="c1", name="export", data="exported: " + "page " * 50)
    history = [
        Message.user("export the report"),
        Message.assistant(tool_calls=[call]),
        Message.tool(result, parts=[huge]),  # 10,000 tokens of PDF in a 2,800-token budget
    ]
    ctx = await build(agent, history)
    sent = ctx.messages[-1]
    assert sent.role == "tool" and sent.parts == []
    assert sent.content == result.to_content() + "\n" + describe(huge)  # text kept whole
    notes = [d for k, d in ctx.notes if k is E.CONTEXT_COMPONENT_TRUNCATED]
    assert [d["component"] for d in notes] == ["current_turn_media"]
    assert ctx.token_estimate <= 2800


async def test_current_turn_media_that_cannot_fit_are_a_typed_error_naming_them() -> None:
    agent = agent_for(1200)
    huge = File(ref="sha256:f", media_type="application/pdf", size=2_000_000, name="big.pdf")
    with pytest.raises(ContextTooLong, match=r"big\.pdf \(~100000 tokens\)"):
        await build(agent, [Message(role="user", content="read it", parts=[huge])])


# -- the property ------------------------------------------------------------------------------
media_part = st.one_of(
    st.builds(
        lambda w, h, d, n: image(w, h, name=f"i{n}.png", detail=d),
        st.one_of(st.none(), st.integers(1, 5000)),
        st.one_of(st.none(), st.integers(1, 5000)),
        st.sampled_from([None, "low", "high"]),
        st.integers(0, 10_000),
    ),
    st.builds(
        lambda s, n: File(ref=f"sha256:f{n}", media_type="application/pdf", size=s, name="f"),
        st.integers(1, 200_000),
        st.integers(0, 10_000),
    ),
    st.builds(
        lambda s, n: Audio(ref=f"sha256:a{n}", media_type="audio/mpeg", size=s),
        st.integers(1, 400_000),
        st.integers(0, 10_000),
    ),
)
message_spec = st.tuples(
    st.sampled_from(["user", "assistant", "tool"]),
    st.integers(0, 600),  # words of text
    st.lists(media_part, max_size=2),
)


def words(n: int, seed: int) -> str:
    return " ".join(f"w{(seed * 31 + i) % 97}" for i in range(n))


async def check_every_build(
    specs: list[tuple[str, int, list[Media]]], window: int, rule_model: str, scale: float
) -> None:
    counter = EstimateCounter(scale=scale)

    def summarise(messages: list[Message], tools: Any) -> str:
        return "## Task Overview\n" + words(30, len(messages))

    config = MemoryConfig(
        counter=counter, retry_delays=(0.0,), memory_file=None, summarizer=FunctionModel(summarise)
    )
    model = FunctionModel(lambda m, t: "x", name=rule_model)
    agent = Agent("p", "You help.", model=model, context_window=window, memory=config)
    builder = agent.runtime.builder_for(agent)
    assert isinstance(builder, SegmentedContextBuilder)
    fresh = MessageCounter(counter, media=media_rule_for(model))
    budget = window - builder.window_of(agent, model)[1]
    history: list[Message] = []
    latest_user: Message | None = None
    for i, (role, n, parts) in enumerate(specs):
        added: list[Message]
        if role == "tool":  # a round of one call whose result carries the media
            if latest_user is None:
                continue
            call = ToolCall(id=f"c{i}", name="look", arguments={})
            result = ToolResult(tool_call_id=call.id, name="look", data=words(n, i))
            added = [Message.assistant(tool_calls=[call]), Message.tool(result, parts=parts)]
        elif role == "user":
            added = [Message(role="user", content=words(n, i), parts=parts)]
        else:
            history.append(Message.assistant(words(n, i)))
            continue
        history.extend(added)
        user = added[0] if role == "user" else latest_user
        assert user is not None
        request = ContextRequest(agent, history, "s", "r", 1, "u", tool_specs=[], model=model)
        try:
            ctx = await builder.build(request)
        except ContextTooLong:
            # only when the latest user message's own media (which always stay) do not fit,
            # with the least the rest of the current turn can shrink to
            rest = [m.model_copy(update={"content": "", "parts": []}) for m in added[1:]]
            least = [
                Message.system("You help."),
                user.model_copy(update={"content": ""}),
                *(m.model_copy(update={"tool_calls": []}) for m in rest),
            ]
            assert fresh.scaled(fresh.messages(least)) > budget
            event("too long")
            del history[-len(added) :]
            continue
        latest_user = user
        history.extend(ctx.persist)
        sent = fresh.scaled(fresh.messages(ctx.messages))
        assert sent <= budget, f"sent {sent} tokens, budget {budget}"
        given_parts = {id(p) for m in history for p in m.parts}
        for m in ctx.messages:
            # a part is sent whole (the very object the transcript holds) or not at all
            assert all(id(p) in given_parts for p in m.parts)
        if user.parts:  # the latest user message's media stay
            assert any(m.role == "user" and m.parts == user.parts for m in ctx.messages)
        if any(k is E.COMPRESSION_START for k, _ in ctx.notes):
            event("summarised")
        if any(d.get("component") == "current_turn_media" for _, d in ctx.notes):
            event("current turn's tool media replaced")
        if any("\n[image" in m.content or "\n[file" in m.content for m in ctx.messages):
            event("placeholders")


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.lists(message_spec, min_size=1, max_size=16),
    window=st.integers(min_value=1500, max_value=12_000),
    rule_model=st.sampled_from(["openai:gpt-4o", "anthropic:claude-x", "local", "other"]),
    scale=st.sampled_from([1.0, 0.8, 1.35]),
)
def test_no_request_exceeds_its_budget_and_no_part_is_split(
    specs: list[tuple[str, int, list[Media]]], window: int, rule_model: str, scale: float
) -> None:
    asyncio.run(check_every_build(specs, window, rule_model, scale))
