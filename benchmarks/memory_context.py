"""Memory and context benchmarks (issue #5). Prints JSON.

    PYTHONPATH=src python benchmarks/memory_context.py [--quick] [--prompt-cache]

1. ``long_run``: 500 scripted turns (tool outputs of 3-900 lines), a 4096-token window with 512
   reserved: max tokens per call vs the budget, total tokens sent vs sending the full history,
   tokenizer work per turn as the history grows, share of each call taken by summaries.
2. ``counting``: tokens/s of the counters vs plain tiktoken on the same texts.
3. ``loop_overhead``: µs per loop step with a zero-latency model, whole-history builder vs
   the segmented builder (the default).

``long_run.prompt_cache`` (issue #31): over the same 500 turns, the input tokens a provider
would read from its prompt cache given the cache points Loom sends (``ModelSettings.
cache_points``), and the input cost with and without them at the shipped prices
(``src/loom/prices.json``): Anthropic (Claude Sonnet 4.5) caches only at breakpoints, so
without them nothing is cached; with them a request reads the longest prefix ending at a
breakpoint that an earlier request wrote (Anthropic looks back up to 20 blocks from each
breakpoint; prefixes under 1024 tokens are not cached) and writes up to its last breakpoint.
OpenAI (GPT-4.1) caches automatically (prefixes of 1024 tokens and more, in 128-token steps):
the figure is the prefix each request shares with the one before it, what a stable
``prompt_cache_key`` keeps on one cache. Tokens are counted with cl100k as a stand-in for
each provider's tokenizer. Cache busts (``CACHE_BUST`` with ``expected=False``) are counted.
"""

from __future__ import annotations

import asyncio
import glob
import json
import re
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

from loom import Agent, EventType, Message, ModelResponse, ToolCall, tool
from loom.context import FullHistoryBuilder
from loom.memory import MemoryConfig
from loom.memory.compression import FLUSH_USER, SEGMENTS
from loom.memory.tokens import EstimateCounter, MessageCounter, TiktokenCounter, tiktoken_encoding
from loom.testing import FunctionModel

SIZES = (3, 40, 250, 900, 15, 120)


@tool(effect="pure", blocking=False)
def fetch(n: int, topic: str) -> str:
    """Fetch n lines about a topic.

    Args:
        n: Lines wanted.
        topic: What about.
    """
    return f"ref_{topic}_{n:06d}\n" + "\n".join(
        f"{topic} fact {i}: value {i * 7}" for i in range(n)
    )


def model_fn(messages: list[Message], tools: Any) -> ModelResponse | str:
    first, last = messages[0], messages[-1]
    if first.content.startswith("You compress"):
        turns = re.findall(r"\[user\] turn (\d+)", last.content)
        span = f"turns {turns[0]}–{turns[-1]}" if turns else "earlier summaries"
        return "\n".join(f"## {s}\n{s}: {span}" for s in SEGMENTS[:-1])
    system = "\n".join(m.content for m in messages if m.role == "system")
    if last.content == FLUSH_USER:
        said = any("colour is teal" in m.content for m in messages if m.role == "user")
        if said and "teal" not in system:
            return ModelResponse(
                tool_calls=[
                    ToolCall(
                        name="memory_write",
                        arguments={"note": "The user's favourite colour is teal."},
                    )
                ]
            )
        return "NO_REPLY"
    if last.role == "tool":
        return f"Noted {len(last.content)} characters."
    n = int(re.match(r"turn (\d+)", last.content).group(1))  # type: ignore[union-attr]
    if n % 7 == 3:
        return f"Plain answer to turn {n}."
    return ModelResponse(
        tool_calls=[
            ToolCall(name="fetch", arguments={"n": SIZES[n % len(SIZES)], "topic": f"t{n}"})
        ]
    )


class SpyCounter:
    """cl100k, recording how many characters each build had to tokenize."""

    exact = True
    message_overhead = 3

    def __init__(self) -> None:
        self.inner = TiktokenCounter("cl100k_base")
        self.chars = 0

    def count(self, text: str) -> int:
        self.chars += len(text)
        return self.inner.count(text)


