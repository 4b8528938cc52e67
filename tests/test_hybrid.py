"""Hybrid drafts (``method: hybrid``): lookup first, a fallback source on a miss.

Greedy identity (tiny and real model, every fallback), what each source contributed, exact sampling
(and a drafter that hands the verifier the wrong source's q fails the same check), the surrogate, the
parameter errors, and the ``hybrid`` strategy with ``optimize`` end to end.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import yaml
from clocks import work_clock
from conftest import assert_one_line_error, make_tiny_model
from test_ngram import MUTANT_SAMPLES, chi2_fails, exact_joint, ngram, sample_pairs
from typer.testing import CliRunner

from skipsearch import methods
from skipsearch.cli import app
from skipsearch.config import NO_EXIT, Candidate, ConfigError, DraftConfig, ExitRule, SamplingParams
from skipsearch.engine.decoding import Draft, generate, hf_generate
from skipsearch.engine.surrogate import calibrate
from skipsearch.methods.fractal import METHOD as FRACTAL
from skipsearch.methods.fractal import FractalParams
from skipsearch.methods.hybrid import METHOD as HYBRID
from skipsearch.methods.hybrid import NONE, HybridDrafter, HybridParams
from skipsearch.methods.layer_skip import METHOD as LAYER_SKIP
from skipsearch.methods.layer_skip import LayerSkipParams, frequent_tokens
from skipsearch.methods.precision import METHOD as PRECISION
from skipsearch.profile import ModelRef, Profile, load_profile, profile_to_dict, save_profile
from skipsearch.search import optimize as opt
from skipsearch.search.objective import ModelObjective
from skipsearch.search.space import SearchSpace
from skipsearch.search.strategies import make_strategy

PROMPTS = ([1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [5, 9, 2, 33, 7, 5, 9], [40, 41, 42, 43, 40, 41], [7], [30, 31, 32])
SAMPLES = 1500


def hybrid(draft: DraftConfig, *, min_n: int = 1, max_n: int = 3, fallback: str = LAYER_SKIP.name,
           fallback_k: int | None = None, head: LayerSkipParams | None = None, **theirs) -> Candidate:
    pairs = (head.to_pairs() if head is not None else ()) + tuple(theirs.items())
    return Candidate(HYBRID.name, draft, HybridParams(min_n, max_n, fallback, fallback_k, pairs).to_pairs())


def _tiny_candidates(num_layers: int) -> dict[str, Candidate]:
    mid = num_layers // 2
    skip = DraftConfig(skip_attn=(mid,), skip_mlp=(mid + 1,), max_draft_tokens=4)
    return {
        "layer-skip": hybrid(skip, fallback_k=2),
        "layer-skip-trimmed": hybrid(skip, head=LayerSkipParams.trimmed(range(0, 64, 2))),
        "layer-skip-no-exit": hybrid(dataclasses.replace(skip, exit=NO_EXIT), min_n=2, max_n=2, fallback_k=1),
        "fractal": hybrid(DraftConfig(max_draft_tokens=5, exit=NO_EXIT), fallback=FRACTAL.name,
                          **dict(FractalParams(n=1, w=1, quantization="int8-dynamic").to_pairs())),
        "none": hybrid(DraftConfig(max_draft_tokens=4, exit=NO_EXIT), fallback=NONE),
    }


# -- greedy identity and the sources' shares -----------------------------------------------------------------
@pytest.mark.parametrize("name", list(_tiny_candidates(4)))
def test_greedy_equals_hf_greedy_on_the_tiny_model(tiny_sm, name):
    candidate = _tiny_candidates(tiny_sm.num_layers)[name]
    totals = dict.fromkeys(("drafted", "accepted", "ngram", "fallback"), 0)
    for prompt in PROMPTS:
        result = generate(tiny_sm, prompt, drafter=methods.build_drafter(candidate, tiny_sm), max_new_tokens=30)
        assert result.token_ids == hf_generate(tiny_sm, prompt, max_new_tokens=30)
        s = result.stats
        report = dict(s.drafter_stats)
        # every cycle looks up; a miss goes to the fallback; each source's tokens add up to the engine's
        assert report["fallback_cycles"] == (report["lookups"] - report["lookup_hits"] if name != NONE else 0)
        assert report["ngram_drafted"] + report["fallback_drafted"] == s.drafted_tokens
        # the draft model's forwards are the fallback's alone: a looked-up token takes none (bench's draft ms/forward)
        assert s.draft_steps == report["fallback_drafted"]
        assert report["ngram_accepted"] + report["fallback_accepted"] == s.accepted_tokens  # no EOS here
        # each source's time is counted where it ran: the lookup every cycle, the fallback only on a miss
        assert report["ngram_seconds"] > 0 and (report["fallback_seconds"] > 0) == (report["fallback_cycles"] > 0)
        totals["drafted"] += s.drafted_tokens
        totals["accepted"] += s.accepted_tokens
        totals["ngram"] += report["ngram_drafted"]
        totals["fallback"] += report["fallback_drafted"]
    assert totals["ngram"] > 0 and (totals["fallback"] > 0) == (name != NONE)
    if name == NONE:  # the lookup alone is exactly method ngram
        for prompt in PROMPTS:
            a = generate(tiny_sm, prompt, drafter=methods.build_drafter(candidate, tiny_sm), max_new_tokens=30).stats
            b = generate(tiny_sm, prompt, drafter=methods.build_drafter(ngram(1, 3, 4), tiny_sm),
                         max_new_tokens=30).stats
            assert (a.drafted_tokens, a.accepted_tokens, a.verify_steps) == (b.drafted_tokens, b.accepted_tokens,
                                                                              b.verify_steps)


def test_the_fallback_drafts_only_on_a_miss_and_its_exit_rule_still_adapts(tiny_sm):
    skip = DraftConfig(skip_attn=(2,), max_draft_tokens=4, exit=ExitRule(threshold=0.5, adaptive=True))
    drafter = methods.build_drafter(hybrid(skip, fallback_k=3), tiny_sm)
    calls = []
    inner = drafter.fallback.draft
    drafter.fallback.draft = lambda *a, **k: calls.append(k["limit"]) or inner(*a, **k)
    generate(tiny_sm, PROMPTS[1], drafter=drafter, max_new_tokens=30)
    report = dict(drafter.report())
    assert len(calls) == report["fallback_cycles"] > 0 and max(calls) <= 3
    assert drafter.threshold == drafter.fallback.threshold != 0.5  # γ moved with the fallback's own verdicts


def test_greedy_equals_hf_greedy_on_the_real_model(real_sm, encode_offline):
    prompts = [ids for _, ids in encode_offline(real_sm, "humaneval,mtbench", n=2, seed=0)]
    references = [hf_generate(real_sm, ids, max_new_tokens=40) for ids in prompts]
    head = LayerSkipParams.trimmed(frequent_tokens(prompts, 8192, real_sm.lm_head.weight.shape[0]))
    skip = DraftConfig(skip_attn=(16, 20, 24), max_draft_tokens=6, exit=ExitRule(threshold=0.5, adaptive=False))
    for candidate in (hybrid(skip, fallback_k=2), hybrid(skip, fallback_k=1, head=head)):
        sources = {"ngram": 0, "fallback": 0}
        for ids, reference in zip(prompts, references, strict=True):
            result = generate(real_sm, ids, drafter=methods.build_drafter(candidate, real_sm), max_new_tokens=40)
            assert result.token_ids == reference
            report = dict(result.stats.drafter_stats)
            sources["ngram"] += report["ngram_accepted"]
            sources["fallback"] += report["fallback_accepted"]
        assert sources["ngram"] > 0 and sources["fallback"] > 0, sources


# -- sampling --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sm16():
    return make_tiny_model(vocab_size=16, num_layers=4, head_scale=10.0, name="tiny16-hybrid")


@pytest.fixture(scope="module")
def prompt16(sm16) -> list[int]:
    # half the vocabulary, in the model's own greedy order: t1 is often in it (a lookup), often not (the fallback)
    return [5, 9, *generate(sm16, [5, 9], max_new_tokens=6, eos_token_ids=()).token_ids]


class WrongSourceQ(HybridDrafter):
    """A broken hybrid: on a lookup hit it hands the verifier the fallback's q instead of the one-hot."""

    def draft(self, sm, cache, **kw):
        d = super().draft(sm, cache, **kw)
        if self._last is self.lookup and d.probs is not None:
            other = self.fallback.draft(sm, cache, pending=kw["pending"], start=kw["start"], limit=len(d.tokens),
                                        sampling=kw["sampling"], generator=torch.Generator().manual_seed(1))
            return Draft(d.tokens, other.probs)
        return d


