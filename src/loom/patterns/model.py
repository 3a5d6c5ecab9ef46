"""A pattern and how pattern files are read and validated.

A pattern is one YAML file:

```yaml
name: sql-slow-query            # unique in the library; lowercase, digits, - _ .
title: Diagnose a slow SQL query
description: The user reports a query that got slow or times out.
keywords: [slow query, explain plan, index, timeout, latency]
instructions: |
  Ask for the query and its EXPLAIN output before proposing indexes. ...
examples:                       # optional: messages this pattern is meant for
  - "this select takes 30 seconds since yesterday"
tools: [run_sql]                # optional: tools the instructions rely on
```
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from loom.errors import DuplicatePatternName, PatternError, PatternFileError

__all__ = [
    "PATTERN_SUFFIXES",
    "FileCache",
    "LoadResult",
    "Pattern",
    "PatternProblem",
    "digests_of",
    "load_dir",
    "load_file",
    "pattern_files",
]

PATTERN_SUFFIXES = (".yaml", ".yml")
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when available: ~10x
FileCache = dict[str, tuple[bytes, "Pattern | PatternProblem"]]
"""Path -> (digest of the bytes, what they loaded as): reloads re-parse changed files only."""
_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]*")


class Pattern(BaseModel):
    """One domain pattern: when it applies (title, description, keywords, examples) and what the
    agent should do then (instructions, tools). Immutable, so a turn can keep the one it matched."""

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)

    name: str = Field(min_length=1, max_length=100)
    title: str = Field(min_length=1)
    description: str = Field(min_length=1)
    keywords: tuple[str, ...] = Field(min_length=1)
    instructions: str = Field(min_length=1)
    examples: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    _source: str | None = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def _slug(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a pattern name: use lowercase letters, digits and - _ . "
                "(starting with a letter or digit), e.g. 'sql-slow-query'"
            )
        return value

    @field_validator("keywords", "examples", "tools", mode="before")
    @classmethod
    def _numbers_are_words(cls, value: Any) -> Any:
        # YAML reads `429` or `3.11` as numbers; in these lists they are meant as words.
        if isinstance(value, list | tuple):
            return [
                str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v
                for v in value
            ]
        return value

    @property
    def source(self) -> str | None:
        """The file the pattern was loaded from, if any."""
        return self._source

    def index_text(self) -> str:
        """The text matched against messages: what the pattern is about, not what to do.

        Keywords appear twice so a message naming them outweighs incidental description words.
        """
        keywords = " ".join(self.keywords)
        return "\n".join(
            [
                self.name.replace("-", " ").replace("_", " "),
                self.title,
                self.description,
                keywords,
                keywords,
                *self.examples,
            ]
        )

    def to_prompt(self) -> str:
        """The text that goes into ROM when the pattern matches."""
        lines = [
            f"## Pattern: {self.title} ({self.name})",
            self.description,
            "",
            "Instructions:",
            self.instructions,
        ]
        if self.tools:
            lines += ["", "Tools for this pattern: " + ", ".join(self.tools)]
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class PatternProblem:
    """Why one file was skipped: its path, the field at fault (if one), and what to fix."""

    path: str
    message: str
    field: str | None = None
    kind: str = "invalid"  # "invalid" | "duplicate" | "empty" | "io"
    error: PatternError | None = dc_field(default=None, repr=False, compare=False)

    def __str__(self) -> str:
        what = f"field {self.field!r}: " if self.field else ""
        return f"{self.path}: {what}{self.message}"

    def to_error(self) -> PatternError:
        """The typed exception for this problem (raised in strict mode)."""
        return self.error or PatternFileError(self.message, path=self.path, field=self.field)


@dataclass(frozen=True, slots=True)
class LoadResult:
    """Valid patterns (in path order) and the problems of the files that were skipped."""

    patterns: tuple[Pattern, ...]
    problems: tuple[PatternProblem, ...]
    digests: tuple[tuple[str, bytes], ...] = ()  # (path, content digest) of every file read


def _field_of(loc: Iterable[Any]) -> str:
    return ".".join(str(part) for part in loc) or "(file)"


def load_file(path: Path, raw: bytes | None = None) -> Pattern | PatternProblem:
    """Parse and validate one pattern file (``raw``: its bytes, if already read); never raises
    for a bad file."""
    where = str(path)
    try:
        text = (path.read_bytes() if raw is None else raw).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return PatternProblem(where, f"cannot read the file: {exc}", kind="io")
    try:
        data = yaml.load(text, Loader=_Loader)  # a safe loader: plain data only
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        return PatternProblem(where, f"malformed YAML{at}: {problem}")
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        return PatternProblem(
            where,
            f"expected a mapping with name, title, description, keywords and "
            f"instructions; got {got}",
        )
    try:
        pattern = Pattern.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        more = f" (and {len(exc.errors()) - 1} more problems)" if len(exc.errors()) > 1 else ""
        return PatternProblem(where, f"{err['msg']}{more}", field=_field_of(err["loc"]))
    pattern._source = where
    return pattern


def pattern_files(path: Path) -> list[Path]:
    """The pattern files under ``path`` in path order; hidden files and directories skipped."""
    return sorted(
        p
        for p in path.rglob("*")
        if p.suffix in PATTERN_SUFFIXES
        and not any(part.startswith(".") for part in p.relative_to(path).parts)
        and p.is_file()
    )


def _digest(raw: bytes) -> bytes:
    return hashlib.blake2b(raw, digest_size=16).digest()


def load_dir(path: Path, cache: FileCache | None = None) -> LoadResult:
    """Load every ``*.yaml`` / ``*.yml`` file under ``path`` (recursively, in path order).

    Invalid files and later files reusing a name are reported and skipped; the rest load.
    With a ``cache`` (kept between calls), files whose bytes did not change are not parsed
    again; the cache is updated to the files read this time.
    """
    patterns: dict[str, Pattern] = {}
    problems: list[PatternProblem] = []
    digests: list[tuple[str, bytes]] = []
    fresh: FileCache = {}
    for file in pattern_files(path):
        where = str(file)
        try:
            raw = file.read_bytes()
        except OSError as exc:  # deleted or unreadable between listing and reading
            problems.append(PatternProblem(where, f"cannot read the file: {exc}", kind="io"))
            continue
        digest = _digest(raw)
        digests.append((where, digest))
        hit = cache.get(where) if cache is not None else None
        loaded = hit[1] if hit is not None and hit[0] == digest else load_file(file, raw)
        fresh[where] = (digest, loaded)
        if isinstance(loaded, PatternProblem):
            problems.append(loaded)
        elif loaded.name in patterns:
            first = patterns[loaded.name].source or "?"
            err = DuplicatePatternName(loaded.name, path=str(file), first_path=first)
            problems.append(
                PatternProblem(
                    str(file),
                    f"pattern name {loaded.name!r} is already used by {first}; rename one "
                    "of them (names must be unique in a library)",
                    "name",
                    "duplicate",
                    err,
                )
            )
        else:
            patterns[loaded.name] = loaded
    if cache is not None:
        cache.clear()
        cache.update(fresh)
    return LoadResult(tuple(patterns.values()), tuple(problems), tuple(digests))


def digests_of(path: Path) -> tuple[tuple[str, bytes], ...]:
    """(path, content digest) of the pattern files under ``path``, as ``load_dir`` sees them."""
    out = []
    for file in pattern_files(path):
        try:
            out.append((str(file), _digest(file.read_bytes())))
        except OSError:
            continue
    return tuple(out)
