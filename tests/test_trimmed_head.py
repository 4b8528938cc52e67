"""FR-Spec's trimmed draft head as a layer-skip option: the portable subset, the head itself, greedy
identity, exact sampling (a q handed over with the ids shuffled against the rows fails), what a shuffled
head does and does not break, parameter errors, the surrogate's pieces and the report script."""

from __future__ import annotations

import base64
import hashlib
import random
import sys
import zlib

import pytest
import torch
import yaml
from conftest import assert_one_line_error, make_tiny_model
from test_ngram import MUTANT_SAMPLES, chi2_fails, exact_joint, sample_pairs
from typer.testing import CliRunner

from skipsearch import methods
from skipsearch.cli import app
from skipsearch.config import NO_EXIT, Candidate, DraftConfig, ExitRule, SamplingParams
from skipsearch.engine.decoding import Draft, LayerSkipDrafter, generate, hf_generate
from skipsearch.engine.surrogate import calibrate
from skipsearch.methods import ParamsError
from skipsearch.methods.layer_skip import METHOD as LAYER_SKIP
from skipsearch.methods.layer_skip import LayerSkipParams, decode_ids, encode_ids, frequent_tokens, subset_sha256
from skipsearch.methods.layer_skip import drafter as ls_drafter
from skipsearch.methods.layer_skip import surrogate as ls_surrogate
from skipsearch.profile import ModelRef, Profile, load_profile, profile_to_dict, save_profile
from skipsearch.search.objective import ModelObjective

SAMPLES = 1500
PROMPTS = ([1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [5, 9, 2, 33, 7, 5, 9], [40, 41, 42, 43, 40, 41], [7])
SKIP = DraftConfig(skip_attn=(1,), skip_mlp=(2,), max_draft_tokens=3, exit=ExitRule(threshold=0.3, adaptive=True))


def trimmed(draft: DraftConfig, ids) -> Candidate:
    return Candidate(LAYER_SKIP.name, draft, LayerSkipParams.trimmed(ids).to_pairs())


# -- the portable form ------------------------------------------------------------------------------------
@pytest.mark.parametrize("ids", [[0], [5], [0, 1, 2, 3], [127, 128, 16383, 16384, 2**21 + 3],
                                 sorted(random.Random(0).sample(range(128256), 32000))])
def test_ids_round_trip_and_the_checksum_is_over_their_decimal_text(ids):
    text = encode_ids(ids)
    assert decode_ids(text) == tuple(ids) and "\n" not in text
    params = LayerSkipParams.trimmed(reversed([*ids, *ids[:1]]))  # any order, repeats: the sorted set is kept
    assert params.token_ids == tuple(ids) and params.vocab_subset == len(ids)
    assert params.vocab_sha256 == subset_sha256(ids) == hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()


def test_the_encoding_is_leb128_gaps_zlib_base64():
    # written out by hand, as another implementation would read it: 3, then gaps 2 and 300
    raw = zlib.decompress(base64.b64decode(encode_ids([3, 5, 305])))
    assert raw == bytes([3, 2, 0xAC, 0x02])
    assert len(encode_ids(list(range(8192)))) < 100  # a frequency-ranked subset is mostly runs: a few bytes


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("not base64!", "base64"),
        (base64.b64encode(b"not zlib").decode(), "incorrect header check"),
        (base64.b64encode(zlib.compress(bytes([3, 0x81]))).decode(), "cut off"),
        (base64.b64encode(zlib.compress(bytes([3, 0]))).decode(), "repeat"),
    ],
)
def test_bad_encodings_are_refused(text, fragment):
    with pytest.raises(ValueError, match=fragment):
        decode_ids(text)


def test_frequent_tokens_rank_by_count_then_by_id():
    data = [[5, 5, 5, 2], [2, 9, 70]]
    assert frequent_tokens(data, 3, 10) == (2, 5, 9)  # 70 is outside the vocabulary: ignored
    assert frequent_tokens(data, 2, 10) == (2, 5)
    assert frequent_tokens(data, 5, 10) == (0, 1, 2, 5, 9)  # then the lowest unseen ids
    assert frequent_tokens([], 3, 10) == (0, 1, 2)
    with pytest.raises(ParamsError, match=r"vocab_subset must be an integer in 1..10, got 11"):
        frequent_tokens(data, 11, 10)


