"""``loom eval`` as CI runs it: real subprocesses. ``--fail-under`` exits non-zero, the JUnit and
JSON reports parse, a bad dataset or a tool the agent lacks exits 2 before anything runs,
``list`` / ``show`` / ``compare`` read the stored experiments back, and an experiment killed
with SIGKILL mid-run resumes without running its finished cases again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from xml.etree import ElementTree

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")  # this checkout, not an installed loom

CALC_AGENT = """\
---
name: calc
model: demo
tools: [add, multiply]
---
You add.
"""

CALC_CASES = """\
name: calc
cases:
  - id: adds
    input: what is 2 + 3?
    assertions: [{called: add}]
  - id: multiplies
    input: what is 2 * 3?
    assertions: [{called: multiply}]
"""


def loom(
    tmp: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loom", *args],
        capture_output=True,
        text=True,
        cwd=tmp,
        env=dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([SRC, str(tmp)]),
            NO_COLOR="1",
            COLUMNS="200",
            **(env or {}),
        ),
        timeout=120,
    )


@pytest.fixture
def calc(tmp_path: Path) -> Path:
    (tmp_path / "calc.md").write_text(CALC_AGENT)
    (tmp_path / "calc.yaml").write_text(CALC_CASES)
    return tmp_path


def test_fail_under_exits_non_zero_and_the_reports_parse(calc: Path) -> None:
    run = ["eval", "run", "calc.yaml", "--agent", "calc.md", "--store", "e.db"]
    below = loom(calc, *run, "--fail-under", "0.9", "--report", "junit", "r.xml")
    assert below.returncode == 1, below.stderr
    assert "score 0.50 is under --fail-under 0.90" in below.stderr
    assert "expected a call of multiply; the run called no tool" in below.stdout  # the table
    suite = ElementTree.parse(calc / "r.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "2" and suite.get("failures") == "1"
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases["adds"].find("failure") is None
    failure = cases["multiplies"].find("failure")
    assert failure is not None and "multiply" in (failure.get("message") or "")
    above = loom(calc, *run, "--new", "--fail-under", "0.5", "--report", "json", "r.json")
    assert above.returncode == 0, above.stderr
    report = json.loads((calc / "r.json").read_text())
    assert report["experiment"]["score"] == 0.5
    assert [c["status"] for c in report["cases"]] == ["passed", "failed"]
    listed = json.loads(loom(calc, "eval", "list", "--store", "e.db", "--json").stdout)
    assert len(listed) == 2 and {r["status"] for r in listed} == {"finished"}
    shown = loom(calc, "eval", "show", listed[0]["id"], "--store", "e.db", "--json")
    assert json.loads(shown.stdout)["experiment"]["id"] == listed[0]["id"]
    compared = loom(calc, "eval", "compare", listed[1]["id"], listed[0]["id"], "--store", "e.db")
    assert compared.returncode == 0 and "same" in compared.stdout
    missing = loom(calc, "eval", "show", "exp_nope", "--store", "e.db")
    assert missing.returncode == 2 and "no experiment 'exp_nope'" in missing.stderr


def test_compare_shows_what_got_better_and_worse(calc: Path) -> None:
    run = ["eval", "run", "calc.yaml", "--agent", "calc.md", "--store", "e.db"]
    assert loom(calc, *run, "--model", "demo").returncode == 0  # demo calls add only
    assert loom(calc, *run, "--model", "test:multiply").returncode == 0  # multiply only
    listed = json.loads(loom(calc, "eval", "list", "--store", "e.db", "--json").stdout)
    newest, oldest = listed[0]["id"], listed[1]["id"]
    compared = loom(calc, "eval", "compare", oldest, newest, "--store", "e.db", "--json")
    assert compared.returncode == 0
    rows = {r["case_id"]: r for r in json.loads(compared.stdout)["cases"]}
    assert rows["adds"]["change"] == "worse" and rows["adds"]["delta"] == -1.0
    assert rows["multiplies"]["change"] == "better" and rows["multiplies"]["delta"] == 1.0
    gate = loom(calc, "eval", "compare", oldest, newest, "--store", "e.db", "--fail-on-worse")
    assert gate.returncode == 1 and "worse" in gate.stdout and "better" in gate.stdout


def test_a_dataset_that_does_not_parse_exits_2_naming_file_and_line(calc: Path) -> None:
    (calc / "calc.yaml").write_text(CALC_CASES.replace("{called: add}", "{called: 3}"))
    result = loom(calc, "eval", "run", "calc.yaml", "--agent", "calc.md", "--store", "e.db")
    assert result.returncode == 2
    assert "DatasetError: calc.yaml:5 (field cases.0.assertions.0)" in result.stderr


def test_a_case_naming_a_tool_the_agent_lacks_exits_2_before_anything_runs(calc: Path) -> None:
    (calc / "calc.yaml").write_text(CALC_CASES.replace("{called: multiply}", "{called: divide}"))
    result = loom(calc, "eval", "run", "calc.yaml", "--agent", "calc.md", "--store", "e.db")
    assert result.returncode == 2
    assert "UnknownCaseTool: case 'multiplies'" in result.stderr and "'divide'" in result.stderr
    listed = loom(calc, "eval", "list", "--store", "e.db", "--json")
    assert json.loads(listed.stdout) == []


STALLING_AGENT = """\
import asyncio
import os
from pathlib import Path

