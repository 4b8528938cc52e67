"""``skipsearch plan``: the hierarchical planner on given or measured inputs, a profile re-planned for another
device's costs, or the planner's levels chosen from a study."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from skipsearch.cli import options
from skipsearch.cli.edge import draw_plot, finite, save_profile_kept, user_errors, warnings_to_stderr, write_text
from skipsearch.config import ConfigError
from skipsearch.files.bounds import MAX_PLAN_M, MAX_PLAN_N
from skipsearch.files.targets import PLAN_REPORT, PLOT, PROFILE, check_target


def plan(
    alpha: Annotated[float | None, typer.Option(min=0.0, max=1.0, callback=finite,
                                                help="Analysis: M_q tokens' acceptance by M_p.")] = None,
    beta: Annotated[float | None, typer.Option(min=0.0, max=1.0, callback=finite,
                                               help="Analysis: M_s tokens' acceptance by M_q.")] = None,
    c: Annotated[float | None, typer.Option("--c", min=0.0, callback=finite,
                                            help="Analysis: one M_q step / one M_p step.")] = None,
    cs: Annotated[float | None, typer.Option("--cs", min=0.0, callback=finite,
                                             help="Analysis: one M_s step / one M_q step.")] = None,
    verify: Annotated[
        str | None, typer.Option(help="Analysis: v(1),v(2),...: a k-token forward / one step (default: free).")
    ] = None,
    model: options.Model = None,
    medium: Annotated[str | None, typer.Option(help="Profile whose draft skip sets are M_q.")] = None,
    small: Annotated[str | None, typer.Option(help="Profile whose draft skip sets are M_s.")] = None,
    profile: Annotated[str | None, typer.Option(
        help="Re-plan this profile for --costs: a layer-skip one's K, exit rule and skip set from its kept traces, "
             "a prompt-lookup one's K from its match record. A profile that kept no record has its draft traced on "
             "the model first (--model, --dataset, --n-prompts, --max-new-tokens; no timing).")] = None,
    costs: Annotated[str | None, typer.Option(
        help="A cost file (skipsearch costs): the device --profile or --study is planned for.")] = None,
    study: Annotated[str | None, typer.Option(
        help="Choose M_q and M_s from this study's α/c Pareto front, plan (m, n), validate.")] = None,
    dataset: options.Dataset = options.DATASET,
    n_prompts: options.NPrompts = options.N_PROMPTS,
    max_new_tokens: options.MaxNewTokens = options.MAX_NEW_TOKENS,
    max_m: Annotated[int, typer.Option(min=1, max=MAX_PLAN_M, help="Largest m (medium tokens per cycle) planned "
                                                                    "(the table grows as its cube).")] = 8,
    max_n: Annotated[int, typer.Option(min=0, max=MAX_PLAN_N, help="Largest n (small tokens per medium token) "
                                                                    "planned.")] = 4,
    validate: Annotated[bool | None, typer.Option(
        "--validate/--no-validate",
        help="Decode the best three- and two-level pairs and time them (default: with --study only).")] = None,
    repeats: options.Repeats = options.REPEATS,
    seed: options.Seed = options.SEED,
    device: options.Device = options.DEVICE,
    dtype: options.DType = options.DTYPE,
    as_json: options.Json = False,
    plot: Annotated[Path | None, typer.Option(help="Draw predicted speedup over (m, n) to this PNG.")] = None,
    out: Annotated[Path | None, typer.Option(help="Write a hierarchical profile of the chosen (m, n).")] = None,
    force: Annotated[bool, typer.Option(help="Replace --out, --plot and --report where each holds a file of its kind "
                                             "already (a profile, a PNG plot, a plan report); another file is never "
                                             "replaced.")] = False,
    report: options.Report = None,
) -> None:
    """Plan hierarchical speculative decoding: predicted speedup over (m, n), from given or measured inputs."""
    from skipsearch import api
    from skipsearch.methods.hierarchical import closed_form as planner
    warnings_to_stderr()
    say = lambda msg: typer.echo(msg, err=True)  # noqa: E731
    command = " ".join(["skipsearch", *sys.argv[1:]])
    with user_errors():
        # 1. where the results go is checked first, so that a bad path fails before the measuring does; then
        # which of the four modes the flags ask for
        for path, kind in ((plot, PLOT), (report, PLAN_REPORT)):
            if path:
                check_target(path, kind, replace=force)
        mode = _plan_mode(alpha=alpha, beta=beta, c=c, cs=cs, verify=verify, model=model, medium=medium, small=small,
                          profile=profile, study=study, costs=costs, validate=validate, out=out, plot=plot)
        if out and mode != "analysis":
            check_target(out, PROFILE, replace=force)
        # 2. the mode's one library function
        common = dict(model=model, dataset=dataset, n_prompts=n_prompts, max_new_tokens=max_new_tokens, max_m=max_m,
                      max_n=max_n, repeats=repeats, seed=seed, device=device, dtype=dtype, want_profile=out is not None,
                      command=command, on_stage=say)
        if mode == "analysis":
            outcome = api.plan_given(alpha, beta, c, cs, verify=planner.parse_curve(verify or ""), max_m=max_m,
                                     max_n=max_n)
        elif mode == "profile":  # search once, deploy anywhere (skipsearch.device_replan)
            outcome = api.replan_profile_file(profile, costs=costs, command=command, model=model, dataset=dataset,
                                              n_prompts=n_prompts, max_new_tokens=max_new_tokens, seed=seed,
                                              device=device, dtype=dtype, on_stage=say)
        elif mode == "study":
            outcome = api.plan_study(study, costs=costs, validate=validate is not False,
                                     on_note=lambda note: typer.echo(f"warning: {note}", err=True), **common)
        else:
            outcome = api.plan_profiles(medium, small, validate=bool(validate), **common)
        # 3. write at the edge
        if out and outcome.profile is not None:
            save_profile_kept(outcome.profile, out, replace=force)
        if plot:
            draw_plot(outcome.plan, plot, replace=force)
        if report:
            write_text(report, outcome.body, kind=PLAN_REPORT, replace=force)
    typer.echo(json.dumps(outcome.data) if as_json else outcome.text)
    for path, what in ((plot, "plot"), (report, "report"), (out, "profile")):
        if path:
            typer.echo(f"wrote {what} {path}", err=True)


def _plan_mode(*, alpha, beta, c, cs, verify, model, medium, small, profile, study, costs, validate, out,
               plot) -> str:
    """Which mode of ``plan`` the flags ask for: "analysis" (given inputs), "profile" (re-plan a profile), "study"
    (levels from a study) or "measured" (--medium and --small); a one-line ConfigError for a mix of them."""
    given = {"--alpha": alpha, "--beta": beta, "--c": c, "--cs": cs}
    if any(v is not None for v in given.values()) or verify is not None:
        if medium or small or model or validate or out or profile or study or costs:
            raise ConfigError("give either --alpha --beta --c --cs (analysis), --medium and --small (measured), "
                              "--profile or --study")
        missing = [k for k, v in given.items() if v is None]
        if missing:
            raise ConfigError(f"analysis needs {', '.join(missing)} as well")
        return "analysis"
    if profile is not None or study is not None:
        if (profile is not None and study is not None) or medium or small:
            raise ConfigError("give one of --profile, --study, or --medium and --small")
        if plot and profile is not None:
            raise ConfigError("--plot draws the (m, n) plan of --study or --medium/--small, not a profile's")
        return "profile" if profile is not None else "study"
    if medium is None or small is None:
        raise ConfigError("give --alpha --beta --c --cs (analysis), both --medium and --small (measured), "
                          "--profile or --study")
    if costs:
        raise ConfigError("--costs plans --profile or --study for another device; --medium/--small are measured here")
    return "measured"
