"""The ``skipsearch`` command: a thin typer layer over library functions that return data.

Every known kind of bad input (profile, model, data, config, storage) ends as one line on
stderr and exit code 2, with no traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import sys
import warnings
from pathlib import Path
from typing import Annotated

import typer
import typer.core

from skipsearch.config import ConfigError, SamplingParams, int_list
from skipsearch.data import DataError, Prompt, load_prompts
from skipsearch.files.errors import ProfileError
from skipsearch.models import ModelError
from skipsearch.profile import load_profile, save_profile
from skipsearch.study import StudyError


class _OneLineErrors(typer.core.TyperGroup):
    """Typer's own option errors (``--max-new-tokens 0``, an unknown flag) as one ``error:`` line and
    exit 2, like every other kind of bad input, instead of a usage panel."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.Abort:  # Ctrl-C outside a command's own handler
            typer.echo("interrupted", err=True)
            code = 130
        except typer.TyperException as exc:  # typer's usage errors: a bad value, an unknown option
            message = exc.format_message()
            if type(exc).__name__ == "NoArgsIsHelpError":  # `skipsearch profile` alone: its help, as asked
                typer.echo(message)
                code = 0
            else:
                typer.echo(f"error: {' '.join(message.split())}", err=True)
                code = 2
        if not standalone_mode:
            return code
        sys.exit(code or 0)


app = typer.Typer(
    cls=_OneLineErrors,
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


class _CurrentStderr(logging.Handler):
    """A log line to whatever sys.stderr is when it is logged (a StreamHandler keeps the stream it was made with,
    which a second in-process run, e.g. typer's CliRunner, may have closed since)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 - logging must never fail a run
            self.handleError(record)


def _warnings_to_stderr() -> None:
    # Library warnings (e.g. a forced fingerprint mismatch) as one plain line each, and skipsearch's own
    # informational lines (where a model is placed, and why) likewise.
    warnings.showwarning = lambda msg, cat, *a, **k: typer.echo(f"warning: {msg}", err=True)
    log = logging.getLogger("skipsearch")
    if not any(getattr(h, "skipsearch_cli", False) for h in log.handlers):
        handler = _CurrentStderr()
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.skipsearch_cli = True
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def _read_prompts_file(path: Path, chat_default: bool) -> tuple[Prompt, ...]:
    """Prompts from JSONL, one {"prompt": str, "chat": bool} object a line. A value of the wrong type
    is refused, naming the file and line, never coerced: null is not the text "None", "false" is not true."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read prompts file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    prompts = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{no}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: not valid JSON ({exc.msg})") from None
        except RecursionError:
            raise DataError(f"{where}: not valid JSON (nested too deeply)") from None
        if not isinstance(row, dict):
            raise DataError(f'{where}: each line must be a JSON object like {{"prompt": "...", "chat": false}}, '
                            f"got {_json_short(row)}")
        text, chat = row.get("prompt"), row.get("chat")
        if not isinstance(text, str):
            if "prompt" not in row:
                raise DataError(f'{where}: no "prompt" key')
            raise DataError(f'{where}: "prompt" must be a string, got {_json_short(text)}')
        if not text:
            raise DataError(f'{where}: "prompt" is empty')
        if chat is not None and not isinstance(chat, bool):  # null, like a missing key, means the default
            raise DataError(f'{where}: "chat" must be true or false, got {_json_short(chat)}')
        prompts.append(Prompt(str(no), text, chat_default if chat is None else chat, "", str(path)))
    if not prompts:
        raise DataError(f"{path} holds no prompts")
    return tuple(prompts)


