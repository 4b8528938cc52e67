"""``skipsearch costs``: measure this device's cost profile, for re-planning profiles for it (``--roofline GPU``:
model one from the model's shapes and a GPU's published figures, timing nothing)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from skipsearch.cli import options
from skipsearch.cli.edge import line, save_costs_checked, user_errors, warnings_to_stderr
from skipsearch.cli.options import renamed
from skipsearch.config import ConfigError
from skipsearch.data import load_prompts
from skipsearch.files.targets import COSTS, check_target
from skipsearch.model.loader import DEFAULT_MODEL


def costs_command(
    ctx: typer.Context,
    model: options.Model = None,
    device: options.Device = options.DEVICE,
    dtype: options.DType = options.DTYPE,
    out: Annotated[Path | None, typer.Option(help="Cost file to write (default costs/<device>-<dtype>.yaml).")]
    = None,
    dataset: options.Dataset = options.DATASET,
    max_new_tokens: options.MaxNewTokens = options.MAX_NEW_TOKENS,
    samples: Annotated[int, typer.Option(min=1, help="Samples per quantity (the median is kept).")] = 9,
    repeats: Annotated[int | None, typer.Option(hidden=True, min=1, help="The old spelling of --samples.")] = None,
    threads: options.Threads = None,
    seed: options.Seed = options.SEED,
    force: Annotated[bool, typer.Option(help="Replace the cost file at --out (or the default path); another kind of "
                                             "file is never replaced.")] = False,
    kernel: options.CostsKernel = options.KERNEL,
    schemes: Annotated[str | None, typer.Option(
        help="Also cost these draft schemes per sublayer: precision's fp16,int8 (CPU) or int8,int4,fp8 (CUDA); "
             "fractal's int8-dynamic (CPU), int8-weight-only, bnb-int8 (CUDA); none: no scheme. Default: the "
             "device's own (fp16 on a CPU, int8 on a GPU) and every scheme profiles/<model>/*.yaml need.")
    ] = None,
    roofline: Annotated[str | None, typer.Option(
        help="Time nothing: model the costs of a GPU from --model's shapes (config only) and the GPU's published "
             "figures: h100-sxm, h100-pcie, a100-80gb-sxm, a100-80gb-pcie, a100-40gb, l4, rtx-4090, rtx-a6000; "
             "cpu: this CPU, its bandwidth probed; any other name with --bandwidth and --tflops.")] = None,
    bandwidth: Annotated[float | None, typer.Option(help="With --roofline: peak memory bandwidth, GB/s.")] = None,
    tflops: Annotated[float | None, typer.Option(help="With --roofline: dense peak TFLOPS in --dtype.")] = None,
    efficiency: Annotated[float | None, typer.Option(
        help="With --roofline: achieved / peak bandwidth (default: the GPU family's calibrated value).")] = None,
    launch_us: Annotated[float | None, typer.Option(help="With --roofline: microseconds per kernel launch.")] = None,
    context_tokens: Annotated[int | None, typer.Option(
        help="With --roofline: KV-cache positions a step reads (default 512).")] = None,
    batch_sizes: options.BatchSizes = None,
) -> None:
    """Measure this device's cost profile (per-sublayer cost, fixed part and LM head, v(k)) for re-planning."""
    import shlex

    import torch

    from skipsearch.api.costs import batch_sizes_option, default_schemes, measure_schemes, parse_schemes
    from skipsearch.engine.measuring import calibration_context, measure_cost_profile
    from skipsearch.model.loader import load_model

    warnings_to_stderr()
    source = ctx.get_parameter_source("kernel")
    kernel_given = source is not None and source.name == "COMMANDLINE"
    model = model or DEFAULT_MODEL
    if repeats is not None:
        renamed("costs --repeats", "--samples")
        samples = repeats
    if kernel == "auto" and kernel_given:  # costs' old auto, the timed choice: fastest now
        renamed("costs --kernel auto (the timed choice)", "--kernel fastest")
        kernel = "fastest"
    # auto: a cost file reads no profile, so eager; fastest: measure_cost_profile's timed choice (its "auto")
    kernel = {"auto": "eager", "fastest": "auto"}.get(kernel, kernel)
    if max_new_tokens < 2:
        with user_errors():
            raise ConfigError(f"--max-new-tokens must be >= 2 for costs (the context is the first calibration prompt "
                              f"plus half as many generated tokens), got {max_new_tokens}")
    figures = dict(bandwidth_gb_s=bandwidth, tflops=tflops, efficiency=efficiency, launch_us=launch_us,
                   context_tokens=context_tokens)
    if roofline is not None or any(v is not None for v in figures.values()):  # modelled: nothing is timed
        from skipsearch import roofline as rl

        with user_errors():
            if roofline is None:
                raise ConfigError("--bandwidth, --tflops, --efficiency, --launch-us and --context-tokens give a "
                                  "roofline's figures: use them with --roofline GPU")
            if device != "auto":
                raise ConfigError("--device is where costs are timed; a roofline names its device: --roofline GPU")
            if out:
                check_target(out, COSTS, replace=force)
            if threads:
                torch.set_num_threads(threads)
            sizes = batch_sizes_option(batch_sizes)
            cp = rl.roofline_cost_profile(
                device=roofline, model=model, dtype=dtype, repeats=samples, command=shlex.join(
                    ["skipsearch", *sys.argv[1:]]), schemes=None if schemes is None else tuple(
                    x.strip() for x in schemes.split(",") if x.strip()), batch_sizes=sizes, **figures)
            path = out or rl.default_path(cp)
            save_costs_checked(cp, path, replace=force)
        typer.echo(cp.describe())
        typer.echo(f"wrote {path} (modelled, not measured)")
        return
    with user_errors():
        if out:
            check_target(out, COSTS, replace=force)
        sizes = batch_sizes_option(batch_sizes)  # bad input fails before the model loads
        choice = parse_schemes(schemes)  # an unknown scheme fails before the model loads
        if kernel != "auto":
            from skipsearch.kernels import check_kernel, parse_kernel
            from skipsearch.model.placement import choose_placement

            check_kernel(parse_kernel(kernel), choose_placement(device, dtype).device)  # before the model loads
        from skipsearch.api.checks import check_prompts_fit

        # the first calibration prompt, continued for half of --max-new-tokens (costs.calibration_context), fits the
        # model's context: a megabyte is refused by its length, untokenized
        check_prompts_fit(model, load_prompts(dataset, split="calib", n=1, seed=seed),
                          max_new_tokens=max(max_new_tokens // 2, 1))
        if threads:
            torch.set_num_threads(threads)
        sm = load_model(model, device=device, dtype=dtype)
        path = out or Path("costs") / f"{sm.device.type}-{sm.dtype_name}.yaml"
        if not out:
            check_target(path, COSTS, replace=force)  # the default path, before the timing
        typer.echo(f"timing {sm.name} on {sm.device} ({sm.dtype_name}, {torch.get_num_threads()} thread(s))", err=True)
        context = calibration_context(sm, dataset=dataset, max_new_tokens=max_new_tokens, seed=seed)
        cp = measure_cost_profile(sm, context, repeats=samples, command=shlex.join(["skipsearch", *sys.argv[1:]]),
                                  kernel=kernel)
        if choice is None:
            choice = default_schemes((model, sm.name), str(sm.device))
            for note in choice.notes:
                typer.echo(f"warning: {line(note)}", err=True)
        typer.echo(choice.describe(), err=True)
        measured = measure_schemes(sm, context, choice, repeats=samples,
                                   warn=lambda text: typer.echo(f"warning: {line(text)}", err=True))
        if measured:
            from dataclasses import replace

            cp = replace(cp, costs=replace(cp.costs, schemes=measured))
        if sizes:
            from dataclasses import replace

            from skipsearch.api.costs import measure_batched_costs

            priced = tuple(s.scheme for s in cp.costs.schemes)
            typer.echo(f"timing batched forwards at B = {', '.join(map(str, sizes))} ({sm.kernel.label})"
                       + (f" and the draft step of {', '.join(priced)}" if priced else ""), err=True)
            cp = replace(cp, batched=measure_batched_costs(
                sm, context, sizes, priced, repeats=samples,
                warn=lambda text: typer.echo(f"warning: {line(text)}", err=True)))
        save_costs_checked(cp, path, replace=force)
    typer.echo(cp.describe())
    typer.echo(f"wrote {path} ({cp.run.seconds:.1f} s)")
