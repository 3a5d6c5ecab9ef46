"""Judges score final answers; a failing panel makes the agent answer again with a correction.

```python
from loom.judge import JudgePanel, LLMJudge, FunctionJudge

panel = JudgePanel(
    [LLMJudge("openai:gpt-4o-mini", "The answer is correct and cites its source."),
     FunctionJudge(lambda q, a, ctx: (len(a) < 2000, "keep answers under 2000 characters"))],
    strategy="mean", threshold=0.7, max_retries=3,
)
agent = Agent(..., judges=panel)
result = await agent.run("...")
result.verdict   # {"passed": ..., "score": ..., "judges": [...], "attempt": ..., ...}
```
"""

from __future__ import annotations

from loom.judge.base import FunctionJudge, Judge, JudgeContext, Judgement
from loom.judge.llm import JUDGE_SCHEMA, LLMJudge, parse_judgement
from loom.judge.panel import STRATEGIES, JudgePanel, JudgeScore, Strategy, Verdict, aggregate

__all__ = [
    "JUDGE_SCHEMA",
    "STRATEGIES",
    "FunctionJudge",
    "Judge",
    "JudgeContext",
    "JudgePanel",
    "JudgeScore",
    "Judgement",
    "LLMJudge",
    "Strategy",
    "Verdict",
    "aggregate",
    "parse_judgement",
]