def _json_short(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


class _LazyProgress:
    """A rich progress bar that opens at the library's first report (``stage``), so that nothing is drawn while
    the input is checked and the model loads, and closes with the ``with`` block."""

    def __init__(self, *columns, **kwargs) -> None:
        self._columns, self._kwargs = columns, kwargs
        self.progress = None  # rich.progress.Progress, once a stage has opened
        self.task = None  # the last stage's task

    def stage(self, title: str, total: int | None, **fields):
        if self.progress is None:
            from rich.progress import Progress

            self.progress = Progress(*self._columns, **self._kwargs)
            self.progress.start()
        self.task = self.progress.add_task(title, total=total, **fields)
        return self.task

    def update(self, task, **changes) -> None:
        self.progress.update(task, **changes)

    def __enter__(self) -> _LazyProgress:
        return self

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.stop()


def _write_text(path: Path, text: str) -> None:
    """Write a report atomically (a temporary file beside it, renamed over it): a failed write leaves no empty
    or half-written file. An unwritable path is one line (ConfigError)."""
    import os
    import tempfile

    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise ConfigError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def _save_profile_kept(profile, path: Path, *, keep_in: str | Path | None = None) -> Path:
    """save_profile, where a write error (a full disk, a read-only folder) never loses a profile that took a
    search to make: it is written to ``keep_in`` (the study directory) or the temporary folder instead, and the
    one-line error says where (exit 2)."""
    import tempfile

    try:
        return save_profile(profile, path)
    except OSError as e:
        reason = e.strerror or str(e) or type(e).__name__
    kept = None
    for place in [*([Path(keep_in)] if keep_in else []), Path(tempfile.gettempdir())]:
        try:
            kept = save_profile(profile, place / f"{path.stem}.unsaved{path.suffix or '.yaml'}")
            break
        except OSError:
            continue
    where = (f"the profile was written to {kept} instead" if kept else
             "it could not be written anywhere: free some space and run the same command again (the study keeps "
             "every trial)")
    raise ConfigError(f"cannot write {path}: {reason}; {where}")


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
    device: Annotated[str, typer.Option(help="auto (CUDA if available, spread over several GPUs; else cpu), cpu, "
                                             "cuda, cuda:N.")] = "auto",
    dtype: Annotated[str, typer.Option(help="auto (float32 on CPU; on GPU the profile's, else the checkpoint's), "
                                            "float32, bfloat16, float16.")] = "auto",
    force: Annotated[bool, typer.Option(help="Use a profile despite a model fingerprint mismatch.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per prompt on stdout.")] = False,
    check: Annotated[bool, typer.Option("--check", help="Greedy only: also decode with HF greedy and print each "
                                                        "output's verdict (identical, equal up to numerical ties, "
                                                        "different) on stderr; with --json, as \"check\".")] = False,
) -> None:
    """Decode with a draft profile (lossless), or plainly with --model."""
    from skipsearch import api

    _warnings_to_stderr()
    with user_errors():
        if (prompt is None) == (prompts_file is None):
            raise DataError("give exactly one of --prompt or --prompts-file")
        if prompt == "":
            raise DataError("--prompt is empty: give the text to continue")
        sampling = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
        if check and not sampling.greedy:
            raise ConfigError("--check compares greedy output with HF greedy: leave --temperature at 0")
        # 1. all the input is checked before the model loads: a typo costs milliseconds
        prompts = (
            _read_prompts_file(prompts_file, chat) if prompts_file else (Prompt("", prompt, chat, "", "--prompt"),)
        )
        api.check_model_arg(model)
        sm, prof = api.open_model(model=model, profile=profile, device=device, dtype=dtype, force=force)
        drafters = api.drafter_factory(prof, sm)

        def show(_: int, text: str) -> None:
            sys.stdout.write(text)
            sys.stdout.flush()

        # 2. every prompt is encoded and checked against the context here, before the first decodes
        results = api.decode_prompts(
            sm, prompts, drafters=drafters, sampling=sampling, max_new_tokens=max_new_tokens, seed=seed,
            on_text=None if as_json else show,
        )
        # the input is all checked: now, before any output, a profile measured elsewhere says so
        note = api.profile_hardware_note(prof, sm.device, source=profile)
        if note:  # a warning, never a refusal: the output is lossless anywhere, only the speed may differ
            typer.echo(f"warning: {note}", err=True)
        # 3. each result is written (and flushed) as soon as its prompt is done: Ctrl-C or a failure
        # later keeps every finished one
        for d in results:
            verdict = _check_decoded(sm, d, max_new_tokens) if check else None
            if as_json:
                row = {
                    "prompt": d.prompt.text,
                    "prompt_token_ids": list(d.prompt_token_ids),
                    "token_ids": list(d.result.token_ids),
                    "text": d.text,
                    "stats": dataclasses.asdict(d.result.stats),
                    **({"check": verdict.to_dict()} if verdict is not None else {}),
                }
                typer.echo(json.dumps(row))  # click's echo flushes
            else:
                s = d.result.stats
                acc = "-" if s.acceptance_rate is None else f"{s.acceptance_rate:.2f}"
                own = "".join(f", {k} {v:.3g}" for k, v in s.drafter_stats)  # the method's own figures
                typer.echo(
                    f"\n[{s.new_tokens} tokens, {s.seconds:.2f}s, {s.tokens_per_s:.1f} tok/s, "
                    f"tau {s.tau:.2f}, acceptance {acc}{own}]",
                    err=True,
                )
            if verdict is not None:
                typer.echo(f"[check: {verdict.describe()}]", err=True)


