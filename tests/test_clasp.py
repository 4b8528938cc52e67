"""CLaSp: the layer primitives it needs, the DP against brute force, the dynamic drafter's losslessness,
its profile parameters, and the static strategy's use of the DP's skip sets."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import make_tiny_model

from skipsearch import api
from skipsearch.config import ConfigError, DraftConfig, ExitRule, SamplingParams
from skipsearch.engine.decoding import Drafter, generate, hf_generate
from skipsearch.methods.clasp_dynamic import METHOD as CLASP_DYNAMIC
from skipsearch.methods.clasp_dynamic import SUBLAYERS, DynamicParams, config_for, granularity
from skipsearch.methods.clasp_dynamic.dp import (
    ClaspSkipSets,
    ModelLayers,
    approximation_check,
    brute_force,
    dp_skip_sets,
    final_similarity,
    sequence_targets,
    static_skip_sets,
)
from skipsearch.methods.clasp_dynamic.drafter import ClaspDynamicDrafter
from skipsearch.methods.layer_skip import acceptance_from_dict
from skipsearch.profile import ModelRef, Profile, load_profile, save_profile
from skipsearch.search.space import SearchSpace
from skipsearch.search.strategies import make_strategy
from skipsearch.search.study import open_study, records, run_search

PROMPT = [3, 5, 7, 9, 11, 2, 4, 6]




@pytest.fixture(scope="module")
def sm8():
    return make_tiny_model(num_layers=8)


def _targets(sm, n_tokens=8, seed_prompt=PROMPT):
    cont = generate(sm, seed_prompt, max_new_tokens=16).token_ids
    return sequence_targets(sm, [seed_prompt + list(cont)], [len(seed_prompt) - 1], tokens_per_sequence=n_tokens)


# -- the model primitives ----------------------------------------------------------------------------


def test_forward_hidden_is_forward_plus_the_residual_stream(sm8):
    ids = torch.tensor(PROMPT)
    logits, hidden = sm8.forward_hidden(ids, start=0, cache=sm8.new_cache())
    assert hidden.shape == (sm8.num_layers + 1, len(PROMPT), 32)
    torch.testing.assert_close(logits, sm8.forward(ids, start=0, cache=sm8.new_cache()))
    # the last entry is before the final norm: norm + LM head of it give the logits
    with torch.no_grad():
        torch.testing.assert_close(sm8.hf.lm_head(sm8.hf.model.norm(hidden[-1])).float(), logits)
    torch.testing.assert_close(hidden[0], sm8.hf.get_input_embeddings()(ids).detach())
    # no hook is left behind
    assert all(not layer._forward_hooks for layer in sm8.layers)


def test_run_layer_batches_independent_states_over_the_shared_cache(sm8):
    cache = sm8.new_cache()
    _, hidden = sm8.forward_hidden(torch.tensor(PROMPT), start=0, cache=cache)
    before = [(e.keys.clone(), e.values.clone()) for e in cache.layers]
    positions = torch.tensor([7, 3, 5, 0])
    for i in range(sm8.num_layers):
        # each state sees the cache before its own position and itself: the full model's next state
        out = sm8.run_layer(i, hidden[i][positions], positions, cache)
        torch.testing.assert_close(out, hidden[i + 1][positions], atol=1e-5, rtol=1e-5)
    # one at a time gives the same: the states do not see each other
    alone = torch.cat([sm8.run_layer(2, hidden[2][p : p + 1] * 1.5, p.view(1), cache) for p in positions])
    torch.testing.assert_close(sm8.run_layer(2, hidden[2][positions] * 1.5, positions, cache), alone,
                               atol=1e-5, rtol=1e-5)
    # the cache is left exactly as it was
    for (k, v), e in zip(before, cache.layers, strict=True):
        assert torch.equal(k, e.keys) and torch.equal(v, e.values)
    skipped_attn = sm8.run_layer(3, hidden[3][positions], positions, cache, skip="attn")
    assert not torch.allclose(skipped_attn, hidden[4][positions], atol=1e-4)


# -- the DP against brute force ------------------------------------------------------------------------


def test_dp_is_exact_where_the_objective_is_additive():
    # Layers that add fixed orthogonal vectors: the cosine of a state with h_L grows with the norm
    # it keeps, so the problem has optimal substructure and the DP must find the true optimum,
    # which is to skip the m layers with the smallest contributions.
    L, H = 9, 16
    basis = torch.eye(H)
    norms = torch.tensor([3.0, 0.5, 2.0, 0.7, 1.5, 0.2, 2.5, 0.9, 1.1])
    deltas = basis[1 : L + 1] * norms[:, None]  # [L, H], orthogonal to each other and to x_0
    x0 = basis[0] * 2.0
    targets = torch.stack([x0 + deltas[:i].sum(0) for i in range(L + 1)]).unsqueeze(1)  # [L+1, 1, H]

    def run(i, states):
        return states + deltas[i]

    allowed = range(1, L - 1)
    dp = dp_skip_sets(targets, run, max_skips=len(allowed), allowed=allowed)
    naive = dp_skip_sets(targets, run, max_skips=len(allowed), allowed=allowed, batched=False)
    order = sorted(allowed, key=lambda i: float(norms[i]))
    for m in range(len(allowed) + 1):
        expected = tuple(sorted(order[:m]))
        assert dp.skip_sets[m] == expected == brute_force(targets, run, num_skips=m, allowed=allowed).best_set
        assert naive.skip_sets[m] == expected
        assert dp.similarity[m] == pytest.approx(final_similarity(targets, run, expected), abs=1e-6)
    assert dp.layer_calls < naive.layer_calls


@pytest.mark.parametrize("sublayer", SUBLAYERS)
def test_dp_against_brute_force_on_a_random_tiny_model(sm8, sublayer):
    """The DP is approximate (§3.5). Stated bound, on a 6-layer sub-range of a random 8-layer model:
    it is never more than 0.05 of cosine below the enumerated optimum, beats a random choice on
    average over m, agrees with brute force on most m and always on the trivial ones (m = 0, 6);
    and the similarity it reports is that of an exact forward with its set."""
    targets, caches, positions = _targets(sm8)
    layers = ModelLayers(sm8, caches, positions, sublayer=sublayer)
    sub_range = range(1, 7)
    rows = approximation_check(targets, layers, sub_range=sub_range, num_skips=range(0, 7))
    for row in rows:
        assert row["subsets"] == math.comb(6, row["m"])
        assert row["brute"] >= row["dp"] - 1e-6  # brute force is the optimum...
        assert row["brute"] - row["dp"] <= 0.05, row  # ...and the DP stays close to it
        assert set(row["dp_set"]) <= set(sub_range) and len(row["dp_set"]) == row["m"]
        exact = final_similarity(targets, layers.run, row["dp_set"], layers.skip)
        assert row["dp"] == pytest.approx(exact, abs=1e-5)
    assert rows[0]["same_set"] and rows[-1]["same_set"]
    assert sum(r["same_set"] for r in rows) >= 4
    assert sum(r["dp"] - r["random_mean"] for r in rows) > 0


def test_batched_dp_equals_the_naive_double_loop(sm8):
    targets, caches, positions = _targets(sm8)
    for sublayer in ("layer", "attn"):
        layers = ModelLayers(sm8, caches, positions, sublayer=sublayer)
        kwargs = dict(max_skips=5, allowed=range(1, 7), skip=layers.skip)
        batched = dp_skip_sets(targets, layers.run, **kwargs)
        naive = dp_skip_sets(targets, layers.run, batched=False, **kwargs)
        assert batched.skip_sets == naive.skip_sets
        assert batched.similarity == pytest.approx(naive.similarity, abs=1e-5)
        assert batched.layer_calls < naive.layer_calls


def test_static_skip_sets_give_a_set_for_every_m(sm8):
    cont = generate(sm8, PROMPT, max_new_tokens=12).token_ids
    plan = static_skip_sets(sm8, [PROMPT, PROMPT[:5]], [cont, cont[:6]], allowed=range(1, 7),
                       limits={"layer": 3, "attn": 6}, tokens_per_sequence=4)
    assert plan.sublayers == ("layer", "attn") and plan.source == "dp"
    for sub, limit in (("layer", 3), ("attn", 6)):
        sets = plan.sets(sub)
        assert len(sets) == limit + 1
        assert all(len(s) == m and set(s) <= set(range(1, 7)) for m, s in enumerate(sets))
        assert plan.similarity[plan.sublayers.index(sub)][0] == pytest.approx(1.0)


# -- the dynamic drafter -----------------------------------------------------------------------------


@pytest.mark.parametrize("loi", [1, 3])
@pytest.mark.parametrize("sublayer", SUBLAYERS)
def test_dynamic_greedy_equals_plain_decoding(sm8, loi, sublayer):
    plain = generate(sm8, PROMPT, max_new_tokens=40)
    drafter = ClaspDynamicDrafter(DynamicParams(num_skips=3, loi=loi, sublayer=sublayer),
                                  DraftConfig(skip_attn=(2,), max_draft_tokens=3), num_layers=8)
    result = generate(sm8, PROMPT, drafter=drafter, max_new_tokens=40)
    assert result.token_ids == plain.token_ids
    stats = dict(result.stats.drafter_stats)
    # verified() runs after every verify step but the last; the DP on the 1st, 1+LOI-th, ...
    assert stats["dp_runs"] == math.ceil((result.stats.verify_steps - 1) / loi)
    assert stats["dp_seconds"] > 0
    assert granularity(drafter.config) == (sublayer, 3)  # the DP's set replaced the starting one


def test_dynamic_sampling_runs_and_stays_in_the_vocabulary(sm8):
    drafter = ClaspDynamicDrafter(DynamicParams(num_skips=2, loi=2), DraftConfig(max_draft_tokens=2),
                                  num_layers=8)
    result = generate(sm8, PROMPT, drafter=drafter, sampling=SamplingParams(temperature=0.8), max_new_tokens=24,
                      seed=3)
    assert len(result.token_ids) == 24 and all(0 <= t < 64 for t in result.token_ids)
    assert result.stats.drafted_tokens > 0


class _Recorder(Drafter):
    """A drafter that drafts nothing useful and records what the engine hands it after verify."""

    wants_hidden_states = True

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    threshold = None

    def draft(self, *args, **kwargs):
        return self.inner.draft(*args, **kwargs)

    def observe(self, drafted, accepted):
        pass

    def verified(self, sm, cache, *, hidden, position):
        self.calls.append((hidden.clone(), position, sm.cache_lengths(cache)))


def test_engine_hands_the_last_kept_tokens_hidden_states(sm8):
    from skipsearch.engine.decoding import LayerSkipDrafter

    rec = _Recorder(LayerSkipDrafter(DraftConfig(skip_attn=(3, 5), max_draft_tokens=3,
                                                 exit=ExitRule(threshold=0.0, adaptive=False))))
    result = generate(sm8, PROMPT, drafter=rec, max_new_tokens=20)
    assert len(rec.calls) == result.stats.verify_steps - 1
    seq = PROMPT + list(result.token_ids)
    _, full = sm8.forward_hidden(torch.tensor(seq), start=0, cache=sm8.new_cache())  # [L+1, T, H]
    for hidden, position, lengths in rec.calls:
        assert set(lengths) == {position + 1}  # the cache holds the kept tokens, up to this one
        torch.testing.assert_close(hidden, full[:, position], atol=1e-4, rtol=1e-4)


def test_engine_asks_no_hidden_states_of_other_drafters(sm8, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("forward_hidden called without wants_hidden_states")

    monkeypatch.setattr(sm8, "forward_hidden", refuse)
    generate(sm8, PROMPT, config=DraftConfig(skip_attn=(3,), max_draft_tokens=2), max_new_tokens=8)


# -- the profile ---------------------------------------------------------------------------------------


def _dyn(profile):
    return CLASP_DYNAMIC.parse(profile.method_params, draft=profile.draft, num_layers=profile.model.num_layers)


def _profile(num_layers=8, **params):
    return Profile(model=ModelRef(name="tiny", num_layers=num_layers), method="clasp-dynamic",
                   draft=DraftConfig(skip_attn=(2,), max_draft_tokens=2), method_params=tuple(params.items()))


@pytest.mark.parametrize(("params", "fragment"), [
    ({"num_skips": 0, "loi": 4}, "num_skips must be an integer in 1..6"),
    ({"num_skips": 7, "loi": 4}, "num_skips must be an integer in 1..6"),
    ({"num_skips": True, "loi": 4}, "num_skips"),
    ({"num_skips": "3", "loi": 4}, "num_skips"),
    ({"num_skips": 3, "loi": 0}, "loi must be an integer >= 1"),
    ({"num_skips": 3, "loi": 2.5}, "loi must be an integer >= 1"),
    ({"num_skips": 3}, "missing required key method_params.loi"),
    ({"loi": 3}, "missing required key method_params.num_skips"),
    ({"num_skips": 3, "loi": 2, "sublayer": "heads"}, "sublayer must be one of"),
    ({"num_skips": 3, "loi": 2, "protect_ends": "yes"}, "protect_ends"),
    ({"num_skips": 3, "loi": 2, "m": 4}, "unknown key method_params.m"),
])
def test_invalid_dynamic_params_are_one_line_errors(sm8, params, fragment):
    with pytest.raises(ConfigError, match=fragment) as info:
        api.drafter_factory(_profile(**params), sm8)
    assert "\n" not in str(info.value)


def test_protect_ends_off_allows_every_layer():
    assert _dyn(_profile(num_skips=8, loi=1, protect_ends=False)).num_skips == 8


def test_dynamic_profile_round_trips_and_decodes_through_the_api(sm8, tmp_path):
    prof = _profile(num_skips=3, loi=2, sublayer="attn")
    path = save_profile(prof, tmp_path / "d.yaml")
    again = load_profile(path, num_layers=8)
    assert again.method == "clasp-dynamic" and _dyn(again) == DynamicParams(3, 2, "attn")
    build = api.drafter_factory(again, sm8)
    first, second = build(), build()
    assert isinstance(first, ClaspDynamicDrafter) and first is not second  # a fresh drafter per prompt
    result = generate(sm8, PROMPT, drafter=first, max_new_tokens=16)
    assert result.token_ids == generate(sm8, PROMPT, max_new_tokens=16).token_ids


# -- the static strategy -----------------------------------------------------------------------------


def test_static_strategy_drafts_with_the_dps_sets():
    space = SearchSpace(num_layers=10, max_draft_tokens=(1, 2, 3))
    layers = space.skippable_layers()  # 1..8
    plan = ClaspSkipSets(("layer", "attn", "mlp"), tuple(
        tuple(tuple(sorted(layers[::-1][:m])) for m in range(len(layers) + 1)) for _ in range(3)))
    strategy = make_strategy("clasp", space, seed=0, skip_sets=plan)
    study = open_study(strategy=strategy)

    class Objective:
        def evaluate(self, candidate, *, kind):
            config = candidate.draft
            from skipsearch.measure import Measurement

            return Measurement(kind=kind, speedup=1.0 + 0.01 * len(config.skip_attn))

    run_search(study, strategy, Objective(), budget=20)
    recs = records(study)
    seeds = [s.config for s in strategy.plan().seeds]
    assert [r.config for r in recs[:len(seeds)]] == seeds
    for r in recs[len(seeds):]:
        sub, m = granularity(r.config)
        expected = plan.sets(sub)[m]
        assert r.config == config_for(sub, expected, r.config) and space.contains(r.config)


def test_warm_start_from_a_clasp_set_goes_first_in_tpe():
    space = SearchSpace(num_layers=10)
    clasp_config = config_for("attn", (4, 6, 8), DraftConfig(max_draft_tokens=2, exit=ExitRule(threshold=0.5)))
    strategy = make_strategy("tpe", space, seed=0, warm_start=(clasp_config,))
    assert strategy.plan().seeds[0].config == clasp_config


# -- the real model ----------------------------------------------------------------------------------


@pytest.mark.parametrize("loi", [1, 4])
def test_dynamic_greedy_equals_hf_on_the_real_model(real_sm, encode_offline, loi):
    for _, ids in encode_offline(real_sm, "mtbench,humaneval", n=2):
        drafter = ClaspDynamicDrafter(DynamicParams(num_skips=6, loi=loi, sublayer="attn"),
                                      DraftConfig(skip_attn=(16, 20, 24), max_draft_tokens=3), num_layers=30)
        result = generate(real_sm, ids, drafter=drafter, max_new_tokens=24)
        assert result.token_ids == hf_generate(real_sm, ids, max_new_tokens=24)
        assert dict(result.stats.drafter_stats)["dp_runs"] >= 1


def test_cli_decodes_a_dynamic_profile_on_the_real_model(real_sm, tmp_path):
    from typer.testing import CliRunner

    from skipsearch.cli import app

    prof = Profile(model=ModelRef(name="smollm2-135m", num_layers=30, fingerprint=real_sm.fingerprint),
                   method="clasp-dynamic", draft=DraftConfig(skip_attn=(20,), max_draft_tokens=2),
                   method_params=DynamicParams(num_skips=4, loi=2).to_pairs())
    path = save_profile(prof, tmp_path / "dyn.yaml")
    result = CliRunner().invoke(app, ["decode", "--profile", str(path), "--prompt", "def fib(n):", "--json",
                                      "--max-new-tokens", "16"])
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout.splitlines()[-1])
    assert row["token_ids"] == list(hf_generate(real_sm, row["prompt_token_ids"], max_new_tokens=16))
    assert dict(map(tuple, row["stats"]["drafter_stats"]))["dp_runs"] >= 1


@pytest.mark.parametrize("command", ["decode", "bench"])
def test_a_dynamic_profile_on_a_compiled_kernel_is_one_line_before_the_model_loads(tmp_path, monkeypatch, command):
    # its drafter reads every verify pass's hidden states and runs single layers on a cache that grows: a compiled
    # kernel's StaticCache gave a traceback mid-decode (forward_hidden's hooks saw nothing, then a shape mismatch)
    from typer.testing import CliRunner

    from skipsearch.cli import app
    from skipsearch.model import loader
    from tests.conftest import assert_one_line_error

    def loaded(*args, **kwargs):
        pytest.fail("the model loaded")

    monkeypatch.setattr(loader, "load_model", loaded)  # bench's, imported where it runs
    monkeypatch.setattr("skipsearch.api.loading.load_model", loaded)  # decode's
    for where in ("skipsearch.api.loading", "skipsearch.api.benchmark"):  # a machine without a C++ compiler too
        monkeypatch.setattr(f"{where}.check_kernel", lambda *args, **kwargs: None)
    prof = Profile(model=ModelRef(name="smollm2-135m", num_layers=30), method="clasp-dynamic",
                   draft=DraftConfig(skip_attn=(20,), max_draft_tokens=2),
                   method_params=DynamicParams(num_skips=4, loi=2).to_pairs())
    path = str(save_profile(prof, tmp_path / "dyn.yaml"))
    args = (["decode", "--profile", path, "--prompt", "def fib(n):"] if command == "decode" else
            ["bench", "--profiles", path, "--peers", "hf-greedy", "--n-prompts", "1", "--sweep-prompts", "0"])
    result = CliRunner().invoke(app, [*args, "--kernel", "panel-c8"])
    assert_one_line_error(result, "clasp-dynamic draft reads the hidden states of every verify pass")
    assert "--kernel eager" in result.stderr


def test_a_searchs_dynamic_companion_records_eager_where_the_search_ran_a_compiled_kernel():
    from skipsearch.config import Candidate
    from skipsearch.search.optimize import _companion_profiles
    from skipsearch.search.strategies import Companion

    static = Profile(model=ModelRef(name="tiny", num_layers=8), method="layer-skip",
                     draft=DraftConfig(skip_attn=(2,), max_draft_tokens=2), kernel="panel-c8")
    dynamic = CLASP_DYNAMIC.candidate(static.draft, DynamicParams(num_skips=2, loi=3))
    (suffix, companion), = _companion_profiles(static, [Companion("-dynamic", dynamic, "notes")])
    assert suffix == "-dynamic" and companion.method == "clasp-dynamic" and companion.kernel is None
    same = Candidate("layer-skip", static.draft)  # a companion that runs beside the kernel keeps it
    assert _companion_profiles(static, [Companion("-x", same, "")])[0][1].kernel == "panel-c8"


def test_optimize_warm_start_with_a_bad_profile_is_one_line_before_the_model_loads(tmp_path):
    from typer.testing import CliRunner

    from skipsearch.cli import app

    result = CliRunner().invoke(app, ["optimize", "--study", str(tmp_path / "s"), "--warm-start",
                                      str(tmp_path / "missing.yaml")])
    assert result.exit_code == 2 and result.stderr.startswith("error: ") and "missing.yaml" in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.model
def test_cli_optimize_clasp_writes_static_and_dynamic_profiles(tmp_path):
    from typer.testing import CliRunner

    from skipsearch.cli import app

    out = tmp_path / "clasp.yaml"
    result = CliRunner().invoke(app, ["optimize", "--strategy", "clasp", "--budget", "3", "--n-prompts", "1",
                                      "--max-new-tokens", "8", "--shortlist", "1", "--study", str(tmp_path / "s"),
                                      "--out", str(out), "--clasp-loi", "3"])
    assert result.exit_code == 0, result.output
    static, dyn = load_profile(out, num_layers=30), load_profile(tmp_path / "clasp-dynamic.yaml", num_layers=30)
    assert static.method == "layer-skip" and static.search.strategy == "clasp"
    params = _dyn(dyn)
    assert dyn.method == "clasp-dynamic" and params.loi == 3 and granularity(dyn.draft)[1] == params.num_skips
    # it keeps the traces of its starting skip set, so that plan --profile --costs re-plans it for another device
    (kept,) = acceptance_from_dict(dict(dyn.measured.extra)["acceptance"]).skip_sets
    assert (kept.skip_attn, kept.skip_mlp) == (dyn.draft.skip_attn, dyn.draft.skip_mlp)
