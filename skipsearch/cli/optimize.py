"""``skipsearch optimize``: search a study and write the best profile; with ``--budget 0 --costs``, re-rank a study
for another device's costs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from skipsearch.cli import options
from skipsearch.cli.edge import LazyProgress, finite, save_profile_kept, user_errors, warnings_to_stderr
from skipsearch.cli.strategy_flags import strategy_options, with_strategy_flags
from skipsearch.config import ConfigError
from skipsearch.files.bounds import MAX_DRAFT_TOKENS
from skipsearch.model.loader import DEFAULT_MODEL

# the command's own options (those several commands share are in options.py)
Strategy = Annotated[str, typer.Option(help="Search strategy.")]  # its help lists the registered strategies
Budget = Annotated[int, typer.Option(help="Trials in the study (over all workers and resumed runs).")]
Shortlist = Annotated[int, typer.Option(help="Candidates timed after a surrogate search.")]
MaxK = Annotated[int, typer.Option(max=MAX_DRAFT_TOKENS, help="Largest max_draft_tokens searched (>= 1; the "
                                                              "engine's limit above).")]
MaxSkipRatio = Annotated[float, typer.Option(min=0.0, max=1.0, callback=finite,
                                             help="Most of the 2L sublayers a draft may skip.")]
ProtectEnds = Annotated[bool, typer.Option(help="Never skip the first or last layer.")]
Study = Annotated[str | None, typer.Option(help="Study directory (SQLite inside); default studies/<model>-<strategy>.")]
Out = Annotated[Path | None, typer.Option(help="Profile to write (default <study>/best.yaml; with --engine, "
                                               "<profile or model>-<engine>.yaml).")]
Force = Annotated[bool, typer.Option(help="Replace the profile at --out (the study's own default path is replaced as "
                                          "it resumes); another kind of file is never replaced.")]
WarmStart = Annotated[list[str] | None, typer.Option(
    help="A profile whose draft config is tried first (repeatable), e.g. CLaSp's.")]
Costs = Annotated[str | None, typer.Option(
    help="With --budget 0: re-rank the study's evaluated configs under this cost file (skipsearch costs), no new "
         "trials.")]
TimeShortlist = Annotated[bool, typer.Option(
    help="With --costs: time the --shortlist best re-ranked configs here, against plain decoding.")]
Engine = Annotated[str | None, typer.Option(
    help="Search a serving engine's own speculative settings on its own server instead (llama.cpp, vllm): each "
         "timed against the engine's plain decoding in two passes, outputs checked against HF greedy; the profile "
         "records what it measured, and export --engine writes it.")]
EngineProfile = Annotated[str | None, typer.Option(
    help="With --engine: the profile to add the engine's record to (its own export joins the settings timed); "
         "default: a plain profile of --model.")]
Concurrency = Annotated[str, typer.Option(
    help="With --engine: requests in flight at once the chosen setting is checked at against plain (comma list; 1 "
         "is where the grid is timed); it ships only if at least as fast at every one. vLLM times its whole grid "
         "at each and ships a draft length per batch size.")]


@with_strategy_flags  # a flag for each option the registered strategies declare, in panels named after them
def optimize(
    model: options.Model = None,
    strategy: Strategy = "tpe",
    budget: Budget = 100,
    dataset: options.Dataset = options.DATASET,
    n_prompts: options.NPrompts = options.N_PROMPTS,
    max_new_tokens: options.MaxNewTokens = options.MAX_NEW_TOKENS,
    objective: options.Objective = "auto",
    shortlist: Shortlist = 5,
    repeats: options.Repeats = options.REPEATS,
    max_k: MaxK = 8,
    max_skip_ratio: MaxSkipRatio = 0.5,
    protect_ends: ProtectEnds = True,
    study: Study = None,
    storage: options.Storage = None,
    study_name: options.StudyName = None,
    out: Out = None,
    force: Force = False,
    warm_start: WarmStart = None,
    seed: options.Seed = options.SEED,
    device: options.Device = options.DEVICE,
    dtype: options.DType = options.DTYPE,
    target_precision: options.TargetPrecision = options.TARGET_PRECISION,
    costs: Costs = None,
    time_shortlist: TimeShortlist = False,
    kernel: options.Kernel = options.KERNEL,
    threads: options.Threads = None,
    engine: Engine = None,
    profile: EngineProfile = None,
    llama_server: options.LlamaServer = None,
    llama_target: options.LlamaTarget = None,
    vllm_python: options.VllmPython = None,
    concurrency: Concurrency = "1,2,4",
    strategy_flags: Mapping[str, Any] = {},  # noqa: B006 - read only: the strategy options' flags given
) -> None:
    """Search draft candidates with a timed objective and write the best as a profile."""
    import optuna

    from skipsearch import api

    warnings_to_stderr()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with user_errors():
        if any(x is not None for x in (engine, profile, llama_server, llama_target, vllm_python)):
            return _print_engine(_engine_search(_engine_settings(
                engine, profile=profile, llama_server=llama_server, llama_target=llama_target, vllm_python=vllm_python,
                study_flags=(costs, study, storage), model=model, out=out, dataset=dataset, n_prompts=n_prompts,
                max_new_tokens=max_new_tokens, seed=seed, threads=threads, force=force, concurrency=concurrency,
                target_precision=target_precision)), replace=force)
        # 1. the options: which job (a search, or re-ranking a study: --budget 0 --costs), and their values
        rerank = costs is not None or budget == 0
        if rerank and (costs is None or budget != 0):
            raise ConfigError("--budget must be >= 1, got 0 (--budget 0 re-ranks a study and needs --costs)"
                              if costs is None else
                              "--costs re-ranks the study's evaluated configs without new trials: give --budget 0")
        counts = (("--n-prompts", n_prompts), ("--max-new-tokens", max_new_tokens), ("--shortlist", shortlist),
                  ("--repeats", repeats))
        _at_least_one(counts if rerank else (("--budget", budget), *counts, ("--max-k", max_k)))
        # auto: nothing here records a kernel, so eager (as before; a warm-start profile's kernel is not assumed)
        kernel = "eager" if options.reject_fastest(kernel) == "auto" else kernel
        model = model or DEFAULT_MODEL
        settings = api.SearchSettings(
            model=model, strategy=strategy, budget=budget, dataset=dataset, n_prompts=n_prompts,
            max_new_tokens=max_new_tokens, objective=objective, shortlist=shortlist, repeats=repeats, max_k=max_k,
            max_skip_ratio=max_skip_ratio, protect_ends=protect_ends, study=study, storage=storage,
            study_name=study_name, out=out, force=force, warm_start=tuple(warm_start or ()), seed=seed, device=device,
            dtype=dtype, target_precision=options.precision_of(target_precision, "native"),
            costs=costs, time_shortlist=time_shortlist, kernel=kernel, threads=threads,
            strategy_options=() if rerank else strategy_options(strategy_flags),
        )
        replace = force or out is None  # a default path lies in the study, whose own profile it replaces
        if rerank:
            return _print_reranked(_rerank(settings), costs=costs, shortlist=shortlist, replace=replace)
        _print_searched(_search(settings), replace=replace)


def _engine_settings(engine: str | None, *, profile, llama_server, llama_target, vllm_python, study_flags, model, out,
                     dataset, n_prompts, max_new_tokens, seed, threads, force, concurrency, target_precision):
    """``optimize --engine``'s flags as ``api.EngineSearchSettings``; a flag that does not go with them is one
    line."""
    from skipsearch import api

    if engine is None:
        raise ConfigError("--profile, --llama-server, --llama-target and --vllm-python go with --engine llama.cpp|vllm")
    llama = "llama.cpp"
    for flag, given, own in (("--llama-server", llama_server, llama), ("--llama-target", llama_target, llama),
                             ("--vllm-python", vllm_python, "vllm")):
        if given is not None and engine != own:
            raise ConfigError(f"{flag} goes with --engine {own}, not --engine {engine}")
    if any(v is not None for v in study_flags):
        raise ConfigError("--engine times the engine's own settings, with no study: drop --costs, --study and "
                          "--storage")
    _at_least_one((("--n-prompts", n_prompts), ("--max-new-tokens", max_new_tokens)))
    try:
        levels = tuple(sorted({int(c) for c in concurrency.split(",") if c.strip()}))
    except ValueError:
        raise ConfigError(f"--concurrency takes a comma list of integers, got {concurrency!r}") from None
    name = model or DEFAULT_MODEL
    return api.EngineSearchSettings(
        engine=engine, out=out or Path(f"{Path(profile).stem if profile else name}-{engine}.yaml"), model=model,
        profile=profile, dataset=dataset, n_prompts=n_prompts, max_new_tokens=max_new_tokens, seed=seed,
        threads=threads, server=llama_server, llama_target=llama_target, vllm_python=vllm_python, force=force,
        concurrency=levels,
        target_precision=options.precision_of(target_precision))


def _search(settings):
    """``optimize``'s search: ``api.optimize_study`` with its progress bar, opened once the model is loaded."""
    from rich.console import Console
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from skipsearch import api

    budget = settings.budget
    with LazyProgress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                       TextColumn("best {task.fields[best]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                       transient=False, console=Console(stderr=True)) as bar:  # stdout: the results only

        def trials():  # the one task, opened at the search's first report
            return bar.task if bar.task is not None else bar.stage("trials", budget, best="-")

        def on_trial(record, best_so_far) -> None:
            label = "-"
            if best_so_far is not None and best_so_far.measurement is not None:
                m = best_so_far.measurement
                label = f"{m.speedup:.3f}x ({m.kind})"
            bar.update(trials(), completed=min(record.number + 1, budget), best=label)

        def on_stage(msg: str) -> None:
            trials()
            bar.progress.console.log(msg)

        return api.optimize_study(settings, on_trial=on_trial, on_stage=on_stage)


def _print_searched(run, *, replace: bool) -> None:
    """Write the search's profile (and its companions) and print what was timed (inside user_errors)."""
    from skipsearch.search.optimize import candidate_summary

    result, path = run.result, run.path
    for conflict in result.summary.conflicts[:1]:  # one line: the study keeps the rest
        more = len(result.summary.conflicts) - 1
        typer.echo(f"warning: survived {len(result.summary.conflicts)} storage conflict(s) with other workers "
                   f"(first: {conflict}){f'; {more} more' if more else ''}", err=True)
    save_profile_kept(result.profile, path, replace=replace, keep_in=run.study)
    for r in result.timed:
        m = r.measurement
        typer.echo(
            f"timed  {m.speedup:.3f}x (predicted {m.predicted_speedup or 0:.3f}x)  tau {m.tau or 0:.2f}  "
            f"acceptance {m.acceptance_rate or 0:.2f}  {candidate_summary(r.candidate)}"
            + (f"  [{m.notes}]" if m.notes else "")
        )
    typer.echo(f"{result.verdict}\nwrote {path}")
    for suffix, companion in result.companions:  # e.g. CLaSp's dynamic profile, beside the static one
        beside = path.with_name(f"{path.stem}{suffix}{path.suffix or '.yaml'}")
        save_profile_kept(companion, beside, replace=replace, keep_in=run.study)
        typer.echo(f"wrote {beside}")
    if result.interrupted:
        typer.echo("interrupted: the study keeps every finished trial; run the same command to resume", err=True)
        raise typer.Exit(130)


def _engine_search(settings):
    """``optimize --engine``: ``api.optimize_engine`` with a progress bar over the settings of each pass."""
    from rich.console import Console
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

    from skipsearch import api

    with LazyProgress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                       TextColumn("{task.fields[setting]}"), TimeElapsedColumn(),
                       console=Console(stderr=True)) as bar:
        opened: dict[int, Any] = {}

        def on_setting(run: int, name: str, index: int, total: int) -> None:
            if run not in opened:
                opened[run] = bar.stage(f"{settings.engine} pass {run + 1}", total, setting="")
            bar.update(opened[run], completed=index, setting=name)

        return api.optimize_engine(settings, on_setting=on_setting)