def test_sampling_follows_the_model_and_the_wrong_q_fails(sm16, prompt16):
    sampling = SamplingParams(temperature=1.0)
    candidate = hybrid(DraftConfig(skip_attn=(1, 2), max_draft_tokens=2, exit=NO_EXIT), min_n=1, max_n=2)
    params = HYBRID.parse(candidate.params, draft=candidate.draft, num_layers=sm16.num_layers)
    fb = params.fallback_candidate(candidate.draft)
    made: list[HybridDrafter] = []

    def make(cls=HybridDrafter):
        made.append(cls(params, 2, methods.build_drafter(fb, sm16), fb.draft.max_draft_tokens))
        return made[-1]

    joint = exact_joint(sm16, prompt16, sampling)
    counts, first = sample_pairs(sm16, prompt16, make, sampling, n=SAMPLES)
    assert chi2_fails(counts, joint, SAMPLES) == []
    assert min(first) > 0.05 * sum(first), first
    hits, misses = sum(d.lookup.hits for d in made), sum(d.cycles for d in made)
    assert hits > 0.2 * SAMPLES and misses > 0.2 * SAMPLES, (hits, misses)  # both sources drafted often
    bad, _ = sample_pairs(sm16, prompt16, lambda: make(WrongSourceQ), sampling, n=MUTANT_SAMPLES)
    assert chi2_fails(bad, joint, MUTANT_SAMPLES), "a hybrid that mixes up its sources' q passed the check"


