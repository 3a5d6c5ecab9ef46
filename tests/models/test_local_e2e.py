"""The README's first command, end to end: `loom run` on the embedded model, in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SRC = Path(__file__).parent.parent.parent / "src"


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
