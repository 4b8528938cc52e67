"""``skipsearch export``: a profile inside transformers' generate (identical greedy output), as vLLM, SGLang and
llama.cpp settings (each parsed against the engine's schema), the one line for what an engine cannot express,
the manifest, an export that fails leaving the last good one, and the llama.cpp draft GGUF read back."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import TINY_WORDS, assert_one_line_error, tiny_llama
from typer.testing import CliRunner

from skipsearch import methods
from skipsearch.cli import app
from skipsearch.config import ConfigError
from skipsearch.export import MANIFEST, hf
from skipsearch.files.errors import ProfileError
from skipsearch.model.skippable import SkippableModel
from skipsearch.profile import ModelRef, Profile, load_profile, profile_from_dict, save_profile

runner = CliRunner()
PROMPT = [5, 6, 7, 8, 5, 6, 7, 9, 5, 6, 7, 8]  # repeats, so that a lookup drafts


def _profile(sm: SkippableModel, method: str, **params) -> Profile:
    cand = methods.get(method).example(sm.num_layers)
    merged = {**dict(cand.plain_params()), **params}
    return profile_from_dict({"schema_version": 3, "model": {**vars(ModelRef.of(sm))}, "method": method,
                              "draft": {"max_draft_tokens": cand.draft.max_draft_tokens, "exit": {"threshold": 0.0,
                                                                                                  "adaptive": False}},
                              "method_params": merged})


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return tiny_llama()


@pytest.fixture(scope="module")
def sm(model):
    return SkippableModel(model, None, name="tiny")


def _generate(model, ids, **kwargs):
    ids = torch.tensor([ids]) if not isinstance(ids, torch.Tensor) else ids
    return model.generate(ids, attention_mask=kwargs.pop("attention_mask", torch.ones_like(ids)), do_sample=False,
                          **kwargs)


# -- inside HF generate ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("method,params", [("ngram", {}), ("hybrid", {"fallback": "precision", "scheme": "fp16"}),
                                           ("precision", {})])
def test_a_profile_inside_hf_generate_gives_plain_generates_greedy_output(model, sm, tmp_path, method, params):
    prof = _profile(sm, method, **params)
    hf.write(tmp_path, prof)
    stats = []
    want = _generate(model, PROMPT, max_new_tokens=40)
    got = _generate(model, PROMPT, max_new_tokens=40, custom_generate=str(tmp_path), trust_remote_code=True,
                    skipsearch_stats=stats.append)
    assert torch.equal(got, want)  # the sequences, prompt included, as generate returns them
    assert stats[0].new_tokens == 40 and stats[0].drafted_tokens > 0 and stats[0].verify_steps < 39


def test_hf_generate_with_a_profile_decodes_a_left_padded_batch_row_by_row(model, sm, tmp_path):
    hf.write(tmp_path, _profile(sm, "ngram"))
    short = PROMPT[3:]
    ids = torch.tensor([PROMPT, [0, 0, 0, *short]])
    mask = torch.tensor([[1] * len(PROMPT), [0, 0, 0, *[1] * len(short)]])
    got = _generate(model, ids, attention_mask=mask, max_new_tokens=20, custom_generate=str(tmp_path),
                    trust_remote_code=True, return_dict_in_generate=True).sequences
    assert torch.equal(got[0], _generate(model, PROMPT, max_new_tokens=20)[0])
    assert torch.equal(got[1, 3:], _generate(model, short, max_new_tokens=20)[0])


def test_hf_generate_refuses_a_profile_of_other_weights_and_what_the_engine_cannot_honour(model, sm, tmp_path):
    other = SkippableModel(tiny_llama(seed=1), None, name="tiny")
    hf.write(tmp_path, _profile(other, "ngram"))
    with pytest.raises(ProfileError, match="different weights of the same architecture") as e:
        _generate(model, PROMPT, max_new_tokens=5, custom_generate=str(tmp_path), trust_remote_code=True)
    assert "\n" not in str(e.value)
    hf.write(tmp_path, _profile(sm, "ngram"))
    for bad, fragment in (({"num_beams": 2}, "num_beams=2"), ({"repetition_penalty": 1.3}, "repetition_penalty"),
                          ({"output_scores": True, "return_dict_in_generate": True}, "output_scores")):
        with pytest.raises(ConfigError, match=fragment):
            _generate(model, PROMPT, max_new_tokens=5, custom_generate=str(tmp_path), trust_remote_code=True, **bad)


def test_hf_generate_runs_the_profiles_compiled_kernel_built_once(tmp_path):
    """A profile planned with inductor-c4 compiles the model inside generate, as decode would, and keeps it."""
    from skipsearch.export import hf_runtime
    from skipsearch.kernels.inductor import static_cache_supported
    from tests.conftest import graphs_made

    if not static_cache_supported():  # transformers 4.x refuses the kernel (tests/test_kernels.py)
        pytest.skip("the compiled kernel needs transformers 5's StaticCache layers")

    model = tiny_llama(seed=4)  # its own model: the kernel stays with it, away from the module's
    prof = dataclasses.replace(_profile(SkippableModel(model, None, name="tiny"), "ngram"), kernel="inductor-c4")
    hf.write(tmp_path, prof)
    run = dict(custom_generate=str(tmp_path), trust_remote_code=True)
    for length in (len(PROMPT), 5):
        want = _generate(model, PROMPT[:length], max_new_tokens=24)
        assert torch.equal(_generate(model, PROMPT[:length], max_new_tokens=24, **run), want)
        if length == len(PROMPT):
            adapted = hf_runtime._ADAPTED[model].sm
            report, graphs = adapted.kernel_report, graphs_made()
            assert report.kernel == "inductor-c4" and report.capacity == hf_runtime.CAPACITY_STEP + 4
    assert adapted.kernel_report.compile_seconds == report.compile_seconds  # the same kernel: not built again
    assert graphs_made() == graphs  # and nothing recompiled
    assert torch.equal(_generate(model, PROMPT, max_new_tokens=24, skipsearch_kernel="eager", **run),
                       _generate(model, PROMPT, max_new_tokens=24))
    assert adapted.kernel_report is None  # eager, as asked
    with pytest.raises(ConfigError, match="skipsearch_capacity=20 is less than") as e:
        _generate(model, PROMPT, max_new_tokens=24, skipsearch_capacity=20, **run)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="unknown kernel"):
        _generate(model, PROMPT, max_new_tokens=4, skipsearch_kernel="cuda-graphs", **run)


def test_hf_generate_refuses_a_draft_that_cannot_run_beside_the_compiled_kernel_before_building_it(tmp_path):
    # CLaSp's dynamic drafter reads every verify pass's hidden states: on a compiled kernel it failed mid-decode
    model = tiny_llama(seed=5)
    sm = SkippableModel(model, None, name="tiny")
    cand = methods.get("clasp-dynamic").example(sm.num_layers)
    hf.write(tmp_path, Profile(model=ModelRef.of(sm), method=cand.method, draft=cand.draft,
                               method_params=cand.params, kernel="inductor-c4"))
    run = dict(custom_generate=str(tmp_path), trust_remote_code=True)
    with pytest.raises(ConfigError, match='not give: decode it with skipsearch_kernel="eager"') as e:
        _generate(model, PROMPT, max_new_tokens=8, **run)
    assert "\n" not in str(e.value) and "clasp-dynamic draft reads the hidden states" in str(e.value)
    assert torch.equal(_generate(model, PROMPT, max_new_tokens=8, skipsearch_kernel="eager", **run),
                       _generate(model, PROMPT, max_new_tokens=8))


def test_a_kernel_the_device_cannot_run_says_how_to_ask_generate_for_eager():
    from skipsearch.kernels import Kernel, check_kernel

    with pytest.raises(ConfigError, match='use skipsearch_kernel="eager" on cuda'):
        check_kernel(Kernel("inductor"), "cuda", instead='skipsearch_kernel="eager"')


@pytest.mark.model
def test_shipped_profiles_inside_hf_generate_on_the_real_model(real_sm, encode_offline, tmp_path):
    from skipsearch.export import shapes

    code = load_profile("profiles/smollm2-135m/cpu-float32-code.yaml")
    profiles = {"hybrid": code, "lookup": shapes.lookup_only(code),
                "precision": load_profile("profiles/smollm2-135m/cpu-float32-precision-code.yaml")}
    (_, ids), = encode_offline(real_sm, "humaneval", n=1)
    want = _generate(real_sm.hf, ids, max_new_tokens=32)
    for name, prof in profiles.items():
        (tmp_path / name).mkdir()
        hf.write(tmp_path / name, prof)
        # eager: the compiled kernel inside generate is checked on the tiny model (a compile here takes minutes)
        got = _generate(real_sm.hf, ids, max_new_tokens=32, custom_generate=str(tmp_path / name),
                        trust_remote_code=True, skipsearch_kernel="eager")
        assert torch.equal(got, want), name


# -- the serving engines' settings, against their schemas ------------------------------------------------------
# vLLM 0.33.0, vllm/config/speculative.py (SpeculativeConfig): the keys an ngram export uses, their types and
# bounds, and the check SpeculativeConfig makes between them (kept here so that the suite needs no vLLM install).
VLLM_NGRAM = {"method": str, "num_speculative_tokens": int, "prompt_lookup_min": int, "prompt_lookup_max": int,
              "num_speculative_tokens_per_batch_size": list}
VLLM_METHODS = ("ngram", "ngram_gpu", "draft_model", "suffix", "custom_class", "eagle", "eagle3", "mtp")
# vllm/model_executor/layers/quantization/__init__.py (0.33.0): the QuantizationMethods a draft checkpoint may name
VLLM_QUANTIZATIONS = ("compressed-tensors", "fp8", "gptq", "awq", "torchao", "int8_per_channel_weight_only")
# the keys a draft_model export sets (SpeculativeConfig's model and quantization fields)
VLLM_DRAFT = {"method": str, "model": str, "quantization": str, "num_speculative_tokens": int}
# SGLang 0.5.23, sglang/srt/arg_groups/fields/spec.py: the server arguments an NGRAM export sets, spelt as its
# --config YAML takes them (the flags' names without "--": server_args_config_parser.py).
SGLANG_NGRAM = {"speculative-algorithm": str, "speculative-num-draft-tokens": int,
                "speculative-ngram-min-bfs-breadth": int, "speculative-ngram-max-bfs-breadth": int}
SGLANG_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO")
# the same file's draft-model arguments, and its QUANTIZATION_CHOICES entry for them (arg_groups/choices.py); with
# top-k 1 SGLang forces num-draft-tokens to num-steps + 1 (speculative_hook.py)
SGLANG_DRAFT = {"speculative-algorithm": str, "speculative-draft-model-path": str,
                "speculative-draft-model-quantization": str, "speculative-num-steps": int,
                "speculative-eagle-topk": int, "speculative-num-draft-tokens": int}
# llama.cpp as vendored in llama-cpp-python 0.3.36, common/arg.cpp: flags and their value kinds.
LLAMA_FLAGS = {"--spec-type": str, "--spec-ngram-simple-size-n": int, "--spec-ngram-simple-size-m": int,
               "--spec-ngram-simple-min-hits": int, "-md": str, "--spec-draft-n-max": int, "--spec-draft-n-min": int,
               "--spec-draft-p-min": float}
LLAMA_SPEC_TYPES = ("none", "draft-simple", "draft-eagle3", "draft-mtp", "ngram-simple", "ngram-map-k",
                    "ngram-map-k4v", "ngram-mod", "ngram-cache")


def check_vllm_batch_sizes(entries: list, num_speculative_tokens: int) -> None:
    """vLLM 0.33.0's ``validate_and_normalize_dynamic_sd_schedule``, restated: a non-empty list of three-integer
    (start, end, k), start and end >= 1, start <= end, k >= 0, sorted and non-overlapping, the first starting at 1;
    and no k above num_speculative_tokens, which vLLM would clamp."""
    assert isinstance(entries, list) and entries
    previous_end = 0
    for entry in entries:
        assert isinstance(entry, list) and len(entry) == 3 and all(type(x) is int for x in entry)
        start, end, k = entry
        assert 1 <= start <= end and 0 <= k <= num_speculative_tokens
        assert start > previous_end
        previous_end = end
    assert entries[0][0] == 1


def check_vllm(cfg: dict) -> None:
    """An ngram or draft_model --speculative-config against SpeculativeConfig's keys and checks."""
    assert cfg["method"] in VLLM_METHODS and cfg["num_speculative_tokens"] > 0
    if "num_speculative_tokens_per_batch_size" in cfg:
        check_vllm_batch_sizes(cfg["num_speculative_tokens_per_batch_size"], cfg["num_speculative_tokens"])
    if cfg["method"] == "draft_model":
        assert set(cfg) == set(VLLM_DRAFT) and all(isinstance(cfg[k], VLLM_DRAFT[k]) for k in cfg)
        assert cfg["quantization"] in VLLM_QUANTIZATIONS
        return
    assert set(cfg) <= set(VLLM_NGRAM) and all(isinstance(cfg[k], VLLM_NGRAM[k]) for k in cfg)
    assert 1 <= cfg["prompt_lookup_min"] <= cfg["prompt_lookup_max"]