# -- the surrogate ----------------------------------------------------------------------------------------------
def _measured(sm, cal, candidate):
    drafted = accepted = steps = emitted = 0
    for prompt in cal.prompts:
        s = generate(sm, prompt, drafter=methods.build_drafter(candidate, sm), max_new_tokens=cal.max_new_tokens).stats
        drafted, accepted = drafted + s.drafted_tokens, accepted + s.accepted_tokens
        steps, emitted = steps + s.verify_steps, emitted + s.new_tokens - 1
    return accepted / drafted, emitted / steps


def test_the_surrogate(tiny_sm):
    cal = calibrate(tiny_sm, list(PROMPTS), max_new_tokens=30)
    objective = ModelObjective(tiny_sm, cal)
    # fallback none is prompt lookup: the same prediction as method ngram's
    alone = objective.evaluate(hybrid(DraftConfig(max_draft_tokens=4, exit=NO_EXIT), fallback=NONE), kind="surrogate")
    lookup = objective.evaluate(ngram(1, 3, 4), kind="surrogate")
    assert (alone.acceptance_rate, alone.tau) == (lookup.acceptance_rate, lookup.tau)
    # a one-token fallback reads exactly what the trace read (full-model context, nothing drafted before it),
    # so the whole prediction is exact; the lookup part always is
    for head in (None, LayerSkipParams.trimmed(range(0, 64, 2))):
        candidate = hybrid(DraftConfig(skip_attn=(1,), skip_mlp=(2,), max_draft_tokens=4, exit=NO_EXIT),
                           fallback_k=1, head=head)
        predicted = objective.evaluate(candidate, kind="surrogate")
        assert (predicted.acceptance_rate, predicted.tau) == _measured(tiny_sm, cal, candidate)
        assert predicted.alpha is not None and 0 < predicted.cost_ratio
    with pytest.raises(ConfigError, match="has no surrogate: time it"):
        objective.evaluate(_tiny_candidates(4)["fractal"], kind="surrogate")


# -- bad parameters -----------------------------------------------------------------------------------------------
GOOD = {"min_n": 1, "max_n": 3, "fallback": LAYER_SKIP.name, "fallback_k": 2}


