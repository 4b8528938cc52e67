"""The int8 target (skipsearch.model.target): the model drafts are verified against, as int8 weight-only linears.

What users rely on: the int8 target is torchao's Int8WeightOnlyConfig model up to the order of its sums; every draft
that can run on it decodes exactly its plain greedy output; the profile records the precision, and a profile (or a
draft) made for another precision is refused in one line before the model loads.
"""

from __future__ import annotations

import copy

import pytest
import torch
import yaml
from conftest import assert_one_line_error, make_tiny_model, save_tiny_checkpoint
from typer.testing import CliRunner

from skipsearch import methods
from skipsearch.cli import app
from skipsearch.config import NO_EXIT, Candidate, ConfigError, DraftConfig
from skipsearch.engine.decoding import generate, hf_generate
from skipsearch.engine.equivalence import check
from skipsearch.files.errors import ProfileError
from skipsearch.model.target import INT8, NATIVE, check_precision, quantize_target
from skipsearch.profile import ModelRef, Profile, check_model, load_profile, profile_to_dict, save_profile

PROMPTS = ([1, 5, 9, 3], [7, 7, 2, 7, 7, 2, 7], [4, 20, 33, 4, 20, 33, 4, 20])


@pytest.fixture(scope="module")
def tiny8(lowbit_built_module):
    sm = make_tiny_model(num_layers=4, vocab_size=64, name="tiny-int8")
    quantize_target(sm.hf, INT8)
    sm.target_precision = INT8
    return sm


@pytest.fixture(scope="module")
def lowbit_built_module() -> None:
    from skipsearch.kernels.lowbit import check_lowbit

    try:
        check_lowbit()
    except ConfigError as exc:
        pytest.skip(str(exc))


def test_the_int8_target_swaps_every_linear_the_head_included(tiny8):
    from torch import nn

    from skipsearch.kernels.lowbit import Int8WoLinear

    assert not any(isinstance(m, nn.Linear) for m in tiny8.hf.modules())
    assert isinstance(tiny8.lm_head, Int8WoLinear) and tiny8.vocab_size == 64
    assert isinstance(tiny8.embedding, nn.Embedding)  # the embedding keeps its fp32 rows


def test_the_int8_target_is_torchaos_int8_weight_only_model_up_to_the_order_of_sums(lowbit_built_module):
    ao = pytest.importorskip("torchao.quantization")
    sm = make_tiny_model(num_layers=4, vocab_size=64, name="tiny-int8")
    reference = copy.deepcopy(sm.hf)
    ao.quantize_(reference, ao.Int8WeightOnlyConfig())
    quantize_target(sm.hf, INT8)
    ids = torch.tensor([PROMPTS[2]])
    with torch.no_grad():
        ours, theirs = sm.hf(input_ids=ids).logits, reference(input_ids=ids).logits
        plain = make_tiny_model(num_layers=4, vocab_size=64).hf(input_ids=ids).logits
    gap = (ours - theirs).abs().max().item()
    assert gap < 1e-4 * theirs.abs().max().item()  # summation order only
    assert (ours - plain).abs().max().item() > 100 * gap  # and another model than the fp32 one


@pytest.mark.parametrize("name", ["layer-skip", "ngram", "hybrid", "clasp-dynamic", "precision"])
def test_a_draft_of_the_int8_target_decodes_its_plain_greedy_output(name, tiny8):
    candidate = methods.get(name).example(tiny8.num_layers)
    assert not methods.copies_weights(candidate)
    drafted = 0
    for prompt in PROMPTS:
        result = generate(tiny8, prompt, drafter=methods.build_drafter(candidate, tiny8), max_new_tokens=20)
        assert result.token_ids == hf_generate(tiny8, prompt, max_new_tokens=20)
        drafted += result.stats.drafted_tokens
    assert drafted > 0


def test_drafts_that_copy_fp32_weights_are_refused_for_the_int8_target():
    trimmed = Candidate("layer-skip", DraftConfig(skip_attn=(1,), max_draft_tokens=3, exit=NO_EXIT),
                        (("vocab_subset", 8),))
    hybrid = Candidate("hybrid", trimmed.draft, (("min_n", 1), ("max_n", 2), ("fallback", "layer-skip"),
                                                 *trimmed.params))
    for candidate in (methods.get("fractal").example(6), trimmed, hybrid):
        assert methods.copies_weights(candidate), candidate
        methods.check_target(candidate, NATIVE)  # the native target takes them
        with pytest.raises(ConfigError, match="int8 target does not keep"):
            methods.check_target(candidate, INT8)