def check_sglang(cfg: dict) -> None:
    """An NGRAM or STANDALONE server config against spec.py's fields and the checks SGLang makes."""
    assert cfg["speculative-algorithm"] in SGLANG_ALGORITHMS and cfg["speculative-num-draft-tokens"] >= 2
    if cfg["speculative-algorithm"] == "STANDALONE":
        assert set(cfg) == set(SGLANG_DRAFT) and all(isinstance(cfg[k], SGLANG_DRAFT[k]) for k in cfg)
        assert cfg["speculative-eagle-topk"] == 1
        assert cfg["speculative-num-draft-tokens"] == cfg["speculative-num-steps"] + 1
        return
    assert set(cfg) <= set(SGLANG_NGRAM) and all(isinstance(cfg[k], SGLANG_NGRAM[k]) for k in cfg)
    assert 1 <= cfg["speculative-ngram-min-bfs-breadth"] <= cfg["speculative-ngram-max-bfs-breadth"]


def check_llama(args: list[str]) -> None:
    assert len(args) % 2 == 0
    for flag, value in zip(args[::2], args[1::2], strict=True):
        LLAMA_FLAGS[flag](value)  # a known flag whose value parses as its kind
    types = dict(zip(args[::2], args[1::2], strict=True))["--spec-type"].split(",")
    assert set(types) <= set(LLAMA_SPEC_TYPES)