@pytest.mark.parametrize(
    ("params", "draft", "fragment"),
    [
        ({**GOOD, "min_n": 3, "max_n": 2}, None, "hybrid: method_params.min_n (3) must be <= max_n (2)"),
        ({**GOOD, "max_n": 0}, None, "hybrid: method_params.max_n must be an integer in 1..16, got 0"),
        ({**GOOD, "fallback": "eagle"}, None, "hybrid: method_params.fallback must be one of layer-skip, fractal, "
                                              "precision, none, got 'eagle'"),
        ({**GOOD, "fallback_k": 0}, None, "hybrid: method_params.fallback_k must be an integer >= 1, got 0"),
        ({**GOOD, "fallback_k": 5}, None, "hybrid: method_params.fallback_k (5) must be <= the draft's "
                                          "max_draft_tokens (4)"),
        ({**GOOD, "span": 1}, None, "hybrid: unknown key method_params.span (known with fallback layer-skip: min_n, "
                                    "max_n, fallback, fallback_k, vocab_subset, vocab_ids, vocab_sha256)"),
        ({**GOOD, **dict(LayerSkipParams.trimmed([1, 5]).to_pairs()), "vocab_sha256": "0" * 64}, None,
         "hybrid: fallback layer-skip: method_params.vocab_sha256 does not match vocab_ids"),
        ({"fallback": NONE, "fallback_k": 1}, None, "hybrid: with fallback none, method_params takes no fallback_k"),
        ({"fallback": NONE}, {"skip_attn": [3]}, "hybrid: draft.skip_attn and draft.skip_mlp must be empty with "
                                                 "fallback none"),
        ({"fallback": FRACTAL.name, "n": 1}, {"skip_attn": []},
         "hybrid: fallback fractal: missing required key method_params.w"),
        ({"fallback": FRACTAL.name, "n": 1, "w": 0}, {"skip_attn": []}, "hybrid: fallback fractal: "
                                                                        "method_params.w must be an integer in 1..64, "
                                                                        "got 0"),
        ({"fallback": FRACTAL.name, "n": 1, "w": 1}, None, "hybrid: draft.skip_attn and draft.skip_mlp must be empty "
                                                           "with fallback fractal"),
        ({**GOOD}, {"skip_attn": [31]}, "draft.skip_attn has layer index 31"),
    ],
)
def test_bad_params_are_one_line_errors(tmp_path, params, draft, fragment):
    prof = Profile(model=ModelRef(name="smollm2-135m", num_layers=30), method=HYBRID.name,
                   draft=DraftConfig(skip_attn=(12,), max_draft_tokens=4), method_params=tuple(GOOD.items()))
    raw = profile_to_dict(prof)
    raw["method_params"] = params
    raw["draft"].update(draft or {})
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert_one_line_error(CliRunner().invoke(app, ["profile", "validate", str(path)]), fragment)
    assert_one_line_error(CliRunner().invoke(app, ["decode", "--profile", str(path), "--prompt", "x"]), fragment)


def test_a_fallback_head_beyond_the_vocabulary_fails_when_the_drafter_is_built(tiny_sm):
    skip = DraftConfig(skip_attn=(1,), max_draft_tokens=2)
    with pytest.raises(methods.ParamsError, match="^hybrid: fallback layer-skip: method_params.vocab_ids has token "
                                                  "99, but the model's vocabulary has 64 tokens"):
        methods.build_drafter(hybrid(skip, head=LayerSkipParams.trimmed([3, 99])), tiny_sm)


def test_a_plain_decoding_hybrid_profile_is_valid(tmp_path):
    # what optimize ships when nothing pays: K = 0 and no skip sets, the best parameters kept
    prof = Profile(model=ModelRef(name="tiny", num_layers=4), method=HYBRID.name,
                   draft=DraftConfig(max_draft_tokens=0, exit=NO_EXIT), method_params=tuple(GOOD.items()))
    assert load_profile(save_profile(prof, tmp_path / "plain.yaml")) == prof


# -- a new draft source is a fallback by its own hooks (issue 40) -----------------------------------------------------
@pytest.fixture
def toy_source():
    """tests/toy_method.py's draft source, registered for one test."""
    import toy_method

    methods.register(toy_method.SOURCE_METHOD)  # the one registry line a new draft source adds
    try:
        yield toy_method
    finally:
        methods.unregister(toy_method.SOURCE)


