"""What names a kept call's file (``precompiled``): what the traced code bakes in of the model and its cache, and
that saved guards cannot check, as text and a hash (``entry_key``). A call whose key differs is another file, built
anew; so one that matches is safe to load. No torch at import."""

from __future__ import annotations

import functools
import hashlib
from collections import OrderedDict
from pathlib import Path

_TRACED = ("kernels", "model", "methods", "kv_cache.py")  # skipsearch's code that runs inside a call


@functools.cache
def _versions() -> str:
    """torch's and transformers' versions and a hash of skipsearch's source that a call runs (``_TRACED``)."""
    import torch
    import transformers

    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(p for name in _TRACED for p in ((package / name).rglob("*.py") if (package / name).is_dir()
                                                       else [package / name])):
        digest.update(path.relative_to(package).as_posix().encode())
        digest.update(path.read_bytes())
    return f"{torch.__version__}|{transformers.__version__}|{digest.hexdigest()}"


def structure(model) -> str:
    """What the traced code of ``model`` reads of it, as text: each module's name and class, and each of its
    attributes (``_describe``): tensors by shape, stride, dtype, device and whether they need grad, plain values by
    value, configs by their JSON, other objects by class and their own attributes, functions by name, and an object
    met again by where it was first met (tied weights, a group shared by sibling layers). Weights' values are left
    out: they are the call's inputs. The saved call keeps no guard on the model's own attributes (``_savable``), so
    this is all that tells its models apart."""
    seen: dict = {}  # an object's id, or a storage's key -> where it was first met
    parts = []
    for name, module in model.named_modules(remove_duplicate=False):
        if id(module) in seen:
            parts.append(f"{name}:={seen[id(module)]}")
            continue
        seen[id(module)] = name
        parts.append(f"{name}:{_kind(module)}{_attributes(module, name, seen, 0)}")
    return "\n".join(parts)


def _kind(value) -> str:
    return f"{type(value).__module__}.{type(value).__qualname__}"


def _attributes(value, where: str, seen: dict, depth: int) -> str:
    """An object's own attributes, by name."""
    attrs = vars(value)
    return "(" + ", ".join(f"{k}={_describe(attrs[k], f'{where}.{k}', seen, depth)}" for k in sorted(attrs)) + ")"


_PLAIN = frozenset({bool, int, float, str, complex})  # described by their repr, looked up before any isinstance
_EMPTY = frozenset({dict, OrderedDict, list, tuple})


@functools.cache
def _kinds() -> tuple:
    """The classes ``_describe`` asks about, imported once (no torch at this module's import): what else is described
    by its repr; what is described by its class alone (a module has its own line; generate's settings are never
    traced); tensors; configs."""
    import enum

    import torch
    from transformers import GenerationConfig, PretrainedConfig

    return ((bool, int, float, str, complex, torch.dtype, torch.device, torch.Size, enum.Enum),
            (torch.nn.Module, GenerationConfig), torch.Tensor, PretrainedConfig)


def _describe(value, where: str, seen: dict, depth: int) -> str:
    """``structure``'s text for one value held at ``where``; ``seen``: id -> where each object was first met."""
    plain, by_class, tensor, config = _kinds()
    if value is None or type(value) in _PLAIN or isinstance(value, plain):
        return repr(value)
    if type(value) in _EMPTY and not value:  # a module's hook tables: nine a module, nearly always empty
        return f"{_kind(value)}{{}}"
    if isinstance(value, by_class):
        return _kind(value)
    if id(value) in seen:
        return f"={seen[id(value)]}"
    seen[id(value)] = where
    if isinstance(value, tensor):  # and which tensor's storage it views, where (a sibling's slice of a buffer)
        storage = ("storage", value.device, value.untyped_storage().data_ptr())
        base = seen.setdefault(storage, where)
        return (f"{_kind(value)}{tuple(value.shape)}{value.stride()}{value.dtype}{value.device}"
                f"{'grad' if value.requires_grad else ''}{'inference' if value.is_inference() else ''}"
                f"@{base}+{value.storage_offset()}")
    if isinstance(value, config):
        return value.to_json_string(use_diff=False)
    if isinstance(value, tuple | list):
        return f"{_kind(value)}[{', '.join(_describe(v, f'{where}[{i}]', seen, depth) for i, v in enumerate(value))}]"
    if isinstance(value, dict):
        return (f"{_kind(value)}{{" + ", ".join(f"{k!r}: {_describe(v, f'{where}[{k!r}]', seen, depth)}"
                                                for k, v in value.items()) + "}")
    if isinstance(value, set | frozenset):
        return f"{_kind(value)}{sorted(map(repr, value))}"
    if callable(value) or depth >= 4 or not hasattr(value, "__dict__"):
        return getattr(value, "__qualname__", _kind(value))  # a function or a class: its code is in _versions' hash
    return f"{_kind(value)}{_attributes(value, where, seen, depth + 1)}"


def cache_shape(cache) -> tuple:
    """What a call's graph fixes of its KV cache: each kind of layer's class, capacity and key tensor's shape and
    dtype (a cache of another capacity bucket is another call, not a stale one that two buckets would build over
    each other in turn)."""
    import torch

    kinds = set()
    for layer in getattr(cache, "layers", ()):
        keys = getattr(layer, "keys", None)
        shape = (tuple(keys.shape), str(keys.dtype)) if isinstance(keys, torch.Tensor) else None
        kinds.add((type(layer).__name__, getattr(layer, "max_cache_len", None), shape))
    return tuple(sorted(kinds, key=repr))


def entry_key(model, role: str, shapes: tuple, settings: dict) -> str:
    """The file name of a call: a hash of ``structure(model)``, its role (a step, a block, a draft's step), the shapes
    of its inputs and its cache (``cache_shape``), inductor's settings and ``_versions()``."""
    text = "\n".join((_versions(), role, repr(shapes), repr(sorted(settings.items())), structure(model)))
    return hashlib.sha256(text.encode()).hexdigest()[:32]