def _saved(tmp_path, prof: Profile, name: str) -> str:
    path = tmp_path / f"{name}.yaml"
    save_profile(prof, path)
    return str(path)


def _export(*args):
    return runner.invoke(app, ["export", *args])


def test_a_lookup_profile_exports_to_each_engine_and_parses_with_its_schema(sm, tmp_path):
    path = _saved(tmp_path, _profile(sm, "ngram", min_n=2, max_n=2), "lookup")
    done = _export("--profile", path, "--engine", "vllm", "--out", str(tmp_path / "v"))
    assert done.exit_code == 0, done.output
    cfg = json.loads((tmp_path / "v" / "speculative_config.json").read_text())
    check_vllm(cfg)
    assert cfg == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 2}
    man = yaml.safe_load((tmp_path / "v" / MANIFEST).read_text())
    assert man["exact"] and man["model"]["weights_fingerprint"] == sm.weights_fingerprint
    assert man["profile"]["path"] == path and len(man["profile"]["sha256"]) == 64 and "speedup" in man
    done = _export("--profile", path, "--engine", "llama.cpp", "--out", str(tmp_path / "l"))
    assert done.exit_code == 0, done.output
    args = (tmp_path / "l" / "llama-args.txt").read_text().split()
    check_llama(args)
    assert args[:2] == ["--spec-type", "ngram-simple"] and "--spec-ngram-simple-size-m" in args
    # SGLang has no prompt lookup: its nearest setting only with --nearest
    assert_one_line_error(_export("--profile", path, "--engine", "sglang", "--out", str(tmp_path / "s")),
                          "sglang cannot express prompt lookup")
    assert not (tmp_path / "s").exists()
    done = _export("--profile", path, "--engine", "sglang", "--out", str(tmp_path / "s"), "--nearest")
    assert done.exit_code == 0, done.output
    check_sglang(yaml.safe_load((tmp_path / "s" / "sglang.yaml").read_text()))
    assert yaml.safe_load((tmp_path / "s" / MANIFEST).read_text())["exact"] is False