def test_a_new_draft_source_is_a_hybrid_fallback_by_its_hooks_alone(tiny_sm, toy_source):
    """The toy draft source is the model under its skip sets, as layer-skip with the full head is, and says so only
    through its hooks (a drafter, drafts_alone, Tracing): a hybrid drafts, predicts, keeps and re-plans through it
    exactly as through layer-skip, and nothing in hybrid names it."""
    from skipsearch.files.cost_profile import CostModelRef, CostProfile
    from skipsearch.files.costs import Costs
    from skipsearch.methods import Keeping
    from skipsearch.profile import Measured
    from skipsearch.search import replan as device_replan

    name = toy_source.SOURCE
    with pytest.raises(methods.ParamsError, match=f"must be one of layer-skip, fractal, precision, {name}, none, "
                                                  f"got 'eagle'"):
        HybridParams(fallback="eagle")
    skip = DraftConfig(skip_attn=(1,), skip_mlp=(2,), max_draft_tokens=4, exit=NO_EXIT)
    toy, ref = hybrid(skip, fallback=name, fallback_k=2), hybrid(skip, fallback_k=2)
    # its skip sets are its own (a traced draft's), so the profile's draft may carry them
    HYBRID.parse(toy.params, draft=toy.draft, num_layers=tiny_sm.num_layers)
    # 1. decoding: the source drafts on the lookup's misses, and greedy output is the full model's
    for prompt in PROMPTS:
        a = generate(tiny_sm, prompt, drafter=methods.build_drafter(toy, tiny_sm), max_new_tokens=30)
        b = generate(tiny_sm, prompt, drafter=methods.build_drafter(ref, tiny_sm), max_new_tokens=30)
        assert a.token_ids == b.token_ids == hf_generate(tiny_sm, prompt, max_new_tokens=30)
        ra, rb = dict(a.stats.drafter_stats), dict(b.stats.drafter_stats)
        assert [ra[k] for k in ("fallback_cycles", "fallback_drafted", "fallback_accepted")] == [
            rb[k] for k in ("fallback_cycles", "fallback_drafted", "fallback_accepted")]
    # 2. the surrogate replays the traces its Tracing.measure gives
    cal = calibrate(tiny_sm, list(PROMPTS), max_new_tokens=30)
    objective = ModelObjective(tiny_sm, cal)
    p, q = objective.evaluate(toy, kind="surrogate"), objective.evaluate(ref, kind="surrogate")
    assert p.alpha is not None and p.cost_ratio > 0
    assert (p.acceptance_rate, p.tau, p.alpha, p.cost_ratio) == (q.acceptance_rate, q.tau, q.alpha, q.cost_ratio)
    # 3. the profile keeps its record beside the lookup's (Tracing.keep), and re-planning reads it back
    # (Tracing.read) and replays both under another device's costs
    target = CostProfile(CostModelRef(tiny_sm.name, tiny_sm.num_layers), "gpu-synthetic", "bfloat16",
                         Costs(0.05, 0.0001, 0.0001, 0.0001, (1.0,) * 13))
    plans, keys = [], []
    for candidate in (toy, ref):
        kept = HYBRID.record.build(Keeping(objective, candidate, "tiny", "tiny-arch"))
        profile = Profile(ModelRef.of(tiny_sm), HYBRID.name, candidate.draft, method_params=candidate.params,
                          measured=Measured(source="optimize", extra=kept.entries))
        plans.append(device_replan.replan_profile(profile, target, source="p", costs_source="c")[1])
        keys.append([k for k, _ in kept.entries])
    assert keys == [["lookup", toy_source.SOURCE_KEY], ["lookup", "acceptance"]]
    mine, theirs = plans
    assert mine.basis.startswith(f"its lookup record and its {name} fallback's traces")
    assert [(d.max_draft_tokens, m.tau, m.alpha) for d, m in mine.options] == [
        (d.max_draft_tokens, m.tau, m.alpha) for d, m in theirs.options]
    assert mine.draft.max_draft_tokens == theirs.draft.max_draft_tokens > 0


# -- the strategy and the search -----------------------------------------------------------------------------------
def test_the_grid_lists_none_then_precision_then_the_warm_start_then_the_probes():
    space = SearchSpace(num_layers=30, max_draft_tokens=(2, 4))
    warm = DraftConfig(skip_attn=(9, 11), max_draft_tokens=2, exit=ExitRule(threshold=0.4, adaptive=False))
    strategy = make_strategy(HYBRID.name, space, warm_start=(warm,), n_values=(1, 3), vocab_sizes=(0, 8192))
    grid = strategy.grid()
    assert grid["n_range"] == ["1-1", "1-3", "3-3"] and grid["k"] == [2, 4]
    assert grid["fallback"][0] == NONE and list(strategy.fallbacks.values())[0] == warm
    assert grid["fallback"][1] == "precision fp16"  # the default precision fallback (--schemes)
    assert len(grid["fallback"]) == 2 + 2 * len(strategy.fallbacks) == 2 + 2 * (1 + len(space.probe_configs()))
    first = strategy.candidate({"n_range": "1-3", "k": 4, "fallback": grid["fallback"][3]})
    params = HYBRID.parse(first.params, draft=first.draft, num_layers=30)
    assert first.draft.skip_attn == (9, 11) and first.draft.max_draft_tokens == 4 and params.fallback_k == 2
    assert dict(params.fallback_params)["vocab_subset"] == 8192