def test_a_precision_draft_of_the_int8_target_copies_the_int8_weights(tiny8):
    from skipsearch.kernels.lowbit.convert import fp32_linears
    from skipsearch.kernels.lowbit.quant import dequantize_int8, quantize_int8

    original = make_tiny_model(num_layers=4, vocab_size=64).hf  # the same seed: tiny8's fp32 weights
    attention = fp32_linears(tiny8.layers[1].self_attn)
    want = dequantize_int8(*quantize_int8(original.model.layers[1].self_attn.q_proj.weight))
    assert torch.equal(attention.q_proj.weight, want)  # q * s exactly, as the int8 target multiplies
    assert fp32_linears(original) is original  # nothing to read back: the module itself


def test_the_precision_is_checked_before_anything_loads():
    with pytest.raises(ConfigError, match="unknown target precision"):
        check_precision("int3")
    with pytest.raises(ConfigError, match="--device cpu"):
        check_precision(INT8, device="cuda:0")
    with pytest.raises(ConfigError, match="fp32 activations"):
        check_precision(INT8, dtype="bfloat16")
    check_precision(INT8, device="cpu", dtype="float32")


def _profile(precision: str | None) -> Profile:
    return Profile(model=ModelRef(name="tiny", num_layers=4, precision=precision), method="ngram",
                   draft=DraftConfig(max_draft_tokens=4, exit=NO_EXIT), method_params=(("min_n", 1), ("max_n", 3)))


def test_the_profile_records_the_int8_target_and_a_native_one_writes_nothing_new(tmp_path):
    native = profile_to_dict(_profile(None))
    assert "precision" not in native["model"] and native["schema_version"] == 6
    path = save_profile(_profile(INT8), tmp_path / "int8.yaml")
    assert yaml.safe_load(path.read_text())["model"]["precision"] == INT8
    loaded = load_profile(path)
    assert loaded.model.target_precision == INT8 and "int8 target" in loaded.describe()
    old = {**native, "schema_version": 5}  # every earlier file is a native one
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old))
    assert load_profile(tmp_path / "old.yaml").model.target_precision == NATIVE


@pytest.mark.parametrize(("model", "message"), [
    ({"precision": "int3"}, "model.precision must be one of native, int8"),
    ({"precision": INT8, "dtype": "bfloat16"}, "takes fp32 activations"),
])
def test_a_bad_precision_in_a_profile_is_one_line(tmp_path, model, message):
    raw = profile_to_dict(_profile(None))
    raw["model"].update(model)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ProfileError, match=message):
        load_profile(path)
    assert_one_line_error(CliRunner().invoke(app, ["profile", "validate", str(path)]), message)


def test_a_profile_for_one_precision_refuses_the_other():
    with pytest.raises(ProfileError, match="made for the int8 target.*--target-precision int8"):
        check_model(_profile(INT8), num_layers=4, precision=NATIVE)
    with pytest.raises(ProfileError, match="made for the native target"):
        check_model(_profile(None), num_layers=4, precision=INT8, force=True)  # not a fingerprint: no --force
    check_model(_profile(INT8), num_layers=4, precision=INT8)


def test_decode_refuses_another_precisions_profile_and_a_copying_draft_in_one_line(tmp_path):
    checkpoint = save_tiny_checkpoint(tmp_path / "tiny")
    int8 = _profile(INT8)
    int8 = Profile(model=ModelRef(name=str(checkpoint), num_layers=4, precision=INT8), method=int8.method,
                   draft=int8.draft, method_params=int8.method_params)
    path = save_profile(int8, tmp_path / "int8.yaml")
    run = CliRunner().invoke(app, ["decode", "--profile", str(path), "--prompt", "def fib", "--target-precision",
                                   "native", "--max-new-tokens", "4"])
    assert_one_line_error(run, "made for the int8 target")
    candidate = methods.get("fractal").example(4)  # its 8-bit layers are made from fp32 weights
    raw = profile_to_dict(Profile(model=ModelRef(name=str(checkpoint), num_layers=4, precision=INT8),
                                  method=candidate.method, draft=candidate.draft, method_params=candidate.params))
    (tmp_path / "fractal.yaml").write_text(yaml.safe_dump(raw))
    run = CliRunner().invoke(app, ["decode", "--profile", str(tmp_path / "fractal.yaml"), "--prompt", "def fib"])
    assert_one_line_error(run, "int8 target does not keep")


