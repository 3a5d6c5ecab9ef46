"""Helpers for writing pattern files."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "patterns"


def pattern_yaml(name: str, **over: object) -> str:
    data: dict[str, object] = {
        "name": name,
        "title": f"Title of {name}",
        "description": f"Handles {name.replace('-', ' ')} requests.",
        "keywords": [name.replace("-", " ")],
        "instructions": f"Do the {name} thing.",
    }
    data.update(over)
    return yaml.safe_dump(data, sort_keys=False)


@pytest.fixture
def write_pattern(tmp_path: Path):
    def write(name: str, file: str | None = None, **over: object) -> Path:
        path = tmp_path / (file or f"{name}.yaml")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(pattern_yaml(name, **over), encoding="utf-8")
        return path

    return write
