"""The three-level decoder: greedy identity, M_q-level and end-to-end sampling losslessness, profiles, the
measured planner on a tiny model, and greedy identity with HF on the real default model."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch
import yaml
from conftest import assert_one_line_error, make_tiny_model
from typer.testing import CliRunner

from skipsearch import api
from skipsearch.api.planning import build_profile
from skipsearch.cli import app
from skipsearch.config import NO_EXIT, ConfigError, DraftConfig, SamplingParams
from skipsearch.engine.decoding import LayerSkipDrafter, generate, hf_generate, process_logits
from skipsearch.engine.surrogate import calibrate
from skipsearch.files.errors import ProfileError
from skipsearch.methods.hierarchical import Hierarchy, hierarchy_from_profile, hierarchy_to_profile_fields
from skipsearch.methods.hierarchical.drafter import HierarchicalDrafter
from skipsearch.methods.hierarchical.planner import plan_model, render_markdown
from skipsearch.profile import ModelRef, Profile, load_profile, profile_to_dict, save_profile

PROMPT = [3, 9, 4, 1, 7, 22, 5, 40, 11]
MEDIUM = DraftConfig(skip_attn=(2,), skip_mlp=(3,))
SMALL = DraftConfig(skip_attn=(1, 2), skip_mlp=(1, 3))
SHAPES = [(1, 0), (1, 1), (2, 1), (3, 2), (1, 4), (4, 3)]




# -- greedy -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("m", "n"), SHAPES)
@pytest.mark.parametrize(
    ("medium", "small"),
    [(DraftConfig(), DraftConfig(skip_mlp=(1,))), (MEDIUM, SMALL), (MEDIUM, DraftConfig(skip_attn=(1, 2, 3)))],
    ids=["medium-is-full", "nested", "small-skips-attn-only"],
)
def test_greedy_output_is_identical_to_plain_decoding(tiny_sm, m, n, medium, small):
    reference = hf_generate(tiny_sm, PROMPT, max_new_tokens=40)
    for max_new in (1, 2, 5, 40):  # short budgets cut the block inside a round
        drafter = _Spy(Hierarchy(medium, small, m, n))
        out = generate(tiny_sm, PROMPT, drafter=drafter, max_new_tokens=max_new, eos_token_ids=())
        assert out.token_ids == reference[:max_new], (m, n, max_new)
        assert all(m <= k <= m * (n + 1) for k in drafter.blocks[:-1]), drafter.blocks  # the last may be cut


class _Spy(HierarchicalDrafter):
    def __init__(self, h):
        super().__init__(h)
        self.blocks = []

    def observe(self, drafted, accepted):
        self.blocks.append(drafted)
        super().observe(drafted, accepted)


def test_the_block_is_m_q_s_own_greedy_continuation(tiny_sm):
    """Lossless at the M_q level: whatever M_s proposes, the block is what M_q alone would draft."""
    cache = tiny_sm.new_cache()
    tiny_sm.forward(torch.tensor(PROMPT[:-1]), start=0, cache=cache)
    start = len(PROMPT) - 1
    for m, n in SHAPES:
        drafter = HierarchicalDrafter(Hierarchy(MEDIUM, SMALL, m, n))
        block = drafter.draft(tiny_sm, cache, pending=PROMPT[-1], start=start, limit=50,
                              sampling=SamplingParams(), generator=torch.Generator()).tokens
        tiny_sm.crop(cache, start)
        plain = LayerSkipDrafter(replace(MEDIUM, max_draft_tokens=len(block), exit=NO_EXIT))
        alone = plain.draft(tiny_sm, cache, pending=PROMPT[-1], start=start, limit=50,
                            sampling=SamplingParams(), generator=torch.Generator()).tokens
        tiny_sm.crop(cache, start)
        assert block == alone, (m, n)
        assert m <= len(block) <= m * (n + 1)


def test_the_report_measures_each_level(tiny_sm):
    # M_q = M_p: every M_q token passes; M_s = M_q: every M_s token passes
    same = HierarchicalDrafter(Hierarchy(DraftConfig(), DraftConfig(), 2, 2))
    stats = dict(generate(tiny_sm, PROMPT, drafter=same, max_new_tokens=30, eos_token_ids=()).stats.drafter_stats)
    assert stats["alpha"] == 1.0 and stats["beta"] == 1.0 and stats["block_tokens"] == pytest.approx(6.0, abs=1.5)
    drafter = HierarchicalDrafter(Hierarchy(MEDIUM, SMALL, 3, 2))
    result = generate(tiny_sm, PROMPT, drafter=drafter, max_new_tokens=30, eos_token_ids=())
    stats = dict(result.stats.drafter_stats)
    assert {"alpha", "beta", "block_tokens", "medium_tokens_per_round", "m", "n"} <= set(stats)
    assert 0 <= stats["alpha"] < 1 and 0 <= stats["beta"] <= 1
    # α is accepted / tested: the engine's accepted count over accepted + one per rejecting cycle
    assert stats["alpha"] >= result.stats.accepted_tokens / result.stats.drafted_tokens


# -- the level rules -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("medium", "small", "m", "n", "fragment"),
    [
        (DraftConfig(skip_attn=(2,)), DraftConfig(skip_attn=(1,)), 2, 1, "add [2] to the small draft's skip_attn"),
        (DraftConfig(skip_attn=(0,)), DraftConfig(skip_attn=(0, 1)), 2, 1, "must keep layer 0's attention"),
        (MEDIUM, SMALL, 0, 1, "m (medium tokens per cycle) must be an integer >= 1"),
        (MEDIUM, SMALL, 2, -1, "n (small tokens per medium token) must be an integer >= 0"),
    ],
)
def test_level_rules_are_clear_errors(medium, small, m, n, fragment):
    with pytest.raises(ConfigError, match=None) as info:
        Hierarchy(medium, small, m, n)
    assert fragment in str(info.value)


def test_skipping_layer_0_attention_is_fine_without_small_drafts(tiny_sm):
    h = Hierarchy(DraftConfig(skip_attn=(0,)), DraftConfig(skip_attn=(0, 1)), 3, 0)
    out = generate(tiny_sm, PROMPT, drafter=HierarchicalDrafter(h), max_new_tokens=20, eos_token_ids=())
    assert out.token_ids == hf_generate(tiny_sm, PROMPT, max_new_tokens=20)


# -- sampling: lossless in distribution ------------------------------------------------------------------------
V = 16
SAMPLE_PROMPT = [3, 9, 4]
Z = 3.719  # one-sided 1e-4 normal quantile


@pytest.fixture(scope="module")
def sm16():
    return make_tiny_model(vocab_size=V, head_scale=10.0, name="tiny16")


def _critical(df: int) -> float:
    c = 2.0 / (9.0 * df)  # Wilson-Hilferty
    return df * (1.0 - c + Z * math.sqrt(c)) ** 3


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, float]:
    """(statistic, critical value) with cells of expected count < 5 pooled."""
    n = float(counts.sum())
    e, o = probs.flatten().double() * n, counts.flatten().double()
    small = e < 5
    cells = list(zip(o[~small].tolist(), e[~small].tolist(), strict=True))
    if small.any():
        cells.append((float(o[small].sum()), float(e[small].sum())))
    stat = sum((oi - ei) ** 2 / ei for oi, ei in cells if ei > 0)
    return stat, _critical(len(cells) - 1)


def _pair_distribution(sm, config: DraftConfig | None, pending: int, sampling) -> torch.Tensor:
    """P(b0, b1) [V, V] of sampling two tokens after `pending` from ``config`` (None = the full model).

    Context: full-model KV for SAMPLE_PROMPT, as the engine hands it over; then the level's own KV.
    """
    L = len(SAMPLE_PROMPT)
    cache = sm.new_cache()
    sm.forward(torch.tensor(SAMPLE_PROMPT), start=0, cache=cache)
    rows = []
    for b0 in range(V):
        if config is None:
            logits = sm.forward(torch.tensor([pending, b0]), start=L, cache=cache).double()  # [2, V]
        else:
            with sm.drafting(config):
                logits = sm.forward(torch.tensor([pending, b0]), start=L, cache=cache).double()
        sm.crop(cache, L)
        probs = process_logits(logits, sampling)  # [2, V]
        rows.append(probs[0, b0] * probs[1])
    return torch.stack(rows)  # [b0, b1]


SAMPLINGS = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_k=8, top_p=0.9)]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["t1.0", "t0.8-topk8-topp0.9"])
def test_the_block_is_distributed_as_m_q_s_own_samples(sm16, sampling):
    """M_q-level losslessness: two block tokens drafted through M_s + rejection follow M_q exactly."""
    pending, L, n_samples = 5, len(SAMPLE_PROMPT), 3000
    target = _pair_distribution(sm16, MEDIUM, pending, sampling)
    first_q = target.sum(1)  # [V]: M_q's distribution of the first block token
    small = _pair_distribution(sm16, SMALL, pending, sampling)
    tv = 0.5 * float((target.sum(1) - small.sum(1)).abs().sum())
    assert tv > 0.1, f"M_s too close to M_q (TV {tv:.3f}): the test could not catch a broken M_q-level sampler"
    cache = sm16.new_cache()
    sm16.forward(torch.tensor(SAMPLE_PROMPT), start=0, cache=cache)
    counts = torch.zeros(V, V)
    accepted_first = 0
    drafter = HierarchicalDrafter(Hierarchy(MEDIUM, SMALL, 2, 1))
    generator = torch.Generator().manual_seed(0)
    for _ in range(n_samples):
        before = drafter._q_accepted
        block = drafter.draft(sm16, cache, pending=pending, start=L, limit=2, sampling=sampling, generator=generator)
        sm16.crop(cache, L)
        assert len(block.tokens) == 2 and block.probs.shape == (2, V)
        # the probabilities handed to M_p's rejection sampler are M_q's own
        torch.testing.assert_close(block.probs[0].double(), first_q.double(), atol=1e-5, rtol=1e-4)
        counts[block.tokens[0], block.tokens[1]] += 1
        accepted_first += drafter._q_accepted - before
    stat, crit = _chi2(counts, target)
    assert stat < crit, f"chi2 {stat:.1f} >= {crit:.1f}"
    assert float(counts[target == 0].sum()) == 0
    assert 0.05 * n_samples < accepted_first < 0.95 * n_samples  # both the accept and the reject path ran


@pytest.mark.parametrize("sampling", SAMPLINGS[:1], ids=["t1.0"])
def test_sampled_output_follows_the_full_model(sm16, sampling):
    """End to end: (t2, t3) after a sampled t1 follow M_p, though they were drafted by M_s and M_q."""
    L, n_samples = len(SAMPLE_PROMPT), 3000
    grid = torch.cartesian_prod(torch.arange(V), torch.arange(V))  # [V*V, 2]: (t1, t2)
    ids = torch.cat([torch.tensor(SAMPLE_PROMPT).expand(len(grid), L), grid], dim=1)
    with torch.inference_mode():
        p = process_logits(sm16.hf(input_ids=ids).logits.double()[:, L - 1:], sampling).view(V, V, 3, V)
    joint = (p[0, 0, 0][:, None, None] * p[:, 0, 1][:, :, None] * p[:, :, 2]).sum(0)  # [t2, t3]
    # the check has power: t2 drawn from M_q instead of M_p would be caught
    q_first = torch.stack([_pair_distribution(sm16, MEDIUM, t1, sampling).sum(1) for t1 in range(V)])  # [t1, V]
    broken = (p[0, 0, 0][:, None] * q_first).sum(0)
    lam = n_samples * float(((broken - joint.sum(1)) ** 2 / joint.sum(1).clamp_min(1e-12)).sum())
    assert lam > 4 * _critical(V - 1), f"noncentrality {lam:.0f} too small"
    counts = torch.zeros(V, V)
    h = Hierarchy(MEDIUM, SMALL, 2, 1)
    for seed in range(n_samples):
        out = generate(sm16, SAMPLE_PROMPT, drafter=HierarchicalDrafter(h), sampling=sampling, max_new_tokens=4,
                       eos_token_ids=(), seed=seed).token_ids
        counts[out[1], out[2]] += 1
    for name, obs, exp in (("joint", counts, joint), ("t2", counts.sum(1), joint.sum(1))):
        stat, crit = _chi2(obs, exp)
        assert stat < crit, f"{name}: chi2 {stat:.1f} >= {crit:.1f}"
    assert float(counts[joint == 0].sum()) == 0


# -- profiles -------------------------------------------------------------------------------------------------
def _profile(h: Hierarchy, num_layers: int = 4) -> Profile:
    draft, params = hierarchy_to_profile_fields(h)
    return Profile(model=ModelRef("tiny", num_layers), method="hierarchical", draft=draft, method_params=params)


def test_profile_round_trip_and_decode_through_the_registry(tiny_sm, tmp_path):
    h = Hierarchy(MEDIUM, SMALL, 3, 2)
    path = save_profile(_profile(h), tmp_path / "h.yaml")
    loaded = load_profile(path)
    assert hierarchy_from_profile(loaded) == h
    assert loaded.draft.max_draft_tokens == 9
    make = api.drafter_factory(loaded, tiny_sm)
    first, second = make(), make()
    assert isinstance(first, HierarchicalDrafter) and first is not second
    out = generate(tiny_sm, PROMPT, drafter=first, max_new_tokens=20, eos_token_ids=())
    assert out.token_ids == hf_generate(tiny_sm, PROMPT, max_new_tokens=20)


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (lambda d: d["method_params"].update(m=0), "m (medium tokens per cycle) must be an integer >= 1"),
        (lambda d: d["method_params"].update(n=-1), "n (small tokens per medium token) must be an integer >= 0"),
        (lambda d: d["method_params"].update(m="3"), "m (medium tokens per cycle)"),
        (lambda d: d["method_params"].pop("small"), "missing required key method_params.small"),
        (lambda d: d["method_params"].update(k=2), "unknown key method_params.k"),
        (lambda d: d["method_params"]["small"].update(skip_attn=[1]), "add [2] to the small draft's skip_attn"),
        (lambda d: d["method_params"]["small"].update(skip_mlp=[7]), "has layer 7"),
        (lambda d: d["method_params"]["small"].update(skip_attn="1,2"), "must be a list of layer indices"),
        (lambda d: d["draft"].update(max_draft_tokens=4), "must be m·(n+1) = 9"),
        (lambda d: d["draft"].update(exit={"threshold": 0.6, "adaptive": True}), "draft.exit must be"),
    ],
)
def test_bad_method_params_are_one_line_profile_errors(tiny_sm, tmp_path, edit, fragment):
    data = profile_to_dict(_profile(Hierarchy(MEDIUM, SMALL, 3, 2)))
    edit(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError) as info:  # reading the profile runs the method's own validation
        load_profile(path)
    assert fragment in str(info.value) and "\n" not in str(info.value) and str(path) in str(info.value)


def test_a_profile_for_another_model_size_is_refused(tiny_sm):
    profile = _profile(Hierarchy(MEDIUM, DraftConfig(skip_attn=(2, 5)), 2, 1), num_layers=8)
    with pytest.raises(ConfigError, match="has layer 5"):
        api.drafter_factory(profile, tiny_sm)


# -- the measured planner, on the tiny model -----------------------------------------------------------------
def test_plan_model_measures_plans_validates_and_ships(tiny_sm, tmp_path):
    cal = calibrate(tiny_sm, [PROMPT, [2, 8, 1, 30]], max_new_tokens=12)
    rep = plan_model(tiny_sm, cal, MEDIUM, SMALL, dataset="tiny", max_m=3, max_n=2, run_validation=True,
                     cost_repeats=1)
    i = rep.plan.inputs
    assert 0 <= i.alpha <= 1 and 0 <= i.beta <= 1 and i.c > 0 and i.cs > 0
    assert len(i.verify) == 3 * 3 + 1 and len(i.verify_medium) == 3
    assert rep.acceptance.positions == 24
    assert {(r.m, r.n) for r in rep.validation} == {
        (rep.plan.best_three_level.m, rep.plan.best_three_level.n), (rep.plan.best_two_level.m, 0)}
    for row in rep.validation:
        assert row.measured_speedup > 0 and row.predicted_speedup > 0 and row.measured_tau >= 1
    json.dumps(rep.to_dict())  # --json prints it
    text = render_markdown(rep, num_layers=tiny_sm.num_layers, command="skipsearch plan ...")
    assert "Predicted against measured" in text and "| m | n |" in text
    path = save_profile(build_profile(rep, tiny_sm, rep.chosen()), tmp_path / "h.yaml")
    shipped = load_profile(path)
    assert shipped.method == "hierarchical" and shipped.measured.predicted_speedup is not None
    assert shipped.measured.baseline == "skipsearch-ar"  # validated: timed against our own loop
    assert hierarchy_from_profile(shipped) == rep.chosen()


def test_measured_alpha_is_one_when_the_medium_draft_is_the_full_model(tiny_sm):
    cal = calibrate(tiny_sm, [PROMPT], max_new_tokens=10)
    rep = plan_model(tiny_sm, cal, DraftConfig(), DraftConfig(), dataset="tiny", max_m=2, max_n=1, cost_repeats=1)
    assert rep.acceptance.alpha == 1.0 and rep.acceptance.beta == 1.0


# -- the CLI, measured mode -----------------------------------------------------------------------------------
def test_cli_plan_refuses_unnested_profiles_before_loading_the_model(tmp_path, monkeypatch):
    from skipsearch.model import loader

    example = yaml.safe_load(open("profiles/smollm2-135m/example.yaml"))
    small = {**example, "draft": {**example["draft"], "skip_attn": [5, 9]}}
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(small))
    # each profile is valid alone, so only the planner's level check can refuse them: and it must, before the model
    # loads (Hierarchy would refuse the pair after loading too, which is the slow path this test rules out)
    monkeypatch.setattr(loader, "load_model", lambda *a, **k: pytest.fail("the model loaded before the levels were "
                                                                           "checked"))
    result = CliRunner().invoke(app, ["plan", "hierarchical", "--medium", "profiles/smollm2-135m/example.yaml",
                                      "--small", str(path)])
    assert_one_line_error(result, "error: hierarchical: the small draft must skip every attention sublayer the "
                                  "medium draft skips (add [13, 17, 21] to the small draft's skip_attn)")


# -- the real model -------------------------------------------------------------------------------------------
REAL_NEW = 24


@pytest.mark.model
def test_real_model_greedy_three_level_equals_hf_generate(real_sm, encode_offline):
    medium = DraftConfig(skip_attn=(5, 9, 13, 17, 21))
    small = DraftConfig(skip_attn=(3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25), skip_mlp=(10, 14, 18))
    for (name, ids), (m, n) in zip(encode_offline(real_sm, "mtbench,humaneval", n=2, seed=0), [(2, 2), (3, 1)],
                                   strict=True):
        reference = hf_generate(real_sm, ids, max_new_tokens=REAL_NEW)
        out = generate(real_sm, ids, drafter=HierarchicalDrafter(Hierarchy(medium, small, m, n)),
                       max_new_tokens=REAL_NEW)
        assert out.token_ids == reference, name
        stats = dict(out.stats.drafter_stats)
        assert 0 < stats["alpha"] <= 1 and 0 <= stats["beta"] <= 1, stats
