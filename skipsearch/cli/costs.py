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
from skipsearch.model.loader import DEFAULT_MODEL

# the command's own options (those several commands share are in options.py)
Out = Annotated[Path | None, typer.Option(help="Cost file to write (default costs/<device>-<dtype>.yaml).")]
Samples = Annotated[int, typer.Option(min=1, help="Samples per quantity (the median is kept).")]
OldRepeats = Annotated[int | None, typer.Option(hidden=True, min=1, help="The old spelling of --samples.")]
Force = Annotated[bool, typer.Option(help="Replace the cost file at --out (or the default path); another kind of "
    "file is never replaced.")]
Schemes = Annotated[str | None, typer.Option(
    help="Also cost these draft schemes per sublayer: precision's fp16,int8 (CPU) or int8,int4,fp8 (CUDA); "
    "fractal's int8-dynamic (CPU), int8-weight-only, bnb-int8 (CUDA); none: no scheme. Default: the "
    "device's own (fp16 on a CPU, int8 on a GPU) and every scheme profiles/<model>/*.yaml need.")
]
Roofline = Annotated[str | None, typer.Option(
    help="Time nothing: model the costs of a GPU from --model's shapes (config only) and the GPU's published "
    "figures: h100-sxm, h100-pcie, h200, a100-80gb-sxm, a100-80gb-pcie, a100-40gb, l4, rtx-4090, rtx-a6000; "
    "cpu: this CPU, its bandwidth probed; any other name with --bandwidth and --tflops.")]
Bandwidth = Annotated[float | None, typer.Option(help="With --roofline: peak memory bandwidth, GB/s.")]
Tflops = Annotated[float | None, typer.Option(help="With --roofline: dense peak TFLOPS in --dtype.")]
Efficiency = Annotated[float | None, typer.Option(
    help="With --roofline: achieved / peak bandwidth (default: the GPU family's calibrated value).")]
LaunchUs = Annotated[float | None, typer.Option(help="With --roofline: microseconds per kernel launch.")]
ContextTokens = Annotated[int | None, typer.Option(
    help="With --roofline or --random-weights: KV-cache positions a step reads (default 512).")]
RandomWeights = Annotated[bool, typer.Option(
    help="Time --model's architecture with seeded random weights (its config.json, or the published shapes of an "
    "alias whose files are not here, e.g. llama-2-7b): real costs, no acceptance. Nothing is downloaded.")]


def costs_command(
    ctx: typer.Context,
    model: options.Model = None,
    device: options.Device = options.DEVICE,
    dtype: options.DType = options.DTYPE,
    out: Out = None,
    dataset: options.Dataset = options.DATASET,
    max_new_tokens: options.MaxNewTokens = options.MAX_NEW_TOKENS,
    samples: Samples = 9,
    repeats: OldRepeats = None,
    threads: options.Threads = None,
    seed: options.Seed = options.SEED,
    force: Force = False,
    kernel: options.CostsKernel = options.KERNEL,
    schemes: Schemes = None,
    roofline: Roofline = None,
    bandwidth: Bandwidth = None,
    tflops: Tflops = None,
    efficiency: Efficiency = None,
    launch_us: LaunchUs = None,
    context_tokens: ContextTokens = None,
    random_weights: RandomWeights = False,
    batch_sizes: options.BatchSizes = None,
    target_precision: options.TargetPrecision = options.TARGET_PRECISION,
) -> None:
    """Measure this device's cost profile (per-sublayer cost, fixed part and LM head, v(k)) for re-planning."""
    import shlex

    from skipsearch.api.costs import CostsInterrupted, measure_cost_file, model_cost_file

    warnings_to_stderr()
    model = model or DEFAULT_MODEL
    figures = dict(bandwidth_gb_s=bandwidth, tflops=tflops, efficiency=efficiency, launch_us=launch_us,
                   context_tokens=context_tokens)
    command = shlex.join(["skipsearch", *sys.argv[1:]])
    with user_errors():
        kernel, samples, precision, modelled = _flags(ctx, kernel=kernel, samples=samples, repeats=repeats,
                                                      max_new_tokens=max_new_tokens, roofline=roofline,
                                                      figures=figures, random_weights=random_weights,
                                                      target_precision=target_precision)
    if modelled:  # modelled: nothing is timed
        with user_errors():
            cp, path = model_cost_file(roofline, model=model, device=device, dtype=dtype, out=out, force=force,
                                       threads=threads, samples=samples, command=command, schemes=schemes,
                                       batch_sizes=batch_sizes, figures=figures)
            save_costs_checked(cp, path, replace=force)
        typer.echo(cp.describe())
        typer.echo(f"wrote {path} (modelled, not measured)")
        return
    with user_errors():
        try:
            cp, path = measure_cost_file(model, device=device, dtype=dtype, out=out, force=force, threads=threads,
                                         samples=samples, command=command, schemes=schemes,
                                         batch_sizes=batch_sizes, kernel=kernel, dataset=dataset,
                                         max_new_tokens=max_new_tokens, seed=seed,
                                         on_note=lambda text: typer.echo(text, err=True),
                                         warn=lambda text: typer.echo(f"warning: {line(text)}", err=True),
                                         random_weights=random_weights, context_tokens=context_tokens,
                                         target_precision=precision)
        except CostsInterrupted as stop:  # Ctrl-C after the step and v(k): they are kept
            save_costs_checked(stop.cp, stop.path, replace=force)
            typer.echo(f"interrupted while measuring {stop.missing}: wrote {stop.path} without it", err=True)
            raise typer.Exit(130) from None
        save_costs_checked(cp, path, replace=force)
    typer.echo(cp.describe())
    typer.echo(f"wrote {path} ({cp.run.seconds:.1f} s)")


def _flags(ctx: typer.Context, *, kernel: str, samples: int, repeats: int | None, max_new_tokens: int,
           roofline: str | None, figures: dict, random_weights: bool, target_precision: str) -> tuple:
    """``costs``' flags as the library takes them, old names said once, contradictions one line each: (the kernel,
    the samples, the target precision, whether the file is modelled rather than timed)."""
    source = ctx.get_parameter_source("kernel")
    if repeats is not None:
        renamed("costs --repeats", "--samples")
        samples = repeats
    if kernel == "auto" and source is not None and source.name == "COMMANDLINE":  # the old timed choice
        renamed("costs --kernel auto (the timed choice)", "--kernel fastest")
        kernel = "fastest"
    # auto: a cost file reads no profile, so eager; fastest: measure_cost_profile's timed choice (its "auto")
    kernel = {"auto": "eager", "fastest": "auto"}.get(kernel, kernel)
    if max_new_tokens < 2:
        raise ConfigError(f"--max-new-tokens must be >= 2 for costs (the context is the first calibration prompt "
                          f"plus half as many generated tokens), got {max_new_tokens}")
    modelled = roofline is not None or any(v is not None for k, v in figures.items()
                                           if k != "context_tokens" or not random_weights)
    if modelled and random_weights:
        raise ConfigError("--random-weights times a model; --roofline and its figures model one: use one of them")
    precision = options.precision_of(target_precision, "native")
    if modelled and precision != "native":
        raise ConfigError(f"--target-precision {precision} is timed on the checkpoint's weights at that "
                          "precision; --roofline and its figures model the native target only")
    return kernel, samples, precision, modelled
