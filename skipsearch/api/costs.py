"""``skipsearch costs`` as functions: a cost file measured on this device (``measure_cost_file``) or modelled from a
GPU's figures (``model_cost_file``), each checking its input before the model loads.

Which draft schemes ``skipsearch costs`` measures: those asked for, or by default the device's own draft scheme
(fp16 on a CPU, int8 on a GPU) and every scheme a profile shipped for the model (``profiles/<model>/*.yaml``)
needs to be re-planned (``plan --profile``), so that the default cost file re-plans every shipped profile.

What a profile needs is its method's to say (``methods.replan_schemes``): a precision draft its scheme, a hybrid
its precision fallback's, a fractal draft its compressed layers' scheme on that device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from skipsearch import methods
from skipsearch.config import NATIVE, ConfigError
from skipsearch.files.yamlio import OneLineError

PROFILES = Path("profiles")  # where shipped profiles live, one folder per model (relative to the working directory)


@dataclass(frozen=True)
class SchemeChoice:
    """The schemes to measure and, for people, why each one."""

    schemes: tuple[str, ...]
    why: tuple[tuple[str, str], ...] = ()  # (scheme, reason)
    asked: bool = False  # named by --schemes: each must be measured; a default one is skipped where it cannot run
    notes: tuple[str, ...] = ()  # shipped profiles that could not be read, one line each

    def describe(self) -> str:
        if not self.schemes:
            return "measuring no draft scheme's costs"
        reasons = dict(self.why)
        return "measuring draft schemes " + "; ".join(
            f"{s} ({reasons[s]})" if s in reasons else s for s in self.schemes)


def parse_schemes(text: str | None) -> SchemeChoice | None:
    """``--schemes`` as given: None (not given: the defaults, chosen once the device is known), ``none`` (no
    scheme), or comma-separated names, each checked against the registry before any model loads."""
    if text is None:
        return None
    if text.strip() == "none":
        return SchemeChoice((), asked=True)
    names = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    if not names:
        raise ConfigError("--schemes must name draft schemes, e.g. fp16,int8 or int8-dynamic (none: no scheme)")
    for name in names:  # an unknown scheme fails before the model loads
        methods.scheme_method(name)
    return SchemeChoice(names, asked=True)


def batch_sizes_option(text: str | None) -> tuple[int, ...] | None:
    """``--batch-sizes`` as given: None (not given), else ascending distinct batch sizes
    (``schedule.parse_batch_sizes``) that include 1, the unit a draft's growth with the batch is taken from; one
    ConfigError line otherwise."""
    from skipsearch.files.schedule import parse_batch_sizes

    if text is None:
        return None
    try:
        sizes = parse_batch_sizes(text)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if sizes[0] != 1:
        raise ConfigError(f"--batch-sizes must include 1 (the schedule planner measures growth from it), got {text!r}")
    return sizes


def model_folders(models: Sequence[str], *, root: str | Path = PROFILES) -> tuple[Path, ...]:
    """The folders under ``root`` that hold profiles shipped for ``models`` (an alias, a hub id, a directory: the
    last part of each names the folder, so nothing outside ``root`` is read)."""
    out = []
    for model in models:
        name = Path(str(model)).name
        folder = Path(root) / name
        if name not in ("", ".", "..") and folder.is_dir() and folder not in out:
            out.append(folder)
    return tuple(out)


def default_schemes(models: Sequence[str], device: str, *, root: str | Path = PROFILES,
                    target_precision: str = NATIVE) -> SchemeChoice:
    """The device's own draft scheme, then every scheme the profiles shipped for ``models`` and made for
    ``target_precision`` need on ``device``. The int8 target's own draft scheme is int4: the one copy of its weights
    that streams fewer bytes than the target itself."""
    from skipsearch.methods.precision import device_scheme
    from skipsearch.profile import load_profile

    own = device_scheme(device) if target_precision == NATIVE else "int4"
    mine = f"the {'device' if target_precision == NATIVE else target_precision + ' target'}'s own draft scheme"
    needed: dict[str, list[str]] = {own: []}
    notes = []
    for folder in model_folders(models, root=root):
        for path in sorted(folder.glob("*.yaml")):
            try:
                profile = load_profile(path)
            except (OneLineError, ConfigError) as e:
                notes.append(f"{e} (its schemes are not measured)")
                continue
            if profile.model.target_precision != target_precision:  # re-planned with its own target's costs
                continue
            for scheme in methods.replan_schemes(profile.candidate, device):
                needed.setdefault(scheme, []).append(path.name)
    why = []
    for scheme, users in needed.items():
        parts = ([mine] if scheme == own else []) + (
            [f"needed by {', '.join(users)}"] if users else [])
        why.append((scheme, ", ".join(parts)))
    return SchemeChoice(tuple(needed), tuple(why), notes=tuple(notes))


class SchemesInterrupted(KeyboardInterrupt):
    """Ctrl-C while measuring a scheme: the schemes measured before it, kept."""

    def __init__(self, measured: tuple, scheme: str) -> None:
        super().__init__(scheme)
        self.measured, self.scheme = measured, scheme


class CostsInterrupted(KeyboardInterrupt):
    """Ctrl-C after the model's own costs were measured: the cost file as far as it got (``cp``, for ``path``), and
    what it lacks, for people."""

    def __init__(self, cp, path: Path, missing: str) -> None:
        super().__init__(missing)
        self.cp, self.path, self.missing = cp, path, missing


def measure_schemes(sm, context: Sequence[int], choice: SchemeChoice, *, repeats: int = 9,
                    warn: Callable[[str], None] = lambda _line: None,
                    on_note: Callable[[str], None] = lambda _line: None) -> tuple:
    """Each chosen scheme's per-sublayer costs on ``sm``'s device (``files.costs.SchemeCosts``), one ``on_note``
    line a scheme with the seconds it took (a 7B model's int8 and fp8 on a GPU ran past 400 s together). A scheme
    the device cannot run is an error where it was asked for, and one ``warn`` line where it is a default. Ctrl-C
    raises ``SchemesInterrupted`` with the schemes measured before it."""
    import time

    out = []
    for scheme in choice.schemes:
        t0 = time.perf_counter()
        try:
            (m,) = methods.measure_scheme_costs(sm, context, (scheme,), repeats=repeats)
        except ConfigError as e:
            if choice.asked:
                raise
            warn(f"not measuring scheme {scheme} here: {e}")
            continue
        except KeyboardInterrupt:
            raise SchemesInterrupted(tuple(out), scheme) from None
        out.append(m.kept())  # files.costs.SchemeCosts, with the compiled whole draft where one was timed
        on_note(f"scheme {scheme} measured in {time.perf_counter() - t0:.0f} s")
    return tuple(out)


def measure_batched_costs(sm, context: Sequence[int], batch_sizes: Sequence[int], schemes: Sequence[str], *,
                          repeats: int = 9, warn: Callable[[str], None] = lambda _line: None):
    """The cost file's batched grid (``costs.measure_batched``): v(k, B) at each B and, for each of ``schemes`` (those
    the cost file prices), c(B), its whole-model draft step at B as its method runs that draft
    (``methods.scheme_draft``), timed in the same rounds. A scheme whose method has no such draft gets one ``warn``
    line and no c(B) column (the planner then grows its drafts with B as the full step)."""
    from skipsearch.engine.measuring import measure_batched

    drafts = {}
    for scheme in schemes:
        draft = methods.scheme_draft(sm, scheme)
        if draft is None:
            warn(f"no c(B) for scheme {scheme}: its method ({methods.scheme_method(scheme).name}) times no batched "
                 f"draft; the planner grows its drafts with B as the full step")
            continue
        drafts[scheme] = draft
    return measure_batched(sm, context, batch_sizes, repeats=repeats, drafts=drafts)


__all__ = ["PROFILES", "CostsInterrupted", "SchemeChoice", "batch_sizes_option", "default_schemes",
           "measure_batched_costs", "measure_schemes", "model_folders", "parse_schemes"]


def model_cost_file(roofline: str | None, *, model: str, device: str, dtype: str, out: Path | None, force: bool,
                    threads: int | None, samples: int, command: str, schemes: str | None, batch_sizes: str | None,
                    figures: dict) -> tuple:
    """``costs --roofline GPU``: a cost file modelled from ``model``'s shapes and the GPU's figures (``figures``:
    bandwidth, TFLOPS, efficiency, launch and context overrides), timing nothing; and where it goes."""
    from skipsearch import roofline as rl
    from skipsearch.files.targets import COSTS, check_target

    if roofline is None:
        raise ConfigError("--bandwidth, --tflops, --efficiency, --launch-us and --context-tokens give a "
                          "roofline's figures: use them with --roofline GPU (--context-tokens also with "
                          "--random-weights)")
    if device != "auto":
        raise ConfigError("--device is where costs are timed; a roofline names its device: --roofline GPU")
    if out:
        check_target(out, COSTS, replace=force)
    if threads:
        import torch

        torch.set_num_threads(threads)
    sizes = batch_sizes_option(batch_sizes)
    cp = rl.roofline_cost_profile(
        device=roofline, model=model, dtype=dtype, repeats=samples, command=command,
        schemes=None if schemes is None else tuple(x.strip() for x in schemes.split(",") if x.strip()),
        batch_sizes=sizes, **figures)
    return cp, out or rl.default_path(cp)


def _random_weights(model: str, *, device: str, dtype: str, seed: int, context_tokens: int | None,
                    on_note: Callable[[str], None]) -> tuple:
    """``costs --random-weights``: the model's architecture with seeded random weights, and its timing context of
    ``context_tokens`` random ids (default: the roofline's)."""
    import torch

    from skipsearch.model.loader import random_model
    from skipsearch.roofline import DEFAULT_CONTEXT
    from skipsearch.roofline.shapes import architecture_config

    if context_tokens is not None and context_tokens < 1:
        raise ConfigError(f"--context-tokens must be >= 1, got {context_tokens}")
    config, source = architecture_config(model)
    length = DEFAULT_CONTEXT if context_tokens is None else context_tokens
    if length + 32 > getattr(config, "max_position_embeddings", length + 32):
        raise ConfigError(f"--context-tokens {length} is past {model}'s {config.max_position_embeddings} positions")
    sm = random_model(config, name=model, device=device, dtype=dtype, seed=seed, max_tokens=length + 32)
    on_note(f"random weights (seed {seed}) of {model}'s architecture ({source}), {length} random context tokens")
    generator = torch.Generator().manual_seed(seed)
    return sm, tuple(torch.randint(config.vocab_size, (length,), generator=generator).tolist())


def measure_cost_file(model: str, *, device: str, dtype: str, out: Path | None, force: bool, threads: int | None,
                      samples: int, command: str, schemes: str | None, batch_sizes: str | None, kernel: str,
                      dataset: str, max_new_tokens: int, seed: int, on_note: Callable[[str], None],
                      warn: Callable[[str], None], random_weights: bool = False,
                      context_tokens: int | None = None, target_precision: str = NATIVE) -> tuple:
    """``skipsearch costs``: the cost file of ``model`` on this device (the step, the sublayers, v(k), each draft
    scheme's costs and, with ``batch_sizes``, the batched grid), timed at optimize's calibration context; and where it
    goes. Every input is checked before the model loads.

    With ``random_weights`` the model is its architecture alone (its config.json, or the published table's row for
    an alias whose files are not here: ``roofline.shapes.architecture_config``) with seeded random weights, timed at
    ``context_tokens`` random token ids (default: the roofline's context, so the two files compare): its costs,
    not its acceptance, which the weights decide. ``target_precision`` (``--target-precision``, model/target.py)
    times that target instead of the checkpoint's own weights (int8: its int8 products, a quarter of the bytes a
    step streams); the file records it, and re-planning takes a profile's costs from its own target's file only.
    Ctrl-C after the model's own costs were measured raises
    ``CostsInterrupted`` with the file as far as it got."""
    import torch

    from skipsearch.api.checks import check_prompts_fit
    from skipsearch.data import load_prompts
    from skipsearch.engine.measuring import calibration_context, measure_cost_profile
    from skipsearch.files.targets import COSTS, check_target
    from skipsearch.model.loader import load_model

    sizes, choice = _checked_before_loading(out=out, force=force, batch_sizes=batch_sizes, schemes=schemes,
                                            device=device, dtype=dtype, kernel=kernel,
                                            target_precision=target_precision, random_weights=random_weights)
    if threads:
        torch.set_num_threads(threads)
    if random_weights:
        sm, context = _random_weights(model, device=device, dtype=dtype, seed=seed, context_tokens=context_tokens,
                                      on_note=on_note)
    else:
        if context_tokens is not None:
            raise ConfigError("--context-tokens sets a roofline's or random weights' context: use it with "
                              "--roofline GPU or --random-weights (a measured cost file runs at the calibration "
                              "context)")
        # the first calibration prompt, continued for half of --max-new-tokens (calibration_context), fits the
        # model's context: a megabyte is refused by its length, untokenized
        check_prompts_fit(model, load_prompts(dataset, split="calib", n=1, seed=seed),
                          max_new_tokens=max(max_new_tokens // 2, 1))
        sm = load_model(model, device=device, dtype=dtype, precision=target_precision)
    suffix = "" if target_precision == NATIVE else f"-{target_precision}"  # costs/cpu-float32-int8.yaml
    path = out or Path("costs") / f"{sm.device.type}-{sm.dtype_name}{suffix}.yaml"
    if not out:
        check_target(path, COSTS, replace=force)  # the default path, before the timing
    target = "" if target_precision == NATIVE else f", the {target_precision} target"
    on_note(f"timing {sm.name} on {sm.device} ({sm.dtype_name}{target}, {torch.get_num_threads()} thread(s))")
    if not random_weights:
        context = calibration_context(sm, dataset=dataset, max_new_tokens=max_new_tokens, seed=seed)
    cp = measure_cost_profile(sm, context, repeats=samples, command=command, kernel=kernel)
    if choice is None:
        choice = default_schemes((model, sm.name), str(sm.device), target_precision=target_precision)
        for note in choice.notes:
            warn(note)
    if random_weights and cp.run is not None:
        cp = replace(cp, run=replace(cp.run, weights=f"random:seed={seed}"))
    on_note(choice.describe())
    # Ctrl-C from here on keeps what was measured (CostsInterrupted): the step and v(k) of a 7B model are minutes
    try:
        measured = measure_schemes(sm, context, choice, repeats=samples, warn=warn, on_note=on_note)
    except SchemesInterrupted as stop:
        left = choice.schemes[choice.schemes.index(stop.scheme):]
        raise CostsInterrupted(_with_schemes(cp, stop.measured), path,
                               f"scheme{'s' if len(left) > 1 else ''} {', '.join(left)}") from None
    cp = _with_schemes(cp, measured)
    if sizes:
        priced = tuple(s.scheme for s in cp.costs.schemes)
        on_note(f"timing batched forwards at B = {', '.join(map(str, sizes))} ({sm.kernel.label})"
                + (f" and the draft step of {', '.join(priced)}" if priced else ""))
        try:
            grid = measure_batched_costs(sm, context, sizes, priced, repeats=samples, warn=warn)
        except KeyboardInterrupt:
            raise CostsInterrupted(cp, path, "the batched grid") from None
        cp = replace(cp, batched=grid)
    return cp, path


def _checked_before_loading(*, out: Path | None, force: bool, batch_sizes: str | None, schemes: str | None,
                            device: str, dtype: str, kernel: str, target_precision: str,
                            random_weights: bool) -> tuple:
    """``measure_cost_file``'s input, every part of it that can be wrong checked before the model loads: (the
    batch sizes, the schemes chosen or None)."""
    from skipsearch.files.targets import COSTS, check_target
    from skipsearch.model.placement import choose_placement
    from skipsearch.model.target import check_precision

    if out:
        check_target(out, COSTS, replace=force)
    sizes = batch_sizes_option(batch_sizes)
    choice = parse_schemes(schemes)  # an unknown scheme
    placed = choose_placement(device, dtype).device
    if kernel != "auto":
        from skipsearch.kernels import check_kernel, parse_kernel

        check_kernel(parse_kernel(kernel), placed)
    # an unknown precision, int8 on a GPU or with --dtype bfloat16
    check_precision(target_precision, device=None if placed == "auto" else placed, dtype=dtype)
    if target_precision != NATIVE and random_weights:
        raise ConfigError(f"--target-precision {target_precision} times the checkpoint's weights at that precision; "
                          "--random-weights has none: leave one of them out")
    return sizes, choice


def _with_schemes(cp, measured: tuple):
    return replace(cp, costs=replace(cp.costs, schemes=measured)) if measured else cp
