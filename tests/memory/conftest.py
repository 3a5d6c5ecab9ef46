"""Shared helpers for the memory tests: a real-text corpus and conversation builders."""

from __future__ import annotations

import glob
import json
import sysconfig
from pathlib import Path

import pytest


def _ast_records(path: Path) -> str:
    """A JSON document describing a stdlib module's functions (deterministic per Python)."""
    import ast

    tree = ast.parse(path.read_text(errors="ignore"))
    records = [
        {
            "name": node.name,
            "line": node.lineno,
            "args": [a.arg for a in node.args.args],
            "doc": (ast.get_docstring(node) or "").split("\n")[0],
            "async": isinstance(node, ast.AsyncFunctionDef),
        }
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    return json.dumps({"module": path.stem, "functions": records[:60]})


def _corpus() -> dict[str, list[str]]:
    # Only texts that do not depend on which packages (or which install of Loom) are present:
    # a package's METADATA or JSON file list changes with the environment, and the estimator's
    # accuracy assertions must not change with it.
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    site = Path(sysconfig.get_paths()["purelib"])
    code = [p.read_text(errors="ignore") for p in sorted(stdlib.glob("*.py"))[:40]]
    stable = (
        "pydantic",
        "rich",
        "typer",
        "click",
        "PyYAML",
        "tenacity",
        "docstring_parser",
        "openai",
        "anthropic",
        "httpx",
        "mcp",
        "jsonschema",
        "pytest",
        "hypothesis",
    )
    prose = [
        Path(p).read_text(errors="ignore")
        for name in stable
        for p in sorted(glob.glob(str(site / f"{name}-*.dist-info" / "METADATA")))[:1]
    ]
    data = [
        json.dumps(json.loads(p.read_text()))
        for p in sorted((site / "jsonschema_specifications" / "schemas").glob("*/metaschema.json"))
    ]
    for p in sorted(stdlib.glob("*.py"))[40:80]:
        if len(data) >= 30:
            break
        data.append(_ast_records(p))
    return {"code": code, "prose": [t for t in prose if len(t) > 500], "json": data}


@pytest.fixture(scope="session")
def corpus() -> dict[str, list[str]]:
    """Real texts: stdlib source, the READMEs of Loom's own dependencies, JSON schemas and
    JSON records made from stdlib modules (the same whatever else is installed)."""
    return _corpus()
