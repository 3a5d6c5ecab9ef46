"""Typed answers: an agent's ``output_type`` compiled once, and each final answer judged by it.

```python
class Weather(BaseModel):
    city: str
    celsius: float

agent = Agent(model=..., output_type=Weather)
result = await agent.run("weather in Oslo?")
result.output        # Weather(city='Oslo', celsius=4.5); result.text is the JSON it came from
```

``output_type`` may be a pydantic model, a dataclass, a ``TypedDict``, a union of them, a list
(any type pydantic's ``TypeAdapter`` can build a JSON schema for), or a JSON schema given as a
dict (validated with ``jsonschema``; the value is then plain JSON data). ``str`` means a plain
text answer, as without an ``output_type``.

What this module gives the loop (it never touches the turn): :func:`compile_output` turns the
type into an :class:`OutputSpec` (its JSON schema, the object form providers get as
``ModelSettings.output``), :func:`check_answer` turns a final answer into a decision
(:class:`Accept` the typed value, :class:`Retry` with a correction that lists the validation
errors, or :class:`GiveUp` after ``output_retries`` corrections), and
:meth:`OutputSpec.partial_reader` follows the streamed text and returns each partial value as
soon as it validates (``OUTPUT_PARTIAL`` events).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loom.errors import ConfigurationError, MissingDependencyError
from loom.models.base import OutputSchema

__all__ = [
    "WRAP_KEY",
    "Accept",
    "Decision",
    "GiveUp",
    "OutputSpec",
    "PartialReader",
    "Retry",
    "check_answer",
    "compile_output",
]

WRAP_KEY = "response"
"""The key a non-object answer is wrapped in (``{"response": [...]}``) for the providers."""

_FENCE = re.compile(r"^\s*```[a-zA-Z0-9_-]*\s*\n(.*?)\n?\s*```\s*$", re.S)
_NAME = re.compile(r"[^a-zA-Z0-9_-]+")


class _Invalid(Exception):
    """An answer that does not fit: ``errors`` as ``[{"loc": "a.b", "msg": "..."}]``."""

    def __init__(self, errors: list[dict[str, str]]) -> None:
        super().__init__("; ".join(f"{e['loc']}: {e['msg']}" for e in errors))
        self.errors = errors


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """A compiled ``output_type``: its schema, the object form for providers, its validator.

    ``wire.schema`` equals ``schema`` when the type is an object (a model, a dataclass, a
    ``TypedDict``); otherwise it is ``{"response": schema}`` and answers are unwrapped.
    """

    type: Any
    name: str
    schema: dict[str, Any]
    wire: OutputSchema
    wrapped: bool
    _parse: Callable[[Any], Any] = field(repr=False)  # JSON data (unwrapped) -> typed value
    _dump: Callable[[Any], Any] = field(repr=False)  # typed value -> JSON data

    def parse(self, text: str) -> Any:
        """The typed value of an answer's text; ``_Invalid`` lists what is wrong with it."""
        from pydantic_core import from_json

        match = _FENCE.match(text)  # a model without a native mechanism may fence its JSON
        raw = match.group(1) if match else text
        try:
            data = from_json(raw)
        except ValueError as exc:
            shown = raw if len(raw) <= 200 else raw[:200] + "..."
            raise _Invalid(
                [{"loc": "(answer)", "msg": f"not valid JSON ({exc}); the answer was {shown!r}"}]
            ) from None
        return self._parse(self._unwrap(data))

    def _unwrap(self, data: Any) -> Any:
        # A model without a native mechanism may leave the wrapper off: the bare value is fine.
        if self.wrapped and isinstance(data, dict) and set(data) == {WRAP_KEY}:
            return data[WRAP_KEY]
        return data

    def dump(self, value: Any) -> Any:
        """``value`` as JSON data (what events and the server carry)."""
        return self._dump(value)

    def partial_reader(self) -> PartialReader:
        """A reader for one streamed answer (see :class:`PartialReader`)."""
        return PartialReader(self)


class PartialReader:
    """Follows one streamed answer; ``feed`` returns the partial value (as JSON data) each time
    the text so far parses (unfinished strings kept, unfinished containers closed) *and*
    validates to something new, else ``None``."""

    __slots__ = ("_last", "_spec", "_text")

    def __init__(self, spec: OutputSpec) -> None:
        self._spec, self._text, self._last = spec, "", None

    def feed(self, delta: str) -> Any:
        from pydantic_core import from_json

        self._text += delta
        if not self._text.lstrip().startswith(("{", "[")):
            return None
        try:
            data = from_json(self._text, allow_partial="trailing-strings")
            dumped = self._spec.dump(self._spec._parse(self._spec._unwrap(data)))
        except (ValueError, _Invalid):  # not valid yet (ValidationError is a ValueError)
            return None
        if dumped == self._last:
            return None
        self._last = dumped
        return dumped


@dataclass(frozen=True, slots=True)
class Accept:
    """The answer fits: ``value`` is the typed object."""

    value: Any


@dataclass(frozen=True, slots=True)
class Retry:
    """The answer does not fit: the model gets ``correction`` and answers again."""

    errors: list[dict[str, str]]
    correction: str


@dataclass(frozen=True, slots=True)
class GiveUp:
    """The answer does not fit and the corrections are spent: the run stops."""

    errors: list[dict[str, str]]
    error: str


Decision = Accept | Retry | GiveUp


