"""The batched engine (engine.batched): B prompts in one row cache (a slot per position, per row) and per-row masks.

Greedy identity, batched: every row of a speculative batch decodes what plain batched greedy decodes, and plain
batched greedy decodes what ``decoding.generate`` does for each prompt alone. A difference is allowed only at a
numerical tie: where the reference's top two logits, teacher-forced at the first divergence, are within
``TIE_REL`` of each other (relative to the top logit). Ties are counted and reported in the assertion message.
Covered: mixed prompt lengths, mixed acceptance (a row that accepts everything beside one that accepts nothing),
rows that stop at EOS at different cycles, B = 1, and the lookup, precision and hybrid drafts. Refusals are one
line: a method that cannot batch (through the CLI too: exit 2), sampling, a batch that does not fit memory (before
any forward runs).
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_one_line_error, make_tiny_model
from typer.testing import CliRunner

from skipsearch import api, methods
from skipsearch.cli import app
from skipsearch.config import NO_EXIT, Candidate, ConfigError, DraftConfig, ExitRule, SamplingParams
from skipsearch.engine import batched
from skipsearch.engine.batched import BatchRefused, check_fits, decode_rows, generate_batch
from skipsearch.engine.decoding import generate
from skipsearch.engine.draft import BatchDrafter
from skipsearch.methods.hybrid import HybridParams
from skipsearch.methods.ngram import NgramParams
from skipsearch.methods.precision import PrecisionParams

TIE_REL = 1e-4  # a top-two logit gap under this fraction of the top logit is a numerical tie
PROMPTS = ([5, 9, 2, 33, 7, 12], [1, 2, 3], [40, 41, 42, 43, 40, 41, 17, 3, 4, 5, 40, 41], [7, 7, 7, 7])
NEW = 24


@pytest.fixture(scope="module")
def sm():
    # hidden and intermediate sizes that the precision schemes' kernels accept (as tests/test_precision.py's)
    from transformers import LlamaConfig, LlamaForCausalLM

    from skipsearch.model.skippable import SkippableModel

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False, attn_implementation="sdpa")
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(5.0)
    model.generation_config.eos_token_id = None
    return SkippableModel(model, tokenizer=None, name="tiny-batched")


def _ties(sm, prompts, outputs, references) -> tuple[int, list[str]]:
    """(rows that part from their reference at a numerical tie, rows that part elsewhere: described)."""
    ties, bad = 0, []
    for row, (prompt, out, ref) in enumerate(zip(prompts, outputs, references, strict=True)):
        out, ref = tuple(out), tuple(ref)
        if out == ref:
            continue
        d = next((j for j, (a, b) in enumerate(zip(out, ref, strict=False)) if a != b), min(len(out), len(ref)))
        if d >= min(len(out), len(ref)):
            bad.append(f"row {row}: lengths {len(out)} and {len(ref)}, equal up to the shorter")
            continue
        cache = sm.new_cache()
        logits = sm.forward(torch.tensor([*prompt, *ref[:d]]), start=0, cache=cache, last_only=True)[-1]  # [V]
        top2 = logits.topk(2).values
        gap, scale = float(top2[0] - top2[1]), abs(float(top2[0]))
        if gap <= TIE_REL * scale and {out[d], ref[d]} <= set(logits.topk(2).indices.tolist()):
            ties += 1
        else:
            bad.append(f"row {row}: parts at token {d} ({out[d]} vs {ref[d]}), top-two gap {gap:.3g} "
                       f"> {TIE_REL} x {scale:.3g}")
    return ties, bad


def assert_same_rows(sm, prompts, outputs, references, what: str) -> None:
    ties, bad = _ties(sm, prompts, outputs, references)
    assert not bad, f"{what}: {len(bad)} row(s) differ outside a numerical tie ({ties} tie(s)): {'; '.join(bad)}"


def _candidates() -> dict[str, Candidate]:
    fp16 = PrecisionParams(scheme="fp16")
    return {
        "ngram": Candidate("ngram", DraftConfig(max_draft_tokens=3, exit=NO_EXIT), NgramParams(1, 3).to_pairs()),
        "precision": Candidate("precision", DraftConfig(skip_attn=(2,), max_draft_tokens=4,
                                                        exit=ExitRule(threshold=0.5, adaptive=True)),
                               fp16.to_pairs()),
        "hybrid": Candidate("hybrid", DraftConfig(max_draft_tokens=3, exit=NO_EXIT),
                            HybridParams(min_n=2, max_n=3, fallback="precision", fallback_k=2,
                                         fallback_params=fp16.to_pairs()).to_pairs()),
    }


# -- plain batched greedy: the reference ---------------------------------------------------------------------------
def test_plain_batched_greedy_decodes_each_prompt_as_it_decodes_alone(sm):
    """Mixed prompt lengths in one cache (left-padded, per-row positions): each row is ``decoding.generate``'s."""
    res = generate_batch(sm, PROMPTS, max_new_tokens=NEW)
    alone = [generate(sm, p, max_new_tokens=NEW).token_ids for p in PROMPTS]
    assert_same_rows(sm, PROMPTS, res.token_ids, alone, "plain batched vs one at a time")
    s = res.stats
    assert (s.batch_size, s.k, s.new_tokens, s.drafted_tokens, s.draft_steps) == (len(PROMPTS), 0, NEW * 4, 0, 0)
    assert s.verify_steps == NEW - 1  # one batched forward per token after the prefill's


