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
from skipsearch.profile import ProfileError, load_profile
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
                typer.echo(
                    f"\n[{s.new_tokens} tokens, {s.seconds:.2f}s, {s.tokens_per_s:.1f} tok/s, "
                    f"tau {s.tau:.2f}, acceptance {acc}]",
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
    strategy: Annotated[str, typer.Option(help="Search strategy: tpe, bayes, or fractal (an (n, w) grid).")] = "tpe",
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
        from skipsearch.strategies import REGISTRY

        if strategy not in REGISTRY:
            raise ConfigError(f"unknown strategy '{strategy}': use {', '.join(sorted(REGISTRY))}")
        if storage is None and study is None:
            study = f"studies/{Path(model).name}-{strategy}"
        load_prompts(dataset, split="calib", n=n_prompts, seed=seed)  # fail on bad data before the model loads
        sm = load_model(model, device=device, dtype=dtype)
        space = SearchSpace(
            num_layers=sm.num_layers, max_draft_tokens=tuple(k for k in (1, 2, 3, 4, 6, 8, 12) if k <= max_k),
            protect_ends=protect_ends, max_skip_ratio=max_skip_ratio,
        )
        settings = opt.OptimizeSettings(
            strategy=strategy, budget=budget, dataset=dataset, n_prompts=n_prompts, max_new_tokens=max_new_tokens,
            objective=objective, shortlist=shortlist, seed=seed, repeats=repeats, space=space, study_dir=study,
            storage=storage, study_name=study_name,
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
