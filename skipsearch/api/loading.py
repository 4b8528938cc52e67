"""Opening the model a profile names (or a given one), with the profile checked against it before and after it
loads: ``open_model``, which ``decode`` and ``plan --profile`` (when it traces a draft) share."""

from __future__ import annotations

from skipsearch import methods
from skipsearch.checkpoints import ModelError, arch_fingerprint, find_checkpoint, weights_fingerprint
from skipsearch.kernels import check_kernel, choose_kernel
from skipsearch.model.loader import DEFAULT_MODEL, load_model, read_config
from skipsearch.model.placement import DEFAULT_MAX_TOKENS, choose_placement
from skipsearch.model.skippable import SkippableModel
from skipsearch.model.target import NATIVE, check_precision
from skipsearch.profile import Profile, check_model, load_profile


def open_model(
    *, model: str | None = None, profile: str | None = None, device: str = "auto", dtype: str | None = "auto",
    force: bool = False, max_tokens: int = DEFAULT_MAX_TOKENS, kernel: str | None = None,
    precision: str | None = None,
) -> tuple[SkippableModel, Profile | None]:
    """Load the model a profile names (or ``model``) and check the profile fits it.

    The profile is read and validated *before* the model loads, so a bad file fails in
    milliseconds rather than after a model load; so do other weights, whose fingerprint is read
    from the checkpoint's files. With a profile, ``model`` may name another path or alias: it is
    accepted when its weights are the profile's (a schema-1 profile, which does not record them,
    still needs the same name). ``dtype`` auto (or None) is fp32 on the CPU and the profile's dtype
    on a GPU. ``max_tokens`` (longest prompt + max_new_tokens) sizes the KV cache in the memory check.
    ``kernel`` (``--kernel``; None: the profile's, else eager) is checked against the device before the model
    loads; the caller builds it (``SkippableModel.use_kernel``) once it knows the longest sequence.
    ``precision`` (``--target-precision``; None: the profile's, else native) is the target's (model/target.py): a
    profile made for another precision is refused, as is a draft that copies fp32 weights an int8 target does not
    hold (a trimmed head, fractal's layers).
    """
    prof = load_profile(profile) if profile else None
    precision = precision or (prof.model.target_precision if prof is not None else NATIVE)
    check_precision(precision, dtype=dtype)
    if prof is not None and model not in (None, prof.model.name) and prof.model.weights_fingerprint is None:
        raise ModelError(f"--model {model} differs from the profile's model {prof.model.name}, and the profile "
                         "records no weights fingerprint to compare them by; pass one of them")
    name = model or (prof.model.name if prof is not None else DEFAULT_MODEL)
    checkpoint = find_checkpoint(name)
    checked = prof is None
    if prof is not None:
        config = read_config(checkpoint)
        weights = weights_fingerprint(checkpoint.path)
        if weights is not None or prof.model.weights_fingerprint is None:
            check_model(prof, num_layers=config.num_hidden_layers, fingerprint=arch_fingerprint(config, name),
                        weights_fingerprint=weights, force=force, source=profile,
                        fingerprint_as_profile=arch_fingerprint(config, prof.model.name), precision=precision)
            checked = True
        else:  # no safetensors files: the weights can only be hashed once they are loaded
            check_model(prof, num_layers=config.num_hidden_layers, source=profile, precision=precision)
    method = methods.get(prof.method) if prof is not None else None
    placement = choose_placement(device, dtype or "auto", profile=prof.model.dtype if prof is not None else None)
    if method is not None and method.check_device is not None:  # e.g. fp8 on a CPU: refused before loading
        method.check_device(prof.candidate, placement.device)
    chosen = choose_kernel(kernel, prof.kernel if prof is not None else None)
    check_kernel(chosen, placement.device)
    if prof is not None:  # a draft that cannot run beside a compiled kernel (CLaSp's dynamic DP): refused here
        methods.check_kernel_fits(prof.candidate, chosen, source=profile)
    draft_bits = method.draft_weight_bits(prof.candidate) if method and method.draft_weight_bits else None
    if precision != NATIVE:
        check_precision(precision, device=placement.device, dtype=placement.dtype)
        if prof is not None:
            methods.check_target(prof.candidate, precision, source=profile)
    sm = load_model(checkpoint, device=device, dtype=dtype or "auto", max_tokens=max_tokens,
                    profile_dtype=prof.model.dtype if prof is not None else None, draft_bits=draft_bits,
                    precision=precision)
    if not checked:
        check_model(prof, num_layers=sm.num_layers, fingerprint=sm.fingerprint,
                    weights_fingerprint=sm.weights_fingerprint, force=force, source=profile,
                    fingerprint_as_profile=arch_fingerprint(sm.hf.config, prof.model.name), precision=precision)
    return sm, prof


__all__ = ["open_model"]