def _check_decoded(sm, decoded, max_new_tokens: int):
    """``decode --check``: the output against HF greedy's, judged by skipsearch.equivalence."""
    from skipsearch.equivalence import check_against_hf

    return check_against_hf(sm, decoded.prompt_token_ids, decoded.result.token_ids, max_new_tokens=max_new_tokens)


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
    strategy: Annotated[str, typer.Option(
        help="Search strategy: tpe, bayes, clasp, fractal, ngram or hybrid (`skipsearch methods` says which searches "
             "what).")
    ] = "tpe",
    budget: Annotated[int, typer.Option(help="Trials in the study (over all workers and resumed runs).")]
    = 100,
    dataset: Annotated[str, typer.Option(help="Calibration prompts: mtbench, humaneval, a file, hf:...")] = "mtbench",
    n_prompts: Annotated[int, typer.Option(help="Calibration prompts (calib split).")] = 8,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens decoded per calibration prompt.")] = 64,
    objective: Annotated[str, typer.Option(
        help="auto (two-stage where the method has a surrogate, else timed), two-stage (surrogate, then time a "
             "shortlist), surrogate, timed.")] = "auto",
    shortlist: Annotated[int, typer.Option(help="Candidates timed after a surrogate search.")] = 5,
    repeats: Annotated[int, typer.Option(help="Timed runs per prompt (median).")] = 1,
    max_k: Annotated[int, typer.Option(help="Largest max_draft_tokens searched.")] = 8,
    max_skip_ratio: Annotated[float, typer.Option(help="Most of the 2L sublayers a draft may skip.")] = 0.5,
    protect_ends: Annotated[bool, typer.Option(help="Never skip the first or last layer.")] = True,
    study: Annotated[
        str | None, typer.Option(help="Study directory (SQLite inside); default studies/<model>-<strategy>.")
    ] = None,
    storage: Annotated[str | None, typer.Option(help="Optuna RDB URL shared by workers, e.g. postgresql://...")] = None,
    study_name: Annotated[str | None, typer.Option(help="Study name inside --storage.")] = None,
    out: Annotated[Path | None, typer.Option(help="Profile to write (default <study>/best.yaml).")] = None,
    force: Annotated[bool, typer.Option(help="Overwrite --out even if it is not a skipsearch profile.")] = False,
    warm_start: Annotated[
        list[str] | None, typer.Option(help="A profile whose draft config is tried first (repeatable), e.g. CLaSp's.")
    ] = None,
    clasp_loi: Annotated[
        int | None, typer.Option(min=1, help="clasp: the LOI of the <out>-dynamic.yaml profile it also writes (8).")
    ] = None,
    seed: Annotated[int, typer.Option()] = 0,
    device: Annotated[str, typer.Option(help="auto (CUDA if available, else cpu), cpu, cuda, cuda:N.")] = "auto",
    dtype: Annotated[str, typer.Option(help="auto (the checkpoint's on GPU, float32 on CPU), float32, bfloat16, "
                                            "float16.")] = "auto",
    n: Annotated[str | None, typer.Option("--n", help="fractal: fractal layer counts, e.g. 3,5,7; ngram and hybrid: "
                                                      "suffix lengths looked up, e.g. 1,2,3,4.")] = None,
    w: Annotated[str | None, typer.Option("--w", help="fractal: draft windows to try, e.g. 3,5,7.")] = None,
    quantization: Annotated[
        str | None, typer.Option(help="fractal: auto, int8-dynamic, int8-weight-only, bnb-int8, none.")
    ] = None,
    vocab_sizes: Annotated[str | None, typer.Option(
        help="hybrid, precision: trimmed draft heads to try, V' most frequent tokens, 0 = the full head; "
             "e.g. 0,8192,16384.")
    ] = None,
    schemes: Annotated[str | None, typer.Option(
        help="precision: weight formats of the draft's copy, e.g. fp16,int8,int4 (CPU) or int8,int4,fp8 (CUDA).")
    ] = None,
    costs: Annotated[str | None, typer.Option(
        help="With --budget 0: re-rank the study's evaluated configs under this cost file (skipsearch costs), "
             "no new trials.")] = None,
    time_shortlist: Annotated[bool, typer.Option(
        help="With --costs: time the --shortlist best re-ranked configs here, against plain decoding.")] = False,
) -> None:
    """Search draft candidates with a timed objective and write the best as a profile."""
    import optuna

    from skipsearch import api

    _warnings_to_stderr()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with user_errors():
        # 1. the options: which job (a search, or re-ranking a study: --budget 0 --costs), and their values
        rerank = costs is not None or budget == 0
        if rerank and (costs is None or budget != 0):
            raise ConfigError("--budget must be >= 1, got 0 (--budget 0 re-ranks a study and needs --costs)"
                              if costs is None else
                              "--costs re-ranks the study's evaluated configs without new trials: give --budget 0")
        counts = (("--n-prompts", n_prompts), ("--max-new-tokens", max_new_tokens), ("--shortlist", shortlist),
                  ("--repeats", repeats))
        _at_least_one(counts if rerank else (("--budget", budget), *counts, ("--max-k", max_k)))
        given = {} if rerank else {
            "n_values": ("--n", n and int_list(n, "--n")), "w_values": ("--w", w and int_list(w, "--w")),
            "quantization": ("--quantization", quantization), "loi": ("--clasp-loi", clasp_loi),
            "vocab_sizes": ("--vocab-sizes", vocab_sizes and int_list(vocab_sizes, "--vocab-sizes")),
            "schemes": ("--schemes", schemes and tuple(x.strip() for x in schemes.split(",") if x.strip()))}
        options = api.SearchOptions(
            model=model, strategy=strategy, budget=budget, dataset=dataset, n_prompts=n_prompts,
            max_new_tokens=max_new_tokens, objective=objective, shortlist=shortlist, repeats=repeats, max_k=max_k,
            max_skip_ratio=max_skip_ratio, protect_ends=protect_ends, study=study, storage=storage,
            study_name=study_name, out=out, force=force, warm_start=tuple(warm_start or ()), seed=seed, device=device,
            dtype=dtype, costs=costs, time_shortlist=time_shortlist,
            strategy_options=tuple((key, value) for key, (_, value) in given.items() if value is not None),
            option_names=tuple((key, flag) for key, (flag, _) in given.items()),
        )
        if rerank:
            return _print_reranked(_rerank(options), costs=costs, shortlist=shortlist)
        _print_searched(_search(options))