def test_prepare_ranks_the_trimmed_head_by_calibration_frequency(tiny_sm):
    strategy = make_strategy(HYBRID.name, SearchSpace(num_layers=4), vocab_sizes=(0, 8, 64, 100))
    cal = calibrate(tiny_sm, [[50, 50, 50, 61], [61, 50]], max_new_tokens=4)
    strategy.prepare(tiny_sm, cal, say=lambda _: None)
    assert strategy.head(64) == strategy.head(100) == strategy.head(0) == LayerSkipParams()  # the whole vocabulary
    ids = strategy.head(8).token_ids
    data = [*cal.prompts, *cal.continuations]
    assert strategy.head(8) == LayerSkipParams.trimmed(frequent_tokens(data, 8, 64))
    assert len(ids) == 8 and {50, 61} <= set(ids)  # the calibration's most frequent tokens are in


def test_optimize_hybrid_ships_a_valid_profile(tiny_sm, monkeypatch, tmp_path):
    monkeypatch.setattr("skipsearch.engine.calibration.encode_prompt",
                        lambda tokenizer, prompt: [1, 2, 3, 1, 2, len(prompt.text) % 60])
    settings = opt.SearchSettings(strategy=HYBRID.name, budget=24, n_prompts=2, max_new_tokens=12, shortlist=2,
                                  space=SearchSpace(num_layers=4, max_draft_tokens=(2, 4)),
                                  study=str(tmp_path / "study"),
                                  strategy_options=(("n_values", (1, 2)), ("vocab_sizes", (0, 32))))
    with work_clock(tiny_sm):  # the search picks from timings: the same pick under any load
        result = opt.optimize(tiny_sm, settings)
    prof = result.profile
    assert prof.method == HYBRID.name and prof.search.strategy == HYBRID.name and len(result.timed) == 2
    params = HYBRID.parse(prof.method_params, draft=prof.draft, num_layers=4)
    assert params.fallback in (LAYER_SKIP.name, NONE, PRECISION.name)
    loaded = load_profile(save_profile(prof, tmp_path / "hybrid.yaml"))
    assert loaded == prof
    if not prof.draft.is_autoregressive:  # it paid on this machine: the shipped drafter decodes losslessly
        drafter = methods.build_drafter(loaded.candidate, tiny_sm)
        assert generate(tiny_sm, PROMPTS[0], drafter=drafter, max_new_tokens=20).token_ids == hf_generate(
            tiny_sm, PROMPTS[0], max_new_tokens=20)


def test_optimize_hybrid_through_the_cli_with_a_warm_start(tiny_sm, monkeypatch, tmp_path):
    from skipsearch.model import loader

    warm = Profile(model=ModelRef(name="tiny", num_layers=4), method=LAYER_SKIP.name,
                   draft=DraftConfig(skip_attn=(2,), max_draft_tokens=2))
    warm_path = save_profile(warm, tmp_path / "warm.yaml")
    monkeypatch.setattr(loader, "load_model", lambda *a, **k: tiny_sm)
    monkeypatch.setattr("skipsearch.engine.calibration.encode_prompt",
                        lambda tokenizer, prompt: [4, 5, 6, 4, 5, len(prompt.text) % 60])
    out = tmp_path / "code.yaml"
    result = CliRunner().invoke(app, ["optimize", "--strategy", HYBRID.name, "--warm-start", str(warm_path),
                                      "--dataset", "humaneval", "--budget", "12", "--n-prompts", "2",
                                      "--max-new-tokens", "10", "--shortlist", "1", "--max-k", "4",
                                      "--study", str(tmp_path / "study"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert CliRunner().invoke(app, ["profile", "validate", str(out)]).exit_code == 0
    prof = load_profile(out)
    assert prof.method == HYBRID.name and prof.measured.dataset == "humaneval (calib split)"
