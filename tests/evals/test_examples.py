"""Every example agent has a small eval dataset beside it (``<agent>.evals.yaml``), and
``loom eval run`` passes each one on test models (scripts or the demo model), as CI runs them.
An example changed to call a different tool fails its trajectory assertion."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = str(ROOT / "src")
EXAMPLES = ROOT / "examples"
AGENT_FILES = sorted(EXAMPLES.glob("agents/*.md")) + sorted(EXAMPLES.glob("backends/*_agent.md"))


def dataset_of(agent: Path) -> Path:
    return agent.with_name(agent.stem + ".evals.yaml")


def loom(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=SRC, NO_COLOR="1", COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "loom", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=180,
    )


def test_every_example_agent_has_a_dataset() -> None:
    assert len(AGENT_FILES) >= 4
    missing = [str(a.relative_to(ROOT)) for a in AGENT_FILES if not dataset_of(a).is_file()]
    assert missing == []


@pytest.fixture
def placed(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """The example agent's folder as the dataset sees it; the shop agent gets its database."""
    agent: Path = request.param
    if agent.name != "shop_agent.md":
        return agent
    sys.path.insert(0, str(EXAMPLES / "backends"))
    from make_shop_db import make

    make(tmp_path / "shop.db")
    for file in (agent, dataset_of(agent)):
        shutil.copy(file, tmp_path / file.name)
    return tmp_path / agent.name


@pytest.mark.parametrize("placed", AGENT_FILES, ids=lambda p: p.stem, indirect=True)
def test_the_example_dataset_passes(placed: Path, tmp_path: Path) -> None:
    report = tmp_path / "report.xml"
    result = loom(
        placed.parent,
        "eval",
        "run",
        dataset_of(placed).name,
        "--agent",
        placed.name,
        "--store",
        str(tmp_path / "evals.db"),
        "--fail-under",
        "1",
        "--report",
        "junit",
        str(report),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    suite = ElementTree.parse(report).getroot().find("testsuite")
    assert suite is not None and int(suite.get("tests") or 0) >= 1
    assert suite.get("failures") == "0" and suite.get("errors") == "0"


def test_an_example_changed_to_call_another_tool_fails_its_trajectory_assertion(
    tmp_path: Path,
) -> None:
    agent = EXAMPLES / "agents" / "calculator.md"
    shutil.copy(agent, tmp_path / agent.name)
    text = dataset_of(agent).read_text()
    changed = text.replace(
        "{tool: multiply, arguments: {a: 6, b: 7}}", "{tool: add, arguments: {a: 6, b: 7}}"
    )
    assert changed != text
    (tmp_path / dataset_of(agent).name).write_text(changed)
    result = loom(
        tmp_path,
        "eval",
        "run",
        dataset_of(agent).name,
        "--agent",
        agent.name,
        "--store",
        "evals.db",
        "--fail-under",
        "1",
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "multiplies-with-the-tool │ failed" in result.stdout
    assert "expected calls in order multiply" in result.stdout


FOLLOWER = '''\
import re
from pathlib import Path

from loom import Agent, ModelResponse, ToolCall
from loom.testing import FunctionModel


def follow(messages, tools):
    """A stand-in for a model that does what its instructions say: it calls the first tool
    the system prompt tells it to call, once, then answers with the result."""
    if messages[-1].role == "tool":
        return messages[-1].content
    system = " ".join(m.content for m in messages if m.role == "system")
    name = re.search(r"Call (\\w+)", system)[1]
    return ModelResponse(tool_calls=[ToolCall(name=name, arguments={"a": 2, "b": 3})])


agent = Agent.from_file(Path(__file__).with_name("calculator.md"), model=FunctionModel(follow))
'''

SUM_CASE = """\
cases:
  - id: sums-with-add
    input: what is 2 + 3?
    assertions: [{called: add}, {not_called: multiply}]
"""


def test_changing_the_example_agents_instructions_fails_its_trajectory_assertion(
    tmp_path: Path,
) -> None:
    calculator = EXAMPLES / "agents" / "calculator.md"
    (tmp_path / "calculator.md").write_text(calculator.read_text())
    (tmp_path / "follower.py").write_text(FOLLOWER)
    (tmp_path / "sum.yaml").write_text(SUM_CASE)
    run = ["eval", "run", "sum.yaml", "--agent", "follower.py", "--store", "e.db"]
    before = loom(tmp_path, *run, "--fail-under", "1")
    assert before.returncode == 0, before.stdout + before.stderr
    text = calculator.read_text()
    changed = text.replace("Call add for a sum and multiply for a product", "Call multiply")
    assert changed != text
    (tmp_path / "calculator.md").write_text(changed)
    after = loom(tmp_path, *run, "--fail-under", "1")
    assert after.returncode == 1, after.stdout + after.stderr
    assert "expected a call of add; the run called multiply" in after.stdout
