"""``skipsearch plan``: two commands under one name.

``plan profile`` re-plans a profile for another device's cost file (search once, deploy anywhere);
``plan hierarchical`` runs the hierarchical planner, on given numbers (no model), on two hand-picked profiles, or on
the levels it chooses from a study.

The old flat spelling (``plan --profile ...``, ``plan --alpha ...``, ``plan --study ...``, ``plan --medium ...``)
still works for this release: ``_PlanGroup`` hands it to the hidden command ``FLAT``, which runs exactly as before
and says the new spelling in one ``notice:`` line on stderr.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
import typer.core

from skipsearch.cli import options
from skipsearch.cli.edge import draw_plot, finite, save_profile_kept, user_errors, warnings_to_stderr, write_text
from skipsearch.cli.options import in_panel
from skipsearch.config import ConfigError
from skipsearch.files.bounds import MAX_PLAN_M, MAX_PLAN_N
from skipsearch.files.targets import PLAN_REPORT, PLOT, PROFILE, check_target
from skipsearch.methods.hierarchical import HierarchicalParams

FLAT = "flat"  # the hidden command behind the old spelling `plan --...`; goes in the next release


class _PlanGroup(typer.core.TyperGroup):
    """``plan`` followed by an option rather than a subcommand is the old flat spelling: run it as ``plan flat``."""

    def parse_args(self, ctx, args):
        if args and args[0].startswith("-") and args[0] not in ctx.help_option_names:
            args = [FLAT, *args]
        return super().parse_args(ctx, args)


plan_app = typer.Typer(
    cls=_PlanGroup,
    help="Plan a draft: re-plan a profile for another device's costs (plan profile), or plan hierarchical "
         "speculative decoding (plan hierarchical).",
    no_args_is_help=True,
)

# -- the help panels -----------------------------------------------------------------------------------------------
INPUTS = "Inputs"
TRACING = "Tracing (a profile that kept no record)"
ANALYSIS = "Analysis (given numbers, no model)"
MEASURED = "Measured (two hand-picked profiles)"
STUDY = "From a study"
PROMPTS = "Model and prompts (--medium/--small, --study)"
PLANNER = "Planner"
OUTPUT = "Output"

# -- the options of plan hierarchical (and of the old spelling), declared once -------------------------------------
Alpha = Annotated[float | None, typer.Option(min=0.0, max=1.0, callback=finite, rich_help_panel=ANALYSIS,
                                             help="M_q tokens' acceptance by M_p.")]
Beta = Annotated[float | None, typer.Option(min=0.0, max=1.0, callback=finite, rich_help_panel=ANALYSIS,
                                            help="M_s tokens' acceptance by M_q.")]
C = Annotated[float | None, typer.Option("--c", min=0.0, callback=finite, rich_help_panel=ANALYSIS,
                                         help="one M_q step / one M_p step.")]
Cs = Annotated[float | None, typer.Option("--cs", min=0.0, callback=finite, rich_help_panel=ANALYSIS,
                                          help="one M_s step / one M_q step.")]
Verify = Annotated[str | None, typer.Option(
    rich_help_panel=ANALYSIS, help="v(1),v(2),...: a k-token forward / one step (default: free).")]
Medium = Annotated[str | None, typer.Option(rich_help_panel=MEASURED, help="Profile whose draft skip sets are M_q.")]
Small = Annotated[str | None, typer.Option(rich_help_panel=MEASURED, help="Profile whose draft skip sets are M_s.")]
Study = Annotated[str | None, typer.Option(
    rich_help_panel=STUDY, help="Choose M_q and M_s from this study's α/c Pareto front, plan (m, n), validate.")]
StudyCosts = Annotated[str | None, typer.Option(
    "--costs", rich_help_panel=STUDY, help="A cost file (skipsearch costs): the device --study is planned for.")]
MaxM = Annotated[int, typer.Option(min=1, max=MAX_PLAN_M, rich_help_panel=PLANNER,
                                   help="Largest m (medium tokens per cycle) planned (the table grows as its cube).")]
MaxN = Annotated[int, typer.Option(min=0, max=MAX_PLAN_N, rich_help_panel=PLANNER,
                                   help="Largest n (small tokens per medium token) planned.")]
Validate = Annotated[bool | None, typer.Option(
    "--validate/--no-validate", rich_help_panel=PROMPTS,
    help="Decode the best three- and two-level pairs and time them (default: with --study only).")]
Plot = Annotated[Path | None, typer.Option(rich_help_panel=OUTPUT,
                                           help="Draw predicted speedup over (m, n) to this PNG.")]
HierOut = Annotated[Path | None, typer.Option("--out", rich_help_panel=OUTPUT,
                                              help="Write a hierarchical profile of the chosen (m, n).")]
HierForce = Annotated[bool, typer.Option(
    "--force", rich_help_panel=OUTPUT, help="Replace --out, --plot and --report where each holds a file of its kind "
                                            "already (a profile, a PNG plot, a plan report); another file is never "
                                            "replaced.")]

# -- the options of plan profile -----------------------------------------------------------------------------------
ReplanProfile = Annotated[str, typer.Option(
    "--profile", rich_help_panel=INPUTS,
    help="Re-plan this profile for --costs: a layer-skip one's K, exit rule and skip set from its kept traces, a "
         "prompt-lookup one's K from its match record. A profile that kept no record has its draft traced on the model "
         "first (--model, --dataset, --n-prompts, --max-new-tokens; no timing).")]
ReplanCosts = Annotated[str | None, typer.Option(
    "--costs", rich_help_panel=INPUTS,
    help="A cost file (skipsearch costs): the device the profile is planned for (default: the costs the profile "
         "records).")]
ReplanOut = Annotated[Path | None, typer.Option("--out", rich_help_panel=OUTPUT,
                                                help="Write the re-planned profile to this YAML.")]
ReplanForce = Annotated[bool, typer.Option(
    "--force", rich_help_panel=OUTPUT, help="Replace --out and --report where each holds a file of its kind already "
                                            "(a profile, a plan report); another file is never replaced.")]


# -- the shared options, each in the panel it belongs to in each subcommand -----------------------------------------
TracingModel, TracingDataset = in_panel(options.Model, TRACING), in_panel(options.Dataset, TRACING)
TracingNPrompts, TracingMaxNewTokens = in_panel(options.NPrompts, TRACING), in_panel(options.MaxNewTokens, TRACING)
TracingSeed, TracingDevice = in_panel(options.Seed, TRACING), in_panel(options.Device, TRACING)
TracingDType = in_panel(options.DType, TRACING)
PromptsModel, PromptsDataset = in_panel(options.Model, PROMPTS), in_panel(options.Dataset, PROMPTS)
PromptsNPrompts, PromptsMaxNewTokens = in_panel(options.NPrompts, PROMPTS), in_panel(options.MaxNewTokens, PROMPTS)
PromptsRepeats, PromptsSeed = in_panel(options.Repeats, PROMPTS), in_panel(options.Seed, PROMPTS)
PromptsDevice, PromptsDType = in_panel(options.Device, PROMPTS), in_panel(options.DType, PROMPTS)
OutputJson, OutputReport = in_panel(options.Json, OUTPUT), in_panel(options.Report, OUTPUT)


@plan_app.command("profile")
def plan_profile(
    profile: ReplanProfile,
    costs: ReplanCosts = None,
    model: TracingModel = None,
    dataset: TracingDataset = options.DATASET,
    n_prompts: TracingNPrompts = options.N_PROMPTS,
    max_new_tokens: TracingMaxNewTokens = options.MAX_NEW_TOKENS,
    seed: TracingSeed = options.SEED,
    device: TracingDevice = options.DEVICE,
    dtype: TracingDType = options.DTYPE,
    as_json: OutputJson = False,
    out: ReplanOut = None,
    report: OutputReport = None,
    force: ReplanForce = False,
) -> None:
    """Re-plan a profile for a device's cost file: its K, exit rule and skip set from its kept record, no timing."""
    _run(profile=profile, costs=costs, model=model, dataset=dataset, n_prompts=n_prompts,
         max_new_tokens=max_new_tokens, seed=seed, device=device, dtype=dtype, as_json=as_json, out=out, report=report,
         force=force)