def _search(options):
    """``optimize``'s search: ``api.optimize_study`` with its progress bar, opened once the model is loaded."""
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from skipsearch import api

    budget = options.budget
    with _LazyProgress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                       TextColumn("best {task.fields[best]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                       transient=False, console=None) as bar:

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

        return api.optimize_study(options, on_trial=on_trial, on_stage=on_stage)


def _print_searched(run) -> None:
    """Write the search's profile (and its companions) and print what was timed (inside user_errors)."""
    from skipsearch.optimize import candidate_summary

    result, path = run.result, run.path
    for conflict in result.summary.conflicts[:1]:  # one line: the study keeps the rest
        more = len(result.summary.conflicts) - 1
        typer.echo(f"warning: survived {len(result.summary.conflicts)} storage conflict(s) with other workers "
                   f"(first: {conflict}){f'; {more} more' if more else ''}", err=True)
    _save_profile_kept(result.profile, path, keep_in=run.study)
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
        _save_profile_kept(companion, beside, keep_in=run.study)
        typer.echo(f"wrote {beside}")
    if result.interrupted:
        typer.echo("interrupted: the study keeps every finished trial; run the same command to resume", err=True)
        raise typer.Exit(130)


def _at_least_one(values) -> None:
    """Integer options that must be >= 1, as (flag, value) pairs: the first that is not is a one-line error."""
    for flag, value in values:
        if value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")


def _rerank(options):
    """``optimize --budget 0 --costs C``: ``api.rerank_study`` with its progress bars and its hardware note."""
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

    from skipsearch import api

    with _LazyProgress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                       TimeElapsedColumn()) as bar:
        return api.rerank_study(options, on_stage=bar.stage,
                                on_progress=lambda done, total: bar.update(bar.task, completed=done, total=total),
                                on_note=lambda note: typer.echo(f"warning: {note}", err=True))