SCHEDULES = [
    ((1, 3, 4), (4, 15, 2), (16, 32, 0)),  # the planner's shape: contiguous from 1, K = 0 where speculation loses
    ((1, 8, 3),),  # one range that drafts: vLLM would carry K = 3 to every larger batch
    ((2, 4, 2), (9, 16, 5)),  # hand-written: starts past 1, with a gap
    ((1, 1, 6), (2, 2, 6), (3, 64, 1)),  # neighbours of one K
]


@pytest.mark.parametrize("ranges", SCHEDULES)
def test_a_schedule_exports_to_vllm_as_its_rules_take_it_and_runs_the_same_k_everywhere(sm, tmp_path, ranges):
    from skipsearch.files.schedule import BatchRange, Schedule

    sched = Schedule(tuple(BatchRange(*r) for r in ranges), considered=(0, 1, 2, 3))
    prof = dataclasses.replace(_profile(sm, "ngram", min_n=2, max_n=2), schedule=sched)
    path = _saved(tmp_path, prof, "scheduled")
    done = _export("--profile", path, "--engine", "vllm", "--out", str(tmp_path / "v"))
    assert done.exit_code == 0, done.output
    cfg = json.loads((tmp_path / "v" / "speculative_config.json").read_text())
    check_vllm(cfg)
    entries = cfg["num_speculative_tokens_per_batch_size"]
    assert cfg["num_speculative_tokens"] == max(r[2] for r in ranges)

    def vllm_k(b: int) -> int:  # vLLM's dense lookup: a gap or the tail carries the K before it, clamped
        k = next((e[2] for e in reversed(entries) if e[0] <= b), 0)
        return min(k, cfg["num_speculative_tokens"])

    assert all(vllm_k(b) == sched.k_for(b) for b in range(1, 200))
    man = yaml.safe_load((tmp_path / "v" / MANIFEST).read_text())
    assert any("schedule" in note for note in man["notes"])


