"""Model providers and the model-string registry.

``resolve_model("openai:gpt-4o-mini")`` turns a model string into a ``Model``. Providers are
imported only when a string names them, so ``import loom`` never loads an SDK.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from loom.errors import AgentDefinitionError, ConfigurationError
from loom.models.base import (
    Model,
    ModelSettings,
    ReasoningDelta,
    RetryNotice,
    StreamPart,
    TextDelta,
    complete,
    reports_real_usage,
)

__all__ = [
    "PROVIDERS",
    "Model",
    "ModelSettings",
    "ReasoningDelta",
    "RetryNotice",
    "StreamPart",
    "TextDelta",
    "check_model_spec",
    "complete",
    "reports_real_usage",
    "resolve_model",
]

# provider prefix -> "module:factory"; each factory takes the part after the first ':'.
PROVIDERS: dict[str, str] = {
    "local": "loom.models.local:from_spec",
    "openai": "loom.models.openai:from_spec",
    "openai-compatible": "loom.models.openai:from_compatible_spec",
    "ollama": "loom.models.openai:from_ollama_spec",
    "openai-responses": "loom.models.openai_responses:from_spec",
    "anthropic": "loom.models.anthropic:from_spec",
    "demo": "loom.testing:demo_model",
}

DEFAULT_MODEL = "local"


def check_model_spec(model: Any) -> str | Model | None:
    """``model`` if it is a model string of a known provider, an object with ``stream()`` or
    None (then ``$LOOM_MODEL`` is checked), else ``AgentDefinitionError``: a provider must
    exist when the agent (or a run with a model of its own) is made, not at its first call
    (the model is loaded by the runtime when it is first used)."""
    if model is None:
        env = os.environ.get("LOOM_MODEL")
        if env:
            check_model_spec(env)
        return None
    if isinstance(model, str):
        provider = model.strip().partition(":")[0]
        if not model.strip():
            raise AgentDefinitionError(
                "is empty; try 'local' or 'openai:gpt-4o-mini'", field="model"
            )
        if provider not in PROVIDERS:
            known = ", ".join(sorted(PROVIDERS))
            raise AgentDefinitionError(
                f"unknown model provider {provider!r} in {model!r}; known providers: {known}. "
                "Write it as 'provider:model', for example 'openai:gpt-4o-mini'.",
                field="model",
            )
        return model
    if not callable(getattr(model, "stream", None)):
        raise AgentDefinitionError(
            f"must be a model string or an object with stream(); got {type(model).__name__}",
            field="model",
        )
    return model  # type: ignore[no-any-return]


def resolve_model(spec: str | Model | None) -> Model:
    """Return a ``Model`` for a model string, a ``Model`` instance, or ``None`` (``$LOOM_MODEL``,
    then the embedded local model)."""
    if spec is None:
        spec = os.environ.get("LOOM_MODEL") or DEFAULT_MODEL
    if not isinstance(spec, str):
        if not hasattr(spec, "stream"):
            raise ConfigurationError(
                f"model must be a model string such as 'local' or 'openai:gpt-4o-mini', or an "
                f"object with a stream() method; got {type(spec).__name__}"
            )
        return spec
    text = spec.strip()
    if not text:
        raise ConfigurationError("model string is empty; try 'local' or 'openai:gpt-4o-mini'")
    provider, _, rest = text.partition(":")
    target = PROVIDERS.get(provider)
    if target is None:
        known = ", ".join(sorted(PROVIDERS))
        raise ConfigurationError(
            f"unknown model provider {provider!r} in {spec!r}; known providers: {known}. "
            "Write it as 'provider:model', for example 'openai:gpt-4o-mini'."
        )
    module_name, _, factory_name = target.partition(":")
    module = importlib.import_module(module_name)
    factory: Any = getattr(module, factory_name)
    model: Model = factory(rest)
    return model