@plan_app.command(HierarchicalParams.method)  # the planner of the hierarchical method, under its name
def plan_hierarchical(
    alpha: Alpha = None,
    beta: Beta = None,
    c: C = None,
    cs: Cs = None,
    verify: Verify = None,
    medium: Medium = None,
    small: Small = None,
    study: Study = None,
    costs: StudyCosts = None,
    model: PromptsModel = None,
    dataset: PromptsDataset = options.DATASET,
    n_prompts: PromptsNPrompts = options.N_PROMPTS,
    max_new_tokens: PromptsMaxNewTokens = options.MAX_NEW_TOKENS,
    validate: Validate = None,
    repeats: PromptsRepeats = options.REPEATS,
    seed: PromptsSeed = options.SEED,
    device: PromptsDevice = options.DEVICE,
    dtype: PromptsDType = options.DTYPE,
    max_m: MaxM = 8,
    max_n: MaxN = 4,
    as_json: OutputJson = False,
    plot: Plot = None,
    out: HierOut = None,
    report: OutputReport = None,
    force: HierForce = False,
) -> None:
    """Plan hierarchical speculative decoding: predicted speedup over (m, n), from given numbers, two profiles or a
    study."""
    _run(alpha=alpha, beta=beta, c=c, cs=cs, verify=verify, medium=medium, small=small, study=study, costs=costs,
         model=model, dataset=dataset, n_prompts=n_prompts, max_new_tokens=max_new_tokens, validate=validate,
         repeats=repeats, seed=seed, device=device, dtype=dtype, max_m=max_m, max_n=max_n, as_json=as_json, plot=plot,
         out=out, report=report, force=force, modes=_HIERARCHICAL)