def _print_reranked(rr, *, costs: str, shortlist: int) -> None:
    """Write the re-ranked study's profile and print its table (inside user_errors)."""
    from skipsearch.optimize import config_summary

    _save_profile_kept(rr.profile, rr.path, keep_in=rr.study)
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
    peers: Annotated[str, typer.Option(help="HF peers: hf-greedy (always run), hf-prompt-lookup, hf-early-exit, "
                                            "hf-assisted-quantized, hf-generate+profile (each profile inside HF "
                                            "generate).")]
    = "hf-greedy,hf-prompt-lookup,hf-early-exit,hf-assisted-quantized",
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
    device: Annotated[str, typer.Option(help="auto (CUDA if available, spread over several GPUs; else cpu), cpu, "
                                             "cuda, cuda:N.")] = "auto",
    dtype: Annotated[str, typer.Option(help="auto (the checkpoint's on GPU, float32 on CPU), float32, bfloat16, "
                                            "float16.")] = "auto",
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
    from rich.console import Console
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

    from skipsearch import api

    _warnings_to_stderr()
    options = api.BenchOptions(
        profiles=(*(profiles or []), *(more_profiles or [])), model=model, peers=peers, dataset=dataset, split=split,
        n_prompts=n_prompts, max_new_tokens=max_new_tokens, repeats=repeats, sweep_prompts=sweep_prompts, seed=seed,
        device=device, dtype=dtype, threads=threads, report=report, as_json=as_json, write_measured=write_measured,
        force=force,
    )
    with user_errors():
        # 1. the input is checked before the model loads; 2. the run, with a progress bar per stage on stderr
        with _LazyProgress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                           TextColumn("{task.fields[last]}"), TimeElapsedColumn(), console=Console(stderr=True)) as bar:
            run = api.bench_profiles(
                options, on_stage=lambda title, total: bar.stage(title, total, last=""),
                on_progress=lambda done, _total, what: bar.update(bar.task, completed=done, last=what),
                on_note=lambda note: typer.echo(f"warning: {note}", err=True),
            )
    # 3. print and write at the edge
    _print_bench(run, by_category=by_category, report=report, as_json=as_json, write_measured=write_measured)


def _print_bench(run, *, by_category: bool, report: Path | None, as_json: Path | None, write_measured: bool) -> None:
    """The bench's tables and summary; its reports and measured blocks written; a line per flagged or tied row."""
    import shlex

    from rich.console import Console

    from skipsearch import bench_report as br

    result = run.report
    out = Console(width=None if sys.stdout.isatty() else 200)  # piped: wide enough not to wrap the table
    for table in br.rich_tables(result, by_category=by_category):
        out.print(table)
    for line in br.summary_lines(result):
        typer.echo(line)
    with user_errors():
        if report:
            _write_text(report, br.render_markdown(result, command=shlex.join(run.command)))
            typer.echo(f"wrote {report}")
        if as_json:
            _write_text(as_json, br.report_json(result))
            typer.echo(f"wrote {as_json}")
    if write_measured:
        from skipsearch.profile import save_profile

        for path, updated in br.measured_updates(result, run.profiles):
            if updated is None:
                typer.echo(f"warning: {path}: output differs from hf-greedy; its measured block is left as it was",
                           err=True)
                continue
            save_profile(updated, path)
            typer.echo(f"updated the measured block of {path}")
    for row in result.rows:
        if row.flagged:
            typer.echo(f"warning: {row.method} output differs from hf-greedy ({row.first_mismatch})", err=True)
        elif row.ties:
            typer.echo(f"note: {row.method} output equals hf-greedy up to numerical ties on {row.ties} of "
                       f"{row.prompts} prompts ({row.tie_tokens} tied tokens; identical on {row.identical})", err=True)