def _print_engine(found, *, replace: bool) -> None:
    """The settings over the passes (at each concurrency, where the grid was timed at several), the verdict, and
    the profile written (inside user_errors)."""
    run = found.run
    typer.echo(f"{run.engine} ({run.version}) on {run.hardware}; target {run.target}; {run.workload}; "
               f"checked against {run.checked_against}")
    for level, ranked in found.by_level or ((1, found.ranked),):
        if found.by_level:
            typer.echo(f"{level} request{'s' if level > 1 else ''} in flight:")
        typer.echo(f"{'setting':<34} {'tokens/s per pass':<22} {'vs plain (worse pass)':<22} identical")
        passes = max((len(r.tokens_per_s) for r in ranked), default=0)
        for r in ranked:
            rates = "/".join(f"{v:.1f}" for v in r.tokens_per_s) or "-"
            worst = f"{r.worst:.3f}x" if r.worst is not None else "-"
            once = not r.error and 0 < len(r.tokens_per_s) < passes  # out of reach after the first pass
            typer.echo(f"{r.name:<34} {rates:<22} {worst:<22} {r.identical}/{r.prompts}"
                       + (f"  [{r.error}]" if r.error else "  [first pass only: it could not ship]" if once else ""))
    save_profile_kept(found.profile, found.path, replace=replace)
    typer.echo(f"{found.verdict}\nwrote {found.path}")


