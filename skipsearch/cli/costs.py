"""``skipsearch costs``: measure this device's cost profile, for re-planning profiles for it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from skipsearch.cli.edge import user_errors, warnings_to_stderr
from skipsearch.config import ConfigError
from skipsearch.data import load_prompts


def costs_command(
    model: Annotated[str, typer.Option(help="Model alias, local HF directory or hub id.")] = "smollm2-135m",
    device: Annotated[str, typer.Option(help="auto (CUDA if available, else cpu), cpu, cuda, cuda:N.")] = "auto",
    dtype: Annotated[str, typer.Option(help="auto (the checkpoint's on GPU, float32 on CPU), float32, bfloat16, "
                                            "float16.")] = "auto",
    out: Annotated[Path | None, typer.Option(help="Cost file to write (default costs/<device>-<dtype>.yaml).")]
    = None,
    dataset: Annotated[str, typer.Option(help="Prompts the context is taken from, as optimize's calibration.")]
    = "mtbench",
    max_new_tokens: Annotated[int, typer.Option(min=2, help="As optimize's: the context is the first calibration "
                                                            "prompt plus half as many generated tokens.")] = 64,
    repeats: Annotated[int, typer.Option(min=1, help="Samples per quantity (medians).")] = 9,
    threads: Annotated[int | None, typer.Option(min=1, help="torch intra-op threads (costs depend on them).")]
    = None,
    seed: Annotated[int, typer.Option()] = 0,
    force: Annotated[bool, typer.Option(help="Overwrite --out even if it is not a skipsearch file.")] = False,
    kernel: Annotated[str, typer.Option(
        help="What the step and v(k) run through: eager, inductor[-c<block>], or auto (the compiled kernel where it "
             "runs here and is faster than eager in the same rounds; skipsearch/kernels.py).")] = "eager",
    schemes: Annotated[str | None, typer.Option(
        help="Also cost these draft schemes per sublayer: precision's fp16,int8 (CPU) or int8,int4,fp8 (CUDA); "
             "fractal's int8-dynamic (CPU), int8-weight-only, bnb-int8 (CUDA).")
    ] = None,
) -> None:
    """Measure this device's cost profile (per-sublayer cost, fixed part and LM head, v(k)) for re-planning."""
    import shlex

    import torch

    from skipsearch import methods
    from skipsearch.costs import calibration_context, measure_cost_profile, save_costs
    from skipsearch.models import load_model
    from skipsearch.profile import check_profile_target

    warnings_to_stderr()
    with user_errors():
        if out:
            check_profile_target(out, force=force)
        load_prompts(dataset, split="calib", n=1, seed=seed)
        scheme_names = tuple(x.strip() for x in (schemes or "").split(",") if x.strip())
        if schemes is not None and not scheme_names:
            raise ConfigError("--schemes must name draft schemes, e.g. fp16,int8 or int8-dynamic")
        for name in scheme_names:  # an unknown scheme fails before the model loads
            methods.scheme_method(name)
        if kernel != "auto":
            from skipsearch.kernels import check_kernel, parse_kernel
            from skipsearch.placement import choose_placement

            check_kernel(parse_kernel(kernel), choose_placement(device, dtype).device)  # before the model loads
        if threads:
            torch.set_num_threads(threads)
        sm = load_model(model, device=device, dtype=dtype)
        path = out or Path("costs") / f"{sm.device.type}-{sm.dtype_name}.yaml"
        if not out:
            check_profile_target(path, force=force)
        typer.echo(f"timing {sm.name} on {sm.device} ({sm.dtype_name}, {torch.get_num_threads()} thread(s))", err=True)
        context = calibration_context(sm, dataset=dataset, max_new_tokens=max_new_tokens, seed=seed)
        cp = measure_cost_profile(sm, context, repeats=repeats, command=shlex.join(["skipsearch", *sys.argv[1:]]),
                                  kernel=kernel)
        if scheme_names:
            from dataclasses import replace

            measured = tuple(m.kept() for m in methods.measure_scheme_costs(sm, context, scheme_names, repeats=repeats))
            cp = replace(cp, costs=replace(cp.costs, schemes=measured))
        save_costs(cp, path)
    typer.echo(cp.describe())
    typer.echo(f"wrote {path} ({cp.run.seconds:.1f} s)")