@plan_app.command(FLAT, hidden=True)
def plan_flat(
    alpha: Alpha = None,
    beta: Beta = None,
    c: C = None,
    cs: Cs = None,
    verify: Verify = None,
    model: options.Model = None,
    medium: Medium = None,
    small: Small = None,
    profile: Annotated[str | None, typer.Option(
        help="Re-plan this profile for --costs (now: skipsearch plan profile --profile).")] = None,
    costs: Annotated[str | None, typer.Option(
        help="A cost file (skipsearch costs): the device --profile or --study is planned for.")] = None,
    study: Study = None,
    dataset: options.Dataset = options.DATASET,
    n_prompts: options.NPrompts = options.N_PROMPTS,
    max_new_tokens: options.MaxNewTokens = options.MAX_NEW_TOKENS,
    max_m: MaxM = 8,
    max_n: MaxN = 4,
    validate: Validate = None,
    repeats: options.Repeats = options.REPEATS,
    seed: options.Seed = options.SEED,
    device: options.Device = options.DEVICE,
    dtype: options.DType = options.DTYPE,
    as_json: options.Json = False,
    plot: Plot = None,
    out: HierOut = None,
    force: HierForce = False,
    report: options.Report = None,
) -> None:
    """The old flat spelling of plan profile and plan hierarchical (this release only)."""
    _run(alpha=alpha, beta=beta, c=c, cs=cs, verify=verify, model=model, medium=medium, small=small, profile=profile,
         costs=costs, study=study, dataset=dataset, n_prompts=n_prompts, max_new_tokens=max_new_tokens, max_m=max_m,
         max_n=max_n, validate=validate, repeats=repeats, seed=seed, device=device, dtype=dtype, as_json=as_json,
         plot=plot, out=out, force=force, report=report, modes=_FLAT)