def test_decode_runs_the_int8_target_and_checks_it_against_hf_greedy_of_the_same_model(tmp_path, lowbit_built_module):
    checkpoint = save_tiny_checkpoint(tmp_path / "tiny")
    run = CliRunner().invoke(app, ["decode", "--model", str(checkpoint), "--prompt", "def fib ( n ) :",
                                   "--target-precision", INT8, "--max-new-tokens", "12", "--check", "--json"])
    assert run.exit_code == 0, run.output
    assert '"identical"' in run.stdout


@pytest.mark.model
def test_the_real_models_int8_target_drafts_decode_its_greedy_output_and_torchaos_up_to_ties(encode_offline,
                                                                                          lowbit_built_module):
    ao = pytest.importorskip("torchao.quantization")
    from skipsearch.model.loader import load_model

    sm = load_model("smollm2-135m", device="cpu", dtype="float32", precision=INT8)
    reference = load_model("smollm2-135m", device="cpu", dtype="float32")
    ao.quantize_(reference.hf, ao.Int8WeightOnlyConfig())
    hybrid = Candidate("hybrid", DraftConfig(skip_attn=(3, 9, 17), skip_mlp=(5, 21), max_draft_tokens=4,
                                             exit=NO_EXIT), (("min_n", 2), ("max_n", 4), ("fallback", "layer-skip")))
    drafter = methods.build_drafter(hybrid, sm)
    for _, ids in encode_offline(sm, n=2):
        tokens = generate(sm, ids, drafter=drafter, max_new_tokens=48).token_ids
        assert tokens == hf_generate(sm, ids, max_new_tokens=48)
        theirs = hf_generate(reference, ids, max_new_tokens=48)
        # torchao sums in another order: equal, or apart only where two logits are within 64 ulps (max gap seen on
        # this model's prompt logits: about 25 ulps)
        assert check(sm, ids, tokens, theirs, ulps=64).ok


def test_optimize_searches_drafts_for_the_int8_target_and_records_it(tmp_path, lowbit_built_module):
    checkpoint = save_tiny_checkpoint(tmp_path / "tiny")
    out, study = tmp_path / "int8.yaml", tmp_path / "study"
    common = ["optimize", "--model", str(checkpoint), "--strategy", "hybrid", "--budget", "6", "--n-prompts", "1",
              "--max-new-tokens", "8", "--dataset", "humaneval", "--study", str(study)]
    run = CliRunner().invoke(app, [*common, "--target-precision", INT8, "--out", str(out)])
    assert run.exit_code == 0, run.output
    prof = load_profile(out)
    assert prof.model.target_precision == INT8 and not methods.copies_weights(prof.candidate)
    # the hybrid's grid for the int8 target: lookups and layer-skip fallbacks on the full head, nothing copied
    run = CliRunner().invoke(app, [*common, "--target-precision", INT8, "--vocab-sizes", "8", "--out", str(out),
                                   "--force"])
    assert_one_line_error(run, "int8 target keeps no fp32 weights to copy")
    run = CliRunner().invoke(app, [*common, "--target-precision", INT8, "--strategy", "fractal", "--out", str(out),
                                   "--force"])
    assert_one_line_error(run, "int8 target does not keep")
    run = CliRunner().invoke(app, [*common, "--out", str(tmp_path / "native.yaml")])  # the same study, native
    assert_one_line_error(run, "trials ran on the int8 target, not the native one")


def test_an_int8_profiles_export_names_the_engines_8_bit_model(tmp_path):
    from skipsearch.export import MANIFEST

    prof = Profile(model=ModelRef(name="smollm2-135m", num_layers=30, precision=INT8), method="ngram",
                   draft=DraftConfig(max_draft_tokens=4, exit=NO_EXIT), method_params=(("min_n", 3), ("max_n", 3)))
    path = save_profile(prof, tmp_path / "int8.yaml")
    for engine, says in (("llama.cpp", "--outtype q8_0"), ("hf", "Int8WeightOnlyConfig"), ("vllm", "W8A16")):
        run = CliRunner().invoke(app, ["export", "--profile", str(path), "--engine", engine, "--out",
                                       str(tmp_path / engine)])
        assert run.exit_code == 0, run.output
        notes = yaml.safe_load((tmp_path / engine / MANIFEST).read_text())["notes"]
        assert any(says in n and "int8 target" in n for n in notes), notes
    native = save_profile(Profile(model=ModelRef(name="smollm2-135m", num_layers=30), method=prof.method,
                                  draft=prof.draft, method_params=prof.method_params), tmp_path / "native.yaml")
    run = CliRunner().invoke(app, ["export", "--profile", str(native), "--engine", "llama.cpp", "--out",
                                   str(tmp_path / "n")])
    assert run.exit_code == 0 and "int8 target" not in (tmp_path / "n" / MANIFEST).read_text()