@app.command("costs")
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

    _warnings_to_stderr()
    with user_errors():
        if out:
            check_profile_target(out, force=force)
        load_prompts(dataset, split="calib", n=1, seed=seed)
        scheme_names = tuple(x.strip() for x in (schemes or "").split(",") if x.strip())
        if schemes is not None and not scheme_names:
            raise ConfigError("--schemes must name draft schemes, e.g. fp16,int8 or int8-dynamic")
        for name in scheme_names:  # an unknown scheme fails before the model loads
            methods.scheme_method(name)
        if threads:
            torch.set_num_threads(threads)
        sm = load_model(model, device=device, dtype=dtype)
        path = out or Path("costs") / f"{sm.device.type}-{sm.dtype_name}.yaml"
        if not out:
            check_profile_target(path, force=force)
        typer.echo(f"timing {sm.name} on {sm.device} ({sm.dtype_name}, {torch.get_num_threads()} thread(s))", err=True)
        context = calibration_context(sm, dataset=dataset, max_new_tokens=max_new_tokens, seed=seed)
        cp = measure_cost_profile(sm, context, repeats=repeats, command=shlex.join(["skipsearch", *sys.argv[1:]]))
        if scheme_names:
            from dataclasses import replace

            from skipsearch.files.costs import SchemeCosts

            measured = tuple(SchemeCosts(m.scheme, m.attn_seconds, m.mlp_seconds, m.head_saving_seconds)
                             for m in methods.measure_scheme_costs(sm, context, scheme_names, repeats=repeats))
            cp = replace(cp, costs=replace(cp.costs, schemes=measured))
        save_costs(cp, path)
    typer.echo(cp.describe())
    typer.echo(f"wrote {path} ({cp.run.seconds:.1f} s)")