# -- the head ------------------------------------------------------------------------------------------------
def head_is_right(sm, head, ids) -> bool:
    """The trimmed head's logits are the full head's on ``ids`` and -inf on every other token."""
    h = torch.randn(5, sm.hf.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        full, mine = sm.lm_head(h), head(h)  # [5, V] each
    others = torch.ones(full.shape[-1], dtype=torch.bool)
    others[list(ids)] = False
    return bool(torch.allclose(mine[:, list(ids)], full[:, list(ids)], rtol=1e-4, atol=1e-4)) and bool(
        torch.isneginf(mine[:, others]).all())


def test_the_head_computes_the_subset_s_logits_and_a_shuffled_mapping_is_caught(tiny_sm):
    ids = [1, 4, 9, 16, 25, 36, 49, 63]
    head = tiny_sm.subset_head(torch.tensor(ids))
    assert head.weight.shape == (8, tiny_sm.hf.config.hidden_size) and head_is_right(tiny_sm, head, ids)
    head.ids = head.ids[torch.randperm(8, generator=torch.Generator().manual_seed(0))]  # rows no longer match ids
    assert not head_is_right(tiny_sm, head, ids)


def test_draft_head_swaps_the_head_and_always_puts_it_back(tiny_sm):
    full = tiny_sm.lm_head
    head = tiny_sm.subset_head(torch.tensor([3, 5]))
    with pytest.raises(RuntimeError, match="boom"), tiny_sm.draft_head(head):
        assert tiny_sm.lm_head is head
        logits = tiny_sm.forward(torch.tensor([1, 2]), start=0, cache=tiny_sm.new_cache(), last_only=True)
        assert torch.isfinite(logits[0]).sum() == 2 and int(logits[0].argmax()) in (3, 5)
        raise RuntimeError("boom")
    assert tiny_sm.lm_head is full
    with tiny_sm.draft_head(None):
        assert tiny_sm.lm_head is full


# -- greedy identity --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ids", [range(0, 64, 2), range(40, 44), [7], range(64)], ids=["half", "four", "one", "all"])
def test_greedy_equals_hf_greedy_on_the_tiny_model(tiny_sm, ids):
    for prompt in PROMPTS:
        result = generate(tiny_sm, prompt, drafter=methods.build_drafter(trimmed(SKIP, ids), tiny_sm),
                          max_new_tokens=30)
        assert result.token_ids == hf_generate(tiny_sm, prompt, max_new_tokens=30)
        assert result.stats.drafted_tokens > 0


def test_the_whole_vocabulary_drafts_exactly_what_the_full_head_drafts(tiny_sm):
    """V' = V (in a scrambled order) changes nothing; the same head with its ids shuffled against its rows is
    still lossless (q is read off the logits the draft is drawn from) but drafts other tokens, which this
    comparison, and the acceptance it gives, catch."""
    perm = random.Random(1).sample(range(64), 64)
    same = tiny_sm.subset_head(torch.tensor(perm))
    wrong = tiny_sm.subset_head(torch.tensor(perm))
    wrong.ids = wrong.ids[torch.randperm(64, generator=torch.Generator().manual_seed(2))]
    config = DraftConfig(skip_attn=(1,), max_draft_tokens=3, exit=NO_EXIT)
    accepted = {}
    for name, head in (("full", None), ("same", same), ("wrong", wrong)):
        stats = []
        for prompt in PROMPTS:
            result = generate(tiny_sm, prompt, drafter=LayerSkipDrafter(config, head=head), max_new_tokens=30)
            assert result.token_ids == hf_generate(tiny_sm, prompt, max_new_tokens=30)
            stats.append((result.stats.drafted_tokens, result.stats.accepted_tokens))
        accepted[name] = stats
    assert accepted["same"] == accepted["full"]
    assert sum(a for _, a in accepted["wrong"]) < 0.5 * sum(a for _, a in accepted["full"])


def test_greedy_equals_hf_greedy_on_the_real_model(real_sm, encode_offline):
    prompts = [ids for _, ids in encode_offline(real_sm, "mtbench,humaneval", n=2, seed=0)]
    ids = frequent_tokens(prompts, 8192, real_sm.lm_head.weight.shape[0])
    draft = DraftConfig(skip_attn=(15, 19, 23, 27), max_draft_tokens=2, exit=ExitRule(threshold=0.5, adaptive=False))
    accepted = 0
    for prompt in prompts:
        result = generate(real_sm, prompt, drafter=methods.build_drafter(trimmed(draft, ids), real_sm),
                          max_new_tokens=32)
        assert result.token_ids == hf_generate(real_sm, prompt, max_new_tokens=32)
        accepted += result.stats.accepted_tokens
    assert accepted > 0
    head = ls_drafter.subset_head(real_sm, LayerSkipParams.trimmed(ids))
    assert head_is_right(real_sm, head, ids)


# -- sampling -----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sm16():
    return make_tiny_model(vocab_size=16, num_layers=4, head_scale=10.0, name="tiny16-trimmed")


SUBSET16 = (0, 2, 3, 5, 8, 9, 12, 14)
DRAFT16 = DraftConfig(skip_attn=(1, 2), max_draft_tokens=2, exit=NO_EXIT)


class ShuffledQ(LayerSkipDrafter):
    """A broken trimmed draft: it draws its tokens from the right head, but the q it hands the verifier
    puts each subset logit on another subset id (ids shuffled against the weight rows)."""

    def __init__(self, config, head, wrong_head) -> None:
        super().__init__(config, head=head)
        self.wrong = LayerSkipDrafter(config, head=wrong_head)

    def draft(self, sm, cache, *, pending, start, limit, sampling, generator):
        d = super().draft(sm, cache, pending=pending, start=start, limit=limit, sampling=sampling, generator=generator)
        sm.crop(cache, start)
        from skipsearch.engine.decoding import process_logits

        rows = []
        with sm.drafting(self.config), sm.draft_head(self.wrong.head):  # the same inputs, through the wrong head
            for j, token in enumerate((pending, *d.tokens[:-1])):
                logits = sm.forward(torch.tensor([token]), start=start + j, cache=cache, last_only=True)[-1]
                rows.append(process_logits(logits, sampling))
        return Draft(d.tokens, torch.stack(rows))


def test_sampling_follows_the_model_and_a_shuffled_q_fails(sm16):
    sampling = SamplingParams(temperature=1.0)
    prompt = [5, 9, 2, 5, 9]
    params = LayerSkipParams.trimmed(SUBSET16)
    candidate = Candidate(LAYER_SKIP.name, DRAFT16, params.to_pairs())
    joint = exact_joint(sm16, prompt, sampling)
    counts, first = sample_pairs(sm16, prompt, lambda: methods.build_drafter(candidate, sm16), sampling, n=SAMPLES)
    assert chi2_fails(counts, joint, SAMPLES) == []
    assert sum(first) == SAMPLES and min(first) > 0.03 * SAMPLES, first
    # the draft never proposes a token outside the subset, and its q is zero there
    drafter = methods.build_drafter(candidate, sm16)
    cache = sm16.new_cache()
    sm16.forward(torch.tensor(prompt), start=0, cache=cache)
    d = drafter.draft(sm16, cache, pending=1, start=len(prompt), limit=2, sampling=sampling,
                      generator=torch.Generator().manual_seed(0))
    outside = [t for t in range(16) if t not in SUBSET16]
    assert set(d.tokens) <= set(SUBSET16) and float(d.probs[:, outside].abs().sum()) == 0.0
    torch.testing.assert_close(d.probs.sum(-1), torch.ones(2))
    # the same sampler with q shuffled against the rows is caught
    head = ls_drafter.subset_head(sm16, params)
    wrong = sm16.subset_head(torch.tensor(SUBSET16))
    wrong.ids = wrong.ids[torch.tensor([3, 0, 1, 2, 7, 4, 5, 6])]
    bad, _ = sample_pairs(sm16, prompt, lambda: ShuffledQ(DRAFT16, head, wrong), sampling, n=MUTANT_SAMPLES)
    assert chi2_fails(bad, joint, MUTANT_SAMPLES), "a q with shuffled ids passed the check"


# -- profiles and parameters ---------------------------------------------------------------------------------------
def _profile(ids=range(0, 64, 3), draft=SKIP) -> Profile:
    return Profile(model=ModelRef(name="tiny", num_layers=4), method=LAYER_SKIP.name, draft=draft,
                   method_params=LayerSkipParams.trimmed(ids).to_pairs())


def test_the_profile_alone_rebuilds_the_same_head(tiny_sm, tmp_path):
    path = save_profile(_profile(), tmp_path / "trimmed.yaml")
    text = path.read_text()
    assert "vocab_ids:" in text and "vocab_sha256:" in text and "vocab_subset: 22" in text
    decode_ids.cache_clear()  # "another machine": nothing remembered
    ls_drafter._HEADS.clear()
    loaded = load_profile(path)
    params = LAYER_SKIP.parse(loaded.method_params, draft=loaded.draft, num_layers=4)
    assert params.token_ids == tuple(range(0, 64, 3))
    drafter = methods.build_drafter(loaded.candidate, tiny_sm)
    assert drafter.head is ls_drafter.subset_head(tiny_sm, params)  # built once per model and subset
    torch.testing.assert_close(drafter.head.weight, tiny_sm.lm_head.weight[list(range(0, 64, 3))])
    assert methods.build_drafter(Candidate(LAYER_SKIP.name, DraftConfig(max_draft_tokens=0), loaded.method_params),
                                 tiny_sm) is None


def _bad(**edits) -> dict:
    raw = profile_to_dict(_profile())
    for key, value in edits.items():
        if value is None:
            del raw["method_params"][key]
        else:
            raw["method_params"][key] = value
    return raw


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (_bad(vocab_sha256="0" * 64), "layer-skip: method_params.vocab_sha256 does not match vocab_ids"),
        (_bad(vocab_subset=21), "layer-skip: method_params.vocab_ids holds 22 ids, but vocab_subset is 21"),
        (_bad(vocab_subset=0), "layer-skip: method_params.vocab_subset must be an integer >= 1, got 0"),
        (_bad(vocab_ids=None), "layer-skip: method_params.vocab_ids is missing"),
        (_bad(vocab_ids="%%%"), "layer-skip: method_params.vocab_ids is not base64 of zlib-compressed LEB128 gaps"),
        (_bad(vocab_ids=[1, 2]), "layer-skip: method_params.vocab_ids and vocab_sha256 must be strings"),
        (_bad(vocab_head=3), "layer-skip: unknown key method_params.vocab_head (known: vocab_subset, vocab_ids, "
                             "vocab_sha256)"),
    ],
)
def test_bad_params_are_one_line_errors(tmp_path, raw, fragment):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert_one_line_error(CliRunner().invoke(app, ["profile", "validate", str(path)]), fragment)
    assert_one_line_error(CliRunner().invoke(app, ["decode", "--profile", str(path), "--prompt", "x"]), fragment)


