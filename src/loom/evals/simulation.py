"""Simulated users: a multi-turn case's conversation, driven turn by turn in one session.

A case with ``user`` (``loom.evals.dataset.SimulatedUser``) is a conversation. The user is a
script (its messages sent in order, after the case's ``input`` when one is given) or a model
playing a persona after a goal: it reads the conversation so far (the agent's answers as the
other side) and writes the next message, or ``DONE`` once its goal is met.

The conversation ends when the goal is met (the simulated user says ``DONE``, or ``done_when``
holds after an agent turn: a phrase the agent's answer contains, case-insensitively, or a
judge's rubric that passes), when a script runs out of messages (met, unless ``done_when``
says otherwise), or after ``max_turns`` agent turns: a goal never met then fails the case with
that reason. Every turn is recorded (``Conversation.turns``), and the case's assertions are
checked on the trajectory of every run of the conversation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loom.errors import ConfigurationError
from loom.evals.assertions import CheckResult
from loom.evals.dataset import Case, DoneWhen, SimulatedUser

if TYPE_CHECKING:
    from loom.agent import Agent
    from loom.engine.run_inputs import RunOptions
    from loom.engine.runtime import Runtime
    from loom.messages import Message, RunResult
    from loom.models.base import Model

__all__ = ["DONE", "OPENING", "Conversation", "model_for_run", "simulate", "user_prompt"]

DONE = "DONE"
"""What a simulated user answers once its goal is met."""
OPENING = "(The conversation starts. Write your first message.)"
"""The first message a model user reads (the agent's side, before anything was said)."""

_SYSTEM = """\
You play a user talking to an AI assistant, to test the assistant. Stay in your role: write \
only what this user would write next, one message, no commentary.
{persona}Your goal: {goal}
When your goal is met (or the assistant has clearly done all it can), answer with the single \
word DONE."""


@dataclass(slots=True)
class Conversation:
    """What a simulated conversation did: each turn (``user``, ``agent``, the run's id and
    stop reason), its runs' results, whether the goal was met and why it ended."""

    turns: list[dict[str, Any]] = field(default_factory=list)
    results: list[RunResult] = field(default_factory=list)
    goal_met: bool = False
    reason: str = ""

    def checks(self) -> list[CheckResult]:
        """The conversation's check: the goal was met."""
        return [CheckResult("user.goal", self.goal_met, self.reason)]


def user_prompt(user: SimulatedUser, turns: list[dict[str, Any]]) -> list[Message]:
    """The messages a model user reads: its role, then the conversation with the sides swapped
    (the agent's answers are what it replies to)."""
    from loom.messages import Message

    persona = f"Who you are: {user.persona.strip()}\n" if user.persona.strip() else ""
    # a user message first: some providers refuse a conversation that opens with the assistant
    messages = [
        Message.system(_SYSTEM.format(persona=persona, goal=user.goal.strip())),
        Message.user(OPENING),
    ]
    for turn in turns:
        messages.append(Message.assistant(str(turn["user"])))
        messages.append(Message.user(str(turn["agent"]) or "(no answer)"))
    return messages


def _phrase_met(done_when: str, answer: str) -> bool:
    return done_when.strip().lower() in answer.lower()


async def _judge_met(
    rule: DoneWhen, user: SimulatedUser, result: RunResult, judge_model: str | Model
) -> tuple[bool, str]:
    from loom.judge import JudgeContext, LLMJudge

    judge = LLMJudge(judge_model, rule.rubric, name="done_when", timeout=60.0)
    verdict = await judge.evaluate(
        user.goal or "the user's requests",
        result.text,
        JudgeContext(messages=result.messages, session_id=result.session_id, run_id=result.run_id),
    )
    return verdict.score >= rule.threshold, f"judge scored {verdict.score:.2f}: {verdict.reason}"


async def simulate(
    runtime: Runtime,
    agent: Agent,
    case: Case,
    session_id: str,
    options: RunOptions,
    *,
    user_model: str | Model | None = None,
    judge_model: str | Model | None = None,
) -> Conversation:
    """Drive ``case``'s conversation in ``session_id`` (see the module docstring).
    ``user_model`` is the model user's model when the case's ``user.model`` names none (a
    ``Model`` object for tests); ``judge_model`` scores a ``done_when`` rubric."""
    from loom.models.base import complete

    user = case.user
    assert user is not None
    model: Model | None = None
    if user.script is None:
        spec = user.model if user.model is not None else user_model
        if spec is None:
            raise ConfigurationError(
                f"case {case.id!r}: a simulated user with a goal needs a model: give user.model "
                "(or the experiment's user model)"
            )
        if isinstance(spec, str):
            from loom.models import resolve_model

            resolved = model_for_run(spec)
            model = resolve_model(resolved) if isinstance(resolved, str) else resolved
        else:
            model = spec
    if isinstance(user.done_when, DoneWhen) and judge_model is None:
        raise ConfigurationError(
            f"case {case.id!r}: done_when has a rubric, which needs a judge model: give "
            "--judge-model or the dataset's judge_model"
        )
    script = list(user.script or [])
    conversation = Conversation()
    message = case.message
    for number in range(1, user.max_turns + 1):
        if not message:  # the user writes the opening (or the next) message
            if model is not None:
                response = await complete(model, user_prompt(user, conversation.turns))
                message = response.text.strip()
                if message.upper().rstrip(".!") == DONE:
                    conversation.goal_met = True
                    conversation.reason = (
                        f"the simulated user said its goal was met after {number - 1} turn(s)"
                    )
                    return conversation
            elif script:
                message = script.pop(0)
            else:  # a script that ran out: met unless done_when said otherwise
                break
        result = await runtime.run(agent, message, session_id=session_id, options=options)
        conversation.results.append(result)
        conversation.turns.append(
            {
                "turn": number,
                "user": message,
                "agent": result.text,
                "run_id": result.run_id,
                "stop_reason": result.stop_reason,
            }
        )
        message = ""
        if result.stop_reason != "completed":
            conversation.reason = f"turn {number} stopped: {result.stop_reason}"
            return conversation
        if isinstance(user.done_when, str) and _phrase_met(user.done_when, result.text):
            conversation.goal_met = True
            conversation.reason = f"the agent's answer in turn {number} says {user.done_when!r}"
            return conversation
        if isinstance(user.done_when, DoneWhen) and judge_model is not None:
            met, why = await _judge_met(user.done_when, user, result, judge_model)
            if met:
                conversation.goal_met = True
                conversation.reason = f"done_when passed in turn {number}: {why}"
                return conversation
    turns = len(conversation.turns)
    if model is not None and turns == user.max_turns:  # it may say DONE to the last answer
        response = await complete(model, user_prompt(user, conversation.turns))
        if response.text.strip().upper().rstrip(".!") == DONE:
            conversation.goal_met = True
            conversation.reason = f"the simulated user said its goal was met after {turns} turn(s)"
            return conversation
    if user.script is not None and not script and user.done_when is None:
        conversation.goal_met = True
        conversation.reason = f"the script's {turns} turn(s) all ran"
        return conversation
    if user.script is not None and not script:
        conversation.reason = (
            f"the script ran out after {turns} turn(s) and done_when ({user.done_when!r}) "
            "never held"
        )
        return conversation
    conversation.reason = (
        f"the goal was not met within max_turns ({user.max_turns}): the conversation "
        f"ran {turns} turn(s)"
    )
    return conversation


def model_for_run(spec: str | Model | None) -> str | Model | None:
    """The run's model override: ``test`` (or ``test:tool,tool``) is ``loom.testing.TestModel``
    (calling every tool, or those named); anything else is a model string or a ``Model``."""
    if isinstance(spec, str) and (spec == "test" or spec.startswith("test:")):
        from loom.testing import TestModel

        named = [t for t in spec.partition(":")[2].split(",") if t]
        return TestModel(call_tools=named or "all")
    return spec