@app.command()
def plan(
    alpha: Annotated[float | None, typer.Option(help="Analysis: M_q tokens' acceptance by M_p, in [0, 1].")] = None,
    beta: Annotated[float | None, typer.Option(help="Analysis: M_s tokens' acceptance by M_q, in [0, 1].")] = None,
    c: Annotated[float | None, typer.Option("--c", help="Analysis: one M_q step / one M_p step.")] = None,
    cs: Annotated[float | None, typer.Option("--cs", help="Analysis: one M_s step / one M_q step.")] = None,
    verify: Annotated[
        str | None, typer.Option(help="Analysis: v(1),v(2),...: a k-token forward / one step (default: free).")
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model (default: the --medium profile's; smollm2-135m with "
                                                   "--study).")] = None,
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
    dataset: Annotated[str, typer.Option(help="Calibration prompts: mtbench, humaneval, a file, hf:...")] = "mtbench",
    n_prompts: Annotated[int, typer.Option(min=1, help="Calibration prompts (calib split).")] = 4,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Tokens decoded per prompt.")] = 64,
    max_m: Annotated[int, typer.Option(help="Largest m (medium tokens per cycle) planned.")] = 8,
    max_n: Annotated[int, typer.Option(help="Largest n (small tokens per medium token) planned.")] = 4,
    validate: Annotated[bool | None, typer.Option(
        "--validate/--no-validate",
        help="Decode the best three- and two-level pairs and time them (default: with --study only).")] = None,
    repeats: Annotated[int, typer.Option(min=1, help="Timed runs per prompt when validating (median).")] = 1,
    seed: Annotated[int, typer.Option()] = 0,
    device: Annotated[str, typer.Option(help="auto (CUDA if available, spread over several GPUs; else cpu), cpu, "
                                             "cuda, cuda:N.")] = "auto",
    dtype: Annotated[str, typer.Option(help="auto (the checkpoint's on GPU, float32 on CPU), float32, bfloat16, "
                                            "float16.")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
    plot: Annotated[Path | None, typer.Option(help="Draw predicted speedup over (m, n) to this PNG.")] = None,
    out: Annotated[Path | None, typer.Option(help="Write a hierarchical profile of the chosen (m, n).")] = None,
    force: Annotated[bool, typer.Option(help="Overwrite --out even if it is not a skipsearch profile.")] = False,
    report: Annotated[Path | None, typer.Option(help="Write the run as Markdown, e.g. studies/hier-x.md.")] = None,
) -> None:
    """Plan hierarchical speculative decoding: predicted speedup over (m, n), from given or measured inputs."""
    from skipsearch import api
    from skipsearch import hier_closed_form as planner
    from skipsearch.profile import check_profile_target

    _warnings_to_stderr()
    say = lambda msg: typer.echo(msg, err=True)  # noqa: E731
    command = " ".join(["skipsearch", *sys.argv[1:]])
    with user_errors():
        # 1. where the results go is checked first, so that a bad path fails before the measuring does; then
        # which of the four modes the flags ask for
        for path in (plot, report):
            if path:
                check_profile_target(path, force=True)  # any writable file will do: not a profile
        mode = _plan_mode(alpha=alpha, beta=beta, c=c, cs=cs, verify=verify, model=model, medium=medium, small=small,
                          profile=profile, study=study, costs=costs, validate=validate, out=out, plot=plot)
        if out and mode != "analysis":
            check_profile_target(out, force=force)
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
            _save_profile_kept(outcome.profile, out)
        if plot:
            planner.plot_plan(outcome.plan, str(plot))
        if report:
            _write_text(report, outcome.body)
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

    from skipsearch.study import STUDY_COLUMNS, load_records, study_table

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with user_errors():
        if top < 0:
            raise StudyError(f"--top must be >= 0, got {top}")
        info, recs = load_records(study_dir=study, storage=storage, study_name=study_name)
    states: dict[str, int] = {}
    for r in recs:
        states[r.state] = states.get(r.state, 0) + 1
    typer.echo(f"study {info}: {len(recs)} trials (" + ", ".join(f"{v} {k.lower()}" for k, v in states.items()) + ")")
    table = Table(*STUDY_COLUMNS)
    for row in study_table(recs, top=top):
        table.add_row(*row)
    Console().print(table)
    for r in recs:
        if r.error:
            typer.echo(f"trial {r.number} failed: {r.error}")


@app.command("export")
def export_command(
    profile: Annotated[str, typer.Option(help="The draft profile to export.")],
    engine: Annotated[str, typer.Option(help="hf (transformers' generate), vllm, sglang or llama.cpp.")],
    out: Annotated[Path, typer.Option(help="The export directory (replaced whole; its manifest is export.yaml).")],
    costs: Annotated[str | None, typer.Option(help="Re-plan K for this cost file (the target's) first.")] = None,
    nearest: Annotated[bool, typer.Option(help="Write the nearest setting the engine runs where it cannot express "
                                               "the profile (otherwise: one line, exit 2).")] = False,
    force: Annotated[bool, typer.Option(help="Replace a directory that holds no export.")] = False,
) -> None:
    """The profile as the engine's own configuration, with a manifest naming the profile, model, hardware and
    speedup it came from."""
    from skipsearch.api.export import export_profile

    with user_errors():
        done = export_profile(profile, engine=engine, out=out, costs=costs, nearest=nearest, force=force)
    if done.nearest:
        typer.echo(f"note: {done.nearest}; written", err=True)
    speed = f"{done.speedup.value:.2f}x" if done.speedup.value is not None else "no figure"
    typer.echo(f"{done.engine}: {done.setting} ({done.speedup.kind} {speed}, {done.speedup.source})")
    typer.echo(f"wrote {done.out}: {', '.join(done.manifest['files'])}")
    typer.echo(f"use: {done.written.usage.strip()}")


@app.command("methods")
def methods_command() -> None:
    """The draft methods a profile can name, and the strategy that searches each."""
    from skipsearch import methods

    for name in methods.names():
        m = methods.get(name)
        search = f"--strategy {m.strategy}" if m.strategy else "skipsearch plan"
        typer.echo(f"{name:<14} {m.summary} [{search}]")


@app.command("models")
def models_command() -> None:
    """The names --model takes besides a directory, and where each loads from on this machine."""
    from skipsearch.checkpoints import list_models

    for info in list_models():
        where = str(info.path) if info.path is not None else "not on this machine"
        typer.echo(f"{info.name:<24} {info.hub_id or info.description or '':<44} {where}")