def test_a_schedule_that_never_drafts_exports_plain_decoding_and_a_bad_one_is_one_line(sm):
    from skipsearch.export import ExportError, vllm
    from skipsearch.files.schedule import BatchRange, Schedule

    prof = dataclasses.replace(_profile(sm, "ngram"), schedule=Schedule((BatchRange(1, 32, 0),), (0, 2)))
    assert vllm.config(prof) == {}
    for entries, top, fragment in [([[1, 4, 2], [4, 8, 1]], 2, "overlap"), ([[1, 4, -1]], 2, "k must be >= 0"),
                                   ([[3, 2, 1]], 2, "start 3 is after end 2"),
                                   ([[2, 4, 1]], 2, "must start at batch size 1"),
                                   ([[1, 4, 5]], 2, "above num_speculative_tokens"), ([], 2, "non-empty list"),
                                   ([[1, 4, 1]], 0, "num_speculative_tokens must be an integer > 0")]:
        with pytest.raises(ExportError) as e:
            vllm.check_batch_ranges(entries, top)
        assert fragment in str(e.value) and "\n" not in str(e.value)


def test_sglang_llamacpp_and_hf_say_in_one_line_what_they_run_for_a_schedule(sm, tmp_path):
    from skipsearch.files.schedule import BatchRange, Schedule

    sched = Schedule((BatchRange(1, 3, 4), BatchRange(4, 32, 0)), considered=(0, 4))
    prof = dataclasses.replace(_profile(sm, "ngram", min_n=2, max_n=2), schedule=sched)
    path = _saved(tmp_path, prof, "scheduled")
    done = _export("--profile", path, "--engine", "sglang", "--out", str(tmp_path / "s"), "--nearest")
    assert done.exit_code == 0, done.output
    text = (tmp_path / "s" / "sglang.yaml").read_text()
    comments = [line for line in text.splitlines() if line.startswith("#")]
    assert len(comments) == 1 and "no per-batch-size draft length" in comments[0]
    assert f"K = {prof.draft.max_draft_tokens}" in comments[0]
    check_sglang(yaml.safe_load(text))
    for engine, word in (("llama.cpp", "llama.cpp runs batch 1"), ("hf", "runs batch 1")):
        done = _export("--profile", path, "--engine", engine, "--out", str(tmp_path / engine))
        assert done.exit_code == 0, done.output
        notes = yaml.safe_load((tmp_path / engine / MANIFEST).read_text())["notes"]
        assert sum(word in note and f"K = {prof.draft.max_draft_tokens}" in note for note in notes) == 1


def test_a_method_says_what_it_drafts_as_a_serving_engine_setting_and_the_registry_rebuilds_it():
    """Exporters ask the registry (``methods.setting_of``, ``methods.candidate_for``), never a method's name."""
    from skipsearch.export import llamacpp, shapes

    lookup, exact = set(), 0
    for path in sorted(Path("profiles").rglob("*.yaml")):
        prof = load_profile(str(path))
        setting = methods.setting_of(prof.candidate)
        if setting.lookup is None and setting.draft_model is None:  # layer-skip, fractal, ...: no engine runs it
            speculates = methods.get(prof.method).speculation is not None
            assert setting == methods.Setting() and (not speculates or prof.candidate.is_autoregressive), path
            continue
        lookup.add(setting.lookup is not None)
        dm = setting.draft_model
        if dm is None or (not dm.skips and not dm.trimmed_head):  # exactly a setting: the registry gives it back
            # (a hybrid that never falls back is the lookup itself: the registry gives back its ngram candidate)
            again = methods.candidate_for(setting)
            assert again == prof.candidate or methods.setting_of(again) == setting, path
            exact += 1
    assert lookup == {True, False} and exact >= 2
    code = load_profile("profiles/smollm2-135m/cpu-float32-code.yaml")  # a lookup, a precision copy on a miss
    near = llamacpp.ENGINE.gap(code).nearest
    s = methods.setting_of(near.candidate)
    assert near.method == code.method and s.lookup.min_n == s.lookup.max_n == shapes.setting(code).lookup.max_n
    assert s.draft_model == shapes.runnable_copy(code)
    with pytest.raises(ConfigError, match="no registered method drafts with"):
        methods.candidate_for(methods.Setting())


def test_what_an_engine_cannot_express_is_one_line_and_exit_2_unless_nearest(sm, tmp_path):
    path = _saved(tmp_path, _profile(sm, "layer-skip"), "ls")
    for engine in ("vllm", "sglang", "llama.cpp"):
        out = tmp_path / engine
        assert_one_line_error(_export("--profile", path, "--engine", engine, "--out", str(out)),
                              f"{engine} cannot express layer-skip drafts")
        assert not out.exists()
        done = _export("--profile", path, "--engine", engine, "--out", str(out), "--nearest")
        assert done.exit_code == 0 and "plain decoding" in done.output, done.output
        man = yaml.safe_load((out / MANIFEST).read_text())
        assert man["exact"] is False and "nearest it runs" in man["nearest"] and man["speedup"]["value"] == 1.0
    hybrid = _saved(tmp_path, _profile(sm, "hybrid", fallback="precision", scheme="fp16"), "hy")
    assert_one_line_error(_export("--profile", hybrid, "--engine", "vllm", "--out", str(tmp_path / "hv")),
                          "vllm cannot express a lookup with a precision fallback")
    assert _export("--profile", hybrid, "--engine", "hf", "--out", str(tmp_path / "hh")).exit_code == 0