async def long_run(turns: int, window: int = 4096) -> dict[str, Any]:
    spy = SpyCounter()
    model = FunctionModel(model_fn)
    ws = tempfile.mkdtemp()
    agent = Agent(
        "long",
        "You are a research assistant. Use fetch to look things up.",
        model=model,
        tools=[fetch],
        workspace=ws,
        context_window=window,
        reserved_output_tokens=512,
        memory=MemoryConfig(counter=spy, retry_delays=(0.0,)),
    )
    builder = agent.runtime.builder_for(agent)
    per_turn_chars, per_turn_build_us = [], []
    original_build = builder.build  # type: ignore[attr-defined]
    build_times: list[float] = []

    async def timed_build(request: Any) -> Any:
        t = time.perf_counter()
        out = await original_build(request)
        build_times.append(time.perf_counter() - t)
        return out

    builder.build = timed_build  # type: ignore[method-assign]
    events: dict[str, int] = {}
    breaks: dict[str, int] = {}
    for i in range(turns):
        before_chars, before_builds = spy.chars, len(build_times)
        msg = (
            f"turn {i}: hello, my favourite colour is teal."
            if i == 0
            else (f"turn {i}: please look up topic t{i}.")
        )
        async for ev in agent.stream(msg, session_id="long"):
            events[ev.type.name] = events.get(ev.type.name, 0) + 1
            if ev.type is EventType.CACHE_BUST:
                why = "bust" if not ev.data["expected"] else str(ev.data["reason"])
                breaks[why] = breaks.get(why, 0) + 1
        per_turn_chars.append(spy.chars - before_chars)
        per_turn_build_us.append(sum(build_times[before_builds:]) * 1e6)
    fresh = MessageCounter(TiktokenCounter("cl100k_base"))
    calls = [c for c in model.calls]
    agent_calls = [
        c
        for c in calls
        if not c.messages[0].content.startswith("You compress")
        and c.messages[-1].content != FLUSH_USER
    ]
    sent = [fresh.messages(c.messages) + fresh.tools(c.tools) for c in calls]
    summary_share = []
    for c in agent_calls:
        total = fresh.messages(c.messages) + fresh.tools(c.tools)
        l2 = sum(
            fresh.message(m)
            for m in c.messages
            if m.content.startswith("Summary of the earlier conversation")
        )
        summary_share.append(l2 / total)
    # what sending the whole history would have cost: every agent call's full transcript
    stored = await agent.store.load_messages("long")
    conv = [m for m in stored if "loom" not in m.metadata]
    rom = fresh.message(Message.system(agent.instructions)) + fresh.tools(agent.tool_specs) + 3
    prefix = [0]
    for m in conv:
        prefix.append(prefix[-1] + fresh.message(m))
    full_total, pos, conv_ids = 0, 0, [id(m) for m in conv]
    # each agent call saw the conversation up to its last message; find that point
    index_of = {(m.role, m.content, m.tool_call_id): k for k, m in enumerate(conv)}
    for c in agent_calls:
        last = c.messages[-1]
        pos = index_of.get((last.role, last.content, last.tool_call_id), pos)
        full_total += rom + prefix[pos + 1]
    del conv_ids
    sent_agent = sum(fresh.messages(c.messages) + fresh.tools(c.tools) for c in agent_calls)
    q = max(1, turns // 10)
    return {
        "turns": turns,
        "window": window,
        "reserved_output": 512,
        "budget": window - 512,
        "model_calls": len(calls),
        "agent_calls": len(agent_calls),
        "max_tokens_per_call": max(sent),
        "calls_over_budget": sum(s > window - 512 for s in sent),
        "tokens_sent_agent_calls": sent_agent,
        "tokens_full_history": full_total,
        "sent_vs_full_ratio": round(sent_agent / full_total, 4),
        "tokens_sent_incl_summariser_and_flush": sum(sent),
        "transcript_tokens_at_end": prefix[-1],
        "tokenized_chars_per_turn_first_10pct_median": statistics.median(per_turn_chars[:q]),
        "tokenized_chars_per_turn_last_10pct_median": statistics.median(per_turn_chars[-q:]),
        "build_us_per_turn_first_10pct_median": round(statistics.median(per_turn_build_us[1:q]), 1),
        "build_us_per_turn_last_10pct_median": round(statistics.median(per_turn_build_us[-q:]), 1),
        "summary_share_mean": round(statistics.mean(summary_share), 4),
        "summary_share_max": round(max(summary_share), 4),
        "events": {
            k: v for k, v in sorted(events.items()) if k.startswith(("COMPRESSION", "MEMORY"))
        },
        "prompt_cache": prompt_cache(agent_calls, fresh, breaks, builder.prefixes.busts),
    }


ANTHROPIC_MIN_CACHED = 1024  # Claude Sonnet 4.5's shortest cacheable prefix
ANTHROPIC_LOOKBACK = 20  # blocks a breakpoint looks back for an earlier cache entry
OPENAI_MIN_CACHED, OPENAI_STEP = 1024, 128


def _key(m: Message) -> tuple[Any, ...]:
    calls = tuple((c.name, json.dumps(c.arguments, sort_keys=True)) for c in m.tool_calls)
    return (m.role, m.content, m.tool_call_id, calls)


def prompt_cache(
    calls: list[Any], mc: MessageCounter, breaks: dict[str, int], busts: int
) -> dict[str, Any]:
    """Cached vs uncached input tokens of the agent's calls, and their input cost with and
    without Loom's cache points (see the module docstring)."""
    from loom.pricing import default_prices

    prices = default_prices()
    sonnet = prices.lookup("anthropic:claude-sonnet-4-5")
    gpt = prices.lookup("openai:gpt-4.1")
    assert sonnet is not None and gpt is not None
    assert sonnet.cached_input is not None and sonnet.cache_write is not None
    assert gpt.cached_input is not None
    written: set[tuple[Any, ...]] = set()  # prefixes (as message keys) an earlier call cached
    total = read = write = openai_cached = 0
    previous: list[tuple[Any, ...]] = []
    for c in calls:
        keys = [_key(m) for m in c.messages]
        tokens = [mc.message(m) for m in c.messages]
        head = mc.tools(c.tools)
        upto = [head]  # upto[i + 1]: the tokens of the tools and messages 0..i
        for t in tokens:
            upto.append(upto[-1] + t)
        size = upto[-1]
        total += size
        points = list(c.settings.cache_points) if c.settings is not None else []
        hit = 0
        for p in points:  # the longest earlier entry within a breakpoint's lookback
            for q in range(p, max(-1, p - ANTHROPIC_LOOKBACK), -1):
                if tuple(keys[: q + 1]) in written:
                    hit = max(hit, upto[q + 1])
                    break
        wrote = 0
        for p in points:
            if upto[p + 1] >= ANTHROPIC_MIN_CACHED:
                written.add(tuple(keys[: p + 1]))
                wrote = max(wrote, upto[p + 1])
        read += hit
        write += max(wrote - hit, 0)
        shared = 0
        while shared < min(len(previous), len(keys)) and previous[shared] == keys[shared]:
            shared += 1
        common = upto[shared] if shared else 0
        if common >= OPENAI_MIN_CACHED:
            openai_cached += common - common % OPENAI_STEP
        previous = keys

    def dollars(x: float) -> float:
        return round(x / 1e6, 4)

    plain = total - read - write
    with_points = plain * sonnet.input + read * sonnet.cached_input + write * sonnet.cache_write
    return {
        "agent_calls": len(calls),
        "input_tokens": total,
        "anthropic_claude_sonnet_4_5": {
            "cached_input_tokens": read,
            "cache_write_tokens": write,
            "uncached_input_tokens": plain,
            "cached_share": round(read / total, 4),
            "input_cost_usd_without_breakpoints": dollars(total * sonnet.input),
            "input_cost_usd_with_breakpoints": dollars(with_points),
            "saving": round(1 - with_points / (total * sonnet.input), 4),
        },
        "openai_gpt_4_1_automatic": {
            "cached_input_tokens": openai_cached,
            "cached_share": round(openai_cached / total, 4),
            "input_cost_usd_uncached": dollars(total * gpt.input),
            "input_cost_usd_cached": dollars(
                (total - openai_cached) * gpt.input + openai_cached * gpt.cached_input
            ),
        },
        "prefix_breaks_by_reason": dict(sorted(breaks.items())),
        "cache_busts": busts,
    }


def counting(quick: bool) -> dict[str, Any]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    site = Path(sysconfig.get_paths()["purelib"])
    texts = [p.read_text(errors="ignore") for p in sorted(stdlib.glob("*.py"))[:40]]
    texts += [
        Path(p).read_text(errors="ignore")
        for p in sorted(glob.glob(str(site / "*.dist-info" / "METADATA")))[:40]
    ]
    if quick:
        texts = texts[:10]
    enc = tiktoken_encoding("cl100k_base")
    tokens = sum(len(enc.encode_ordinary(t)) for t in texts)

    def rate(fn: Any) -> float:
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            for x in texts:
                fn(x)
            best = min(best, time.perf_counter() - t)
        return tokens / best

    plain = rate(lambda x: len(enc.encode(x, disallowed_special=())))
    ours = TiktokenCounter("cl100k_base")
    est = EstimateCounter()
    mc = MessageCounter(ours)
    msgs = [Message.user(t) for t in texts]
    for m in msgs:
        mc.message(m)
    cached = rate(lambda x: None) and tokens / max(
        1e-9, _time(lambda: [mc.message(m) for m in msgs])
    )
    return {
        "corpus_tokens": tokens,
        "plain_tiktoken_tokens_per_s": round(plain),
        "TiktokenCounter_tokens_per_s": round(rate(ours.count)),
        "EstimateCounter_tokens_per_s": round(rate(est.count)),
        "MessageCounter_cached_tokens_per_s": round(cached),
    }


def _time(fn: Any) -> float:
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


async def _steps(builder: Any, turns: int, per_session: int, **kw: Any) -> float:
    model = FunctionModel(lambda m, t: "ok", record=False)
    agent = Agent("bench", "You answer.", model=model, context_builder=builder, **kw)
    for i in range(20):  # warm up
        await agent.run(f"warm {i}", session_id="w")
    t = time.perf_counter()
    for i in range(turns):
        await agent.run(f"message {i}", session_id=f"s{i // per_session}")
    return (time.perf_counter() - t) / turns * 1e6


async def loop_overhead(turns: int) -> dict[str, Any]:
    """µs per loop step (one turn = one model call here); best of 5 interleaved trials."""
    out: dict[str, Any] = {"steps_per_trial": turns}
    for per_session in (1, 20, turns):
        runs: dict[str, list[float]] = {
            "full_history": [],
            "segmented": [],
            "segmented_no_component_events": [],
        }
        for _ in range(5):
            runs["full_history"].append(await _steps(FullHistoryBuilder(), turns, per_session))
            runs["segmented"].append(await _steps(None, turns, per_session))
            runs["segmented_no_component_events"].append(
                await _steps(None, turns, per_session, memory=MemoryConfig(component_events=False))
            )
        best = {k: round(min(v), 1) for k, v in runs.items()}
        best["overhead_us"] = round(best["segmented"] - best["full_history"], 1)
        best["overhead_no_component_events_us"] = round(
            best["segmented_no_component_events"] - best["full_history"], 1
        )
        out[f"turns_per_session_{per_session}"] = best
    return out


async def main() -> None:
    quick = "--quick" in sys.argv
    if "--prompt-cache" in sys.argv:  # issue #31's figures only, into results/prompt_cache.json
        cache: dict[str, Any] = {
            "command": "PYTHONPATH=src python benchmarks/memory_context.py --prompt-cache"
            + (" --quick" * quick)
        }
        for window in (4096, 16384):  # the tight window of the memory benchmark, and a roomier one
            run = await long_run(100 if quick else 500, window)
            cache[f"window_{window}"] = {
                "turns": run["turns"],
                "compressions": run["events"].get("COMPRESSION_COMPLETE", 0),
                **run["prompt_cache"],
            }
        out = Path(__file__).parent / "results" / "prompt_cache.json"
        out.write_text(json.dumps(cache, indent=2, ensure_ascii=False) + "\n")
        print(json.dumps(cache, indent=2, ensure_ascii=False))
        return
    result = {
        "command": "PYTHONPATH=src python benchmarks/memory_context.py" + (" --quick" * quick),
        "long_run": await long_run(100 if quick else 500),
        "counting": counting(quick),
        "loop_overhead": await loop_overhead(200 if quick else 1000),
    }
    print(json.dumps(result, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    asyncio.run(main())