def test_a_batch_of_one_is_decoding_generate(sm):
    """B = 1 through the batched loop itself and through generate_batch (which hands it to decoding.generate)."""
    for prompt in PROMPTS:
        ref = generate(sm, prompt, max_new_tokens=NEW).token_ids
        assert_same_rows(sm, [prompt], decode_rows(sm, [prompt], max_new_tokens=NEW).token_ids, [ref], "loop, B=1")
        assert generate_batch(sm, [prompt], max_new_tokens=NEW).token_ids == (ref,)
        lookup = _candidates()["ngram"]
        looped = decode_rows(sm, [prompt], drafter=methods.batch_drafter(lookup, sm), k=3, max_new_tokens=NEW)
        assert_same_rows(sm, [prompt], looped.token_ids, [ref], "loop with lookup, B=1")
        one = generate_batch(sm, [prompt], drafter=methods.batch_drafter(lookup, sm), k=3, max_new_tokens=NEW)
        single = generate(sm, prompt, drafter=methods.build_drafter(lookup, sm), max_new_tokens=NEW)
        assert one.token_ids == (single.token_ids,)
        assert (one.stats.drafted_tokens, one.stats.accepted_tokens, one.stats.verify_steps) == (
            single.stats.drafted_tokens, single.stats.accepted_tokens, single.stats.verify_steps)


def test_rows_stop_at_their_own_eos_and_the_others_go_on(sm):
    plain = generate_batch(sm, PROMPTS, max_new_tokens=NEW)
    eos = plain.token_ids[1][3]  # row 1 stops at its 4th token; the others when (if) they reach it
    res = generate_batch(sm, PROMPTS, drafter=methods.batch_drafter(_candidates()["ngram"], sm), k=3,
                         max_new_tokens=NEW, eos_token_ids=[eos])
    alone = [generate(sm, p, max_new_tokens=NEW, eos_token_ids=[eos]).token_ids for p in PROMPTS]
    assert_same_rows(sm, PROMPTS, res.token_ids, alone, "EOS per row")
    assert res.token_ids[1][-1] == eos and len(res.token_ids[1]) <= 4
    assert res.stats.new_tokens == sum(len(o) for o in res.token_ids)


# -- speculative batches -------------------------------------------------------------------------------------------
class _Oracle(BatchDrafter):
    """Test only: row 0 drafts its reference continuation (accepts everything), row 1 a token the full model
    never picks there (accepts nothing); other rows draft nothing. Records what each row drafted and kept."""

    wants_tokens = True

    def __init__(self, prompts, references, vocab: int) -> None:
        self.prompts, self.references, self.vocab = prompts, references, vocab
        self.drafted: list[int] = []
        self.accepted: list[int] = []

    def begin(self, rows: int) -> None:
        self.drafted, self.accepted = [0] * rows, [0] * rows

    def draft(self, sm, step, *, pending, limits, history):
        out = []
        for row, (seq, limit) in enumerate(zip(history, limits, strict=True)):
            t = len(seq) - len(self.prompts[row])  # tokens emitted so far: the next is reference[t]
            ref = self.references[row]
            if row == 0:
                out.append(tuple(ref[t : t + limit]))
            elif row == 1 and limit and t < len(ref):
                out.append(tuple((ref[t] + 1 + j) % self.vocab for j in range(limit)))
            else:
                out.append(())
        return tuple(out)

    def observe(self, drafted, accepted) -> None:
        self.drafted = [a + b for a, b in zip(self.drafted, drafted, strict=True)]
        self.accepted = [a + b for a, b in zip(self.accepted, accepted, strict=True)]


def test_mixed_acceptance_in_one_batch(sm):
    """One row accepts every draft, the next none, the others draft nothing: each row is plain batched greedy's."""
    plain = generate_batch(sm, PROMPTS, max_new_tokens=NEW)
    oracle = _Oracle(PROMPTS, plain.token_ids, sm.hf.config.vocab_size)
    res = generate_batch(sm, PROMPTS, drafter=oracle, k=4, max_new_tokens=NEW)
    assert_same_rows(sm, PROMPTS, res.token_ids, plain.token_ids, "mixed acceptance vs plain batched")
    assert oracle.drafted[0] > 0 and oracle.accepted[0] == oracle.drafted[0]  # all kept
    assert oracle.drafted[1] > 0 and oracle.accepted[1] == 0  # none kept
    assert oracle.drafted[2:] == [0, 0]
    assert res.stats.drafted_tokens == sum(oracle.drafted) and res.stats.accepted_tokens == oracle.accepted[0]
    # row 0 emits k+1 a cycle, so the batch needs fewer verifies than tokens; rows 1..3 set the pace
    assert res.stats.verify_steps == NEW - 1