def test_a_failed_export_leaves_the_last_good_one_and_refuses_other_directories(sm, tmp_path, monkeypatch):
    from skipsearch.export import vllm

    path = _saved(tmp_path, _profile(sm, "ngram"), "lookup")
    out = tmp_path / "v"
    assert _export("--profile", path, "--engine", "vllm", "--out", str(out)).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def full_disk(directory, profile, model=None):
        (directory / "speculative_config.json").write_text("{")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(vllm, "ENGINE", dataclasses.replace(vllm.ENGINE, write=full_disk))
    assert_one_line_error(_export("--profile", path, "--engine", "vllm", "--out", str(out), "--force"),
                          "No space left")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".v.")] == []
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine")
    assert_one_line_error(_export("--profile", path, "--engine", "hf", "--out", str(work)), "holds no skipsearch")
    assert (work / "notes.txt").read_text() == "mine"


# -- the llama.cpp draft GGUF, read back -----------------------------------------------------------------------
def _bpe_checkpoint(path: Path):
    """A tiny Llama whose vocabulary is a byte-level BPE tokenizer's (what a GGUF's tokenizer metadata reads)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([" ".join(TINY_WORDS)] * 4, trainers.BpeTrainer(
        vocab_size=280, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    model = tiny_llama(vocab_size=tok.get_vocab_size(), bos_token_id=0, eos_token_id=1)
    model.save_pretrained(path)
    fast.save_pretrained(path)
    return model


@pytest.mark.parametrize("scheme,ggml", [("int8", "Q8_0"), ("fp16", "F16")])
def test_the_llama_cpp_draft_gguf_reads_back_at_the_profiles_scheme(tmp_path, scheme, ggml):
    import gguf

    from skipsearch.export.gguf_draft import reorder_rotary

    ckpt = tmp_path / "ckpt"
    model = _bpe_checkpoint(ckpt)
    sm = SkippableModel(model, None, name=str(ckpt))
    prof = _profile(sm, "precision", scheme=scheme, full_mlp=[1], quant_head=False)
    prof = Profile(ModelRef(str(ckpt), sm.num_layers, fingerprint=None,
                            weights_fingerprint=prof.model.weights_fingerprint), prof.method, prof.draft,
                   method_params=prof.method_params)
    path = _saved(tmp_path, prof, "prec")
    done = _export("--profile", path, "--engine", "llama.cpp", "--out", str(tmp_path / "l"))
    assert done.exit_code == 0, done.output
    args = (tmp_path / "l" / "llama-args.txt").read_text().split()
    check_llama(args)
    assert args[args.index("-md") + 1] == str(tmp_path / "l" / f"draft-{scheme}.gguf")  # where it lies, not staged
    reader = gguf.GGUFReader(tmp_path / "l" / f"draft-{scheme}.gguf")
    tensors = {t.name: t for t in reader.tensors}
    kind = {name: t.tensor_type.name for name, t in tensors.items()}
    assert kind["blk.0.ffn_up.weight"] == kind["blk.0.attn_q.weight"] == ggml  # quantized sublayers: the scheme
    assert kind["blk.1.ffn_up.weight"] == "F32" and kind["output.weight"] == "F32"  # full MLP, full-precision head
    assert kind["blk.1.attn_v.weight"] == ggml and kind["blk.0.attn_norm.weight"] == "F32"
    assert len([n for n in tensors if n.startswith("blk.")]) == sm.num_layers * 9

    def values(name):
        t = tensors[name]
        return gguf.quants.dequantize(t.data, t.tensor_type).reshape(tuple(reversed(t.shape.tolist())))

    layer = model.model.layers[0]
    q = reorder_rotary(layer.self_attn.q_proj.weight.detach().numpy(), model.config.num_attention_heads)
    for name, want in (("blk.0.attn_q.weight", q), ("blk.0.ffn_down.weight", layer.mlp.down_proj.weight),
                       ("blk.1.ffn_up.weight", model.model.layers[1].mlp.up_proj.weight)):
        want = np.asarray(want.detach() if isinstance(want, torch.Tensor) else want)
        got = values(name)
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= 0.02 * np.abs(want).max() + 1e-6, name
    fields = {f.name for f in reader.fields.values()}
    assert {"tokenizer.ggml.tokens", "tokenizer.ggml.merges", "llama.block_count", "general.file_type"} <= fields
    assert reader.fields["tokenizer.ggml.eos_token_id"].parts[-1][0] == 1


# -- the vLLM / SGLang draft checkpoint, read back ------------------------------------------------------------
def _copy_profile(sm, ckpt: Path, tmp_path, scheme: str) -> str:
    prof = _profile(sm, "precision", scheme=scheme, full_mlp=[1], quant_head=True)
    prof = Profile(ModelRef(str(ckpt), sm.num_layers, fingerprint=None,
                            weights_fingerprint=prof.model.weights_fingerprint), prof.method, prof.draft,
                   method_params=prof.method_params)
    return _saved(tmp_path, prof, f"copy-{scheme}")


@pytest.mark.parametrize("scheme,bits", [("int8", 8), ("int4", 4)])
def test_an_int_copy_exports_to_vllm_and_sglang_as_a_compressed_tensors_checkpoint(tmp_path, scheme, bits):
    """The draft checkpoint is read back by compressed-tensors' own decompressor and by transformers' loader."""
    pytest.importorskip("compressed_tensors", reason="the export extra (setup.sh --dev installs it)")
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationConfig
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from skipsearch.kernels.lowbit.modules import LowbitLinear
    from skipsearch.methods.precision.linears import quantize_module

    ckpt = tmp_path / "ckpt"
    model = _bpe_checkpoint(ckpt)
    sm = SkippableModel(model, None, name=str(ckpt))
    path = _copy_profile(sm, ckpt, tmp_path, scheme)
    K = load_profile(path).draft.max_draft_tokens
    out = tmp_path / "v"
    done = _export("--profile", path, "--engine", "vllm", "--out", str(out))
    assert done.exit_code == 0, done.output
    cfg = json.loads((out / "speculative_config.json").read_text())
    draft = out / f"draft-{scheme}"
    assert cfg == {"method": "draft_model", "model": str(draft), "quantization": "compressed-tensors",
                   "num_speculative_tokens": K}
    check_vllm(cfg)
    man = yaml.safe_load((out / MANIFEST).read_text())
    assert man["setting"]["draft_checkpoint"]["quantized_linears"] == 7 * sm.num_layers - 3  # layer 1's MLP is full
    assert any("LM head" in n for n in man["notes"])

    config = json.loads((draft / "config.json").read_text())
    qcfg = QuantizationConfig.model_validate(config["quantization_config"])
    assert qcfg.format == "pack-quantized" and "model.layers.1.mlp.up_proj" in qcfg.ignore and "lm_head" in qcfg.ignore
    scheme_cfg = qcfg.config_groups["group_0"]
    assert scheme_cfg.weights.num_bits == bits and scheme_cfg.input_activations is None  # weight-only
    tensors = load_file(draft / "model.safetensors")
    assert "model.layers.1.mlp.up_proj.weight" in tensors and "model.layers.1.mlp.up_proj.weight_packed" not in tensors
    layer = model.model.layers[0]
    for name, linear in (("model.layers.0.self_attn.q_proj", layer.self_attn.q_proj),
                         ("model.layers.0.mlp.down_proj", layer.mlp.down_proj)):
        parts = {k.rsplit(".", 1)[1]: v for k, v in tensors.items() if k.rsplit(".", 1)[0] == name}
        assert set(parts) == {"weight_packed", "weight_scale", "weight_shape"}
        assert parts["weight_packed"].dtype == torch.int32
        got = PackedQuantizationCompressor.decompress(parts, scheme_cfg)["weight"].float()
        want = linear.weight.detach().float()
        step = parts["weight_scale"].float().repeat_interleave(want.shape[1] // parts["weight_scale"].shape[1], 1)
        assert torch.all((got - want).abs() <= step / 2 + 1e-6), name  # within half a step: rounded, not clipped
        # skipsearch's own draft of that linear: the same weights, to within one step. On an x86-64 CPU it runs our
        # kernels, whose weights read back through their own product with the identity; elsewhere torchao's tensors
        mine = quantize_module(linear, scheme)
        if isinstance(mine, LowbitLinear):  # weight-only or int8 activations: an identity row is exact either way
            with torch.no_grad():
                ours = mine(torch.eye(linear.in_features)).T  # [out, in]: one weight per output, no bias here
        else:
            ours = mine.weight.dequantize().float()
        assert torch.all((got - ours).abs() <= step + 1e-6), name
    # transformers loads it through its compressed-tensors integration (packed; unpacked at the first forward)
    loaded = AutoModelForCausalLM.from_pretrained(draft, dtype=torch.float32)
    assert torch.equal(loaded.model.layers[0].mlp.down_proj.weight_packed,
                       tensors["model.layers.0.mlp.down_proj.weight_packed"])
    with torch.no_grad():
        assert loaded(torch.tensor([[5, 6, 7]])).logits.shape == (1, 3, model.config.vocab_size)
    w = loaded.model.layers[0].mlp.down_proj.weight.detach().float()
    parts = {k.rsplit(".", 1)[1]: v for k, v in tensors.items() if k.startswith("model.layers.0.mlp.down_proj.")}
    assert torch.allclose(w, PackedQuantizationCompressor.decompress(parts, scheme_cfg)["weight"].float(), atol=1e-6)

    done = _export("--profile", path, "--engine", "sglang", "--out", str(tmp_path / "s"))
    assert done.exit_code == 0, done.output
    got = yaml.safe_load((tmp_path / "s" / "sglang.yaml").read_text())
    assert got == {"speculative-algorithm": "STANDALONE",
                   "speculative-draft-model-path": str(tmp_path / "s" / f"draft-{scheme}"),
                   "speculative-draft-model-quantization": "compressed-tensors", "speculative-num-steps": K,
                   "speculative-eagle-topk": 1, "speculative-num-draft-tokens": K + 1}
    assert (tmp_path / "s" / f"draft-{scheme}" / "model.safetensors").is_file()
    check_sglang(got)


def test_an_fp16_copy_is_one_line_for_vllm_and_sglang(tmp_path):
    ckpt = tmp_path / "ckpt"
    sm = SkippableModel(_bpe_checkpoint(ckpt), None, name=str(ckpt))
    path = _copy_profile(sm, ckpt, tmp_path, "fp16")
    for engine in ("vllm", "sglang"):
        assert_one_line_error(_export("--profile", path, "--engine", engine, "--out", str(tmp_path / engine)),
                              f"{engine} cannot express a fp16 copy of the model as its draft")
        assert not (tmp_path / engine).exists()


# -- the bench row ---------------------------------------------------------------------------------------------
def test_the_hf_generate_profile_row_is_benched_beside_the_profile(model, sm):
    from skipsearch import bench as bn
    from skipsearch.data import Prompt

    class Chars:
        eos_token_id, chat_template = None, None

        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": [1] + [2 + ord(c) % 60 for c in text]}

    bsm = SkippableModel(model, Chars(), name="tiny")
    prompts = [Prompt("a", "abcabcabc", False, "x", "t"), Prompt("b", "hello hello", False, "y", "t")]
    report = bn.bench(bsm, prompts, profiles=[("p/look.yaml", _profile(sm, "ngram"))], peers=["hf-generate+profile"],
                      max_new_tokens=12, sweep=False)
    assert [r.method for r in report.rows] == ["hf-greedy", "skipsearch-ar", "ngram:look", "hf-generate+profile:look"]
    row = report.row("hf-generate+profile:look")
    assert row.identical == 2 and row.speedup is not None and row.tau == report.row("ngram:look").tau
    with pytest.raises(ConfigError, match="give --profiles"):
        bn.bench(bsm, prompts, peers=["hf-generate+profile"], max_new_tokens=4, sweep=False)


def test_the_sglang_export_parses_with_sglangs_own_server_args(sm, tmp_path, tiny_checkpoint):
    """Runs where SGLang's ServerArgs imports (its wheel and light dependencies; not in CI)."""
    server_args = pytest.importorskip("sglang.srt.server_args")
    path = _saved(tmp_path, _profile(sm, "ngram"), "lookup")
    assert _export("--profile", path, "--engine", "sglang", "--out", str(tmp_path / "s"), "--nearest").exit_code == 0
    args = server_args.prepare_server_args(["--model-path", str(tiny_checkpoint), "--device", "cpu", "--config",
                                            str(tmp_path / "s" / "sglang.yaml")])
    assert (args.speculative_algorithm, args.speculative_num_draft_tokens) == ("NGRAM", 4)
    assert args.speculative_ngram_min_bfs_breadth == args.speculative_ngram_max_bfs_breadth == 1


def test_costs_re_plan_k_before_export_and_the_nearest_lookup_is_priced_from_the_record(tmp_path):
    code = "profiles/smollm2-135m/cpu-float32-code.yaml"
    done = _export("--profile", code, "--engine", "vllm", "--costs", "costs/cpu-float32.yaml", "--nearest", "--out",
                   str(tmp_path / "v"))
    assert done.exit_code == 0, done.output
    check_vllm(json.loads((tmp_path / "v" / "speculative_config.json").read_text()))
    man = yaml.safe_load((tmp_path / "v" / MANIFEST).read_text())
    assert man["costs"] == "costs/cpu-float32.yaml" and man["speedup"]["kind"] == "predicted"
    assert man["speedup"]["value"] > 0 and "lookup record" in man["speedup"]["source"]
    assert man["profile"]["method"] == "hybrid" and man["written"]["method"] == "ngram"
    done = _export("--profile", code, "--engine", "hf", "--costs", "costs/cpu-float32.yaml", "--out",
                   str(tmp_path / "h"))
    assert done.exit_code == 0 and "re-planned for costs/cpu-float32.yaml" in done.output, done.output
    assert load_profile(tmp_path / "h" / "profile.yaml").measured.baseline == "predicted"
