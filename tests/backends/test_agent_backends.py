"""Backends in an agent's turn: their tools join the tool table, their schema text goes into
the ROM, refusals reach the model as error results; AGENT.md ``backends:`` and ``loom run
--backend``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from loom import Agent, ModelResponse, ToolCall
from loom.backends.sql import SQLBackend
from loom.errors import AgentDefinitionError
from loom.testing import ScriptedModel

from .conftest import ALLOWED, SECRET, Database

SRC = Path(__file__).parents[2] / "src"


def _calls(*pairs: tuple[str, dict[str, object]]) -> ModelResponse:
    return ModelResponse(tool_calls=[ToolCall(name=n, arguments=a) for n, a in pairs])


async def test_a_turn_offers_the_tools_and_puts_the_schema_into_rom(sqlite_db: Database) -> None:
    backend = SQLBackend(sqlite_db.url, tables=ALLOWED)
    model = ScriptedModel(
        [
            _calls(
                ("query", {"sql": "SELECT count(*) AS n FROM users"}),
                ("query", {"sql": "SELECT * FROM secret"}),
            ),
            "three users",
        ]
    )
    agent = Agent("analyst", "Answer from the database.", model=model, backends=[backend])
    result = await agent.run("how many users?")
    assert result.output == "three users"
    first = model.calls[0]
    system = first.messages[0].content
    assert system.startswith("Answer from the database.")
    assert "SQL database 'sql' (sqlite, read-only" in system
    assert (
        "- users(id INTEGER PRIMARY KEY, name TEXT NOT NULL, org_id INTEGER -> orgs.id)" in system
    )
    assert {t.name for t in first.tools} >= {
        "list_tables",
        "describe_table",
        "sample_rows",
        "query",
    }
    results = [m for m in model.calls[1].messages if m.role == "tool"]
    assert results[0].content.splitlines()[:2] == ["n", "3"]
    assert "refused" in results[1].content and "secret" in results[1].content
    assert SECRET not in " ".join(m.content for m in model.calls[1].messages)
    backend.close()


def test_agent_md_backends_build_and_write_back(sqlite_db: Database, tmp_path: Path) -> None:
    assert sqlite_db.path is not None
    (tmp_path / "shop.db").write_bytes(sqlite_db.path.read_bytes())
    md = tmp_path / "AGENT.md"
    md.write_text(
        "---\nname: shop\nbackends:\n  - sql: sqlite:///shop.db\n    tables: [users]\n---\nHi\n"
    )
    agent = Agent.from_file(md)
    (backend,) = agent.backends
    assert backend.scope.tables == frozenset({("main", "users")})
    assert agent.to_definition().backends == [{"sql": "sqlite:///shop.db", "tables": ["users"]}]
    md.write_text(
        "---\nname: shop\nbackends:\n  - sql: sqlite:///shop.db\n    tables: [nope]\n---\n"
    )
    with pytest.raises(AgentDefinitionError, match=r"backends.*nope"):
        Agent.from_file(md)


def test_agent_refuses_something_that_is_not_a_backend() -> None:
    with pytest.raises(AgentDefinitionError, match="not a backend"):
        Agent("a", backends=["sqlite:///x.db"])


def test_loom_run_backend_uses_the_database(sqlite_db: Database, tmp_path: Path) -> None:
    """`loom run --backend URL` with a scripted model: the CLI wires the backend in."""
    (tmp_path / "scripted.py").write_text(
        "from loom import ModelResponse, ToolCall\nfrom loom.testing import ScriptedModel\n"
        "from loom.models import PROVIDERS\nPROVIDERS['scripted'] = 'scripted:make'\n"
        "def make(rest):\n    return ScriptedModel([ModelResponse(tool_calls=["
        "ToolCall(name='query', arguments={'sql': 'SELECT name FROM orgs ORDER BY id'})]), "
        "'done'])\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(tmp_path)])}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import scripted, sys; from loom.cli import main; "
            "sys.argv=['loom','run','--model','scripted:x','--store',':memory:','--backend',"
            f"{sqlite_db.url!r},'orgs?']; main()",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "→ query" in proc.stderr and "acme" in proc.stderr