def _at_least_one(values) -> None:
    """Integer options that must be >= 1, as (flag, value) pairs: the first that is not is a one-line error."""
    for flag, value in values:
        if value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")


def _rerank(settings):
    """``optimize --budget 0 --costs C``: ``api.rerank_study`` with its progress bars and its hardware note."""
    from rich.console import Console
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

    from skipsearch import api

    with LazyProgress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                       TimeElapsedColumn(), console=Console(stderr=True)) as bar:
        return api.rerank_study(settings, on_stage=bar.stage,
                                on_progress=lambda done, total: bar.update(bar.task, completed=done, total=total),
                                on_note=lambda note: typer.echo(f"warning: {note}", err=True))


def _print_reranked(rr, *, costs: str, shortlist: int, replace: bool) -> None:
    """Write the re-ranked study's profile and print its table (inside user_errors)."""
    from skipsearch.search.optimize import config_summary

    save_profile_kept(rr.profile, rr.path, replace=replace, keep_in=rr.study)
    rows = rr.reranking.rows
    skipped = rr.reranking.skipped
    typer.echo(f"study {rr.label}: {len(rows)} configs re-ranked under {costs} ({rr.target.device}, "
               f"{rr.target.dtype})" + (f"; {skipped} trials of other methods left out" if skipped else ""))
    for i, r in enumerate(rows[: max(shortlist, 10)], 1):
        where = f"trial {r.trial}" if r.trial is not None else "re-planned"
        study_timed = f"  study timed {r.study_timed:.3f}x" if r.study_timed is not None else ""
        here = f"  timed here {r.timed.speedup:.3f}x" if r.timed is not None else ""
        typer.echo(f"{i:>3}. predicted {r.predicted.speedup:.3f}x{here}{study_timed}  ({where})  "
                   f"{config_summary(r.config)}")
    typer.echo(f"{rr.verdict}\nwrote {rr.path}")