@pytest.mark.parametrize("name", ["ngram", "precision", "hybrid"])
def test_each_batch_draft_decodes_what_plain_batched_greedy_does(sm, name):
    candidate = _candidates()[name]
    plain = generate_batch(sm, PROMPTS, max_new_tokens=NEW)
    drafter = methods.batch_drafter(candidate, sm)
    res = generate_batch(sm, PROMPTS, drafter=drafter, k=candidate.draft.max_draft_tokens, max_new_tokens=NEW)
    assert_same_rows(sm, PROMPTS, res.token_ids, plain.token_ids, f"{name} vs plain batched")
    s = res.stats
    assert s.drafted_tokens > 0 and 0 < s.accepted_tokens <= s.drafted_tokens
    assert (s.draft_steps > 0) == (name != "ngram")  # a lookup runs no model to draft


def test_the_hybrid_runs_its_draft_model_only_for_the_rows_whose_lookup_missed(sm):
    candidate = _candidates()["hybrid"]
    drafter = methods.batch_drafter(candidate, sm)
    drafter.begin(2)
    seen = []

    def spy(sm_, step, *, pending, limits, **kw):  # records which rows it is asked for; drafts 9s for them
        seen.append(list(limits))
        return tuple((9,) * limit for limit in limits)

    drafter.fallback.draft = spy
    repeats, fresh = [1, 2, 3, 1, 2, 3, 1, 2], [5, 9, 2, 33, 7, 12]  # the first's suffix recurs; not the second's
    out = drafter.draft(sm, None, pending=[2, 12], limits=[3, 3], history=[repeats, fresh])
    assert out == ((3, 1, 2), (9, 9))  # row 0: the lookup's (after the earlier "3 1 2"); row 1: the fallback's
    assert seen == [[0, 2]]  # the fallback ran for row 1 alone, up to fallback_k
    seen.clear()
    drafter.begin(2)
    drafter.draft(sm, None, pending=[2, 2], limits=[3, 3], history=[repeats, repeats])
    assert seen == []  # every row hit: no draft model ran


# -- refusals: one line ----------------------------------------------------------------------------------------------
def test_a_method_without_a_batch_drafter_is_refused_in_one_line(sm):
    fractal = methods.get("fractal").example(sm.num_layers)
    with pytest.raises(ConfigError) as e:
        methods.batch_drafter(fractal, sm)
    assert str(e.value) == ("method 'fractal' cannot decode a batch (batched decoding covers: "
                            f"{', '.join(methods.batch_methods())})")
    assert {"ngram", "precision", "hybrid"} <= set(methods.batch_methods())
    assert methods.batch_drafter(Candidate("fractal", DraftConfig(max_draft_tokens=0, exit=NO_EXIT)), sm) is None
    # a hybrid asks the registry for its fallback's batch drafter: a fallback that cannot batch is one line too
    layer_skip = HybridParams(min_n=1, max_n=2, fallback="layer-skip")
    hybrid = Candidate("hybrid", DraftConfig(skip_attn=(1,), max_draft_tokens=3, exit=NO_EXIT), layer_skip.to_pairs())
    with pytest.raises(ConfigError, match=r"^hybrid: fallback method 'layer-skip' cannot decode a batch \("):
        methods.batch_drafter(hybrid, sm)


def test_a_batch_that_does_not_fit_is_refused_before_any_forward(sm, monkeypatch):
    need = batched.batch_bytes(sm, batch_size=4, prompt_tokens=12, max_new_tokens=NEW, k=3)
    one = batched.batch_bytes(sm, batch_size=1, prompt_tokens=12, max_new_tokens=NEW, k=3)
    monkeypatch.setattr(batched, "available_memory", lambda device: need - 1)
    forwards = []
    monkeypatch.setattr(type(sm), "forward_rows", lambda *a, **k: forwards.append(1))
    monkeypatch.setattr(type(sm), "forward", lambda *a, **k: forwards.append(1))
    with pytest.raises(BatchRefused) as e:
        generate_batch(sm, PROMPTS, drafter=methods.batch_drafter(_candidates()["ngram"], sm), k=3,
                       max_new_tokens=NEW)
    message = str(e.value)
    assert "\n" not in message and "a batch of 4 needs" in message
    assert f"a batch size of {(need - 1) // one} or less would fit" in message
    assert forwards == []
    check_fits(sm, batch_size=3, prompt_tokens=12, max_new_tokens=NEW, k=3)  # three fit
    monkeypatch.setattr(batched, "available_memory", lambda device: one - 1)
    with pytest.raises(BatchRefused, match="not even one sequence fits"):
        check_fits(sm, batch_size=1, prompt_tokens=12, max_new_tokens=NEW, k=3)


