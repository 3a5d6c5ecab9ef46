"""How the embedded model is prompted and how its constrained output becomes an answer.

A 135M-parameter model cannot be trusted to produce a tool call on its own, so when tools are
offered the local model decodes under a JSON schema that is a choice between
``{"tool": <a real tool's name>, "arguments": <that tool's parameters>}`` for each tool and
``{"answer": <text>}``. llama.cpp turns the schema into a grammar and samples only tokens the
grammar allows: every call is valid JSON and names a real tool.

Tool results are shown to the model as ``add(a=17, b=25) = 42`` in its own turn, followed by a
short request to state the answer: small chat models answer that far more reliably than a
``tool`` role message their template was never trained on. Media in the history (the embedded
model reads none) are shown as a short placeholder each, such as ``[image chart.png:
image/png, 640x480]``.

With an ``output_type`` (``ModelSettings.output``) the answer branch is ``{"answer": <the
output schema>}`` and, when no tool may be called, the whole answer decodes under the output
schema: the typed answer always parses.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Sequence
from typing import Any

from loom.content import Media, describe
from loom.messages import Message, ToolCall, ToolSpec

__all__ = [
    "AnswerStream",
    "ToolMode",
    "parse_constrained",
    "render_messages",
    "text_with_placeholders",
    "tool_rounds_since_user",
    "tools_schema",
]

ANSWER_NUDGE = "Now state the answer in one sentence."
CONTINUE_NUDGE = "Call another tool if you still need one; otherwise give the answer."


class ToolMode:
    """What the decoder may produce on this call."""

    TEXT = "text"  # free text, no grammar
    CHOICE = "choice"  # a tool call or an answer
    REQUIRED = "required"  # a tool call only


def _type_hint(schema: dict[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, str):
        return kind
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " | ".join(_type_hint(s) for s in schema[key] if isinstance(s, dict))
    if "enum" in schema:
        return " | ".join(json.dumps(v) for v in schema["enum"])
    return "any"


def describe_output(schema: dict[str, Any]) -> str:
    """The system prompt's note on the answer's shape (the grammar enforces it; this says what
    the fields mean)."""
    return "Answer with JSON that fits this JSON schema:\n" + json.dumps(schema, ensure_ascii=False)


def describe_tools(
    tools: Sequence[ToolSpec], mode: str, answer: dict[str, Any] | None = None
) -> str:
    """The tool section of the system prompt."""
    lines = []
    for t in tools:
        props = (t.parameters or {}).get("properties", {})
        sig = ", ".join(f"{k}: {_type_hint(v)}" for k, v in props.items() if isinstance(v, dict))
        desc = f": {t.description.splitlines()[0]}" if t.description else ""
        lines.append(f"- {t.name}({sig}){desc}")
    if mode == ToolMode.REQUIRED:
        how = 'Answer with JSON that calls one tool: {"tool": "name", "arguments": {...}}.'
    else:
        shape = '"text"' if answer is None else "<a JSON object that fits the schema below>"
        how = (
            'Answer with JSON. If a tool fits the question, call it: {"tool": "name", '
            f'"arguments": {{...}}}}. If no tool fits, answer directly: {{"answer": {shape}}}.'
        )
        if answer is not None:
            how += "\n" + describe_output(answer)
    return "Tools:\n" + "\n".join(lines) + "\n\n" + how


def call_signature(call: ToolCall) -> str:
    if call.raw_arguments is not None:
        return f"{call.name}({call.raw_arguments})"
    args = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in call.arguments.items())
    return f"{call.name}({args})"


def tool_rounds_since_user(messages: Sequence[Message]) -> int:
    """How many times the model called tools since the last user message."""
    rounds = 0
    for m in reversed(messages):
        if m.role == "user":
            break
        if m.role == "assistant" and m.tool_calls:
            rounds += 1
    return rounds


def text_with_placeholders(message: Message) -> str:
    """``message``'s text followed by a short placeholder for each of its media
    (``loom.content.describe``): the embedded model reads no media, but a history that holds
    some (an image an earlier model was shown, a tool's screenshot) must not lose them
    silently. Reasoning parts are left out: they belong to the provider that made them."""
    media = [describe(p) for p in message.parts if isinstance(p, Media)]
    if not media:
        return message.content
    return "\n".join([message.content, *media]) if message.content else "\n".join(media)


def render_messages(
    messages: Sequence[Message],
    tools: Sequence[ToolSpec],
    mode: str,
    output: dict[str, Any] | None = None,
) -> list[dict[str, str]]:
    """Loom messages as plain chat messages for the GGUF's chat template (``output``: the
    answer's JSON schema, when the agent has an output type)."""
    results = {
        m.tool_call_id: text_with_placeholders(m)
        for m in messages
        if m.role == "tool" and m.tool_call_id
    }
    system = [m.content for m in messages if m.role == "system" and m.content]
    if mode != ToolMode.TEXT:
        system.append(describe_tools(tools, mode, output))
    elif output is not None:
        system.append(describe_output(output))
    out: list[dict[str, str]] = []
    if system:
        out.append({"role": "system", "content": "\n\n".join(system)})
    for m in messages:
        if m.role == "user":
            out.append({"role": "user", "content": text_with_placeholders(m)})
        elif m.role == "assistant":
            lines = [m.content] if m.content else []
            for call in m.tool_calls:
                lines.append(f"{call_signature(call)} = {results.get(call.id, '(no result)')}")
            if lines:
                out.append({"role": "assistant", "content": "\n".join(lines)})
    if messages and messages[-1].role == "tool":
        out.append(
            {"role": "user", "content": ANSWER_NUDGE if mode == ToolMode.TEXT else CONTINUE_NUDGE}
        )
    return out


def _prefixed(schema: dict[str, Any], prefix: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Move a tool schema's ``$defs`` to the top level under unique names."""
    schema = copy.deepcopy(schema)
    defs = schema.pop("$defs", None) or schema.pop("definitions", None) or {}

    def fix(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                name = ref.rsplit("/", 1)[-1]
                node["$ref"] = f"#/$defs/{prefix}{name}"
            return {k: fix(v) for k, v in node.items()}
        if isinstance(node, list):
            return [fix(v) for v in node]
        return node

    return fix(schema), {f"{prefix}{k}": fix(v) for k, v in defs.items()}


def tools_schema(
    tools: Sequence[ToolSpec], mode: str, answer: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The JSON schema the decoder follows: one branch per tool, plus the answer unless required
    (a string, or the output type's ``answer`` schema)."""
    branches: list[dict[str, Any]] = []
    all_defs: dict[str, Any] = {}
    answer_schema: dict[str, Any] = {"type": "string"}
    if answer is not None:
        answer_schema, defs = _prefixed(answer, "out_")
        all_defs.update(defs)
    for i, t in enumerate(tools):
        params, defs = _prefixed(t.parameters or {"type": "object", "properties": {}}, f"t{i}_")
        params.setdefault("type", "object")
        all_defs.update(defs)
        branches.append(
            {
                "type": "object",
                "properties": {"tool": {"const": t.name}, "arguments": params},
                "required": ["tool", "arguments"],
                "additionalProperties": False,
            }
        )
    if mode != ToolMode.REQUIRED:
        branches.append(
            {
                "type": "object",
                "properties": {"answer": answer_schema},
                "required": ["answer"],
                "additionalProperties": False,
            }
        )
    schema: dict[str, Any] = {"anyOf": branches}
    if all_defs:
        schema["$defs"] = all_defs
    return schema


def loose_tools_schema(
    tools: Sequence[ToolSpec], mode: str, answer: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Fallback when a parameter schema is beyond the grammar converter: any object arguments."""
    loose = [ToolSpec(t.name, t.description, {"type": "object"}) for t in tools]
    return tools_schema(loose, mode, answer)


def parse_constrained(text: str) -> tuple[str, ToolCall | None]:
    """(answer text, tool call) from the JSON the grammar produced; raises ``ValueError``."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if "tool" in data:
        args = data.get("arguments")
        if not isinstance(args, dict):
            return "", ToolCall(name=str(data["tool"]), raw_arguments=json.dumps(args))
        return "", ToolCall(name=str(data["tool"]), arguments=args)
    if "answer" in data:
        answer = data["answer"]
        if isinstance(answer, str):
            return answer, None
        return json.dumps(answer, ensure_ascii=False), None  # a typed answer, as its JSON
    raise ValueError("neither 'tool' nor 'answer'")


_ANSWER_HEAD = re.compile(r'\s*\{\s*"answer"\s*:\s*"')
_ANSWER_TARGET = '{"answer":"'
_RAW_HEAD = re.compile(r'\s*\{\s*"answer"\s*:\s*')
_RAW_TARGET = '{"answer":'
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}


class AnswerStream:
    """Turns the raw JSON stream into answer-text deltas while an ``{"answer": "..."}`` decodes.

    Tool calls produce no deltas (their JSON is not for the user); the final text always comes
    from parsing the complete output. With ``raw=True`` (a typed answer: ``{"answer": {...}}``)
    the answer's JSON is passed through as it decodes, less the closing brackets at its end,
    which may be the wrapper's (:meth:`finish` gives the rest of the answer's own).
    """

    __slots__ = ("buf", "esc", "high", "pos", "raw", "state")

    def __init__(self, raw: bool = False) -> None:
        self.buf = ""
        self.state = "head"
        self.pos = 0
        self.esc = ""
        self.high = 0  # a UTF-16 high surrogate waiting for its pair
        self.raw = raw

    def finish(self) -> str:
        """At the end of a raw answer: what was held back, without the wrapper's ``}``."""
        if not self.raw or self.state != "body":
            return ""
        rest = self.buf[self.pos :].rstrip()
        return rest[:-1].rstrip() if rest.endswith("}") else rest

    def _unicode(self, code: int) -> str:
        if 0xD800 <= code < 0xDC00:
            self.high = code
            return ""
        high, self.high = self.high, 0
        if high and 0xDC00 <= code < 0xE000:
            return chr(0x10000 + ((high - 0xD800) << 10) + (code - 0xDC00))
        return chr(code)

    def feed(self, piece: str) -> str:
        self.buf += piece
        if self.raw:
            return self._feed_raw()
        if self.state == "head":
            match = _ANSWER_HEAD.match(self.buf)
            if match:
                self.state, self.pos = "body", match.end()
            else:
                compact = re.sub(r"\s+", "", self.buf)
                if not _ANSWER_TARGET.startswith(compact):
                    self.state = "other"
                return ""
        if self.state != "body":
            return ""
        out: list[str] = []
        while self.pos < len(self.buf):
            ch = self.buf[self.pos]
            self.pos += 1
            if self.esc:
                self.esc += ch
                if self.esc.startswith("\\u"):
                    if len(self.esc) < 6:
                        continue
                    out.append(self._unicode(int(self.esc[2:], 16)))
                else:
                    out.append(_ESCAPES.get(ch, ch))
                self.esc = ""
            elif ch == "\\":
                self.esc = ch
            elif ch == '"':
                self.state = "done"
                break
            else:
                out.append(ch)
        return "".join(out)

    def _feed_raw(self) -> str:
        if self.state == "head":
            match = _RAW_HEAD.match(self.buf)
            if match:
                self.state, self.pos = "body", match.end()
            else:
                compact = re.sub(r"\s+", "", self.buf)
                if not _RAW_TARGET.startswith(compact):
                    self.state = "other"
                return ""
        if self.state != "body":
            return ""
        end = len(self.buf.rstrip("} \t\r\n"))  # closers may be the wrapper's: hold them
        if end <= self.pos:
            return ""
        out, self.pos = self.buf[self.pos : end], end
        return out
