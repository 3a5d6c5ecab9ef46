"""The embedded model reads no media: a new message with an image is refused before the run
(``UnsupportedContent`` naming models that can), and media already in a session's history
(an earlier model's input, a tool's screenshot) are shown to it as short placeholders, never
dropped silently and never loaded from the store."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from loom import Agent
from loom.content import File, Image, Reasoning, check_parts, describe
from loom.engine.runtime import Runtime
from loom.errors import UnsupportedContent
from loom.messages import Message, ToolCall, ToolResult
from loom.models.local import LocalModel
from loom.models.local_prompt import ToolMode, render_messages, text_with_placeholders
from loom.store import MemoryStore
from loom.testing import FunctionModel

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 24
PDF = b"%PDF-1.4\n1 0 obj\n<<>>\nendobj\n%%EOF\n"


def test_media_in_the_history_are_placeholders_in_the_prompt() -> None:
    shot = Image.from_bytes(PNG, name="shot.png")
    report = File.from_bytes(PDF, name="report.pdf")
    call = ToolCall(id="c1", name="screenshot", arguments={})
    messages = [
        Message.user(["What does the report say?", report]),
        Message(
            role="assistant",
            content="",
            tool_calls=[call],
            parts=[Reasoning(text="secret", provider="anthropic", signature="s")],
        ),
        Message.tool(ToolResult(tool_call_id="c1", name="screenshot", data="taken"), None, [shot]),
    ]
    chat = render_messages(messages, [], ToolMode.TEXT)
    assert chat[0] == {"role": "user", "content": f"What does the report say?\n{describe(report)}"}
    assert chat[1] == {"role": "assistant", "content": f"screenshot() = taken\n{describe(shot)}"}
    assert "secret" not in str(chat)  # another provider's reasoning is not shown


def test_a_message_of_media_only_is_its_placeholders() -> None:
    image = Image(url="https://example.com/cat.jpg")
    assert text_with_placeholders(Message.user([image])) == describe(image)
    assert text_with_placeholders(Message.user("plain")) == "plain"


def test_the_embedded_model_says_it_reads_no_media() -> None:
    model = LocalModel.__new__(LocalModel)  # no weights needed to ask what it reads
    model.name = "local"
    assert model.accepts_media == frozenset()
    with pytest.raises(UnsupportedContent, match=r"'local' cannot read image input.*gpt-4o"):
        check_parts(model, [Image.from_bytes(PNG, name="a.png")])


class TextOnly(FunctionModel):
    accepts_media: frozenset[str] = frozenset()


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.loads: list[list[str]] = []

    async def load_blobs(self, refs: Sequence[str]) -> dict[str, bytes]:
        self.loads.append(list(refs))
        return await super().load_blobs(refs)


async def test_an_image_to_a_text_only_model_is_refused_before_anything_is_stored() -> None:
    store = MemoryStore()
    runtime = Runtime(store)
    agent = Agent(model=TextOnly(lambda m, t: "never asked", name="text-only"))
    with pytest.raises(UnsupportedContent, match=r"'text-only' cannot read image input") as info:
        await runtime.run(agent, ["What is this?", Image.from_bytes(PNG, name="a.png")])
    assert info.value.part == "a.png"
    assert await store.list_sessions() == []


async def test_a_text_only_model_never_loads_the_historys_media() -> None:
    """A session whose history holds an image (sent to a model that reads images) goes on
    with a text-only model: the image's bytes are not read back from the store for it."""
    store = CountingStore()
    seen: list[list[Message]] = []

    def vision(messages: list[Message], tools: Any) -> str:
        return "a cat"

    def text_only(messages: list[Message], tools: Any) -> str:
        seen.append(messages)
        return "noted"

    first = await Runtime(store).run(
        Agent(model=FunctionModel(vision)), ["What is this?", Image.from_bytes(PNG, name="cat.png")]
    )
    # a fresh runtime reads the session from the store: the image is a reference there
    result = await Runtime(store).run(
        Agent(model=TextOnly(text_only)), "Thanks", session_id=first.session_id
    )
    assert result.stop_reason == "completed", result.error
    assert store.loads == []
    (image,) = seen[0][0].parts
    assert isinstance(image, Image) and image.data is None and image.ref is not None
    assert "cat.png" in text_with_placeholders(seen[0][0])


@pytest.mark.slow
async def test_the_embedded_model_refuses_an_image_through_the_runtime(
    local_model: LocalModel,
) -> None:
    store = MemoryStore()
    with pytest.raises(UnsupportedContent, match=r"cannot read image input.*openai:gpt-4o"):
        await Runtime(store).run(
            Agent(model=local_model), ["Describe", Image.from_bytes(PNG, name="a.png")]
        )
    assert await store.list_sessions() == []
