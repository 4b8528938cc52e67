"""Prompt lookup (``method: ngram``): the index, greedy identity, exact sampling, the exact surrogate,
parameter errors and the search end to end.

The sampling helpers here (``exact_joint``, ``sample_pairs``, ``chi2_fails``) serve test_hybrid.py and
test_trimmed_head.py too: t1 comes from the prefill, the first cycle drafts two tokens, and the empirical
(t2, t3) of the speculative sampler is compared with the model's own P(t2, t3), enumerated exactly.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

import pytest
import torch
import yaml
from conftest import assert_one_line_error, make_tiny_model
from test_decoding import _chi2, _chi2_critical
from typer.testing import CliRunner

from skipsearch import methods
from skipsearch.cli import app
from skipsearch.config import NO_EXIT, Candidate, DraftConfig, SamplingParams
from skipsearch.engine.decoding import Draft, generate, hf_generate, process_logits
from skipsearch.engine.surrogate import calibrate
from skipsearch.methods.ngram import METHOD as NGRAM
from skipsearch.methods.ngram import NgramDrafter, NgramIndex, NgramParams
from skipsearch.profile import ModelRef, Profile, load_profile, profile_to_dict, save_profile
from skipsearch.search.objective import ModelObjective

V16 = 16
SAMPLES = 1500
MUTANT_SAMPLES = 500  # a broken sampler fails by a wide margin: chi2 several times the critical value


def ngram(min_n: int = 1, max_n: int = 3, k: int = 4) -> Candidate:
    return Candidate(NGRAM.name, DraftConfig(max_draft_tokens=k, exit=NO_EXIT), NgramParams(min_n, max_n).to_pairs())


# -- the index ----------------------------------------------------------------------------------------------
def naive_lookup(seq: list[int], k: int, min_n: int, max_n: int) -> tuple[int, ...]:
    """The rule written out by brute force: longest n first, the latest occurrence ending before the last
    token, then the tokens after it, copied on over the draft itself where they run out."""
    end = len(seq) - 1
    for n in range(max_n, min_n - 1, -1):
        if n > end:
            continue
        suffix = seq[end - n + 1:]
        for hit in range(end - 1, n - 2, -1):
            if seq[hit - n + 1: hit + 1] == suffix:
                out = list(seq)
                for j in range(k):
                    out.append(out[hit + 1 + j])
                return tuple(out[len(seq):])
    return ()


def test_the_latest_earlier_match_wins():
    seq = [1, 2, 3, 9, 1, 2, 4, 7, 1, 2]
    assert NgramIndex(2, 2).lookup(seq, 2) == (4, 7)  # (1, 2) ended at 1 and at 5: the later one
    assert NgramIndex(1, 1).lookup(seq, 3) == (4, 7, 1)


def test_the_longest_suffix_is_tried_first():
    seq = [5, 6, 7, 8, 0, 7, 9, 5, 6, 7]
    assert NgramIndex(1, 3).lookup(seq, 2) == (8, 0)  # (5, 6, 7) matches; the later (7,) does not count
    assert NgramIndex(1, 1).lookup(seq, 2) == (9, 5)


def test_no_match_drafts_nothing():
    assert NgramIndex(1, 3).lookup([1, 2, 3, 4], 4) == ()
    assert NgramIndex(2, 3).lookup([1, 2, 3, 2], 4) == ()  # only a 1-gram repeats, below min_n
    assert NgramIndex(1, 3).lookup([7], 4) == ()  # the suffix itself is no earlier match
    assert NgramIndex(1, 3).lookup([1, 2, 1], 0) == ()


def test_a_repeating_pattern_drafts_k_tokens_not_one_period():
    assert NgramIndex(1, 3).lookup([4, 4, 4], 5) == (4, 4, 4, 4, 4)
    assert NgramIndex(2, 2).lookup([9, 1, 2, 1, 2], 5) == (1, 2, 1, 2, 1)
    assert NgramIndex(1, 1).lookup([3, 1, 2, 3], 4) == (1, 2, 3, 1)


@pytest.mark.parametrize(("min_n", "max_n"), [(1, 1), (1, 3), (2, 4), (3, 3)])
def test_extending_the_index_equals_building_it_from_scratch(min_n, max_n):
    rng = random.Random(min_n * 10 + max_n)
    seq = [rng.randrange(6) for _ in range(8)]
    grown = NgramIndex(min_n, max_n)
    for _ in range(120):
        k = rng.randrange(0, 6)
        got = grown.lookup(seq, k)
        assert got == NgramIndex(min_n, max_n).lookup(seq, k) == naive_lookup(seq, k, min_n, max_n), seq
        seq.extend(rng.choice([[rng.randrange(6)], list(got[: rng.randrange(len(got) + 1)]) + [rng.randrange(6)]]))


def test_params_validate():
    with pytest.raises(methods.ParamsError, match=r"^ngram: method_params.min_n \(3\) must be <= max_n \(2\)$"):
        NgramParams(3, 2)
    with pytest.raises(methods.ParamsError, match="must be an integer in 1..16, got 0"):
        NgramParams(0, 2)


# -- greedy identity ------------------------------------------------------------------------------------------
TINY_PROMPTS = ([1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [5, 9, 2, 33, 7, 5, 9], [40, 41, 42, 43, 40, 41], [7])


@pytest.mark.parametrize(("min_n", "max_n", "k"), [(1, 1, 1), (1, 3, 4), (2, 4, 8), (1, 2, 12)])
def test_greedy_equals_hf_greedy_on_the_tiny_model(tiny_sm, min_n, max_n, k):
    drafted = accepted = 0
    for prompt in TINY_PROMPTS:
        result = generate(tiny_sm, prompt, drafter=methods.build_drafter(ngram(min_n, max_n, k), tiny_sm),
                          max_new_tokens=40)
        assert result.token_ids == hf_generate(tiny_sm, prompt, max_new_tokens=40)
        drafted += result.stats.drafted_tokens
        accepted += result.stats.accepted_tokens
        assert result.stats.draft_steps == 0  # a lookup runs no draft model, whatever it drafted
    assert accepted > 0 and drafted > accepted  # lookups hit, and some were rejected


def _code_prompts(sm, encode_offline) -> list[list[int]]:
    return [ids for name, ids in encode_offline(sm, "humaneval", n=8, seed=0)]


def test_greedy_equals_hf_greedy_on_the_real_model(real_sm, encode_offline):
    stats = []
    for ids in _code_prompts(real_sm, encode_offline)[:3]:
        result = generate(real_sm, ids, drafter=methods.build_drafter(ngram(1, 3, 6), real_sm), max_new_tokens=48)
        assert result.token_ids == hf_generate(real_sm, ids, max_new_tokens=48)
        stats.append(result.stats)
    assert sum(s.accepted_tokens for s in stats) > 10  # code repeats its prompt: lookup pays here
    hits = sum(dict(s.drafter_stats)["lookup_hits"] for s in stats)
    assert hits > 0 and sum(s.verify_steps for s in stats) < sum(s.new_tokens - 1 for s in stats)


# -- sampling: the output follows the model, and a wrong residual is caught -------------------------------
@pytest.fixture(scope="module")
def sm16():
    # vocab 16 with a 10x LM head: peaked but far from deterministic next-token distributions
    return make_tiny_model(vocab_size=V16, num_layers=4, head_scale=10.0, name="tiny16-lookup")


def exact_joint(sm, prompt: list[int], sampling: SamplingParams) -> torch.Tensor:
    """P(t2, t3) [V, V] after ``prompt``, t1 summed out, from the full model by enumeration."""
    v, n = sm.lm_head.weight.shape[0], len(prompt)
    grid = torch.cartesian_prod(torch.arange(v), torch.arange(v))  # [V*V, 2]: (t1, t2)
    ids = torch.cat([torch.tensor(prompt).expand(len(grid), n), grid], dim=1)  # [V*V, n+2]
    with torch.inference_mode():
        logits = sm.hf(input_ids=ids).logits.double()  # [V*V, n+2, V]
    p = process_logits(logits[:, n - 1:], sampling).view(v, v, 3, v)
    p1, p2, p3 = p[0, 0, 0], p[:, 0, 1], p[:, :, 2]  # [t1], [t1, t2], [t1, t2, t3]
    return (p1[:, None, None] * p2[:, :, None] * p3).sum(0)  # [t2, t3]


def sample_pairs(sm, prompt: list[int], make_drafter: Callable[[], object], sampling: SamplingParams,
                 n: int = SAMPLES) -> tuple[torch.Tensor, list[int]]:
    """(t2, t3) counts over ``n`` seeded decodes of 4 tokens, and how often the first cycle accepted 0, 1, 2."""
    v = sm.lm_head.weight.shape[0]
    counts = torch.zeros(v, v, dtype=torch.float64)
    first = [0, 0, 0]
    for seed in range(n):
        drafter, seen = make_drafter(), []
        observe = drafter.observe
        drafter.observe = lambda d, a, seen=seen, observe=observe: (seen.append((d, a)), observe(d, a))
        out = generate(sm, prompt, drafter=drafter, sampling=sampling, max_new_tokens=4, eos_token_ids=(),
                       seed=seed).token_ids
        counts[out[1], out[2]] += 1
        if seen and seen[0][0] == 2:
            first[seen[0][1]] += 1
    return counts, first


def chi2_fails(counts: torch.Tensor, joint: torch.Tensor, n: int = SAMPLES) -> list[str]:
    """The chi-square checks (joint, t2, t3 marginals; p = 1e-4 each) that reject "counts follow joint"."""
    failed = [] if float(counts[joint == 0].sum()) == 0 else ["impossible pair"]
    for name, obs, exp in (("joint", counts, joint), ("t2", counts.sum(1), joint.sum(1)),
                           ("t3", counts.sum(0), joint.sum(0))):
        stat, df = _chi2(obs, exp, n)
        if stat >= _chi2_critical(df):
            failed.append(f"{name}: chi2 {stat:.0f} >= {_chi2_critical(df):.0f}")
    return failed


@pytest.fixture(scope="module")
def looping_prompt(sm16) -> list[int]:
    """The model's own greedy text, which repeats: the lookup hits often and its drafts are often right,
    so that every path of the first cycle (reject d1, accept d1 only, accept both) is taken often."""
    return [5, 9, *generate(sm16, [5, 9], max_new_tokens=24, eos_token_ids=()).token_ids]


class UniformQ(NgramDrafter):
    """A broken lookup: it reports q uniform instead of one-hot, so it accepts d with min(1, V p(d)) and
    draws rejections from the wrong residual."""

    def draft(self, sm, cache, **kw):
        d = super().draft(sm, cache, **kw)
        return d if d.probs is None else Draft(d.tokens, torch.full_like(d.probs, 1.0 / d.probs.shape[-1]))


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_k=6)],
                         ids=["t1.0", "t0.8-topk6"])
def test_sampling_follows_the_model_and_a_wrong_residual_fails(sm16, looping_prompt, sampling):
    params = NgramParams(1, 2)
    joint = exact_joint(sm16, looping_prompt, sampling)
    counts, first = sample_pairs(sm16, looping_prompt, lambda: NgramDrafter(params, 2), sampling)
    assert chi2_fails(counts, joint) == []
    # the lookup drafted in the first cycle of a third of the decodes at least, and every path ran often
    assert sum(first) > SAMPLES / 3 and min(first) > 0.05 * sum(first), first
    broken, _ = sample_pairs(sm16, looping_prompt, lambda: UniformQ(params, 2), sampling, n=MUTANT_SAMPLES)
    assert chi2_fails(broken, joint, MUTANT_SAMPLES), "a sampler with the wrong residual passed the check"


# -- the surrogate replays the decoder exactly ----------------------------------------------------------------
def _measured(sm, cal, candidate) -> tuple[float, float, int]:
    drafted = accepted = steps = emitted = 0
    for prompt in cal.prompts:
        s = generate(sm, prompt, drafter=methods.build_drafter(candidate, sm), max_new_tokens=cal.max_new_tokens).stats
        drafted, accepted = drafted + s.drafted_tokens, accepted + s.accepted_tokens
        steps, emitted = steps + s.verify_steps, emitted + s.new_tokens - 1
    return accepted / drafted, emitted / steps, drafted


@pytest.mark.parametrize("eos", [False, True], ids=["no-eos", "eos"])
def test_the_surrogate_predicts_the_measured_acceptance_exactly(eos):
    sm = make_tiny_model(num_layers=2, name="tiny-lookup-surrogate")
    prompts = [list(p) for p in TINY_PROMPTS[:3]] + [[8, 8, 8, 2]]
    if eos:  # a token the model emits mid-sequence ends decoding: drafts past it, and accepted EOS, count right
        sm.hf.generation_config.eos_token_id = generate(sm, prompts[0], max_new_tokens=12).token_ids[6]
    cal = calibrate(sm, prompts, max_new_tokens=30)
    assert not eos or min(map(len, cal.continuations)) < 30
    objective = ModelObjective(sm, cal)
    for candidate in (ngram(1, 1, 2), ngram(1, 3, 6), ngram(2, 2, 12)):
        predicted = objective.evaluate(candidate, kind="surrogate")
        acceptance, tau, drafted = _measured(sm, cal, candidate)
        assert drafted > 0
        assert predicted.acceptance_rate == acceptance and predicted.tau == tau


def test_the_surrogate_is_exact_on_real_code_prompts(real_sm, encode_offline):
    cal = calibrate(real_sm, _code_prompts(real_sm, encode_offline)[:2], max_new_tokens=32)
    objective = ModelObjective(real_sm, cal)
    predicted = objective.evaluate(ngram(1, 3, 4), kind="surrogate")
    acceptance, tau, _ = _measured(real_sm, cal, ngram(1, 3, 4))
    assert (predicted.acceptance_rate, predicted.tau) == (acceptance, tau)


# -- bad parameters: one line, exit 2 ----------------------------------------------------------------------------
def _profile_file(tmp_path, *, params: dict, draft: dict | None = None):
    prof = Profile(model=ModelRef(name="smollm2-135m", num_layers=30), method=NGRAM.name,
                   draft=DraftConfig(max_draft_tokens=4, exit=NO_EXIT), method_params=(("min_n", 1), ("max_n", 3)))
    raw = profile_to_dict(prof)
    raw["method_params"] = params
    raw["draft"].update(draft or {})
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(
    ("params", "draft", "fragment"),
    [
        ({"min_n": 3, "max_n": 2}, None, "ngram: method_params.min_n (3) must be <= max_n (2)"),
        ({"min_n": 0, "max_n": 2}, None, "ngram: method_params.min_n must be an integer in 1..16, got 0"),
        ({"min_n": 1, "max_n": 0}, None, "ngram: method_params.max_n must be an integer in 1..16, got 0"),
        ({"min_n": 1, "max_n": 17}, None, "ngram: method_params.max_n must be an integer in 1..16, got 17"),
        ({"min_n": "2"}, None, "ngram: method_params.min_n must be an integer in 1..16"),
        ({"min_n": 1, "span": 2}, None, "ngram: unknown key method_params.span (known: min_n, max_n)"),
        ({"min_n": 1}, {"skip_attn": [3]}, "ngram: draft.skip_attn and draft.skip_mlp must be empty"),
    ],
)
def test_bad_params_are_one_line_errors(tmp_path, params, draft, fragment):
    path = _profile_file(tmp_path, params=params, draft=draft)
    assert_one_line_error(CliRunner().invoke(app, ["profile", "validate", str(path)]), fragment)
    assert_one_line_error(CliRunner().invoke(app, ["decode", "--profile", str(path), "--prompt", "x"]), fragment)


# -- the search, end to end --------------------------------------------------------------------------------------
def test_optimize_ngram_writes_a_valid_profile(tiny_sm, monkeypatch, tmp_path):
    from skipsearch.model import loader

    monkeypatch.setattr(loader, "load_model", lambda *a, **k: tiny_sm)
    monkeypatch.setattr("skipsearch.engine.calibration.encode_prompt",
                        lambda tokenizer, prompt: [1, 2, 3, 1, 2, len(prompt.text) % 60])
    out = tmp_path / "ngram.yaml"
    result = CliRunner().invoke(app, ["optimize", "--strategy", "ngram", "--n", "1,2", "--budget", "6",
                                      "--n-prompts", "2", "--max-new-tokens", "12", "--shortlist", "2",
                                      "--study", str(tmp_path / "study"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert CliRunner().invoke(app, ["profile", "validate", str(out)]).exit_code == 0
    prof = load_profile(out)
    assert prof.method == NGRAM.name and prof.search.strategy == NGRAM.name
    params = NGRAM.parse(prof.method_params, draft=prof.draft, num_layers=prof.model.num_layers)
    assert 1 <= params.min_n <= params.max_n <= 2
    timed = dict(prof.measured.extra)["timed"]
    assert 1 <= len(timed) <= 2 and all(row[0].startswith(NGRAM.name) for row in timed)
    json.dumps(profile_to_dict(prof))  # plain data all through
    assert load_profile(save_profile(prof, tmp_path / "again.yaml")) == prof
