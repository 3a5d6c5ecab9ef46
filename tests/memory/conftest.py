"""Shared helpers for the memory tests: a real-text corpus and conversation builders."""

from __future__ import annotations

import glob
import json
import sysconfig
from pathlib import Path

import pytest


def _corpus() -> dict[str, list[str]]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    site = Path(sysconfig.get_paths()["purelib"])
    code = [p.read_text(errors="ignore") for p in sorted(stdlib.glob("*.py"))[:40]]
    prose = [
        Path(p).read_text(errors="ignore")
        for p in sorted(glob.glob(str(site / "*.dist-info" / "METADATA")))[:40]
    ]
    data = []
    for p in sorted(site.glob("**/*.json"))[:200]:
        if p.stat().st_size < 100_000:
            try:
                data.append(json.dumps(json.loads(p.read_text())))
            except ValueError:
                continue
        if len(data) >= 30:
            break
    return {"code": code, "prose": [t for t in prose if len(t) > 500], "json": data}


@pytest.fixture(scope="session")
def corpus() -> dict[str, list[str]]:
    """Real texts from this machine: stdlib source, package READMEs, JSON files."""
    return _corpus()
