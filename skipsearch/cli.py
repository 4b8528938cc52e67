"""The ``skipsearch`` command: a thin typer layer over library functions that return data.

Every known kind of bad input (profile, model, data, config, storage) ends as one line on
stderr and exit code 2, with no traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import warnings
from pathlib import Path
from typing import Annotated

import typer

from skipsearch.config import ConfigError, SamplingParams
from skipsearch.data import DataError, Prompt, load_prompts
from skipsearch.models import ModelError
from skipsearch.profile import ProfileError, load_profile, save_profile
from skipsearch.study import StudyError

app = typer.Typer(
    help="Search, ship and run self-speculative decoding draft profiles.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
profile_app = typer.Typer(help="Check and describe draft profiles.", no_args_is_help=True)
app.add_typer(profile_app, name="profile")
study_app = typer.Typer(help="Inspect search studies.", no_args_is_help=True)
app.add_typer(study_app, name="study")

USER_ERRORS: tuple[type[Exception], ...] = (ProfileError, ModelError, DataError, ConfigError, StudyError)


@contextlib.contextmanager
def user_errors():
    """Turn known bad input into one line on stderr and exit 2; Ctrl-C into exit 130."""
    try:
        yield
    except USER_ERRORS as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        raise typer.Exit(130) from None


def _warnings_to_stderr() -> None:
    # Library warnings (e.g. a forced fingerprint mismatch) as one plain line each.
    warnings.showwarning = lambda msg, cat, *a, **k: typer.echo(f"warning: {msg}", err=True)


def _read_prompts_file(path: Path, chat_default: bool) -> tuple[Prompt, ...]:
    prompts = []
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise DataError(f"cannot read prompts file {path}: {exc.strerror or exc}") from None
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            text = row["prompt"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise DataError(f"{path}:{no}: each line must be a JSON object with a \"prompt\" string") from None
        prompts.append(Prompt(str(no), str(text), bool(row.get("chat", chat_default)), "", path.name))
    if not prompts:
        raise DataError(f"{path} holds no prompts")
    return tuple(prompts)


@app.command()
def decode(
    prompt: Annotated[str | None, typer.Option(help="Text to continue (or a user message with --chat).")] = None,
    model: Annotated[str | None, typer.Option(help="Model alias, local HF directory or hub id.")] = None,
    profile: Annotated[str | None, typer.Option(help="Draft profile (YAML); it names its model.")] = None,
    prompts_file: Annotated[
        Path | None, typer.Option(help='JSONL, one {"prompt": ..., "chat": bool} per line.')
    ] = None,
    chat: Annotated[bool, typer.Option(help="Wrap the prompt with the model's chat template.")] = False,
    max_new_tokens: Annotated[int, typer.Option(min=1)] = 128,
    temperature: Annotated[float, typer.Option(min=0.0, help="0 is greedy.")] = 0.0,
    top_p: Annotated[float, typer.Option()] = 1.0,
    top_k: Annotated[int, typer.Option(min=0)] = 0,
    seed: Annotated[int, typer.Option()] = 0,
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N, or auto (spread over GPUs).")] = "cpu",
    dtype: Annotated[str | None, typer.Option(help="float32, bfloat16 or float16 (default: the profile's).")] = None,
    force: Annotated[bool, typer.Option(help="Use a profile despite a model fingerprint mismatch.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per prompt on stdout.")] = False,
) -> None:
    """Decode with a draft profile (lossless), or plainly with --model."""
    from skipsearch import api

    _warnings_to_stderr()
    with user_errors():
        if (prompt is None) == (prompts_file is None):
            raise DataError("give exactly one of --prompt or --prompts-file")
        sampling = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
        prompts = (
            _read_prompts_file(prompts_file, chat) if prompts_file else (Prompt("1", prompt, chat, "", "cli"),)
        )
        sm, prof = api.open_model(model=model, profile=profile, device=device, dtype=dtype, force=force)
        drafters = api.drafter_factory(prof, sm)

        def show(_: int, text: str) -> None:
            sys.stdout.write(text)
            sys.stdout.flush()

        results = api.decode_prompts(
            sm, prompts, drafters=drafters, sampling=sampling, max_new_tokens=max_new_tokens, seed=seed,
            on_text=None if as_json else show,
        )
        for d in results:
            if as_json:
                row = {
                    "prompt": d.prompt.text,
                    "prompt_token_ids": list(d.prompt_token_ids),
                    "token_ids": list(d.result.token_ids),
                    "text": d.text,
                    "stats": dataclasses.asdict(d.result.stats),
                }
                typer.echo(json.dumps(row))
            else:
                s = d.result.stats
                acc = "-" if s.acceptance_rate is None else f"{s.acceptance_rate:.2f}"
                own = "".join(f", {k} {v:.3g}" for k, v in s.drafter_stats)  # the method's own figures
                typer.echo(
                    f"\n[{s.new_tokens} tokens, {s.seconds:.2f}s, {s.tokens_per_s:.1f} tok/s, "
                    f"tau {s.tau:.2f}, acceptance {acc}{own}]",
                    err=True,
                )


@profile_app.command("validate")
def profile_validate(path: Annotated[str, typer.Argument(help="Profile YAML to check.")]) -> None:
    """Exit 0 if the profile is valid; else print one line saying what is wrong and exit 2."""
    with user_errors():
        load_profile(path)
    typer.echo(f"{path}: valid")


@profile_app.command("show")
def profile_show(path: Annotated[str, typer.Argument(help="Profile YAML to describe.")]) -> None:
    """Human summary: model, method, skips, measured figures."""
    with user_errors():
        prof = load_profile(path)
    typer.echo(prof.describe())


@app.command()
def optimize(
    model: Annotated[str, typer.Option(help="Model alias, local HF directory or hub id.")] = "smollm2-135m",
    strategy: Annotated[str, typer.Option(help="Search strategy: tpe, bayes, clasp, or fractal (an (n, w) grid).")]
    = "tpe",
    budget: Annotated[int, typer.Option(help="Trials in the study (over all workers and resumed runs).")] = 100,
    dataset: Annotated[str, typer.Option(help="Calibration prompts: mtbench, humaneval, a file, hf:...")] = "mtbench",
    n_prompts: Annotated[int, typer.Option(help="Calibration prompts (calib split).")] = 8,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens decoded per calibration prompt.")] = 64,
    objective: Annotated[str, typer.Option(help="two-stage (surrogate, then time a shortlist), surrogate, timed.")]
    = "two-stage",
    shortlist: Annotated[int, typer.Option(help="Configs timed after a surrogate search.")] = 5,
    repeats: Annotated[int, typer.Option(min=1, help="Timed runs per prompt (median).")] = 1,
    max_k: Annotated[int, typer.Option(min=1, help="Largest max_draft_tokens searched.")] = 8,
    max_skip_ratio: Annotated[float, typer.Option(help="Most of the 2L sublayers a draft may skip.")] = 0.5,
    protect_ends: Annotated[bool, typer.Option(help="Never skip the first or last layer.")] = True,
    study: Annotated[
        str | None, typer.Option(help="Study directory (SQLite inside); default studies/<model>-<strategy>.")
    ] = None,
    storage: Annotated[str | None, typer.Option(help="Optuna RDB URL shared by workers, e.g. postgresql://...")] = None,
    study_name: Annotated[str | None, typer.Option(help="Study name inside --storage.")] = None,
    out: Annotated[Path | None, typer.Option(help="Profile to write (default <study>/best.yaml).")] = None,
    warm_start: Annotated[
        list[str] | None, typer.Option(help="A profile whose draft config is tried first (repeatable), e.g. CLaSp's.")
    ] = None,
    clasp_loi: Annotated[
        int, typer.Option(min=1, help="--strategy clasp: the LOI of the <out>-dynamic.yaml profile also written.")
    ] = 8,
    seed: Annotated[int, typer.Option()] = 0,
    device: Annotated[str, typer.Option()] = "cpu",
    dtype: Annotated[str, typer.Option()] = "float32",
    n: Annotated[str | None, typer.Option("--n", help="fractal: numbers of fractal layers to try, e.g. 3,5,7.")]
    = None,
    w: Annotated[str | None, typer.Option("--w", help="fractal: draft windows to try, e.g. 3,5,7.")] = None,
    quantization: Annotated[str, typer.Option(help="fractal: auto, int8-dynamic, int8-weight-only, bnb-int8, none.")]
    = "auto",
) -> None:
    """Search draft configs with a timed objective and write the best as a profile."""
    import optuna
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from skipsearch import optimize as opt
    from skipsearch.models import load_model
    from skipsearch.space import SearchSpace

    _warnings_to_stderr()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if strategy == "fractal":
        with user_errors():
            _optimize_fractal(model=model, dataset=dataset, n_prompts=n_prompts, max_new_tokens=max_new_tokens,
                              repeats=repeats, n=n or "3,5,7", w=w or "3,5,7", quantization=quantization, study=study,
                              out=out, seed=seed, device=device, dtype=dtype)
        return
    with user_errors():
        if n is not None or w is not None:
            raise ConfigError("--n and --w apply to --strategy fractal only")
        if budget < 1:
            raise StudyError(f"--budget must be >= 1, got {budget}")
        if objective not in opt.OBJECTIVES:
            raise ConfigError(f"unknown objective '{objective}': use {', '.join(opt.OBJECTIVES)}")
        from skipsearch.strategies import check_strategy

        check_strategy(strategy)  # before the model loads: a typo should cost milliseconds
        if storage is None and study is None:
            study = f"studies/{Path(model).name}-{strategy}"
        load_prompts(dataset, split="calib", n=n_prompts, seed=seed)  # fail on bad data before the model loads
        for p in warm_start or ():
            load_profile(p)  # and on a bad warm-start profile
        sm = load_model(model, device=device, dtype=dtype)
        warm = [load_profile(p, num_layers=sm.num_layers) for p in warm_start or ()]
        space = SearchSpace(
            num_layers=sm.num_layers, max_draft_tokens=tuple(k for k in (1, 2, 3, 4, 6, 8, 12) if k <= max_k),
            protect_ends=protect_ends, max_skip_ratio=max_skip_ratio,
        )
        settings = opt.OptimizeSettings(
            strategy=strategy, budget=budget, dataset=dataset, n_prompts=n_prompts, max_new_tokens=max_new_tokens,
            objective=objective, shortlist=shortlist, seed=seed, repeats=repeats, space=space, study_dir=study,
            storage=storage, study_name=study_name, warm_start=tuple(p.draft for p in warm),
        )
        with Progress(
            TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
            TextColumn("best {task.fields[best]}"), TimeElapsedColumn(), TimeRemainingColumn(), transient=False,
            console=None,
        ) as progress:
            task = progress.add_task("trials", total=budget, best="-")

            def on_trial(record, best_so_far) -> None:
                label = "-"
                if best_so_far is not None and best_so_far.measurement is not None:
                    m = best_so_far.measurement
                    label = f"{m.speedup:.3f}x ({m.kind})"
                progress.update(task, completed=min(record.number + 1, budget), best=label)

            result = opt.optimize(sm, settings, on_trial=on_trial, on_stage=lambda msg: progress.console.log(msg))
        path = out or Path(study or ".") / "best.yaml"
        opt.write_profile(result, path)
        for r in result.timed:
            m = r.measurement
            typer.echo(
                f"timed  {m.speedup:.3f}x (predicted {m.predicted_speedup or 0:.3f}x)  tau {m.tau or 0:.2f}  "
                f"acceptance {m.acceptance_rate or 0:.2f}  {opt.config_summary(r.config)}"
            )
        typer.echo(f"{result.verdict}\nwrote {path}")
        if result.plan is not None:  # CLaSp: the dynamic profile goes next to the static one
            dynamic = path.with_name(f"{path.stem}-dynamic{path.suffix or '.yaml'}")
            save_profile(opt.clasp_dynamic_profile(result, loi=clasp_loi, protect_ends=protect_ends), dynamic)
            typer.echo(f"wrote {dynamic}")
        if result.interrupted:
            typer.echo("interrupted: the study keeps every finished trial; run the same command to resume", err=True)
            raise typer.Exit(130)


def _optimize_fractal(*, model: str, dataset: str, n_prompts: int, max_new_tokens: int, repeats: int, n: str, w: str,
                      quantization: str, study: str | None, out: Path | None, seed: int, device: str,
                      dtype: str) -> None:
    """``optimize --strategy fractal``: time the (n, w) grid and write the best as a profile."""
    from skipsearch import fractal_search as fs
    from skipsearch.models import load_model
    from skipsearch.profile import save_profile

    settings = fs.FractalSearchSettings(
        n_values=fs.parse_int_list(n, "--n"), w_values=fs.parse_int_list(w, "--w"), dataset=dataset,
        n_prompts=n_prompts, max_new_tokens=max_new_tokens, repeats=repeats, quantization=quantization, seed=seed,
    )
    load_prompts(dataset, split="calib", n=n_prompts, seed=seed)  # fail on bad data before the model loads
    sm = load_model(model, device=device, dtype=dtype)

    def show(point) -> None:
        m = point.measurement
        typer.echo(f"timed  {m.speedup:.3f}x  tau {m.tau or 0:.2f}  accepted/verify {point.accepted_per_verify:.2f}  "
                   f"n={point.params.n} w={point.params.w}")

    result = fs.search_fractal(sm, settings, on_point=show, on_stage=lambda msg: typer.echo(msg, err=True))
    path = save_profile(result.profile, out or Path(study or f"studies/{Path(model).name}-fractal") / "best.yaml")
    typer.echo(f"{result.verdict}\nwrote {path}")


def _profile_paths(given: list[str]) -> list[str]:
    """Paths from --profiles: repeated, comma-separated, or a glob the shell left unexpanded."""
    import glob

    out: list[str] = []
    for item in given:
        for part in filter(None, (p.strip() for p in item.split(","))):
            matches = sorted(glob.glob(part)) if glob.has_magic(part) else [part]
            if not matches:
                raise ProfileError(f"{part}: no profile matches this pattern")
            out.extend(m for m in matches if m not in out)
    return out


@app.command()
def bench(
    more_profiles: Annotated[
        list[str] | None, typer.Argument(help="More profiles (so that `--profiles dir/*.yaml` works unquoted).")
    ] = None,
    profiles: Annotated[
        list[str] | None, typer.Option(help="Profiles to bench: repeat, comma-separate or give a glob.")
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model alias, directory or hub id (default: the profiles').")]
    = None,
    peers: Annotated[str, typer.Option(help="HF peers: hf-greedy (always run), hf-prompt-lookup, hf-early-exit.")]
    = "hf-greedy,hf-prompt-lookup,hf-early-exit",
    dataset: Annotated[str, typer.Option(help="mtbench, humaneval, a .jsonl/.json/.csv/.parquet file, hf:...")]
    = "mtbench,humaneval",
    split: Annotated[str, typer.Option(help="heldout (prompts the search did not see), calib or all.")] = "heldout",
    n_prompts: Annotated[int, typer.Option(min=1, help="Prompts to bench.")] = 16,
    max_new_tokens: Annotated[int, typer.Option(min=1)] = 128,
    repeats: Annotated[int, typer.Option(min=1, help="Timed runs per prompt and method (median).")] = 1,
    sweep_prompts: Annotated[
        int, typer.Option(min=0, help="Calib-split prompts each peer's knob is swept on; 0: no sweep.")
    ] = 2,
    seed: Annotated[int, typer.Option(help="Which prompts are drawn.")] = 0,
    device: Annotated[str, typer.Option()] = "cpu",
    dtype: Annotated[str | None, typer.Option(help="Default: the profiles' dtype, else float32.")] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="torch intra-op threads.")] = None,
    report: Annotated[Path | None, typer.Option(help="Write the Markdown report here.")] = None,
    as_json: Annotated[Path | None, typer.Option("--json", help="Write the JSON report here.")] = None,
    by_category: Annotated[bool, typer.Option(help="Also print one table per task category.")] = False,
    write_measured: Annotated[
        bool, typer.Option(help="Fill each profile's measured block from its row (identical output only).")
    ] = False,
    force: Annotated[bool, typer.Option(help="Use profiles despite a model fingerprint mismatch.")] = False,
) -> None:
    """Every profile and the HF peers side by side: speed, τ, acceptance, memory, identical output.

    HF greedy and skipsearch's own autoregressive loop always run. A method whose output differs from
    HF greedy gets no speedup and a warning on stderr; the exit code stays 0 (the report is the result).
    """
    import dataclasses as dc
    import shlex

    import torch
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from skipsearch import bench as bn
    from skipsearch import bench_report as br
    from skipsearch.models import load_model
    from skipsearch.profile import check_model, save_profile

    _warnings_to_stderr()
    with user_errors():
        # 1. everything that can be wrong with the input fails here, before the model loads
        paths = _profile_paths([*(profiles or []), *(more_profiles or [])])
        profs = [(p, load_profile(p)) for p in paths]
        names = {prof.model.name for _, prof in profs}
        if len(names) > 1 or (model is not None and names and model not in names):
            raise ModelError(f"the profiles are for {', '.join(sorted(names))}; bench one model at a time")
        peer_list = list(dict.fromkeys(p.strip() for p in peers.split(",") if p.strip()))
        for p in peer_list:
            if p not in bn.PEERS:
                raise ConfigError(f"unknown peer '{p}': use {', '.join(bn.PEERS)}")
        prompts = load_prompts(dataset, split=split, n=n_prompts, seed=seed)
        sweeping = sweep_prompts > 0 and any(bn.PEERS[p].option for p in peer_list)
        sweep_set = load_prompts(dataset, split="calib", n=sweep_prompts, seed=seed) if sweeping else ()
        name = model or (names.pop() if names else "smollm2-135m")
        dtype = dtype or (profs[0][1].model.dtype if profs else "float32")
        if threads:
            torch.set_num_threads(threads)
        sm = load_model(name, device=device, dtype=dtype)
        for path, prof in profs:
            check_model(prof, num_layers=sm.num_layers, fingerprint=sm.fingerprint, force=force, source=path)
        # 2. the run, with a progress bar per stage on stderr
        err = Console(stderr=True)
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TextColumn("{task.fields[last]}"), TimeElapsedColumn(), console=err) as progress:
            task = [None]

            def on_stage(title: str, total: int) -> None:
                task[0] = progress.add_task(title, total=total, last="")

            def on_progress(done: int, total: int, what: str) -> None:
                progress.update(task[0], completed=done, last=what)

            result = bn.bench(
                sm, prompts, profiles=profs, peers=peer_list, max_new_tokens=max_new_tokens, repeats=repeats,
                sweep_prompts=sweep_set, sweep=sweep_prompts > 0, dataset=dataset, split=split,
                on_stage=on_stage, on_progress=on_progress,
            )
    # 3. print and write at the edge
    command = ["skipsearch", "bench", "--model", name]
    if paths:
        command += ["--profiles", ",".join(paths)]
    command += ["--peers", ",".join(peer_list), "--dataset", dataset, "--split", split, "--n-prompts", str(n_prompts),
                "--max-new-tokens", str(max_new_tokens), "--repeats", str(repeats), "--sweep-prompts",
                str(sweep_prompts), "--seed", str(seed), "--device", device, "--dtype", dtype]
    command += ["--threads", str(threads)] if threads else []
    command += ["--report", str(report)] if report else []
    command += ["--json", str(as_json)] if as_json else []
    out = Console(width=None if sys.stdout.isatty() else 200)  # piped: wide enough not to wrap the table
    for table in br.rich_tables(result, by_category=by_category):
        out.print(table)
    for line in br.summary_lines(result):
        typer.echo(line)
    if report:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(br.render_markdown(result, command=shlex.join(command)))
        typer.echo(f"wrote {report}")
    if as_json:
        as_json.parent.mkdir(parents=True, exist_ok=True)
        as_json.write_text(br.report_json(result))
        typer.echo(f"wrote {as_json}")
    if write_measured:
        rows = {r.setting: r for r in result.rows if r.family == "skipsearch"}
        for path, prof in profs:
            row = rows[path]
            if row.flagged:
                typer.echo(f"warning: {path}: output differs from hf-greedy; its measured block is left as it was",
                           err=True)
                continue
            save_profile(dc.replace(prof, measured=br.measured_for(result, row, prof.measured)), path)
            typer.echo(f"updated the measured block of {path}")
    for row in result.rows:
        if row.flagged:
            typer.echo(f"warning: {row.method} output differs from hf-greedy ({row.first_mismatch})", err=True)


@app.command()
def plan(
    alpha: Annotated[float | None, typer.Option(help="Analysis: M_q tokens' acceptance by M_p, in [0, 1].")] = None,
    beta: Annotated[float | None, typer.Option(help="Analysis: M_s tokens' acceptance by M_q, in [0, 1].")] = None,
    c: Annotated[float | None, typer.Option("--c", help="Analysis: one M_q step / one M_p step.")] = None,
    cs: Annotated[float | None, typer.Option("--cs", help="Analysis: one M_s step / one M_q step.")] = None,
    verify: Annotated[
        str | None, typer.Option(help="Analysis: v(1),v(2),...: a k-token forward / one step (default: free).")
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model (default: the --medium profile's).")] = None,
    medium: Annotated[str | None, typer.Option(help="Profile whose draft skip sets are M_q.")] = None,
    small: Annotated[str | None, typer.Option(help="Profile whose draft skip sets are M_s.")] = None,
    dataset: Annotated[str, typer.Option(help="Calibration prompts: mtbench, humaneval, a file, hf:...")] = "mtbench",
    n_prompts: Annotated[int, typer.Option(min=1, help="Calibration prompts (calib split).")] = 4,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Tokens decoded per prompt.")] = 64,
    max_m: Annotated[int, typer.Option(help="Largest m (medium tokens per cycle) planned.")] = 8,
    max_n: Annotated[int, typer.Option(help="Largest n (small tokens per medium token) planned.")] = 4,
    validate: Annotated[bool, typer.Option(help="Decode the best three- and two-level pairs and time them.")] = False,
    repeats: Annotated[int, typer.Option(min=1, help="Timed runs per prompt when validating (median).")] = 1,
    seed: Annotated[int, typer.Option()] = 0,
    device: Annotated[str, typer.Option()] = "cpu",
    dtype: Annotated[str, typer.Option()] = "float32",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
    plot: Annotated[Path | None, typer.Option(help="Draw predicted speedup over (m, n) to this PNG.")] = None,
    out: Annotated[Path | None, typer.Option(help="Write a hierarchical profile of the chosen (m, n).")] = None,
    report: Annotated[Path | None, typer.Option(help="Write the run as Markdown, e.g. studies/hier-x.md.")] = None,
) -> None:
    """Plan hierarchical speculative decoding: predicted speedup over (m, n), from given or measured inputs."""
    from skipsearch import plan as planner

    _warnings_to_stderr()
    with user_errors():
        given = {"--alpha": alpha, "--beta": beta, "--c": c, "--cs": cs}
        if any(v is not None for v in given.values()) or verify is not None:
            if medium or small or model or validate or out:
                raise ConfigError("give either --alpha --beta --c --cs (analysis) or --medium and --small (measured)")
            missing = [k for k, v in given.items() if v is None]
            if missing:
                raise ConfigError(f"analysis needs {', '.join(missing)} as well")
            inputs = planner.PlanInputs(alpha, beta, c, cs, verify=planner.parse_curve(verify or ""))
            result = planner.plan_table(inputs, max_m=max_m, max_n=max_n)
            text, data = planner.format_plan(result), result.to_dict()
            body = f"# Hierarchical planner, given inputs\n\n{text}\n"
        else:
            from skipsearch import hierplan

            if medium is None or small is None:
                raise ConfigError("give --alpha --beta --c --cs (analysis) or both --medium and --small (measured)")
            rep, sm = hierplan.plan_from_profiles(
                medium, small, model=model, dataset=dataset, n_prompts=n_prompts, max_new_tokens=max_new_tokens,
                max_m=max_m, max_n=max_n, run_validation=validate, repeats=repeats, seed=seed, device=device,
                dtype=dtype, on_stage=lambda msg: typer.echo(msg, err=True),
            )
            result, data = rep.plan, rep.to_dict()
            text = body = hierplan.render_markdown(rep, num_layers=sm.num_layers,
                                                   command=" ".join(["skipsearch", *sys.argv[1:]]))
            if out:
                from skipsearch.profile import save_profile

                save_profile(hierplan.build_profile(rep, sm, rep.chosen()), out)
        if plot:
            planner.plot_plan(result, str(plot))
        if report:
            planner.write_text(report, body)
    typer.echo(json.dumps(data) if as_json else text)
    for path, what in ((plot, "plot"), (report, "report"), (out, "profile")):
        if path:
            typer.echo(f"wrote {what} {path}", err=True)


@study_app.command("show")
def study_show(
    study: Annotated[str | None, typer.Argument(help="Study directory.")] = None,
    storage: Annotated[str | None, typer.Option(help="Optuna RDB URL instead of a directory.")] = None,
    study_name: Annotated[str | None, typer.Option()] = None,
    top: Annotated[int, typer.Option(help="Rows to list, best first.")] = 10,
) -> None:
    """Trials, best so far, and status of a study."""
    import optuna
    from rich.console import Console
    from rich.table import Table

    from skipsearch.optimize import config_summary
    from skipsearch.study import load_records

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with user_errors():
        info, recs = load_records(study_dir=study, storage=storage, study_name=study_name)
    states: dict[str, int] = {}
    for r in recs:
        states[r.state] = states.get(r.state, 0) + 1
    typer.echo(f"study {info}: {len(recs)} trials (" + ", ".join(f"{v} {k.lower()}" for k, v in states.items()) + ")")
    table = Table("#", "kind", "speedup", "predicted", "tau", "accept", "config")
    done = [r for r in recs if r.measurement is not None]
    for r in sorted(done, key=lambda r: (r.measurement.kind != "timed", -r.measurement.speedup))[:top]:
        m = r.measurement
        table.add_row(
            str(r.number), m.kind, f"{m.speedup:.3f}x", f"{m.predicted_speedup or 0:.3f}x", f"{m.tau or 0:.2f}",
            "-" if m.acceptance_rate is None else f"{m.acceptance_rate:.2f}", config_summary(r.config),
        )
    Console().print(table)
    for r in recs:
        if r.error:
            typer.echo(f"trial {r.number} failed: {r.error}")


def main() -> None:  # pragma: no cover - console entry for `python -m skipsearch`
    app()
