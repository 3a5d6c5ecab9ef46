"""Guardrails: checks that pass, fix or stop a run's input, output, tool calls and results.

```python
from loom.guardrails import Decision, Redactor, input_guardrail

@input_guardrail
def no_refunds(text, ctx):
    return Decision.trip("refunds go to a human") if "refund" in text.lower() else None

agent = Agent("support", model=..., guardrails=[Redactor(), no_refunds])
```
See ``loom.guardrails.base`` for the protocols and ``docs/agents.md`` for the guide.
"""

from loom.guardrails.base import (
    Decision,
    FunctionGuardrail,
    GuardrailContext,
    InputGuardrail,
    OutputGuardrail,
    ToolCallGuardrail,
    ToolResultGuardrail,
    input_guardrail,
    output_guardrail,
    tool_call_guardrail,
    tool_result_guardrail,
)
from loom.guardrails.checks import AllowedLanguages, MaxLength, detect_language
from loom.guardrails.cite import MustCite
from loom.guardrails.engine import Guardrails, Outcome, Record, Tripped
from loom.guardrails.injection import PromptInjectionGuardrail, find_injections
from loom.guardrails.redact import Redactor, redact

__all__ = [
    "AllowedLanguages",
    "Decision",
    "FunctionGuardrail",
    "GuardrailContext",
    "Guardrails",
    "InputGuardrail",
    "MaxLength",
    "MustCite",
    "Outcome",
    "OutputGuardrail",
    "PromptInjectionGuardrail",
    "Record",
    "Redactor",
    "ToolCallGuardrail",
    "ToolResultGuardrail",
    "Tripped",
    "detect_language",
    "find_injections",
    "input_guardrail",
    "output_guardrail",
    "redact",
    "tool_call_guardrail",
    "tool_result_guardrail",
]
