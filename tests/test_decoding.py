"""The decoding engine: greedy identity, KV-cache bookkeeping, stats, adaptive exit, sampling.

Tiny random Llamas cover every path quickly and exactly; the real default model (marked
``model``) checks greedy identity against Hugging Face ``generate`` on real prompts.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from conftest import make_tiny_model

from skipsearch.config import NO_EXIT, ConfigError, DraftConfig, ExitRule, SamplingParams
from skipsearch.engine.decoding import Draft, Drafter, LayerSkipDrafter, generate, hf_generate, process_logits

V = 64  # the tiny_sm vocabulary
MAX_NEW = 24
_rng = random.Random(1234)
PROMPTS = {
    "one-token": [7],
    "short": [3, 14, 15, 9, 26],
    "random-12": [_rng.randrange(V) for _ in range(12)],
}


def _stack_configs() -> dict[str, DraftConfig]:
    configs = {f"noskip-K{k}": DraftConfig(max_draft_tokens=k) for k in range(1, 7)}
    configs.update(
        {
            "noskip-K4-noexit": DraftConfig(max_draft_tokens=4, exit=NO_EXIT),
            "noskip-K3-fixed-threshold": DraftConfig(max_draft_tokens=3, exit=ExitRule(threshold=0.3, adaptive=False)),
            "attn1": DraftConfig(skip_attn=(1,), max_draft_tokens=3),
            "attn0-noexit": DraftConfig(skip_attn=(0,), max_draft_tokens=5, exit=NO_EXIT),
            "attn02": DraftConfig(skip_attn=(0, 2), max_draft_tokens=4),
            "mlp13": DraftConfig(skip_mlp=(1, 3), max_draft_tokens=4),
            "mlp0-noexit": DraftConfig(skip_mlp=(0,), max_draft_tokens=6, exit=NO_EXIT),
            "mixed-noexit": DraftConfig(skip_attn=(0, 2), skip_mlp=(2, 3), max_draft_tokens=4, exit=NO_EXIT),
            "mixed-K2": DraftConfig(skip_attn=(3,), skip_mlp=(1,), max_draft_tokens=2),
            "everything-noexit": DraftConfig(
                skip_attn=(0, 1, 2, 3), skip_mlp=(0, 1, 2, 3), max_draft_tokens=6, exit=NO_EXIT
            ),
            "everything-adaptive": DraftConfig(skip_attn=(0, 1, 2, 3), skip_mlp=(0, 1, 2, 3), max_draft_tokens=3),
        }
    )
    return configs


CONFIGS = _stack_configs()


@pytest.fixture(scope="module")
def references(tiny_sm):
    """Per prompt: (autoregressive greedy output, HF greedy output), MAX_NEW tokens each."""
    out = {}
    for name, ids in PROMPTS.items():
        ar = generate(tiny_sm, ids, config=None, max_new_tokens=MAX_NEW, eos_token_ids=())
        out[name] = (ar, hf_generate(tiny_sm, ids, max_new_tokens=MAX_NEW))
    return out


def check_stats(result, *, prompt_len: int, max_k: int, eos_hit: bool = False) -> None:
    """Invariants every DecodeStats must satisfy."""
    s = result.stats
    assert s.prompt_tokens == prompt_len
    assert s.new_tokens == len(result.token_ids)
    assert s.accepted_tokens <= s.drafted_tokens
    assert s.draft_steps == s.drafted_tokens  # one draft forward per drafted token
    if s.drafted_tokens:
        assert s.acceptance_rate == pytest.approx(s.accepted_tokens / s.drafted_tokens)
    else:
        assert s.acceptance_rate is None
    assert 1.0 <= s.tau <= max_k + 1
    if not eos_hit:  # every verify step emits its accepted drafts plus one token of its own
        assert s.new_tokens == 1 + s.verify_steps + s.accepted_tokens
    else:  # the last step may end on an accepted draft (EOS), so without a token of its own
        assert s.new_tokens - 1 - s.verify_steps <= s.accepted_tokens <= s.new_tokens - 1
    if s.verify_steps:  # tau counts emitted tokens only, never drafts cut after an EOS
        assert s.tau == pytest.approx((s.new_tokens - 1) / s.verify_steps)
    # the parts are disjoint spans of the one run: together at most its time, and each there when it ran
    assert s.prefill_seconds + s.draft_seconds + s.verify_seconds <= s.seconds
    assert s.prefill_seconds > 0 and (s.verify_seconds > 0) == (s.verify_steps > 0)
    assert s.tokens_per_s == pytest.approx(s.new_tokens / s.seconds)


# -- greedy identity ---------------------------------------------------------------------------------
def test_autoregressive_equals_hf_generate(tiny_sm, references):
    for name, (ar, hf) in references.items():
        assert ar.token_ids == hf, name
        s = ar.stats
        assert s.drafted_tokens == 0 and s.accepted_tokens == 0 and s.draft_steps == 0
        assert s.verify_steps == s.new_tokens - 1 == MAX_NEW - 1
        assert s.acceptance_rate is None and s.final_threshold is None and s.tau == 1.0
        check_stats(ar, prompt_len=len(PROMPTS[name]), max_k=0)
    # the model is not degenerate: outputs vary and are not one repeated token
    assert len({ar.token_ids for ar, _ in references.values()}) == len(PROMPTS)
    assert all(len(set(ar.token_ids)) > 3 for ar, _ in references.values())


@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_greedy_speculative_equals_autoregressive_and_hf(tiny_sm, references, config_name):
    config = CONFIGS[config_name]
    for name, ids in PROMPTS.items():
        ar, hf = references[name]
        result = generate(tiny_sm, ids, config=config, max_new_tokens=MAX_NEW, eos_token_ids=())
        assert result.token_ids == ar.token_ids == hf, f"{config_name} on {name}"
        check_stats(result, prompt_len=len(ids), max_k=config.max_draft_tokens)
        assert result.stats.drafted_tokens > 0
        if config.exit.adaptive:
            assert result.stats.final_threshold is not None
        else:
            assert result.stats.final_threshold == config.exit.threshold
    if config_name.startswith("noskip") and config.exit == NO_EXIT:
        # the draft is the full model itself: everything it proposes is accepted
        assert result.stats.acceptance_rate == 1.0


def test_max_draft_tokens_zero_is_autoregressive(tiny_sm, references):
    ar, _ = references["short"]
    result = generate(tiny_sm, PROMPTS["short"], config=DraftConfig(max_draft_tokens=0), max_new_tokens=MAX_NEW,
                      eos_token_ids=())
    assert result.token_ids == ar.token_ids
    assert result.stats.drafted_tokens == 0 and result.stats.final_threshold is None


class ScriptedDrafter(Drafter):
    """Proposes the reference greedy continuation for its first j tokens, then one wrong token.

    ``schedule(cycle) -> j``; j >= limit proposes ``limit`` correct tokens. On every call it
    checks the engine's state (everything before ``pending`` committed to the cache, nothing
    more) and it leaves draft-only KV of uneven per-layer lengths behind for the engine to crop.
    """

    def __init__(self, prompt, reference, *, k: int, schedule, kv_config=None) -> None:
        self.prompt = list(prompt)
        self.seq = [*prompt, *reference]
        self.k = k
        self.schedule = schedule
        self.kv_config = kv_config if kv_config is not None else DraftConfig(skip_attn=(0, 2), skip_mlp=(1,))
        self.emitted = 0  # kept up to date by on_tokens
        self.expected: list[tuple[int, int]] = []  # (drafted, accepted) the engine should observe
        self.observed: list[tuple[int, int]] = []
        self.entry_lengths: list[tuple[int, tuple[int, ...]]] = []

    def on_tokens(self, tokens) -> None:
        self.emitted += len(tokens)

    @property
    def threshold(self):
        return None

    def draft(self, sm, cache, *, pending, start, limit, sampling, generator) -> Draft:
        self.entry_lengths.append((start, sm.cache_lengths(cache)))
        assert sm.cache_lengths(cache) == (start,) * sm.num_layers, "stale KV at the start of a cycle"
        assert start == len(self.prompt) + self.emitted - 1, "start is not the committed length"
        assert pending == self.seq[start]
        assert 1 <= limit <= self.k
        j = self.schedule(len(self.expected))
        truth = self.seq[start + 1 : start + 1 + limit]
        if j >= limit:
            proposal, accepted = truth, limit
        else:
            proposal, accepted = [*truth[:j], (truth[j] + 1) % V], j
        with sm.drafting(self.kv_config):  # draft-only KV: layers 0 and 2 stay short
            sm.forward(torch.tensor([pending, *proposal[:-1]]), start=start, cache=cache)
        self.expected.append((len(proposal), accepted))
        return Draft(tuple(proposal), None)

    def observe(self, drafted: int, accepted: int) -> None:
        self.observed.append((drafted, accepted))


def _constant(j: int):
    return lambda cycle: j


def _record_crops(sm, monkeypatch) -> list[tuple[int, tuple[int, ...]]]:
    calls: list[tuple[int, tuple[int, ...]]] = []
    original = type(sm).crop

    def crop(cache, length):
        original(cache, length)
        calls.append((length, sm.cache_lengths(cache)))

    monkeypatch.setattr(sm, "crop", crop)
    return calls


@pytest.mark.parametrize("k", [1, 3, 5])
def test_rejections_of_every_length_keep_the_cache_exact(tiny_sm, references, monkeypatch, k):
    crops = _record_crops(tiny_sm, monkeypatch)
    caches, decode_cache = [], tiny_sm.decode_cache
    monkeypatch.setattr(tiny_sm, "decode_cache", lambda *a, **kw: caches.append(decode_cache(*a, **kw)) or caches[-1])
    schedules = {f"j={j}": _constant(j) for j in range(k + 1)}
    schedules["cycle"] = lambda cycle: cycle % (k + 1)
    schedules["random"] = lambda cycle, rng=random.Random(k): rng.randrange(k + 1)
    for prompt_name in ("one-token", "random-12"):
        ids = PROMPTS[prompt_name]
        ar, _ = references[prompt_name]
        for label, schedule in schedules.items():
            crops.clear()
            drafter = ScriptedDrafter(ids, ar.token_ids, k=k, schedule=schedule)
            result = generate(tiny_sm, ids, config=DraftConfig(max_draft_tokens=k), drafter=drafter,
                              max_new_tokens=MAX_NEW, eos_token_ids=(), on_tokens=drafter.on_tokens)
            where = f"k={k} {label} {prompt_name}"
            assert result.token_ids == ar.token_ids, where
            assert drafter.observed == drafter.expected, where
            assert drafter.emitted == MAX_NEW
            check_stats(result, prompt_len=len(ids), max_k=k)
            assert result.stats.accepted_tokens == sum(a for _, a in drafter.expected)
            assert result.stats.final_threshold is None
            # every crop leaves all layers at exactly the requested length; every cycle starts on exactly the
            # committed tokens (prompt + emitted - pending: the drafter checks), and so does the decode end
            assert crops and all(lengths == (n,) * tiny_sm.num_layers for n, lengths in crops), where
            assert tiny_sm.cache_lengths(caches[-1]) == (len(ids) + MAX_NEW - 1,) * tiny_sm.num_layers, where
            if label.startswith("j="):
                j = int(label[2:])
                assert all(a == min(j, d) for d, a in drafter.observed), where


def test_garbage_drafter_is_always_rejected_and_output_unchanged(tiny_sm, references):
    for prompt_name, ids in PROMPTS.items():
        ar, _ = references[prompt_name]
        drafter = ScriptedDrafter(ids, ar.token_ids, k=4, schedule=lambda cycle: 0)
        # make it garbage all the way: a wrong first token followed by random tokens
        inner = drafter.draft

        def garbage(sm, cache, *, limit, inner=inner, rng=random.Random(len(ids)), **kw):
            d = inner(sm, cache, limit=limit, **kw)
            return Draft((*d.tokens, *(rng.randrange(V) for _ in range(limit - 1))), None)

        drafter.draft = garbage
        result = generate(tiny_sm, ids, config=DraftConfig(max_draft_tokens=4), drafter=drafter,
                          max_new_tokens=MAX_NEW, eos_token_ids=(), on_tokens=drafter.on_tokens)
        assert result.token_ids == ar.token_ids
        s = result.stats
        assert s.acceptance_rate == 0.0 and s.accepted_tokens == 0 and s.drafted_tokens > 0
        assert s.verify_steps == s.new_tokens - 1 and s.tau == 1.0
        assert all(a == 0 for _, a in drafter.observed)


# -- stats, limits, EOS --------------------------------------------------------------------------------
@pytest.mark.parametrize("max_new", [1, 2, 3, 4, 5, 7, 11])
def test_max_new_tokens_is_respected_exactly(tiny_sm, references, max_new):
    ids = PROMPTS["random-12"]
    ar_full, _ = references["random-12"]
    always_right = ScriptedDrafter(ids, ar_full.token_ids, k=4, schedule=lambda cycle: 4)
    runs = {
        "ar": generate(tiny_sm, ids, config=None, max_new_tokens=max_new, eos_token_ids=()),
        "noskip-noexit": generate(tiny_sm, ids, config=DraftConfig(max_draft_tokens=4, exit=NO_EXIT),
                                  max_new_tokens=max_new, eos_token_ids=()),
        "always-right": generate(tiny_sm, ids, config=DraftConfig(max_draft_tokens=4), drafter=always_right,
                                 max_new_tokens=max_new, eos_token_ids=(), on_tokens=always_right.on_tokens),
    }
    for name, result in runs.items():
        assert len(result.token_ids) == result.stats.new_tokens == max_new, name
        assert result.token_ids == ar_full.token_ids[:max_new], name
        check_stats(result, prompt_len=len(ids), max_k=4)
    assert runs["ar"].stats.verify_steps == max_new - 1
    # always right: ceil((max_new - 1) / 5) verify steps, and drafts never overshoot
    assert runs["always-right"].stats.verify_steps == math.ceil((max_new - 1) / 5)
    assert runs["always-right"].stats.acceptance_rate in (None, 1.0)


def test_bad_arguments_raise():
    sm = make_tiny_model(num_layers=1, vocab_size=8)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(sm, [1, 2], max_new_tokens=0, eos_token_ids=())
    with pytest.raises(ValueError, match="empty"):
        generate(sm, [], max_new_tokens=3, eos_token_ids=())
    with pytest.raises(ConfigError):
        generate(sm, [1, 2], config=DraftConfig(skip_attn=(1,)), max_new_tokens=3, eos_token_ids=())


def _eos_position(tokens) -> int:
    """The first position >= 5 (else >= 1) whose token did not occur earlier."""
    for lo in (5, 1):
        for p in range(lo, len(tokens)):
            if tokens[p] not in tokens[:p]:
                return p
    raise AssertionError("no usable EOS position")


@pytest.mark.parametrize("prompt_name", ["short", "random-12"])
def test_eos_stops_generation_with_the_eos_included(tiny_sm, references, prompt_name):
    ids = PROMPTS[prompt_name]
    ar, _ = references[prompt_name]
    p = _eos_position(ar.token_ids)
    eos = ar.token_ids[p]
    always_right = ScriptedDrafter(ids, ar.token_ids, k=6, schedule=lambda cycle: 6)
    runs = {
        "ar": generate(tiny_sm, ids, config=None, max_new_tokens=MAX_NEW, eos_token_ids=(eos,)),
        "noskip-noexit": generate(tiny_sm, ids, config=DraftConfig(max_draft_tokens=6, exit=NO_EXIT),
                                  max_new_tokens=MAX_NEW, eos_token_ids=[eos, V + 5]),
        "mixed": generate(tiny_sm, ids, config=CONFIGS["mixed-noexit"], max_new_tokens=MAX_NEW, eos_token_ids=(eos,)),
        # EOS in the middle of a block of accepted drafts
        "always-right": generate(tiny_sm, ids, config=DraftConfig(max_draft_tokens=6), drafter=always_right,
                                 max_new_tokens=MAX_NEW, eos_token_ids=(eos,), on_tokens=always_right.on_tokens),
    }
    for name, result in runs.items():
        assert result.token_ids == ar.token_ids[: p + 1], name
        assert result.token_ids[-1] == eos and result.stats.new_tokens == p + 1, name
        check_stats(result, prompt_len=len(ids), max_k=6, eos_hit=True)
    assert runs["ar"].stats.verify_steps == p
    # the streamed tokens are exactly the returned ones (EOS included, nothing after it)
    streamed = []
    result = generate(tiny_sm, ids, config=CONFIGS["noskip-K4-noexit"], max_new_tokens=MAX_NEW,
                      eos_token_ids=(eos,), on_tokens=streamed.extend)
    assert tuple(streamed) == result.token_ids


def test_eos_as_the_first_token_stops_after_prefill(tiny_sm, references):
    ar, _ = references["short"]
    result = generate(tiny_sm, PROMPTS["short"], config=CONFIGS["noskip-K4"], max_new_tokens=MAX_NEW,
                      eos_token_ids=(ar.token_ids[0],))
    assert result.token_ids == ar.token_ids[:1]
    assert result.stats.verify_steps == 0 and result.stats.drafted_tokens == 0 and result.stats.tau == 1.0


def test_default_eos_comes_from_the_model(tiny_sm, references, monkeypatch):
    ar, _ = references["random-12"]
    p = _eos_position(ar.token_ids)
    monkeypatch.setattr(tiny_sm.hf.generation_config, "eos_token_id", [V + 1, ar.token_ids[p]])
    assert tiny_sm.eos_token_ids == (V + 1, ar.token_ids[p])
    result = generate(tiny_sm, PROMPTS["random-12"], config=CONFIGS["attn1"], max_new_tokens=MAX_NEW)
    assert result.token_ids == ar.token_ids[: p + 1]


# -- draft exit ------------------------------------------------------------------------------------
class _SpyDrafter(LayerSkipDrafter):
    def __init__(self, config):
        super().__init__(config)
        self.observed: list[tuple[int, int]] = []

    def observe(self, drafted, accepted):
        self.observed.append((drafted, accepted))
        super().observe(drafted, accepted)


def test_exit_threshold_one_drafts_one_token_and_zero_drafts_to_k(tiny_sm, references):
    ids = PROMPTS["random-12"]
    ar, _ = references["random-12"]
    one = _SpyDrafter(DraftConfig(skip_mlp=(1,), max_draft_tokens=5, exit=ExitRule(threshold=1.0, adaptive=False)))
    r1 = generate(tiny_sm, ids, config=one.config, drafter=one, max_new_tokens=MAX_NEW, eos_token_ids=())
    assert r1.token_ids == ar.token_ids
    assert one.observed and all(k == 1 for k, _ in one.observed)
    full = _SpyDrafter(DraftConfig(skip_mlp=(1,), max_draft_tokens=5, exit=NO_EXIT))
    emitted = [0]
    r2 = generate(tiny_sm, ids, config=full.config, drafter=full, max_new_tokens=MAX_NEW, eos_token_ids=(),
                  on_tokens=lambda toks: emitted.__setitem__(0, emitted[0] + len(toks)))
    assert r2.token_ids == ar.token_ids
    # a threshold of 0 always drafts K, except where max_new_tokens leaves room for fewer
    assert all(k <= 5 for k, _ in full.observed) and full.observed[0][0] == 5
    assert r2.stats.drafted_tokens == sum(k for k, _ in full.observed)


def _adaptive_run(tiny_sm, references, j):
    ids = PROMPTS["short"]
    ar, _ = references["short"]
    config = DraftConfig(skip_attn=(1,), max_draft_tokens=3, exit=ExitRule(threshold=0.6, adaptive=True))

    class Scripted(_SpyDrafter):  # real adaptive γ, scripted proposals
        def __init__(self):
            super().__init__(config)
            self.script = ScriptedDrafter(ids, ar.token_ids, k=3, schedule=lambda cycle: j)

        def draft(self, sm, cache, **kw):
            return self.script.draft(sm, cache, **kw)

    drafter = Scripted()
    result = generate(tiny_sm, ids, config=config, drafter=drafter, max_new_tokens=MAX_NEW, eos_token_ids=(),
                      on_tokens=drafter.script.on_tokens)
    assert result.token_ids == ar.token_ids
    assert result.stats.final_threshold == drafter.gamma
    return result, drafter


def test_adaptive_exit_raises_the_threshold_when_drafts_are_rejected(tiny_sm, references):
    result, drafter = _adaptive_run(tiny_sm, references, j=0)
    assert result.stats.acceptance_rate == 0.0
    assert result.stats.final_threshold > 0.6
    # each step moves γ by (1 - β2)·ε = 0.001 while AR <= α
    assert result.stats.final_threshold == pytest.approx(0.6 + 0.001 * len(drafter.observed))


def test_adaptive_exit_lowers_the_threshold_when_drafts_are_accepted(tiny_sm, references):
    result, drafter = _adaptive_run(tiny_sm, references, j=3)
    assert result.stats.acceptance_rate == 1.0
    assert result.stats.final_threshold < 0.6
    assert result.stats.final_threshold == pytest.approx(0.6 - 0.001 * len(drafter.observed))


def test_adaptive_update_rule_by_hand():
    rule = ExitRule(threshold=0.5, adaptive=True, target_acceptance=0.7, step=0.1, beta1=0.4, beta2=0.8)
    d = LayerSkipDrafter(DraftConfig(exit=rule))
    assert d.threshold == 0.5
    d.observe(0, 0)  # nothing drafted: no update, AR not started
    assert d.threshold == 0.5
    # step 1: AR = AR_e = 1/4 (no smoothing on the first) <= 0.7 -> γ̃ = 0.6; γ = 0.8·0.5 + 0.2·0.6
    d.observe(4, 1)
    ar, gamma = 0.25, 0.8 * 0.5 + 0.2 * 0.6
    assert d.threshold == pytest.approx(gamma) == pytest.approx(0.52)
    # step 2: AR = 0.4·0.25 + 0.6·1.0 = 0.7 <= 0.7 (boundary: still "<=") -> γ̃ = γ + 0.1
    d.observe(3, 3)
    ar = 0.4 * ar + 0.6 * 1.0
    assert ar == pytest.approx(0.7)
    gamma = 0.8 * gamma + 0.2 * (gamma + 0.1)
    assert d.threshold == pytest.approx(gamma) == pytest.approx(0.54)
    # step 3: AR = 0.4·0.7 + 0.6·1.0 = 0.88 > 0.7 -> γ̃ = γ - 0.1
    d.observe(2, 2)
    gamma = 0.8 * gamma + 0.2 * (gamma - 0.1)
    assert d.threshold == pytest.approx(gamma) == pytest.approx(0.52)
    # step 4: AR = 0.4·0.88 + 0.6·0 = 0.352 -> up again
    d.observe(5, 0)
    assert d.threshold == pytest.approx(0.54)


def test_adaptive_update_is_clamped_and_off_when_not_adaptive():
    up = LayerSkipDrafter(DraftConfig(exit=ExitRule(threshold=1.0, step=1.0, beta2=0.0)))
    up.observe(4, 0)
    assert up.threshold == 1.0
    down = LayerSkipDrafter(DraftConfig(exit=ExitRule(threshold=0.0, step=1.0, beta2=0.0)))
    down.observe(4, 4)
    assert down.threshold == 0.0
    fixed = LayerSkipDrafter(DraftConfig(exit=ExitRule(threshold=0.4, adaptive=False)))
    for drafted, accepted in [(4, 0), (4, 4), (2, 1)]:
        fixed.observe(drafted, accepted)
    assert fixed.threshold == 0.4


# -- process_logits ----------------------------------------------------------------------------------
PROBS = torch.tensor([0.05, 0.5, 0.1, 0.2, 0.15])  # sorted: 0.5 (1), 0.2 (3), 0.15 (4), 0.1 (2), 0.05 (0)


def test_temperature_scales_logits_and_probabilities_sum_to_one():
    logits = torch.randn(3, 7, generator=torch.Generator().manual_seed(0)) * 3
    for t in (0.3, 1.0, 2.5):
        probs = process_logits(logits, SamplingParams(temperature=t))
        torch.testing.assert_close(probs, (logits / t).softmax(-1))
        torch.testing.assert_close(probs.sum(-1), torch.ones(3))
    sharp = process_logits(logits, SamplingParams(temperature=0.3)).max(-1).values
    flat = process_logits(logits, SamplingParams(temperature=2.5)).max(-1).values
    assert (sharp > flat).all()


@pytest.mark.parametrize("k", [1, 2, 3, 5, 9])
def test_top_k_keeps_exactly_k_tokens(k):
    logits = torch.randn(4, 9, generator=torch.Generator().manual_seed(k))
    probs = process_logits(logits, SamplingParams(temperature=1.0, top_k=k))
    assert ((probs > 0).sum(-1) == min(k, 9)).all()
    kept = probs > 0
    assert torch.equal(kept, torch.zeros_like(kept).scatter(-1, logits.topk(min(k, 9), -1).indices, True))
    torch.testing.assert_close(probs.sum(-1), torch.ones(4))
    # the kept tokens keep their relative probabilities
    full = logits.softmax(-1)
    torch.testing.assert_close(probs, torch.where(kept, full, 0.0) / torch.where(kept, full, 0.0).sum(-1, True))


@pytest.mark.parametrize(
    ("top_p", "kept"),
    [(0.3, [1]), (0.5, [1]), (0.69, [1, 3]), (0.71, [1, 3, 4]), (0.84, [1, 3, 4]), (0.9, [1, 3, 4, 2]),
     (0.96, [0, 1, 2, 3, 4]), (1.0, [0, 1, 2, 3, 4])],
)
def test_top_p_keeps_the_smallest_prefix_reaching_p(top_p, kept):
    probs = process_logits(PROBS.log(), SamplingParams(temperature=1.0, top_p=top_p))
    assert sorted(torch.nonzero(probs).flatten().tolist()) == sorted(kept)
    want = torch.zeros(5)
    want[kept] = PROBS[kept] / PROBS[kept].sum()
    torch.testing.assert_close(probs, want)


def test_top_k_applies_before_top_p():
    # top-3 renormalises to 0.588, 0.235, 0.176: top_p = 0.8 then keeps 2 tokens (3 without top-k)
    probs = process_logits(PROBS.log(), SamplingParams(temperature=1.0, top_k=3, top_p=0.8))
    assert sorted(torch.nonzero(probs).flatten().tolist()) == [1, 3]
    only_p = process_logits(PROBS.log(), SamplingParams(temperature=1.0, top_p=0.8))
    assert sorted(torch.nonzero(only_p).flatten().tolist()) == [1, 3, 4]


@pytest.mark.parametrize(
    "sampling",
    [SamplingParams(temperature=0.7, top_k=10), SamplingParams(temperature=1.3, top_p=0.8),
     SamplingParams(temperature=0.9, top_k=20, top_p=0.6)],
)
def test_process_logits_matches_hf_warpers(sampling):
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(7)) * 2
    hf = TemperatureLogitsWarper(sampling.temperature)(None, logits.clone())
    if sampling.top_k:
        hf = TopKLogitsWarper(sampling.top_k)(None, hf)
    if sampling.top_p < 1.0:
        hf = TopPLogitsWarper(sampling.top_p)(None, hf)
    torch.testing.assert_close(process_logits(logits, sampling), hf.softmax(-1))


# -- sampling: lossless in distribution ----------------------------------------------------------------
SAMPLE_V = 16
SAMPLE_PROMPT = [3, 9, 4]
SAMPLE_DRAFT = DraftConfig(skip_attn=(1, 2), skip_mlp=(3,), max_draft_tokens=2, exit=NO_EXIT)
Z_1E4 = 3.719  # standard normal quantile for a one-sided 1e-4 tail


@pytest.fixture(scope="module")
def sampling_sm():
    # vocab 16 with a 10x LM head: next-token entropy ~2.3 nats of 2.77, top probability ~0.3
    return make_tiny_model(vocab_size=SAMPLE_V, head_scale=10.0, name="tiny16")


def _chi2_critical(df: int, z: float = Z_1E4) -> float:
    """Wilson-Hilferty approximation of the chi-square upper quantile."""
    c = 2.0 / (9.0 * df)
    return df * (1.0 - c + z * math.sqrt(c)) ** 3


def _chi2(observed: torch.Tensor, expected: torch.Tensor, n: int) -> tuple[float, int]:
    """Chi-square statistic and df, cells with expected count < 5 pooled into one."""
    e = expected.flatten().double() * n
    o = observed.flatten().double()
    small = e < 5
    cells_e = [*e[~small].tolist()]
    cells_o = [*o[~small].tolist()]
    if small.any():
        cells_e.append(float(e[small].sum()))
        cells_o.append(float(o[small].sum()))
    stat = sum((oi - ei) ** 2 / ei for oi, ei in zip(cells_o, cells_e, strict=True) if ei > 0)
    return stat, len(cells_e) - 1


def _exact_target(sm, sampling) -> tuple[torch.Tensor, torch.Tensor]:
    """p(t1) [V] and P(t2, t3) [V, V] = sum_t1 p(t1) p(t2|t1) p(t3|t1,t2), by enumeration."""
    L = len(SAMPLE_PROMPT)
    grid = torch.cartesian_prod(torch.arange(SAMPLE_V), torch.arange(SAMPLE_V))  # [V*V, 2]: (t1, t2)
    ids = torch.cat([torch.tensor(SAMPLE_PROMPT).expand(len(grid), L), grid], dim=1)  # [V*V, L+2]
    with torch.inference_mode():
        logits = sm.hf(input_ids=ids).logits.double()  # [V*V, L+2, V]
    p = process_logits(logits[:, L - 1 :], sampling).view(SAMPLE_V, SAMPLE_V, 3, SAMPLE_V)
    p1 = p[0, 0, 0]  # [V]
    p2 = p[:, 0, 1]  # [t1, t2]
    p3 = p[:, :, 2]  # [t1, t2, t3]
    joint = (p1[:, None, None] * p2[:, :, None] * p3).sum(0)  # [t2, t3]
    return p1, joint


def _draft_first(sm, sampling) -> torch.Tensor:
    """q(t2 | t1) as the drafter sees it: full-model KV for the prompt, then the draft on t1."""
    L = len(SAMPLE_PROMPT)
    cache = sm.new_cache()
    sm.forward(torch.tensor(SAMPLE_PROMPT), start=0, cache=cache)
    rows = []
    for t1 in range(SAMPLE_V):
        with sm.drafting(SAMPLE_DRAFT):
            rows.append(process_logits(sm.forward(torch.tensor([t1]), start=L, cache=cache)[-1].double(), sampling))
        sm.crop(cache, L)
    return torch.stack(rows)  # [t1, V]


def run_sampling_check(sm, sampling: SamplingParams, n: int) -> dict:
    """Sample (t2, t3) n times through the speculative path; return the chi-square verdicts.

    t1 comes from the prefill (plain sampling); with K = 2 and max_new_tokens = 4 the first
    cycle drafts two tokens, so t2 and t3 are what rejection sampling produced (accepted drafts,
    residual draws or the bonus token), or t3 comes from the next cycle after an early rejection.
    """
    p1, joint = _exact_target(sm, sampling)
    p2_marg, p3_marg = joint.sum(1), joint.sum(0)
    counts = torch.zeros(SAMPLE_V, SAMPLE_V, dtype=torch.float64)
    outcomes = [0, 0, 0]  # first-cycle accepted count a = 0, 1, 2
    for seed in range(n):
        drafter = _SpyDrafter(SAMPLE_DRAFT)
        out = generate(sm, SAMPLE_PROMPT, config=SAMPLE_DRAFT, drafter=drafter, sampling=sampling,
                       max_new_tokens=4, eos_token_ids=(), seed=seed).token_ids
        assert len(out) == 4 and drafter.observed[0][0] == 2
        counts[out[1], out[2]] += 1
        outcomes[drafter.observed[0][1]] += 1
    impossible = float(counts[joint == 0].sum())
    tests = {}
    for name, obs, exp in (("joint", counts, joint), ("t2", counts.sum(1), p2_marg), ("t3", counts.sum(0), p3_marg)):
        stat, df = _chi2(obs, exp, n)
        tests[name] = (stat, df, _chi2_critical(df))
    return {"tests": tests, "impossible": impossible, "outcomes": outcomes, "p1": p1, "joint": joint}


@pytest.mark.parametrize(
    "sampling",
    [SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_k=8, top_p=0.9)],
    ids=["t1.0", "t0.8-topk8-topp0.9"],
)
def test_speculative_sampling_matches_the_target_distribution(sampling_sm, sampling):
    sm = sampling_sm
    n = 3000
    # 1. the draft really differs from the target: expected TV of the first draft token > 0.05
    p1, joint = _exact_target(sm, sampling)
    L = len(SAMPLE_PROMPT)
    with torch.inference_mode():
        full = sm.hf(input_ids=torch.cat(
            [torch.tensor(SAMPLE_PROMPT).expand(SAMPLE_V, L), torch.arange(SAMPLE_V)[:, None]], dim=1
        )).logits.double()
    p2 = process_logits(full[:, -1], sampling)  # [t1, V]
    q2 = _draft_first(sm, sampling)  # [t1, V]
    tv = float((p1 * 0.5 * (p2 - q2).abs().sum(-1)).sum())
    assert tv > 0.05, f"draft too close to the target (TV {tv:.3f}): the test would not catch a broken sampler"
    # ... and the check has power: "always accept the draft" would shift t2 to sum_t1 p1·q2,
    # whose chi-square noncentrality must far exceed the critical value
    broken_t2 = (p1[:, None] * q2).sum(0)
    lam = n * float((((broken_t2 - joint.sum(1)) ** 2) / joint.sum(1).clamp_min(1e-12)).sum())
    assert lam > 4 * _chi2_critical(SAMPLE_V - 1), f"noncentrality {lam:.0f} too small"
    # 2. the empirical (t2, t3) distribution of speculative sampling matches the target
    result = run_sampling_check(sm, sampling, n)
    for name, (stat, df, crit) in result["tests"].items():
        assert stat < crit, f"{name}: chi2 {stat:.1f} >= {crit:.1f} (df {df}), TV draft/target {tv:.3f}"
    assert result["impossible"] == 0, "sampled a token the target gives probability 0"
    # every path of the first cycle ran often: reject d1, accept d1 and reject d2, accept both
    assert min(result["outcomes"]) > 0.03 * n, f"rejection paths not all exercised: {result['outcomes']}"


def test_sampling_is_reproducible_per_seed(sampling_sm):
    sampling = SamplingParams(temperature=1.0)
    runs = [generate(sampling_sm, SAMPLE_PROMPT, config=SAMPLE_DRAFT, sampling=sampling, max_new_tokens=12,
                     eos_token_ids=(), seed=s).token_ids for s in (5, 5, 6, 7)]
    assert runs[0] == runs[1]
    assert len(set(runs[1:])) == 3


# -- the real model --------------------------------------------------------------------------------------
REAL_NEW = 64
REAL_CONFIGS = {
    "noskip-K4": DraftConfig(max_draft_tokens=4),
    "attn-only": DraftConfig(skip_attn=(3, 7, 11, 15, 19), max_draft_tokens=4),
    "mlp-only": DraftConfig(skip_mlp=(5, 9, 13), max_draft_tokens=4),
    "mixed": DraftConfig(skip_attn=(4, 8, 12, 16, 20, 24), skip_mlp=(6, 12, 18), max_draft_tokens=3),
    "bad-only-layer-0": DraftConfig(skip_attn=tuple(range(1, 30)), skip_mlp=tuple(range(1, 30)), max_draft_tokens=4),
}
REAL_PROMPTS = 8


def _real_configs_for(index: int) -> list[str]:
    # two configs per prompt, rotating: each config meets 3-4 prompts from both sets
    names = list(REAL_CONFIGS)
    return [names[index % len(names)], names[(index + 2) % len(names)]]


@pytest.fixture(scope="module")
def real_prompts(real_sm, encode_offline):
    prompts = encode_offline(real_sm, "mtbench,humaneval", n=REAL_PROMPTS, seed=0)
    assert len(prompts) == REAL_PROMPTS
    assert {name.split(":")[0] for name, _ in prompts} == {"mtbench", "humaneval"}
    return prompts


@pytest.mark.model
@pytest.mark.parametrize("index", range(REAL_PROMPTS))
def test_real_model_greedy_speculative_equals_hf_generate(real_sm, real_prompts, index):
    name, ids = real_prompts[index]
    reference = hf_generate(real_sm, ids, max_new_tokens=REAL_NEW)
    assert 0 < len(reference) <= REAL_NEW
    for config_name in _real_configs_for(index):
        config = REAL_CONFIGS[config_name]
        result = generate(real_sm, ids, config=config, max_new_tokens=REAL_NEW)
        assert result.token_ids == reference, f"{config_name} on {name}"
        check_stats(result, prompt_len=len(ids), max_k=config.max_draft_tokens,
                    eos_hit=len(reference) < REAL_NEW)
        rate = result.stats.acceptance_rate
        if config_name == "noskip-K4":  # the draft is the target itself (up to float noise)
            assert rate is not None and rate >= 0.9, rate
        elif config_name == "bad-only-layer-0":  # one layer of 30 cannot predict much
            assert rate is not None and rate <= 0.3, rate
    if index == 0:  # plain autoregressive decoding on the same engine, once
        assert generate(real_sm, ids, config=None, max_new_tokens=REAL_NEW).token_ids == reference


@pytest.mark.model
def test_real_model_skip_configs_fit_the_model(real_sm):
    assert real_sm.num_layers == 30
    for config in REAL_CONFIGS.values():
        config.check_layers(real_sm.num_layers)
    with pytest.raises(ConfigError):
        DraftConfig(skip_attn=(30,)).check_layers(real_sm.num_layers)


def test_a_drafter_s_own_figures_reach_the_stats(tiny_sm, references):
    class Reporting(LayerSkipDrafter):
        def report(self):
            return (("cycles_seen", float(len(self.seen))),)

        seen: list = []

        def observe(self, drafted, accepted):
            self.seen = [*self.seen, (drafted, accepted)]
            super().observe(drafted, accepted)

    config = DraftConfig(skip_mlp=(1,), max_draft_tokens=3, exit=NO_EXIT)
    drafter = Reporting(config)
    result = generate(tiny_sm, PROMPTS["random-12"], config=config, drafter=drafter, max_new_tokens=MAX_NEW,
                      eos_token_ids=())
    assert result.stats.drafter_stats == (("cycles_seen", float(result.stats.verify_steps)),)
    plain = generate(tiny_sm, PROMPTS["random-12"], config=config, max_new_tokens=MAX_NEW, eos_token_ids=())
    assert plain.stats.drafter_stats == ()
