"""Redaction: every planted secret is gone from the journal (raw SQLite bytes), the error
store and the JSONL export; patterns; a pattern that does not compile is a typed error."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from loom import Agent, ModelResponse, ToolCall, tool
from loom.cli import app
from loom.errors import ConfigurationError, RedactionPatternError
from loom.guardrails import Redactor, redact
from loom.guardrails.redact import luhn_ok
from loom.store.sqlite import SQLiteStore
from loom.testing import ScriptedModel

PEM_BODY = "MIIEowIBAAKCAQEA7bq98xVzT1Qm4kDgQ2yXvLrS0a"
SECRETS = {
    "email": "alice.smith@example.com",
    "phone": "+1 415-555-2671",
    "card": "4111 1111 1111 1111",
    "openai": "sk-proj-Zx81Kq2LmN4pQr7StUv9Wx0Yz",
    "github": "ghp_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
    "aws": "AKIAIOSFODNN7EXAMPLE",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9P",
    "pem": f"-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}\n-----END RSA PRIVATE KEY-----",
}
# what to look for in raw bytes: distinctive pieces (a PEM's body, not its header)
NEEDLES = [v if k != "pem" else PEM_BODY for k, v in SECRETS.items()]
PLANTED = "\n".join(f"{k}: {v}" for k, v in SECRETS.items())


@tool
def read_config() -> str:
    """Read the configuration file."""
    return f"config:\n{PLANTED}"


@tool
def login() -> str:
    """Log in."""
    raise RuntimeError(f"login failed with {SECRETS['openai']} for {SECRETS['email']}")


def script() -> ScriptedModel:
    return ScriptedModel(
        [
            ModelResponse(
                tool_calls=[
                    ToolCall(id="c1", name="read_config", arguments={}),
                    ToolCall(id="c2", name="login", arguments={}),
                ]
            ),
            "done",
        ]
    )


def raw_bytes(db: Path) -> bytes:
    return b"".join(p.read_bytes() for p in db.parent.glob(db.name + "*"))


def leaks(data: bytes) -> list[str]:
    return [n for n in NEEDLES if n.encode() in data]


@pytest.mark.parametrize("kind", list(SECRETS))
def test_each_builtin_kind_is_found(kind: str) -> None:
    text = f"before {SECRETS[kind]} after"
    out = redact(text)
    assert (PEM_BODY if kind == "pem" else SECRETS[kind]) not in out
    assert out.startswith("before ") and out.endswith(" after") and "[REDACTED:" in out


def test_luhn_keeps_ordinary_numbers() -> None:
    assert luhn_ok("4111111111111111") and not luhn_ok("4111111111111112")
    assert redact("order 4111 1111 1111 1112 shipped") == "order 4111 1111 1111 1112 shipped"
    assert redact("at 2026-11-23 10:00, ticket 12345") == "at 2026-11-23 10:00, ticket 12345"


def test_credential_keeps_the_key_name_and_extra_patterns() -> None:
    r = Redactor({"employee": r"EMP-\d{6}", "pin": r"pin (?P<secret>\d{4})"})
    assert r.redact("password=hunter2xyz") == "password=[REDACTED:credential]"
    assert r.redact("EMP-123456 pin 9876") == "[REDACTED:employee] pin [REDACTED:pin]"


def test_a_pattern_that_does_not_compile_is_a_typed_error_naming_it() -> None:
    with pytest.raises(RedactionPatternError, match=r"'ticket'.*does not compile") as info:
        Redactor({"ticket": r"TCK-(\d+"})
    assert info.value.name == "ticket" and isinstance(info.value, ConfigurationError)
    with pytest.raises(RedactionPatternError, match="unknown built-in redaction kind 'ssn'"):
        Redactor(kinds=["ssn"])


async def test_no_secret_reaches_the_journal_or_the_error_store(tmp_path: Path) -> None:
    db = tmp_path / "loom.db"
    store = SQLiteStore(db)
    model = script()
    agent = Agent(model=model, tools=[read_config, login], store=store, guardrails=[Redactor()])
    result = await agent.run(
        f"my email is {SECRETS['email']}, card {SECRETS['card']}", session_id="s"
    )
    assert result.stop_reason == "completed"
    seen = "\n".join(m.content for m in model.calls[1].messages)
    assert leaks(seen.encode()) == [] and "[REDACTED:api_key]" in seen  # the model saw none
    (err,) = await store.list_errors(session_id="s")
    assert "[REDACTED:api_key]" in str(err.raw_error)
    assert leaks(str(err.raw_error).encode() + err.short_summary.encode()) == []
    await store.close()
    assert leaks(raw_bytes(db)) == []  # events, messages, ledger, errors: the file's bytes


@tool
def send_note(to: str, body: str) -> str:
    """Send a note."""
    return f"sent to {len(to)} chars"


def calling_script() -> ScriptedModel:
    """The model itself writes secrets: in a tool call's arguments and in the text beside it."""
    return ScriptedModel(
        [
            ModelResponse(
                text=f"Mailing {SECRETS['email']} the key {SECRETS['aws']} now.",
                tool_calls=[
                    ToolCall(
                        id="c1",
                        name="send_note",
                        arguments={
                            "to": SECRETS["email"],
                            "body": f"aws {SECRETS['aws']}, openai {SECRETS['openai']}",
                        },
                    )
                ],
            ),
            "done",
        ]
    )


