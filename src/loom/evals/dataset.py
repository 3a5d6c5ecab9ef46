"""Datasets of eval cases: pydantic models and the YAML / JSONL loaders.

A dataset is a file of cases. Each case says what to send the agent (a message, or a stored
session and a checkpoint to continue from), what a good answer is (``expected``: exact text, a
JSON schema, a pydantic type by import path, or a rubric for a judge panel) and what its
trajectory must look like (``assertions``, checked on the run's journal events by
``loom.evals.assertions``). This module is the seam other eval features build on: a case is
plain data, built from a file or in Python.

A file that does not parse raises ``DatasetError`` naming the file, the line and the field.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from loom.errors import InputError
from loom.evals.assertions import member_name, parse_assertions

__all__ = [
    "Case",
    "Dataset",
    "DatasetError",
    "DoneWhen",
    "Environment",
    "Expected",
    "RecordedCall",
    "ScriptStep",
    "SessionInput",
    "SimulatedUser",
    "load_dataset",
    "parse_dataset",
]


class DatasetError(InputError):
    """A dataset file that cannot be read: ``path``, ``line`` (1-based, when known) and
    ``field`` (a dotted path such as ``cases.2.expected``, when known) say where."""

    def __init__(self, message: str, *, path: str = "", line: int | None = None, field: str = ""):
        where = path + (f":{line}" if line is not None else "")
        what = f" (field {field})" if field else ""
        super().__init__(f"{where}{what}: {message}" if where else f"{message}{what}")
        self.path, self.line, self.field = path, line, field


class _Data(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SessionInput(_Data):
    """Continue a stored session: fork ``session`` at ``checkpoint`` (a turn count, or
    ``"<run_id>.<sequence>"`` for an event; default its end) and send ``message`` there. The
    stored session is never changed: the case runs in a fork of it."""

    session: str
    checkpoint: int | str | None = None
    message: str


class Expected(_Data):
    """What a good final answer is: exactly one of ``text`` (equal after stripping), ``contains``
    (a substring), ``json_schema`` (the answer is JSON valid against it), ``type`` (an import
    path ``module:Name`` of a pydantic model the answer's JSON validates as) or ``rubric``.

    A ``rubric`` (one criterion, or a list) is scored by a judge panel (``loom.judge``): one
    ``LLMJudge`` per criterion on the judge model, combined by ``strategy`` (one of the panel's
    six: mean, median, min, max, weighted, vote) against ``threshold``."""

    text: str | None = None
    contains: str | None = None
    json_schema: dict[str, Any] | None = None
    type: str | None = None
    rubric: str | list[str] | None = None
    strategy: Literal["mean", "median", "min", "max", "weighted", "vote"] = "mean"
    threshold: float = Field(0.7, ge=0, le=1)

    def criteria(self) -> list[str]:
        """The rubric's criteria, one per judge."""
        if self.rubric is None:
            return []
        return [self.rubric] if isinstance(self.rubric, str) else list(self.rubric)

    @model_validator(mode="after")
    def _one_kind(self) -> Expected:
        given = [
            k for k in ("text", "contains", "json_schema", "type", "rubric") if getattr(self, k)
        ]
        if len(given) != 1:
            raise ValueError(
                "expected needs exactly one of text, contains, json_schema, type, rubric; "
                f"got {', '.join(given) or 'none'}"
            )
        return self


class ScriptStep(_Data):
    """One answer of a case's scripted test model (``loom.testing.ScriptedModel``): ``text``, or
    tool calls (``tool`` + ``arguments`` for one, ``tools`` for several)."""

    text: str = ""
    tool: str | None = None
    arguments: dict[str, Any] = Field(default_factory=dict)
    tools: list[dict[str, Any]] = Field(default_factory=list)

    def tool_names(self) -> list[str]:
        """The tools this step calls."""
        names = [self.tool] if self.tool else []
        return names + [str(t.get("name", "")) for t in self.tools]


class RecordedCall(_Data):
    """One tool call of a recorded run and its result (``loom eval capture``): during a case's
    run a call of ``name`` with these ``arguments`` is answered with ``content`` (or, when
    ``success`` is false, fails with ``error_code`` and ``content`` as its message)."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    content: str = ""
    success: bool = True
    error_code: str | None = None


class Environment(_Data):
    """A simulated environment: the agent's tool calls are answered from ``calls`` (matched by
    tool name and canonical arguments, in order; a repeated identical call takes the next
    recording), so the case runs offline and without side effects. A call with no recording
    fails the case (``unmatched: fail``) or runs the real tool (``unmatched: run_real``)."""

    calls: list[RecordedCall] = Field(default_factory=list)
    unmatched: Literal["fail", "run_real"] = "fail"


class DoneWhen(_Data):
    """A judge's test that a simulated user's goal is met: ``rubric`` scored on the agent's
    latest answer by the judge model, passing at ``threshold``."""

    rubric: str = Field(min_length=1)
    threshold: float = Field(0.7, ge=0, le=1)


class SimulatedUser(_Data):
    """The user of a multi-turn case (``loom.evals.simulation``): a ``script`` of messages, or a
    model (``model``) playing ``persona`` after ``goal``. The conversation ends when the goal is
    met (the simulated user answers ``DONE``, or ``done_when`` holds: a phrase in the agent's
    answer, or a judge's rubric), when a script runs out, or after ``max_turns`` agent turns
    (which fails the case)."""

    script: list[str] | None = None
    persona: str = ""
    goal: str = ""
    model: str | None = None
    max_turns: int = Field(5, ge=1, le=100)
    done_when: str | DoneWhen | None = None

    @model_validator(mode="after")
    def _script_or_goal(self) -> SimulatedUser:
        if self.script is not None:
            if not self.script or not all(m.strip() for m in self.script):
                raise ValueError("user.script needs at least one message, none of them empty")
            if self.goal or self.persona or self.model:
                raise ValueError("a user has a script, or a persona/goal/model; not both")
        elif not self.goal.strip():
            raise ValueError("a simulated user needs a goal (or a script of messages)")
        return self


class Case(_Data):
    """One eval case. ``input`` is a message or a ``SessionInput``; ``assertions`` are raw
    mappings checked by ``loom.evals.assertions`` (``parse_assertions`` validates them when the
    dataset loads); ``script`` makes the case run on a ``ScriptedModel`` (tests, examples);
    ``tools`` names built-in tools this run adds (``RunOptions.extra_tools``); ``environment``
    answers tool calls from a recording (``Environment``); ``user`` makes the case a
    conversation driven by a simulated user (``SimulatedUser``; ``input``, when given, is its
    first message)."""

    id: str = Field(min_length=1)
    input: str | SessionInput
    expected: Expected | None = None
    assertions: list[dict[str, Any]] = Field(default_factory=list)
    script: list[str | ScriptStep] | None = None
    tools: list[str] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    environment: Environment | None = None
    user: SimulatedUser | None = None

    @model_validator(mode="before")
    @classmethod
    def _user_opens(cls, data: Any) -> Any:
        # a simulated user may write the first message itself; any other case needs an input
        if isinstance(data, dict) and "input" not in data and data.get("user") is not None:
            return {**data, "input": ""}
        return data

    @field_validator("assertions")
    @classmethod
    def _known_assertions(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        parse_assertions(value)  # raises ValueError naming the bad one
        return value

    @property
    def message(self) -> str:
        """The text this case sends."""
        return self.input if isinstance(self.input, str) else self.input.message

    def tool_names(self) -> set[str]:
        """Every tool this case names (assertions and script): each must be the agent's."""
        names: set[str] = set()
        for check in parse_assertions(self.assertions):
            names.update(check.tool_names())
        for step in self.script or []:
            if isinstance(step, ScriptStep):
                names.update(step.tool_names())
        if self.environment is not None:
            names.update(call.name for call in self.environment.calls)
        return names


class Dataset(_Data):
    """A named list of cases. ``model``: the model every case runs on unless the command line
    says otherwise (a model string, or ``test`` for ``loom.testing.TestModel``); ``judge_model``:
    the model of rubric judges."""

    name: str = "dataset"
    description: str = ""
    model: str | None = None
    judge_model: str | None = None
    cases: list[Case]

    @model_validator(mode="after")
    def _unique_ids(self) -> Dataset:
        seen: set[str] = set()
        for case in self.cases:
            if case.id in seen:
                raise ValueError(f"two cases have the id {case.id!r}; case ids must be unique")
            seen.add(case.id)
        return self

    def fingerprint(self) -> str:
        """A hash of the dataset's content: an experiment resumes only on the same cases."""
        import hashlib

        data = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(data.encode()).hexdigest()[:16]


_ASSERTION_INDEX = re.compile(r"Value error, assertion (\d+)")


def _dotted(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc)


def _validate(
    raw: Any, path: str, line_of: Any, *, name: str
) -> Dataset:  # line_of: loc -> line or None
    if isinstance(raw, list):
        raw = {"name": name, "cases": raw}
    if not isinstance(raw, dict):
        raise DatasetError(
            f"a dataset is a mapping with 'cases' (or a list of cases), not a {type(raw).__name__}",
            path=path,
            line=line_of(()),
        )
    raw.setdefault("name", name)
    try:
        return Dataset.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = tuple(first["loc"])
        # a union's member name (str, SessionInput, ...) is not a field of the file
        loc = tuple(p for p in loc if not member_name(p))
        pointed = _ASSERTION_INDEX.match(str(first["msg"]))
        if loc[-1:] == ("assertions",) and pointed:  # down to the assertion's own line
            loc += (int(pointed[1]),)
        message = str(first["msg"]).removeprefix("Value error, ")
        raise DatasetError(
            f"{message} ({len(exc.errors())} problem(s); fix this one first)",
            path=path,
            line=line_of(loc),
            field=_dotted(loc),
        ) from None


def _yaml_lines(node: Any) -> Any:
    """A function from a field path to the line (1-based) of that field in a composed YAML
    tree: the deepest node the path reaches."""

    def line_of(loc: tuple[int | str, ...]) -> int | None:
        import yaml

        current = node
        if current is None:
            return None
        line = int(current.start_mark.line) + 1
        for part in loc:
            child = None
            if isinstance(current, yaml.MappingNode):
                for key, value in current.value:
                    if key.value == part:
                        child = value
                        line = int(key.start_mark.line) + 1
                        break
            elif (
                isinstance(current, yaml.SequenceNode)
                and isinstance(part, int)
                and 0 <= part < len(current.value)
            ):
                child = current.value[part]
                line = int(child.start_mark.line) + 1
            if child is None:
                break
            current = child
        return line

    return line_of


def parse_dataset(text: str, path: str = "<dataset>", *, jsonl: bool = False) -> Dataset:
    """A dataset from the text of a YAML or JSONL file (``path`` names it in errors)."""
    name = Path(path).stem
    if jsonl:
        cases: list[Any] = []
        lines: list[int] = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                cases.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DatasetError(f"not JSON: {exc.msg}", path=path, line=number) from None
            lines.append(number)

        def line_of(loc: tuple[int | str, ...]) -> int | None:
            if len(loc) >= 2 and loc[0] == "cases" and isinstance(loc[1], int):
                return lines[loc[1]] if loc[1] < len(lines) else None
            return None

        return _validate(cases, path, line_of, name=name)
    import yaml

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        raw = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        raise DatasetError(
            f"not YAML: {exc.problem}",
            path=path,
            line=None if mark is None else mark.line + 1,
        ) from None
    if raw is None:
        raise DatasetError("the file is empty; write a list of cases", path=path, line=1)
    return _validate(raw, path, _yaml_lines(node), name=name)


def load_dataset(path: str | Path) -> Dataset:
    """The dataset in ``path`` (``.jsonl``: one case per line; otherwise YAML)."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise DatasetError(f"cannot read it: {exc.strerror or exc}", path=str(path)) from None
    return parse_dataset(text, str(path), jsonl=file.suffix.lower() == ".jsonl")