def test_ids_beyond_the_vocabulary_fail_when_the_drafter_is_built(tiny_sm):
    with pytest.raises(ParamsError, match=r"^layer-skip: method_params.vocab_ids has token 64, but the model's "
                                          r"vocabulary has 64 tokens \(0..63\)$"):
        methods.build_drafter(trimmed(SKIP, [1, 64]), tiny_sm)


# -- the surrogate's pieces ------------------------------------------------------------------------------------------
def test_the_surrogate_reads_traces_through_the_trimmed_head(tiny_sm):
    cal = calibrate(tiny_sm, list(PROMPTS), max_new_tokens=20)
    objective = ModelObjective(tiny_sm, cal)
    config = DraftConfig(skip_attn=(1,), max_draft_tokens=1, exit=NO_EXIT)
    full = objective.evaluate(Candidate(LAYER_SKIP.name, config), kind="surrogate")
    everything = objective.evaluate(trimmed(config, random.Random(3).sample(range(64), 64)), kind="surrogate")
    assert everything.alpha == full.alpha  # V' = V: the same draft, so the same agreement
    assert everything.cost_ratio <= full.cost_ratio + 1e-9  # never charged more than the full head
    outside = sorted({t for c in cal.continuations for t in c})[:3]
    fewer = objective.evaluate(trimmed(config, [t for t in range(64) if t not in outside]), kind="surrogate")
    assert fewer.alpha < full.alpha  # tokens the model emits but the head cannot draft cost agreement
    head = LayerSkipParams.trimmed([t for t in range(64) if t not in outside])
    traces = ls_surrogate.draft_traces(objective, config, head)
    assert not any(p in outside for tr in traces for p in tr.predictions)