from loom import Agent
from loom.testing import FunctionModel

HERE = Path(os.environ["EVAL_TEST_DIR"])


async def answer(messages, tools):
    text = messages[-1].content
    with open(HERE / "calls.log", "a") as log:
        log.write(text + "\\n")
    if text == "q2" and (HERE / "stall").exists():
        with open(HERE / "ready.fifo", "w") as ready:  # tell the test: q0 and q1 are stored
            ready.write("stalled\\n")
        await asyncio.Event().wait()  # until SIGKILL
    return "answer to " + text


agent = Agent("staller", "Answer.", model=FunctionModel(answer))
"""


def test_a_sigkilled_experiment_resumes_without_rerunning_finished_cases(tmp_path: Path) -> None:
    (tmp_path / "staller.py").write_text(STALLING_AGENT)
    cases = "".join(
        f"  - {{id: c{i}, input: q{i}, expected: {{contains: q{i}}}}}\n" for i in range(5)
    )
    (tmp_path / "cases.yaml").write_text("name: stall\ncases:\n" + cases)
    (tmp_path / "stall").write_text("")
    os.mkfifo(tmp_path / "ready.fifo")
    path = os.pathsep.join([SRC, str(tmp_path)])
    env = dict(os.environ, PYTHONPATH=path, EVAL_TEST_DIR=str(tmp_path), NO_COLOR="1")
    command = [sys.executable, "-m", "loom", "eval", "run", "cases.yaml"]
    command += ["--agent", "staller.py", "--store", "e.db", "--concurrency", "1"]
    proc = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    said: list[str] = []
    reader = threading.Thread(
        target=lambda: said.append((tmp_path / "ready.fifo").read_text()), daemon=True
    )
    reader.start()
    reader.join(timeout=60)  # the handshake: the model of case c2 opened the fifo
    assert said == ["stalled\n"], proc.communicate(timeout=5)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert (tmp_path / "calls.log").read_text().split() == ["q0", "q1", "q2"]

    (tmp_path / "stall").unlink()
    (tmp_path / "calls.log").write_text("")
    again = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0, again.stderr
    # only the cases without a stored result ran: c2 (killed mid-run), c3, c4
    assert (tmp_path / "calls.log").read_text().split() == ["q2", "q3", "q4"]
    assert "3 case(s) run now, 2 kept from before; status finished" in again.stderr
    listed = json.loads(loom(tmp_path, "eval", "list", "--store", "e.db", "--json").stdout)
    assert len(listed) == 1 and listed[0]["passed"] == 5 and listed[0]["status"] == "finished"


def test_a_judge_whose_model_is_down_marks_its_case_errored(calc: Path) -> None:
    """The judge's server refuses connections (nothing listens on the port): the judged case
    is errored, an error in JUnit, not a failure, and the others are scored as usual."""
    import socket

    with socket.socket() as s:  # a port nothing listens on once this socket is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (calc / "rubric.yaml").write_text(
        """
cases:
  - {id: judged, input: hi, script: [hello there], expected: {rubric: is friendly}}
  - {id: plain, input: hi, script: [hello], expected: {text: hello}}
"""
    )
    judge = f"openai-compatible:http://127.0.0.1:{port}/v1#judge"
    run = ["eval", "run", "rubric.yaml", "--agent", "calc.md", "--store", "e.db"]
    result = loom(calc, *run, "--judge-model", judge, "--report", "junit", "r.xml")
    assert result.returncode == 0, result.stderr
    suite = ElementTree.parse(calc / "r.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("errors") == "1" and suite.get("failures") == "0"
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    error = cases["judged"].find("error")
    assert error is not None
    assert "the judge could not score the answer" in (error.get("message") or "")
    assert cases["plain"].find("error") is None and cases["plain"].find("failure") is None