def test_sampling_is_refused_in_one_line(sm):
    from skipsearch.data import Prompt

    with pytest.raises(BatchRefused, match="batched decoding is greedy only"):
        api.decode_batches(sm, [Prompt("", "a", False, "", "--prompt")], profile=None, batch_size=2,
                           sampling=SamplingParams(temperature=0.7))


# -- the CLI ---------------------------------------------------------------------------------------------------------
def _profile(tmp_path, checkpoint, candidate: Candidate):
    from skipsearch.profile import ModelRef, Profile, save_profile

    tiny = make_tiny_model()  # only its layer count matters here: the checkpoint's is the same (4)
    prof = Profile(model=ModelRef(name=str(checkpoint), num_layers=tiny.num_layers), method=candidate.method,
                   draft=candidate.draft, method_params=candidate.params)
    return save_profile(prof, tmp_path / f"{candidate.method}.yaml")


def _prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    words = ["def fib ( n ) : return fib", "the a of and to in", "what how why", "1 2 3 1 2 3 1 2 3"]
    path.write_text("".join(json.dumps({"prompt": w}) + "\n" for w in words))
    return path


def test_decode_batch_size_prints_each_output_and_the_batch_stats(tiny_checkpoint, tmp_path):
    prof = _profile(tmp_path, tiny_checkpoint, _candidates()["ngram"])
    prompts = _prompts_file(tmp_path)
    runner = CliRunner()
    batched_run = runner.invoke(app, ["decode", "--profile", str(prof), "--prompts-file", str(prompts),
                                      "--batch-size", "3", "--max-new-tokens", "12", "--json", "--force"])
    assert batched_run.exit_code == 0, batched_run.output
    rows = [json.loads(line) for line in batched_run.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 4 and [r["batch_stats"]["batch_size"] for r in rows] == [3, 3, 3, 1]
    one_by_one = runner.invoke(app, ["decode", "--profile", str(prof), "--prompts-file", str(prompts),
                                     "--max-new-tokens", "12", "--json", "--force"])
    assert one_by_one.exit_code == 0, one_by_one.output
    singles = [json.loads(line) for line in one_by_one.stdout.splitlines() if line.startswith("{")]
    assert [r["token_ids"] for r in rows] == [r["token_ids"] for r in singles]  # fp32, tiny: no ties expected
    plain_text = runner.invoke(app, ["decode", "--profile", str(prof), "--prompts-file", str(prompts),
                                     "--batch-size", "2", "--max-new-tokens", "12", "--force"])
    assert plain_text.exit_code == 0, plain_text.output
    assert plain_text.stderr.count("[batch of 2:") == 2


@pytest.mark.parametrize("extra", [["--temperature", "0.7"], []])
def test_decode_batch_size_refusals_are_one_line(tiny_checkpoint, tmp_path, extra):
    candidate = _candidates()["ngram"] if extra else methods.get("fractal").example(4)
    prof = _profile(tmp_path, tiny_checkpoint, candidate)
    result = CliRunner().invoke(app, ["decode", "--profile", str(prof), "--prompts-file", str(_prompts_file(tmp_path)),
                                      "--batch-size", "2", "--max-new-tokens", "4", "--force", *extra])
    assert_one_line_error(result, "greedy only" if extra else "cannot decode a batch")


# -- the real model --------------------------------------------------------------------------------------------------
def test_lookup_and_precision_batches_on_the_real_model(real_sm, encode_offline):
    """smollm2-135m, fp32: two prompts of different lengths, each draft batched against plain batched greedy."""
    prompts = [ids for _, ids in encode_offline(real_sm, "mtbench,humaneval", n=2)]
    plain = generate_batch(real_sm, prompts, max_new_tokens=24)
    lookup = Candidate("ngram", DraftConfig(max_draft_tokens=4, exit=NO_EXIT), NgramParams(1, 3).to_pairs())
    precision = Candidate("precision", DraftConfig(max_draft_tokens=3, exit=NO_EXIT),
                          PrecisionParams(scheme="fp16").to_pairs())
    for candidate in (lookup, precision):
        res = generate_batch(real_sm, prompts, drafter=methods.batch_drafter(candidate, real_sm),
                             k=candidate.draft.max_draft_tokens, max_new_tokens=24)
        assert_same_rows(real_sm, prompts, res.token_ids, plain.token_ids, f"real model, {candidate.method}")
        assert res.stats.accepted_tokens > 0
