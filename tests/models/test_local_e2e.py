"""The README's commands on the embedded model, end to end: `loom run` in a subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parent.parent.parent
SRC = ROOT / "src"


def test_loom_run_answers_with_the_embedded_model_and_calls_a_tool(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    env.pop("LOOM_MODEL", None)  # the default must be the embedded model
    proc = subprocess.run(
        [sys.executable, "-m", "loom", "run", "What is 17 + 25?", "--store", ":memory:"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "→ add" in proc.stderr and '"a": 17' in proc.stderr and '"b": 25' in proc.stderr
    assert "✓ add: 42" in proc.stderr
    assert "42" in proc.stdout
    assert "completed" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_readme_showcase_agent_gets_its_example_right(tmp_path: Path) -> None:
    """The example the README quotes for examples/agents/calculator.md, run as quoted."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quoted = re.search(
        r'loom run --agent (examples/agents/calculator\.md)\s+"([^"]+)"`', readme, re.S
    )
    assert quoted is not None, "the README no longer quotes the calculator example"
    agent_file, question = ROOT / quoted[1], quoted[2]
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    env.pop("LOOM_MODEL", None)
    proc = subprocess.run(
        [sys.executable, "-m", "loom", "run", "--agent", str(agent_file), question],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "→ multiply" in proc.stderr and "✓ multiply: 42" in proc.stderr
    assert "42" in proc.stdout and "13" not in proc.stdout
    assert "Traceback" not in proc.stderr
