"""Crew files (YAML) and `loom run --crew`: bad input is a typed error naming the field."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from loom.crew import Crew, Graph, Loop, Manager, Router, Sequential
from loom.errors import CrewCycleError, CrewDefinitionError

SRC = str(Path(__file__).resolve().parents[2] / "src")

GOOD = """
name: pipeline
budget: {tokens: 10000, max_spawns: 10}
members:
  researcher: researcher.md
  writer:
    instructions: You write.
    model: demo
plan:
  sequential:
    - researcher
    - {member: writer, context: "last_n:2", task: "Write from: {input}"}
"""

AGENT_MD = """---
name: researcher
model: demo
---
You research.
"""


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "researcher.md").write_text(AGENT_MD)
    path = tmp_path / "crew.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_a_crew_file_loads_with_agent_files_and_inline_members(tmp_path: Path) -> None:
    crew = Crew.from_file(write(tmp_path, GOOD))
    assert crew.name == "pipeline" and set(crew.members) == {"researcher", "writer"}
    assert isinstance(crew.plan, Sequential) and crew.budget.tokens == 10000
    res = crew.run_sync("hello")
    assert res.stop_reason == "completed"
    assert res.output.startswith("(demo model) You said: Write from: From pipeline/researcher:")


def test_an_inline_member_is_built_like_an_agent_file(tmp_path: Path) -> None:
    # inline members go through the same construction as AGENT.md files: every definition
    # field (here output_schema, an AGENT.md field) is understood, and workspace is resolved
    # from the crew file's folder
    (tmp_path / "ws").mkdir()
    text = """
    name: typed
    members:
      extractor:
        instructions: You extract.
        model: demo
        workspace: ws
        output_schema: {type: object, properties: {city: {type: string}}, required: [city]}
    plan: {sequential: [extractor]}
    """
    crew = Crew.from_file(write(tmp_path, text))
    member = crew.members["extractor"]
    assert member.output_spec is not None and member.workspace == (tmp_path / "ws").resolve()


def test_every_mode_parses(tmp_path: Path) -> None:
    text = """
    name: all
    members: {a: {model: demo}, b: {model: demo}}
    plan:
      sequential:
        - {parallel: [a, b], fail_fast: true}
        - router: {branches: {x: a, y: b}, by: a, default: x}
        - loop: {body: a, max_iterations: 2}
        - graph: {t1: {member: a}, t2: {member: b, depends_on: [t1], context: full}}
        - manager: {manager: a, workers: [b], max_delegations: 2}
        - handoff: {start: a, members: [a, b]}
    """
    crew = Crew.from_file(write(tmp_path, text))
    assert isinstance(crew.plan, Sequential)
    kinds = [type(s).__name__ for s in crew.plan.steps]
    assert kinds == ["Parallel", "Router", "Loop", "Graph", "Manager", "Handoff"]
    graph = crew.plan.steps[3]
    assert isinstance(graph, Graph) and tuple(graph.tasks["t2"].depends_on) == ("t1",)


BAD = [
    ("plan: {sequential: [a, ghost]}", "plan.sequential[1].member", "names no member: 'ghost'"),
    (
        "plan: {graph: {t1: {member: a, depends_on: [t2]}, t2: {member: a, depends_on: [t1]}}}",
        "plan.graph",
        "cycle",
    ),
    (
        "plan: {graph: {t1: {member: a, depends_on: [nope]}}}",
        "plan.graph.t1.depends_on",
        "names no task",
    ),
    (
        "plan: {router: {branches: {x: a}, by: a, default: y}}",
        "plan.router.default",
        "names no branch: 'y'",
    ),
    ("plan: {router: {branches: {}, by: a}}", "plan.router.branches", "branches"),
    (
        "plan: {manager: {manager: a, workers: [ghost]}}",
        "plan.manager.workers[0]",
        "names no member: 'ghost'",
    ),
    ("plan: {loop: {body: a}}", "plan.loop.max_iterations", "max_iterations"),
    ("plan: {loop: {body: a, max_iterations: 3, exit_tool: false}}", "plan.loop.until", "no exit"),
    ("plan: {loop: {body: a, max_iterations: 0}}", "plan.loop.max_iterations", ">= 1"),
    (
        "plan: {sequential: [{member: a, context: everything}]}",
        "plan.sequential[0].context",
        "unknown context policy",
    ),
    ("plan: a\nbudget: {tokenz: 3}", "budget.tokenz", "unknown budget"),
    ("plan: a\nbudget: {tokens: -3}", "budget.tokens", "positive"),
    ("plan: a\ncolor: red", "color", "unknown field"),
    ("plan: {handoff: {start: a, members: [a]}}", "plan.handoff.members", "two members"),
    ("plan: {teleport: [a]}", "plan", "exactly one of"),
    ("plan: {router: {branches: {x: a}, route: os:nope}}", "plan.router.route", "cannot import"),
]


@pytest.mark.parametrize(("plan", "field", "says"), BAD)
def test_bad_crew_files_name_the_field(tmp_path: Path, plan: str, field: str, says: str) -> None:
    path = write(tmp_path, "name: c\nmembers: {a: {model: demo}}\n" + plan + "\n")
    with pytest.raises(CrewDefinitionError) as info:
        Crew.from_file(path)
    assert info.value.field == field
    assert info.value.path == str(path)
    assert says in str(info.value)


def test_a_cycle_is_its_own_error_type(tmp_path: Path) -> None:
    path = write(tmp_path, "name: c\nmembers: {a: {model: demo}}\n" + BAD[1][0] + "\n")
    with pytest.raises(CrewCycleError, match=r"t1 -> t2 -> t1|t2 -> t1 -> t2"):
        Crew.from_file(path)


def test_a_bad_member_file_names_the_member(tmp_path: Path) -> None:
    path = write(tmp_path, "name: c\nmembers: {a: missing.md}\nplan: a\n")
    with pytest.raises(CrewDefinitionError) as info:
        Crew.from_file(path)
    assert info.value.field == "members.a" and "file not found" in str(info.value)


def test_bad_plans_in_code_are_refused_when_the_crew_is_built() -> None:
    from loom import Agent

    a = Agent(name="a", model="demo")
    with pytest.raises(CrewDefinitionError) as info:
        Crew("c", members={"a": a}, plan=Manager("a", workers=["a"]))
    assert info.value.field == "plan.manager.workers[0]"
    with pytest.raises(CrewDefinitionError) as info:
        Crew("c", members={"a": a}, plan=Router({"x": "a"}))
    assert info.value.field == "plan.router.route"
    with pytest.raises(CrewDefinitionError) as info:
        Crew("c", members={"a": a}, plan=Loop("a", exit_tool=False))
    assert info.value.field == "plan.loop.until"
    with pytest.raises(CrewDefinitionError) as info:
        Crew("c/d", members={"a": a}, plan="a")
    assert info.value.field == "name"
    with pytest.raises(CrewDefinitionError) as info:
        Crew("c", members={"a": "not an agent"}, plan="a")  # type: ignore[dict-item]
    assert info.value.field == "members.a"


def test_loom_run_crew_streams_the_members_and_exits_0(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "loom",
            "run",
            "--crew",
            str(path),
            "tide pools",
            "--store",
            ":memory:",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "▶ pipeline/researcher" in proc.stderr and "▶ pipeline/writer" in proc.stderr
    assert "(context: last_n:2)" in proc.stderr
    assert "(demo model) You said: Write from:" in proc.stdout
    assert "completed" in proc.stderr
    # the footer counts the crew's member runs (a crew has no loop iterations of its own)
    assert "2 member runs" in proc.stderr and "0 iterations" not in proc.stderr


def test_loom_run_crew_reports_a_bad_file_and_exits_2(tmp_path: Path) -> None:
    path = write(tmp_path, "name: c\nmembers: {a: {model: demo}}\nplan: ghost\n")
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.run(
        [sys.executable, "-m", "loom", "run", "--crew", str(path), "hi", "--store", ":memory:"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "plan.member" in proc.stderr and "ghost" in proc.stderr
    assert "Traceback" not in proc.stderr


EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "crews"


@pytest.mark.parametrize("name", ["pipeline.yaml", "router.yaml", "manager.yaml"])
def test_the_example_crews_load_and_run(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOM_MODEL", "demo")  # the rule-based stand-in: no LLM needed
    crew = Crew.from_file(EXAMPLES / name)
    res = crew.run_sync("What is 17 + 25?")
    assert res.stop_reason == "completed", res.error
    assert res.members and all(m.stop_reason == "completed" for m in res.members)


def test_a_crew_file_parses_into_a_definition_that_knows_no_agent(tmp_path: Path) -> None:
    from loom.crew.file import AgentMember, load_crew_definition

    definition = load_crew_definition(write(tmp_path, GOOD))
    assert definition.name == "pipeline" and set(definition.members) == {"researcher", "writer"}
    assert all(isinstance(m, AgentMember) for m in definition.members.values())
    crew = Crew.from_definition(definition, shared_state=True)  # overrides win over the file
    assert crew.shared_state and set(crew.members) == {"researcher", "writer"}
    assert crew.members["researcher"].name == "researcher"


def test_a_member_whose_definition_cannot_build_names_the_member(tmp_path: Path) -> None:
    # a definition that parses but cannot make an agent (an unknown model provider) is found
    # when the crew is built, and still names the file and the member
    bad = GOOD.replace("model: demo", "model: nosuch:model")
    with pytest.raises(CrewDefinitionError) as info:
        Crew.from_file(write(tmp_path, bad))
    assert info.value.field == "members.writer" and "nosuch" in str(info.value)
    assert info.value.path == str(tmp_path / "crew.yaml")


def test_deeply_nested_yaml_is_a_crew_definition_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.crew.yaml"
    path.write_text("name: deep\nmembers: " + "[" * 5000 + "]" * 5000 + "\nplan: sequential\n")
    with pytest.raises(CrewDefinitionError, match="nested too deep"):
        Crew.from_file(path)
    path.write_text("name: deep\nmembers:\n" + "".join("  " * i + "a:\n" for i in range(1, 300)))
    with pytest.raises(CrewDefinitionError, match="nested too deep"):
        Crew.from_file(path)