def test_the_report_script_runs_on_a_tiny_model(tiny_sm, monkeypatch, tmp_path):
    import importlib.util
    import json
    from pathlib import Path

    scripts = Path(__file__).resolve().parent.parent / "scripts"
    monkeypatch.syspath_prepend(str(scripts))  # as `python scripts/...` runs it: its shared setup sits beside it
    spec = importlib.util.spec_from_file_location("report_trimmed_head", scripts / "report_trimmed_head.py")
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, script)  # its dataclasses look their module up there
    spec.loader.exec_module(script)
    monkeypatch.setattr("_common.load_model", lambda *a, **k: tiny_sm)
    monkeypatch.setattr("skipsearch.engine.calibration.encode_prompt",
                        lambda tokenizer, prompt: [1, 2, 3, 1, len(prompt.text) % 60])
    out, rows = tmp_path / "report.md", tmp_path / "rows.json"
    assert script.main(["--n-prompts", "2", "--heldout", "1", "--max-new-tokens", "8", "--vocab-sizes", "32,8",
                        "--drafts", "2", "--timed", "1", "--rounds", "2", "--out", str(out), "--json", str(rows)]) == 0
    data = json.loads(rows.read_text())
    assert [r["vocab"] for r in data] == [64, 32, 8] * 2 and data[0]["timed"] is not None and data[3]["timed"] is None
    assert all(r["c_cut"] == 0.0 for r in data[::3])
    assert "| draft | V' | c |" in out.read_text() and "Goal" in out.read_text()