# -- what every spelling runs ----------------------------------------------------------------------------------------
# The modes a spelling offers, as its one-line errors name them; the flat spelling's keep their old words.
_FLAT = {"either": "--alpha --beta --c --cs (analysis), --medium and --small (measured), --profile or --study",
         "one": "one of --profile, --study, or --medium and --small",
         "measured": "--alpha --beta --c --cs (analysis), both --medium and --small (measured), --profile or --study",
         "costs": "--profile or --study"}
_HIERARCHICAL = {"either": "--alpha --beta --c --cs (analysis), --medium and --small (measured), or --study",
                 "one": "one of --study, or --medium and --small",
                 "measured": "--alpha --beta --c --cs (analysis), both --medium and --small (measured), or --study",
                 "costs": "--study"}
# The notice of the flat spelling, by mode: the old words and the new
_NEW_SPELLING = {"profile": ("plan --profile", "plan profile --profile"),
                 "analysis": ("plan --alpha", "plan hierarchical --alpha"),
                 "study": ("plan --study", "plan hierarchical --study"),
                 "measured": ("plan --medium --small", "plan hierarchical --medium --small")}


def _run(*, alpha=None, beta=None, c=None, cs=None, verify=None, model=None, medium=None, small=None, profile=None,
         costs=None, study=None, dataset=options.DATASET, n_prompts=options.N_PROMPTS,
         max_new_tokens=options.MAX_NEW_TOKENS, max_m=8, max_n=4, validate=None, repeats=options.REPEATS,
         seed=options.SEED, device=options.DEVICE, dtype=options.DTYPE, as_json=False, plot=None, out=None,
         force=False, report=None, modes=None) -> None:
    """One run of ``plan`` in the mode its flags ask for; ``modes``: the flat spelling's (which says its notice) or
    plan hierarchical's, None for plan profile."""
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
                          profile=profile, study=study, costs=costs, validate=validate, out=out, plot=plot,
                          modes=modes or _FLAT)
        if modes is _FLAT:
            options.renamed(*_NEW_SPELLING[mode])
        if out and mode != "analysis":
            check_target(out, PROFILE, replace=force)
        # 2. the mode's one library function
        common = dict(model=model, dataset=dataset, n_prompts=n_prompts, max_new_tokens=max_new_tokens, max_m=max_m,
                      max_n=max_n, repeats=repeats, seed=seed, device=device, dtype=dtype, want_profile=out is not None,
                      command=command, on_stage=say)
        if mode == "analysis":
            outcome = api.plan_given(alpha, beta, c, cs, verify=planner.parse_curve(verify or ""), max_m=max_m,
                                     max_n=max_n)
        elif mode == "profile":  # search once, deploy anywhere (skipsearch.search.replan)
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
               plot, modes) -> str:
    """Which mode the flags ask for: "analysis" (given inputs), "profile" (re-plan a profile), "study"
    (levels from a study) or "measured" (--medium and --small); a one-line ConfigError for a mix of them."""
    given = {"--alpha": alpha, "--beta": beta, "--c": c, "--cs": cs}
    if any(v is not None for v in given.values()) or verify is not None:
        if medium or small or model or validate or out or profile or study or costs:
            raise ConfigError(f"give either {modes['either']}")
        missing = [k for k, v in given.items() if v is None]
        if missing:
            raise ConfigError(f"analysis needs {', '.join(missing)} as well")
        return "analysis"
    if profile is not None or study is not None:
        if (profile is not None and study is not None) or medium or small:
            raise ConfigError(f"give {modes['one']}")
        if plot and profile is not None:
            raise ConfigError("--plot draws the (m, n) plan of --study or --medium/--small, not a profile's")
        return "profile" if profile is not None else "study"
    if medium is None or small is None:
        raise ConfigError(f"give {modes['measured']}")
    if costs:
        raise ConfigError(f"--costs plans {modes['costs']} for another device; --medium/--small are measured here")
    return "measured"