def check_answer(
    spec: OutputSpec, text: str, failures: int, retries: int, *, truncated: bool = False
) -> Decision:
    """Judge a final answer. ``failures`` answers of this turn failed before; ``retries`` is
    how many corrections the agent allows (``Agent.output_retries``). ``truncated``: the model
    stopped at its token limit (``finish_reason="length"``): an answer cut there is given up
    at once, since asking again grows the same answer into the same limit."""
    try:
        return Accept(spec.parse(text))
    except _Invalid as exc:
        errors = exc.errors
    listed = "\n".join(f"- {e['loc']}: {e['msg']}" for e in errors[:20])
    if truncated:
        return GiveUp(
            errors,
            f"the answer was cut at the model's token limit before it fit output type "
            f"{spec.name} ({len(text)} characters); raise max_tokens (model_settings), ask for "
            f"a smaller answer, or bound the type (e.g. a list with max_length):\n{listed}",
        )
    if failures >= retries:
        return GiveUp(
            errors,
            f"the answer did not fit output type {spec.name} after {failures + 1} attempts "
            f"(output_retries={retries}):\n{listed}",
        )
    schema = json.dumps(spec.wire.schema, ensure_ascii=False)
    correction = (
        f"Your answer did not fit the required output type {spec.name}:\n{listed}\n\n"
        f"Answer again with only a JSON value that fits this JSON schema:\n{schema}"
    )
    return Retry(errors, correction)


# -- compiling an output_type ----------------------------------------------------------------
_CACHE: dict[Any, OutputSpec | None] = {}


def compile_output(output_type: Any) -> OutputSpec | None:
    """The ``OutputSpec`` of ``output_type`` (None for ``None`` or ``str``: a text answer).

    Raises ``ConfigurationError`` naming the type when no JSON schema can be built for it (or,
    for a dict, when it is not a valid JSON schema).
    """
    if output_type is None or output_type is str:
        return None
    try:
        key: Any = (
            ("schema", json.dumps(output_type, sort_keys=True))
            if isinstance(output_type, dict)
            else output_type
        )
        hash(key)
    except (TypeError, ValueError):
        key = None
    if key is not None and key in _CACHE:
        return _CACHE[key]
    spec = _from_schema(output_type) if isinstance(output_type, dict) else _from_type(output_type)
    if key is not None:
        _CACHE[key] = spec
    return spec


def _name_of(raw: str) -> str:
    name = _NAME.sub("_", raw).strip("_")[:64]
    return name or WRAP_KEY


def _describe(t: Any) -> str:
    return getattr(t, "__name__", None) or repr(t)


def _errors(exc: Any) -> list[dict[str, str]]:
    return [
        {"loc": ".".join(str(p) for p in e["loc"]) or "(answer)", "msg": e["msg"]}
        for e in exc.errors(include_url=False)
    ]


def _from_type(t: Any) -> OutputSpec:
    from pydantic import PydanticUserError, TypeAdapter, ValidationError, create_model
    from pydantic.errors import PydanticSchemaGenerationError

    what = _describe(t)
    if isinstance(t, str | int | float | bool) or t is ...:
        raise ConfigurationError(
            f"output_type must be a type (a pydantic model, dataclass, TypedDict, a union or a "
            f"list of them) or a JSON schema dict, got the value {t!r}"
        )
    try:
        adapter: Any = TypeAdapter(t)
        schema = adapter.json_schema()
    except (PydanticSchemaGenerationError, PydanticUserError, TypeError, ValueError) as exc:
        first = str(exc).splitlines()[0]
        raise ConfigurationError(
            f"output_type {what} cannot be used: pydantic cannot build a JSON schema for it "
            f"({type(exc).__name__}: {first}). Use a pydantic model, dataclass or TypedDict "
            "of JSON-compatible fields, or give a JSON schema dict"
        ) from None
    wrapped = schema.get("type") != "object"
    if wrapped:  # a list, a union, a scalar: providers want an object, so wrap it
        wrapper = create_model(_name_of(what) + "Response", **{WRAP_KEY: (t, ...)})  # type: ignore[call-overload]
        wire_schema = TypeAdapter(wrapper).json_schema()
    else:
        wire_schema = schema

    def parse(data: Any) -> Any:
        try:
            return adapter.validate_python(data)
        except ValidationError as exc:
            raise _Invalid(_errors(exc)) from None

    def dump(value: Any) -> Any:
        return adapter.dump_python(value, mode="json")

    name = _name_of(schema.get("title") or what)
    wire = OutputSchema(name, wire_schema, str(schema.get("description") or ""))
    return OutputSpec(t, name, schema, wire, wrapped, parse, dump)


def _from_schema(schema: dict[str, Any]) -> OutputSpec:
    try:
        import jsonschema  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - a core dependency
        raise MissingDependencyError("jsonschema", "all", "A JSON schema output_type") from None
    try:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ConfigurationError(
            f"output_type is not a valid JSON schema: {exc.message} (at "
            f"{'/'.join(str(p) for p in exc.path) or 'the top'})"
        ) from None
    validator = cls(schema)
    wrapped = schema.get("type") != "object"
    if wrapped:
        inner = {k: v for k, v in schema.items() if k not in ("$defs", "definitions")}
        wire_schema: dict[str, Any] = {
            "type": "object",
            "properties": {WRAP_KEY: inner},
            "required": [WRAP_KEY],
            "additionalProperties": False,
        }
        for defs in ("$defs", "definitions"):  # refs point at the root: keep them there
            if defs in schema:
                wire_schema[defs] = schema[defs]
    else:
        wire_schema = schema

    def parse(data: Any) -> Any:
        found = sorted(validator.iter_errors(data), key=lambda e: list(e.path))
        if found:
            raise _Invalid(
                [
                    {"loc": ".".join(str(p) for p in e.path) or "(answer)", "msg": e.message}
                    for e in found
                ]
            )
        return data

    name = _name_of(str(schema.get("title") or WRAP_KEY))
    wire = OutputSchema(name, wire_schema, str(schema.get("description") or ""))
    return OutputSpec(schema, name, schema, wire, wrapped, parse, lambda v: v)
