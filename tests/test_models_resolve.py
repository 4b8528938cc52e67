"""Finding, placing and identifying a checkpoint: aliases in a local HF cache, --device/--dtype auto,
the memory check before loading, the weights fingerprint and what profiles do with it."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from pathlib import Path

import pytest
import torch
from conftest import assert_one_line_error, save_tiny_checkpoint, tiny_llama
from typer.testing import CliRunner

from skipsearch import checkpoints
from skipsearch.checkpoints import ALIASES, ModelError, list_models, state_fingerprint, weights_fingerprint
from skipsearch.cli import app
from skipsearch.config import DraftConfig
from skipsearch.model import placement
from skipsearch.model.loader import load_model
from skipsearch.model.placement import GIB, Placement, choose_placement, count_parameters, estimate_memory
from skipsearch.profile import SCHEMA_VERSION, Environment, ModelRef, Profile, check_model, load_profile, save_profile

runner = CliRunner()
SAME = "different weights of the same architecture: re-run optimize, or --force"
_tiny_llama = tiny_llama


def _save(model, path: Path, **kwargs) -> Path:
    return save_tiny_checkpoint(path, model, **kwargs)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, Path]:
    """The same tiny Llama in two directories, and a copy with one weight changed."""
    root = tmp_path_factory.mktemp("ckpt")
    model = _tiny_llama()
    a = _save(model, root / "team-a" / "llama-tiny")
    b = Path(shutil.copytree(a, root / "team-b" / "l2-tiny"))
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[3, 5] += 0.5  # one weight, in a middle layer
    c = _save(model, root / "finetune")
    return {"a": a, "b": b, "c": c}


# -- the weights fingerprint -----------------------------------------------------------------------
def test_one_checkpoint_in_two_directories_has_one_fingerprint(dirs):
    fa, fb = weights_fingerprint(dirs["a"]), weights_fingerprint(dirs["b"])
    assert fa == fb and len(fa) == 8 + 1 + 16
    a, b = load_model(str(dirs["a"])), load_model(str(dirs["b"]))
    assert a.weights_fingerprint == b.weights_fingerprint == fa
    assert a.fingerprint != b.fingerprint  # the old architecture fingerprint hashes the path


def test_one_changed_weight_changes_the_fingerprint_not_the_layout(dirs):
    fa, fc = weights_fingerprint(dirs["a"]), weights_fingerprint(dirs["c"])
    assert fa != fc
    assert fa.split("-")[0] == fc.split("-")[0]  # same names and shapes: same architecture


def test_sharding_and_the_in_memory_fallback_give_the_same_fingerprint(dirs, tmp_path):
    model = _tiny_llama()
    sharded = _save(model, tmp_path / "sharded", max_shard_size="20KB")
    assert (sharded / "model.safetensors.index.json").exists() and not (sharded / "model.safetensors").exists()
    assert weights_fingerprint(sharded) == weights_fingerprint(dirs["a"])
    # no safetensors files (a model built in memory): the same hash over the same tensors
    assert state_fingerprint(model) == weights_fingerprint(dirs["a"])
    assert weights_fingerprint(tmp_path) is None


def test_large_tensors_are_sampled_not_read_whole(tmp_path, monkeypatch):
    # Shrink the "whole tensor" limit so that the tiny model's tensors take the sampled path a 70B's do.
    monkeypatch.setattr(checkpoints, "_WHOLE", 16)
    monkeypatch.setattr(checkpoints, "_ROW", 8)
    model = _tiny_llama()
    base = weights_fingerprint(_save(model, tmp_path / "base"))
    assert state_fingerprint(model) == base
    with torch.no_grad():
        model.model.layers[2].self_attn.q_proj.weight[16, 2] += 1.0  # row 16 of 32: the middle row is sampled
    assert weights_fingerprint(_save(model, tmp_path / "tuned")) != base


def test_a_model_built_in_memory_has_a_weights_fingerprint(tiny_sm):
    assert tiny_sm.weights_fingerprint == state_fingerprint(tiny_sm.hf)


# -- profiles and the fingerprint ------------------------------------------------------------------
def _profile_for(sm, path: Path, *, weights: bool = True) -> str:
    ref = ModelRef.of(sm)
    if not weights:  # a schema-1 profile: the architecture fingerprint only
        ref = ModelRef(ref.name, ref.num_layers, ref.dtype, ref.fingerprint)
    prof = Profile(model=ref, method="layer-skip", draft=DraftConfig(skip_attn=(2,), max_draft_tokens=2),
                   environment=Environment.current(str(sm.device), placement=sm.placement))
    return str(save_profile(prof, path))


def test_check_model_follows_the_weights():
    ref = ModelRef("/models/x", 4, fingerprint="arch-a", weights_fingerprint="lay1-content1")
    prof = Profile(model=ref, method="layer-skip", draft=DraftConfig())
    check_model(prof, num_layers=4, fingerprint="arch-b", weights_fingerprint="lay1-content1")  # other path: fine
    with pytest.raises(ValueError, match=SAME) as info:
        check_model(prof, num_layers=4, fingerprint="arch-a", weights_fingerprint="lay1-content2", source="p.yaml")
    assert "\n" not in str(info.value) and str(info.value).startswith("p.yaml: ")
    with pytest.raises(ValueError, match="another architecture"):
        check_model(prof, num_layers=4, weights_fingerprint="lay2-content2")
    with pytest.warns(UserWarning, match=SAME):
        check_model(prof, num_layers=4, weights_fingerprint="lay1-content2", force=True)
    with pytest.raises(ValueError, match="4-layer model"):  # never forceable
        check_model(prof, num_layers=5, weights_fingerprint="lay1-content1", force=True)
    # without the model's weights fingerprint, or a profile without one: the architecture fingerprint as before
    with pytest.raises(ValueError, match="model fingerprint arch-a, this model's is arch-b"):
        check_model(prof, num_layers=4, fingerprint="arch-b")
    old = Profile(model=ModelRef("/models/x", 4, fingerprint="arch-a"), method="layer-skip", draft=DraftConfig())
    check_model(old, num_layers=4, fingerprint="arch-a", weights_fingerprint="lay9-content9")
    with pytest.raises(ValueError, match="force to use it anyway"):
        check_model(old, num_layers=4, fingerprint="arch-b", weights_fingerprint="lay1-content1")


def test_profiles_record_both_fingerprints_and_the_device_choice(dirs, tmp_path):
    sm = load_model(str(dirs["a"]))
    prof = load_profile(_profile_for(sm, tmp_path / "p.yaml"))
    assert prof.schema_version == SCHEMA_VERSION
    assert prof.model.weights_fingerprint == sm.weights_fingerprint and prof.model.fingerprint == sm.fingerprint
    assert prof.environment.device == sm.placement.device and prof.environment.device_choice == sm.placement.reason
    # a schema-1 file still loads: it is upgraded, and keeps its architecture fingerprint
    old = tmp_path / "old.yaml"
    old.write_text("schema_version: 1\nmodel: {name: m, num_layers: 4, fingerprint: abc}\nmethod: layer-skip\n"
                   "draft: {}\n")
    assert load_profile(old).model == ModelRef("m", 4, fingerprint="abc")


def _decode(*args: str):
    return runner.invoke(app, ["decode", "--prompt", "def fib ( n ) :", "--max-new-tokens", "6", *args])


def test_decode_with_a_profile_follows_the_weights(dirs, tmp_path):
    sm = load_model(str(dirs["a"]))
    path = _profile_for(sm, tmp_path / "p.yaml")
    for args in ([], ["--model", str(dirs["b"])]):  # its own path, and the same weights elsewhere: no --force
        result = _decode("--profile", path, *args)
        assert result.exit_code == 0, result.output
    assert_one_line_error(_decode("--profile", path, "--model", str(dirs["c"])), SAME)
    forced = _decode("--profile", path, "--model", str(dirs["c"]), "--force")
    assert forced.exit_code == 0, forced.output
    assert SAME in forced.stderr and "forced" in forced.stderr
    # a schema-1 profile has no weights to compare: another --model is refused as before
    old = _profile_for(sm, tmp_path / "old.yaml", weights=False)
    assert_one_line_error(_decode("--profile", old, "--model", str(dirs["b"])), "differs from the profile's model")


# -- --device auto / --dtype auto ------------------------------------------------------------------
def _fake_gpus(monkeypatch, n: int, *, free_gib: float = 80.0, bf16: bool = True) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i=0: (int(free_gib * GIB), int(80 * GIB)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_auto_is_cpu_and_float32_here(dirs, caplog):
    assert choose_placement() == Placement("cpu", "float32", "device auto: no CUDA device; dtype auto: float32 on CPU")
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append  # on skipsearch's own logger: whether it propagates to the root is not the point
    log = logging.getLogger("skipsearch")
    log.addHandler(handler)
    try:
        with caplog.at_level(logging.INFO, logger="skipsearch"):
            sm = load_model(str(dirs["a"]))
    finally:
        log.removeHandler(handler)
    assert (sm.device.type, sm.dtype, sm.placement.device) == ("cpu", torch.float32, "cpu")
    lines = [r.getMessage() for r in records]
    assert lines == [f"loading {dirs['a']} on cpu in float32 (device auto: no CUDA device; dtype auto: float32 on CPU)"]


def test_auto_on_cuda_takes_the_checkpoints_dtype(monkeypatch):
    _fake_gpus(monkeypatch, 1)
    p = choose_placement("auto", "auto", checkpoint="bfloat16")
    assert (p.device, p.dtype, p.gpus) == ("cuda", "bfloat16", 1) and "the checkpoint's bfloat16" in p.reason
    assert choose_placement("auto", "auto", checkpoint="float16", profile="bfloat16").dtype == "bfloat16"
    assert choose_placement("cuda:0", "auto", checkpoint="float16").dtype == "float16"
    assert choose_placement("cuda", "float32", checkpoint="bfloat16").dtype == "float32"  # as asked
    assert choose_placement("cpu", "auto", checkpoint="bfloat16").dtype == "float32"
    assert choose_placement("auto", "auto").dtype == "bfloat16"  # a checkpoint that declares none
    _fake_gpus(monkeypatch, 1, bf16=False)
    assert choose_placement("auto", "auto").dtype == "float16"
    _fake_gpus(monkeypatch, 4)
    p = choose_placement("auto", "auto", checkpoint="float16")
    assert (p.device, p.gpus) == ("auto", 4) and "4 CUDA GPUs" in p.reason
    with pytest.raises(ModelError, match="4 CUDA device"):
        choose_placement("cuda:4")


def test_bad_device_or_dtype_is_one_line(monkeypatch):
    _fake_gpus(monkeypatch, 0)
    for device, dtype, fragment in (("cuda", "auto", "CUDA is not available"), ("tpu", "auto", "unknown device"),
                                    ("auto", "fp8", "unknown dtype")):
        with pytest.raises(ModelError, match=fragment) as info:
            choose_placement(device, dtype)
        assert "\n" not in str(info.value)


@pytest.mark.parametrize(("gpus", "device_map"), [(1, {"": "cuda"}), (2, "auto")])
def test_auto_on_fake_cuda_loads_with_a_device_map(dirs, monkeypatch, gpus, device_map):
    # The CUDA branch up to transformers: what from_pretrained is asked for.
    from transformers import AutoModelForCausalLM

    _fake_gpus(monkeypatch, gpus)
    asked = {}

    def fake_from_pretrained(path, **kwargs):
        asked.update(kwargs)
        return _tiny_llama()

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", fake_from_pretrained)
    sm = load_model(str(dirs["a"]))
    assert asked["device_map"] == device_map and asked["dtype"] == torch.float32  # the checkpoint's dtype
    assert sm.placement.gpus == gpus and sm.placement.dtype == "float32"


def test_open_model_dtype_auto_is_float32_on_cpu_and_the_profiles_on_a_gpu(dirs, tmp_path, monkeypatch):
    import dataclasses

    from transformers import AutoModelForCausalLM

    from skipsearch import api

    sm = load_model(str(dirs["a"]))
    prof = Profile(model=dataclasses.replace(ModelRef.of(sm), dtype="bfloat16"), method="layer-skip",
                   draft=DraftConfig())
    path = str(save_profile(prof, tmp_path / "bf16.yaml"))
    _fake_gpus(monkeypatch, 0)
    assert api.open_model(profile=path)[0].dtype == torch.float32
    _fake_gpus(monkeypatch, 1)
    asked = {}
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda path, **kw: asked.update(kw) or _tiny_llama())
    opened, _ = api.open_model(profile=path)
    assert asked["dtype"] == torch.bfloat16 and opened.placement.reason.endswith("the profile's bfloat16")


# -- the memory check ------------------------------------------------------------------------------
LLAMA_70B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
             "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
             "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 4096,
             "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "torch_dtype": "float16"}


@pytest.fixture
def llama_70b(tmp_path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_70B))  # config only: no weights exist to load
    return tmp_path


@pytest.mark.parametrize("config", [
    dict(model_type="llama"),
    dict(model_type="llama", tie_word_embeddings=True, attention_bias=True, mlp_bias=True),
    dict(model_type="mistral"),
    dict(model_type="qwen2", tie_word_embeddings=True),
])
def test_parameter_count_from_the_config_alone(config):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**config, vocab_size=50, hidden_size=16, intermediate_size=24, num_hidden_layers=3,
                               num_attention_heads=4, num_key_value_heads=2)
    assert count_parameters(cfg) == sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())


def test_a_70b_model_is_refused_before_loading(llama_70b):
    if (placement._mem_available() or 0) > 300 * GIB:
        pytest.skip("this machine has the RAM for a 70B model in float32")
    start = time.perf_counter()
    with pytest.raises(ModelError) as info:
        load_model(str(llama_70b), device="cpu", dtype="float32")
    assert time.perf_counter() - start < 60  # refused from the config, before minutes of loading (a wide margin)
    message = str(info.value)
    assert "\n" not in message and "needs about" in message and "GiB is available in RAM" in message
    need = estimate_memory(placement_config(llama_70b), "float32")
    assert 68e9 < need.parameters < 70e9 and f"{need.total / GIB:.1f} GiB in float32" in message


def placement_config(path: Path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path)


def test_the_refusal_says_what_would_fit(llama_70b, monkeypatch):
    # 70B: ~129 GiB of weights in bf16, ~257 GiB in fp32
    monkeypatch.setattr(placement, "_mem_available", lambda: 200 * GIB)
    _fake_gpus(monkeypatch, 0)
    with pytest.raises(ModelError, match=r"but only 200.0 GiB is available in RAM: it would fit with --dtype bfloat16"):
        load_model(str(llama_70b), device="cpu", dtype="float32")
    _fake_gpus(monkeypatch, 4, free_gib=75)  # one GPU is too small, four together are not
    with pytest.raises(ModelError, match=r"free on cuda:0: it would fit with --device auto over 4 GPUs \(300.0 GiB"):
        load_model(str(llama_70b), device="cuda", dtype="auto")
    _fake_gpus(monkeypatch, 2, free_gib=30)
    with pytest.raises(ModelError, match=r"60.0 GiB is free on 2 GPUs together: nothing on this machine fits it"):
        load_model(str(llama_70b))  # auto: both GPUs, in the checkpoint's float16
    # the KV cache counts: 80 layers x 8 heads x 128 x 2 (k, v) x 2 bytes = 320 KiB per token
    need = estimate_memory(placement_config(llama_70b), "float16", max_tokens=100_000)
    assert need.kv_cache == 80 * 8 * 128 * 2 * 2 * 100_000


def test_a_model_that_fits_is_not_refused(dirs, monkeypatch):
    monkeypatch.setattr(placement, "_mem_available", lambda: 1 * GIB)
    assert load_model(str(dirs["a"]), max_tokens=1000).num_layers == 4
    monkeypatch.setattr(placement, "_mem_available", lambda: 1000)
    with pytest.raises(ModelError, match="needs about"):
        load_model(str(dirs["a"]))


# -- aliases and the local Hugging Face cache ------------------------------------------------------
def _into_hf_cache(src: Path, hub: Path, hub_id: str, *, ref: bool = True) -> Path:
    """Lay ``src`` out as huggingface_hub does: blobs by hash, a snapshot of links, refs/main."""
    repo = hub / f"models--{hub_id.replace('/', '--')}"
    revision = hashlib.sha1(hub_id.encode()).hexdigest()
    snapshot = repo / "snapshots" / revision
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for file in src.iterdir():
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / file.name).symlink_to(Path("../../blobs") / blob.name)
    if ref:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(revision)
    return snapshot


@pytest.fixture
def hf_home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    return tmp_path / "hf" / "hub"


def test_an_alias_loads_from_the_local_hf_cache(dirs, hf_home):
    snapshot = _into_hf_cache(dirs["a"], hf_home, "meta-llama/Llama-2-13b-hf")
    sm = load_model("llama-2-13b")
    assert sm.name == "llama-2-13b" and sm.num_layers == 4
    assert sm.weights_fingerprint == weights_fingerprint(dirs["a"])
    assert checkpoints.find_checkpoint("Llama-2-13B").path == snapshot  # aliases ignore case
    assert checkpoints.find_checkpoint("meta-llama/Llama-2-13b-hf").path == snapshot  # and the hub id itself
    rows = {row.name: row for row in list_models()}
    assert rows["llama-2-13b"].path == snapshot and rows["llama-2-13b"].hub_id == "meta-llama/Llama-2-13b-hf"
    assert rows["llama-2-70b"].path is None and "smollm2-135m" in rows and len(rows) == len(ALIASES) + 1


def test_a_snapshot_without_refs_main_is_found_by_scanning(dirs, hf_home):
    snapshot = _into_hf_cache(dirs["a"], hf_home, "Qwen/Qwen2.5-7B-Instruct", ref=False)
    assert checkpoints.find_checkpoint("qwen2.5-7b-instruct").path == snapshot
    # fetched under another spelling: the hub ignores case, and so does the lookup
    other = _into_hf_cache(dirs["a"], hf_home, "mistralai/mistral-7b-v0.1")
    assert checkpoints.find_checkpoint("mistral-7b").path == other


def test_a_model_missing_from_the_cache_says_how_to_fetch_it(hf_home):
    with pytest.raises(ModelError) as info:
        load_model("llama-2-7b")
    message = str(info.value)
    assert "\n" not in message and "'llama-2-7b' (meta-llama/Llama-2-7b-hf)" in message
    assert "hf download meta-llama/Llama-2-7b-hf" in message and str(hf_home) in message
    with pytest.raises(ModelError, match="hf download someone/some-model"):
        load_model("someone/some-model")


def test_an_unknown_name_mentions_the_aliases():
    with pytest.raises(ModelError) as info:
        load_model("llama2-13b")
    message = str(info.value)
    assert "\n" not in message and "did you mean llama-2-13b?" in message and "aliases" in message
    with pytest.raises(ModelError, match="model directory './no/such/dir' does not exist"):
        load_model("./no/such/dir")


def test_alias_table_is_well_formed():
    assert all(alias == alias.lower() and "/" in hub_id for alias, hub_id in ALIASES.items())
    for needed in ("llama-2-13b", "llama-2-70b-chat", "llama-3-8b-instruct", "llama-3.1-70b", "mistral-7b",
                   "mistral-7b-instruct", "qwen2.5-7b", "qwen2.5-7b-instruct", "smollm2-360m", "smollm2-1.7b"):
        assert needed in ALIASES, needed
    assert ALIASES["llama-2-13b"] == "meta-llama/Llama-2-13b-hf"


# -- the converted default model's config.json -----------------------------------------------------
def test_a_cached_gguf_quantization_config_is_dropped(dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("SKIPSEARCH_CACHE", str(tmp_path))
    target = Path(shutil.copytree(dirs["a"], tmp_path / "models" / "smollm2-135m"))
    config = json.loads((target / "config.json").read_text())
    gguf = {"dequantize": False, "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf", "quant_method": "gguf"}
    (target / "config.json").write_text(json.dumps({**config, "quantization_config": gguf}))
    assert checkpoints.ensure_embedded("smollm2-135m") == target
    assert json.loads((target / "config.json").read_text()) == config  # all else kept
    assert sorted(p.name for p in target.iterdir() if p.name.startswith(".")) == []  # no temporary left


def test_a_cache_that_cannot_hold_the_converted_model_is_one_line_before_the_conversion(tmp_path, monkeypatch):
    """$SKIPSEARCH_CACHE naming a file (or a folder that cannot be written): one ModelError line naming the variable,
    before the GGUF is read (a conversion is a minute on 2 cores), with nothing written."""
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setenv("SKIPSEARCH_CACHE", str(tmp_path / "a-file"))
    monkeypatch.setattr(checkpoints, "_gguf_read_once", lambda: pytest.fail("the GGUF was read"))
    with pytest.raises(ModelError) as info:
        checkpoints.ensure_embedded("smollm2-135m")
    assert str(info.value) == (f"cannot write model 'smollm2-135m' converted under {tmp_path / 'a-file' / 'models'}: "
                               "Not a directory; set SKIPSEARCH_CACHE to a writable folder with room for it")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_the_converted_default_model_has_no_quantization_config(real_sm):
    config = json.loads((checkpoints.cache_dir() / "models" / "smollm2-135m" / "config.json").read_text())
    assert "quantization_config" not in config
    assert "quantization_config" not in real_sm.hf.config.to_dict()


# -- a GGUF file as the model ----------------------------------------------------------------------
def _tiny_gguf(tmp_path: Path, scheme: str = "int8") -> Path:
    """A tiny Llama written as a GGUF by the llama.cpp export's writer, its linears at ``scheme``'s GGML type."""
    from test_export import _bpe_checkpoint

    from skipsearch.export.gguf_draft import write_draft_gguf
    from skipsearch.model.skippable import SkippableModel

    ckpt = tmp_path / "ckpt"
    model = _bpe_checkpoint(ckpt)
    path = tmp_path / f"tiny.{scheme}.gguf"
    write_draft_gguf(path, SkippableModel(model, None, name=str(ckpt)), ckpt, scheme=scheme, quant_head=True)
    return path


def test_a_gguf_file_is_a_model_converted_once_and_held_in_its_own_blocks(tmp_path, monkeypatch):
    import os

    import gguf

    from skipsearch.kernels.lowbit.exact import fit_q8_0

    monkeypatch.setenv("SKIPSEARCH_CACHE", str(tmp_path / "cache"))
    path = _tiny_gguf(tmp_path)
    found = checkpoints.find_checkpoint(str(path))
    assert found.path.parent == tmp_path / "cache" / "models" / "gguf" and found.path.name.startswith("tiny.int8-")
    sm = load_model(str(path), device="cpu", dtype="float32")
    linears = [m for m in sm.hf.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(fit_q8_0(m.weight) is not None for m in linears)  # the file's Q8_0 blocks, every bit
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    down = tensors["blk.0.ffn_down.weight"]
    want = torch.from_numpy(gguf.quants.dequantize(down.data, down.tensor_type).copy())
    assert torch.equal(sm.layers[0].mlp.down_proj.weight.detach(), want)
    monkeypatch.setattr(checkpoints, "_gguf_read_once", lambda: pytest.fail("the GGUF was read again"))
    assert checkpoints.find_checkpoint(str(path)).path == found.path  # converted once: later loads read safetensors
    from skipsearch.export.base import served_model  # llama.cpp serves the file itself, vLLM and SGLang the conversion

    served = served_model(load_profile(_profile_for(sm, tmp_path / "p.yaml")))
    assert served.gguf == str(path.resolve()) and served.hf == str(found.path)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the file replaced: its conversion is not reused
    with pytest.raises(pytest.fail.Exception, match="the GGUF was read again"):
        checkpoints.find_checkpoint(str(path))


def test_a_q4_0_gguf_file_is_converted_with_plus_zeros_and_held_in_its_blocks(tmp_path, monkeypatch):
    """llama.cpp's most common 4-bit file: gguf dequantizes a Q4_0 block's q = 8 to -0.0 where d < 0, which the
    conversion makes +0.0 (the same value), so the panel kernel holds every linear as its blocks, bit for bit."""
    import gguf

    from skipsearch.kernels.lowbit.exact import Q41PanelLinear, exact_panel_linear, fit_q4_0
    from tests.conftest import lowbit_or_skip

    monkeypatch.setenv("SKIPSEARCH_CACHE", str(tmp_path / "cache"))
    path = _tiny_gguf(tmp_path, scheme="int4")
    sm = load_model(str(path), device="cpu", dtype="float32")
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    down = tensors["blk.0.ffn_down.weight"]
    assert down.tensor_type.name == "Q4_0"
    raw = torch.from_numpy(gguf.quants.dequantize(down.data, down.tensor_type).copy())
    held = sm.layers[0].mlp.down_proj.weight.detach()
    minus_zero = torch.tensor(-0.0).view(torch.int32)
    assert (raw.view(torch.int32) == minus_zero).any() and not (held.view(torch.int32) == minus_zero).any()
    assert torch.equal(held, raw)  # the same values
    linears = [m for m in sm.hf.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(fit_q4_0(m.weight) is not None for m in linears)
    lowbit_or_skip()
    assert all(type(exact_panel_linear(m)) is Q41PanelLinear for m in linears)


def test_a_gguf_file_that_is_missing_or_not_a_model_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("SKIPSEARCH_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelError, match="model file '.*absent.gguf' does not exist"):
        checkpoints.find_checkpoint(str(tmp_path / "absent.gguf"))
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a GGUF at all" * 64)
    with pytest.raises(ModelError, match="cannot read model file 'garbage.gguf' as a GGUF model"):
        checkpoints.find_checkpoint(str(garbage))
    assert not any((tmp_path / "cache" / "models" / "gguf").iterdir())  # no half conversion left
    assert_one_line_error(_decode("--model", str(garbage), "--prompt", "hi", "--max-new-tokens", "2"),
                          "cannot read model file 'garbage.gguf'")