async def test_tool_call_arguments_and_the_text_beside_them_are_redacted(tmp_path: Path) -> None:
    needles = [SECRETS["email"], SECRETS["aws"], SECRETS["openai"]]
    db = tmp_path / "loom.db"
    store = SQLiteStore(db)
    ran_with: list[dict[str, str]] = []

    @tool(name="send_note")
    def spy(to: str, body: str) -> str:
        """Send a note."""
        ran_with.append({"to": to, "body": body})
        return "sent"

    agent = Agent(model=calling_script(), tools=[spy], store=store, guardrails=[Redactor()])
    result = await agent.run("send the note", session_id="s")
    assert result.stop_reason == "completed"
    # what runs is what is committed: the tool got the redacted arguments
    assert ran_with == [
        {"to": "[REDACTED:email]", "body": "aws [REDACTED:aws_key], openai [REDACTED:api_key]"}
    ]
    events = await store.load_events("s")
    dumped = repr(events) + repr(await store.load_messages("s"))
    assert not [n for n in needles if n in dumped]
    assert "in the response and its tool calls" in dumped  # the GUARDRAIL event says so
    await store.close()
    # messages, events and the tool-call ledger, as the file holds them
    assert not [n for n in needles if n.encode() in raw_bytes(db)]
    control = tmp_path / "control.db"
    plain = SQLiteStore(control)
    await Agent(model=calling_script(), tools=[send_note], store=plain).run("x", session_id="s")
    await plain.close()
    assert all(n.encode() in raw_bytes(control) for n in needles)  # the search can see them


async def test_without_the_redactor_the_same_run_does_store_them(tmp_path: Path) -> None:
    """The control: the planted secrets do land in the file when nothing redacts them, so the
    byte search above can see them."""
    db = tmp_path / "loom.db"
    store = SQLiteStore(db)
    agent = Agent(model=script(), tools=[read_config, login], store=store)
    await agent.run("hi", session_id="s")
    await store.close()
    assert set(leaks(raw_bytes(db))) == set(NEEDLES)


@pytest.fixture
def unredacted_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import asyncio

    monkeypatch.chdir(tmp_path)
    db = tmp_path / "loom.db"

    async def go() -> None:
        store = SQLiteStore(db)
        agent = Agent(model=script(), tools=[read_config, login], store=store)
        await agent.run(f"call me at {SECRETS['phone']}", session_id="s")
        await store.close()

    asyncio.run(go())
    return db


def test_the_jsonl_export_is_redacted(unredacted_session: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "t.jsonl"
    r = runner.invoke(
        app,
        [
            "sessions",
            "export",
            "s",
            "--store",
            str(unredacted_session),
            "-o",
            str(out),
            "--redact-pattern",
            "word=\\bconfig\\b",
        ],
    )
    assert r.exit_code == 0, r.output
    data = out.read_bytes()
    assert leaks(data) == [] and b"[REDACTED:word]" in data and b"[REDACTED:phone]" in data
    r = runner.invoke(
        app,
        [
            "sessions",
            "export",
            "s",
            "--store",
            str(unredacted_session),
            "-o",
            str(out),
            "--no-redact",
        ],
    )
    assert r.exit_code == 0 and SECRETS["phone"].encode() in out.read_bytes()


def test_export_with_a_bad_pattern_says_which(unredacted_session: Path) -> None:
    r = CliRunner().invoke(
        app,
        [
            "sessions",
            "export",
            "s",
            "--store",
            str(unredacted_session),
            "--redact-pattern",
            "bad=((",
        ],
    )
    assert r.exit_code == 2 and "RedactionPatternError" in r.output and "'bad'" in r.output
