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


def _check_model_arg(model: str | None) -> None:
    """``--model`` naming a file, not a model directory: say so before anything loads."""
    if model and Path(model).is_file():
        raise ModelError(f"--model '{model}' is a file; give a model directory (with config.json), an alias "
                         f"(`skipsearch models`) or a hub id")


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
        _check_model_arg(model)
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
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from skipsearch import optimize as opt
    from skipsearch.models import load_model
    from skipsearch.profile import check_profile_target
    from skipsearch.space import SearchSpace

    _warnings_to_stderr()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with user_errors():
        # 1. everything that can be wrong with the input fails here, before the model loads
        if costs is not None or budget == 0:  # re-rank the study for another device (skipsearch.replan)
            if costs is None or budget != 0:
                raise ConfigError("--budget must be >= 1, got 0 (--budget 0 re-ranks a study and needs --costs)"
                                  if costs is None else
                                  "--costs re-ranks the study's evaluated configs without new trials: give --budget 0")
            return _rerank(costs, model=model, strategy=strategy, study=study, storage=storage, study_name=study_name,
                           dataset=dataset, n_prompts=n_prompts, max_new_tokens=max_new_tokens, shortlist=shortlist,
                           time_shortlist=time_shortlist, repeats=repeats, seed=seed, device=device, dtype=dtype,
                           out=out, force=force)
        for flag, value in (("--budget", budget), ("--n-prompts", n_prompts), ("--max-new-tokens", max_new_tokens),
                            ("--shortlist", shortlist), ("--repeats", repeats), ("--max-k", max_k)):
            if value < 1:
                raise ConfigError(f"{flag} must be >= 1, got {value}")
        given = {"n_values": ("--n", n and int_list(n, "--n")), "w_values": ("--w", w and int_list(w, "--w")),
                 "quantization": ("--quantization", quantization), "loi": ("--clasp-loi", clasp_loi),
                 "vocab_sizes": ("--vocab-sizes", vocab_sizes and int_list(vocab_sizes, "--vocab-sizes")),
                 "schemes": ("--schemes", schemes and tuple(x.strip() for x in schemes.split(",") if x.strip()))}
        options = tuple((key, value) for key, (_, value) in given.items() if value is not None)
        if storage is None and study is None:
            study = f"studies/{Path(model).name}-{strategy}"
        path = out or Path(study or ".") / "best.yaml"
        check_profile_target(path, force=force)
        _check_model_arg(model)
        from skipsearch.study import check_storage

        check_storage(study_dir=None if storage else study, storage=storage)  # driver, file, permissions
        prompts = load_prompts(dataset, split="calib", n=n_prompts, seed=seed)
        warm = [load_profile(p) for p in warm_start or ()]
        settings = opt.OptimizeSettings(
            strategy=strategy, budget=budget, dataset=dataset, n_prompts=n_prompts, max_new_tokens=max_new_tokens,
            objective=objective, shortlist=shortlist, seed=seed, repeats=repeats, study_dir=study, storage=storage,
            study_name=study_name, warm_start=tuple(p.draft for p in warm), strategy_options=options,
        )
        # Before the model loads its depth is unknown: check the options on a deep stand-in (the warm start's
        # depth when there is one); they are checked again, against the model, by optimize itself.
        layers = warm[0].model.num_layers if warm else 128
        try:
            opt.build_strategy(_space(SearchSpace, layers, max_k, protect_ends, max_skip_ratio), settings)
        except ConfigError as e:  # "strategy 'tpe' does not take n-values": name the option as typed
            text, taken = str(e), " does not take "
            if taken in text:
                key = text.rsplit(taken, 1)[1].replace("-", "_")
                text = text.rsplit(taken, 1)[0] + taken + given.get(key, (key,))[0]
            raise ConfigError(text) from None
        # The KV cache the memory check counts, before any tokenizer is loaded: a token is at least one
        # character, and a chat template adds a few dozen.
        longest = max(len(p.text) for p in prompts) + 64
        sm = load_model(model, device=device, dtype=dtype, max_tokens=longest + max_new_tokens)
        for p in warm_start or ():
            load_profile(p, num_layers=sm.num_layers)  # a warm start made for another depth names other layers
        settings = dataclasses.replace(settings, space=_space(SearchSpace, sm.num_layers, max_k, protect_ends,
                                                              max_skip_ratio))
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
        for conflict in result.summary.conflicts[:1]:  # one line: the study keeps the rest
            more = len(result.summary.conflicts) - 1
            typer.echo(f"warning: survived {len(result.summary.conflicts)} storage conflict(s) with other workers "
                       f"(first: {conflict}){f'; {more} more' if more else ''}", err=True)
        _save_profile_kept(result.profile, path, keep_in=study)
        for r in result.timed:
            m = r.measurement
            typer.echo(
                f"timed  {m.speedup:.3f}x (predicted {m.predicted_speedup or 0:.3f}x)  tau {m.tau or 0:.2f}  "
                f"acceptance {m.acceptance_rate or 0:.2f}  {opt.candidate_summary(r.candidate)}"
                + (f"  [{m.notes}]" if m.notes else "")
            )
        typer.echo(f"{result.verdict}\nwrote {path}")
        for suffix, companion in result.companions:  # e.g. CLaSp's dynamic profile, beside the static one
            beside = path.with_name(f"{path.stem}{suffix}{path.suffix or '.yaml'}")
            _save_profile_kept(companion, beside, keep_in=study)
            typer.echo(f"wrote {beside}")
        if result.interrupted:
            typer.echo("interrupted: the study keeps every finished trial; run the same command to resume", err=True)
            raise typer.Exit(130)


def _rerank(costs: str, *, model: str, strategy: str, study: str | None, storage: str | None, study_name: str | None,
            dataset: str, n_prompts: int, max_new_tokens: int, shortlist: int, time_shortlist: bool, repeats: int,
            seed: int, device: str, dtype: str, out: Path | None, force: bool) -> None:
    """``optimize --study S --costs C --budget 0``: the study's configs re-ranked under C (inside user_errors)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from skipsearch import replan
    from skipsearch.costs import load_costs
    from skipsearch.data import encode_prompt
    from skipsearch.models import load_model
    from skipsearch.optimize import config_summary
    from skipsearch.profile import check_profile_target
    from skipsearch.study import load_study
    from skipsearch.surrogate import calibrate

    # 1. the input, before the model loads
    for flag, value in (("--n-prompts", n_prompts), ("--max-new-tokens", max_new_tokens), ("--shortlist", shortlist),
                        ("--repeats", repeats)):
        if value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    target = load_costs(costs)
    if storage is None and study is None:
        study = f"studies/{Path(model).name}-{strategy}"
    label, records, attrs = load_study(study_dir=study, storage=storage, study_name=study_name)
    _check_study_for_model(label, attrs, model, force=force)
    if not replan.layer_skip_configs(records):
        raise ConfigError(f"study {label} has no evaluated layer-skip config to re-rank")
    path = out or Path(study or ".") / f"rerank-{Path(costs).stem}.yaml"
    check_profile_target(path, force=force)
    prompts = load_prompts(dataset, split="calib", n=n_prompts, seed=seed)
    # 2. trace the study's skip sets on the model and replay every config under the other costs
    sm = load_model(model, device=device, dtype=dtype)
    _warn_costs_hardware(target, sm, costs)
    cal = calibrate(sm, [encode_prompt(sm.tokenizer, p) for p in prompts], max_new_tokens=max_new_tokens)
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn()) as progress:
        task = progress.add_task("tracing skip sets", total=None)
        rr = replan.rerank_study(sm, cal, records, target, costs_source=costs, shortlist=shortlist,
                                 workload=f"{dataset} (calib split), {n_prompts} prompts x {max_new_tokens} tokens",
                                 on_progress=lambda done, total: progress.update(task, completed=done, total=total))
        if time_shortlist:  # 3. time the shortlist here, each against plain decoding in the same rounds
            timing = progress.add_task("timing the shortlist", total=min(shortlist, len(rr.rows)))
            timed = replan.time_rows(sm, cal, rr.rows[:shortlist], repeats=repeats,
                                     on_row=lambda _row: progress.advance(timing))
            rr = dataclasses.replace(rr, rows=timed + rr.rows[shortlist:])
    prof, verdict = replan.reranked_profile(sm, rr, target, study=label, dataset=f"{dataset} (calib split)",
                                            n_prompts=n_prompts, max_new_tokens=max_new_tokens, seed=seed)
    _save_profile_kept(prof, path, keep_in=study)
    # 4. print at the edge
    typer.echo(f"study {label}: {len(rr.rows)} configs re-ranked under {costs} ({target.device}, {target.dtype})"
               + (f"; {rr.skipped} trials of other methods left out" if rr.skipped else ""))
    for i, r in enumerate(rr.rows[: max(shortlist, 10)], 1):
        where = f"trial {r.trial}" if r.trial is not None else "re-planned"
        study_timed = f"  study timed {r.study_timed:.3f}x" if r.study_timed is not None else ""
        here = f"  timed here {r.timed.speedup:.3f}x" if r.timed is not None else ""
        typer.echo(f"{i:>3}. predicted {r.predicted.speedup:.3f}x{here}{study_timed}  ({where})  "
                   f"{config_summary(r.config)}")
    typer.echo(f"{verdict}\nwrote {path}")


def _check_study_for_model(label: str, attrs: dict, model: str, *, force: bool = False) -> None:
    """A study made for another model (depth, fingerprint) is refused before this one loads."""
    from skipsearch.models import arch_fingerprint, find_checkpoint, read_config
    from skipsearch.study import check_study_model

    _check_model_arg(model)
    config = read_config(find_checkpoint(model))
    check_study_model(label, attrs, model=model, num_layers=config.num_hidden_layers,
                      fingerprint=arch_fingerprint(config, model), force=force)


def _warn_costs_hardware(target, sm, source: str) -> None:
    """One line when a cost file used with the model loaded here was measured on other hardware."""
    from skipsearch.api import hardware_note

    note = hardware_note(target.environment, sm.device, what=f"costs {source}",
                         replan=f"skipsearch costs --model {sm.name} --out C` here and use `--costs C")
    if note:
        typer.echo(f"warning: {note}", err=True)


def _space(space_type, num_layers: int, max_k: int, protect_ends: bool, max_skip_ratio: float):
    return space_type(num_layers=num_layers, max_draft_tokens=tuple(k for k in (1, 2, 3, 4, 6, 8, 12) if k <= max_k),
                      protect_ends=protect_ends, max_skip_ratio=max_skip_ratio)


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
    peers: Annotated[str, typer.Option(help="HF peers: hf-greedy (always run), hf-prompt-lookup, hf-early-exit, "
                                            "hf-assisted-quantized.")]
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
    import dataclasses as dc
    import shlex

    import torch
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from skipsearch import bench as bn
    from skipsearch import bench_report as br
    from skipsearch.models import load_model
    from skipsearch.profile import check_model, check_profile_target, save_profile

    _warnings_to_stderr()
    with user_errors():
        # 1. everything that can be wrong with the input fails here, before the model loads
        _check_model_arg(model)
        paths = _profile_paths([*(profiles or []), *(more_profiles or [])])
        profs = [(p, load_profile(p)) for p in paths]
        for target in (report, as_json, *(paths if write_measured else ())):
            if target:
                check_profile_target(target, force=True)  # writable; what is there is replaced on purpose
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
        from skipsearch.api import profile_hardware_note

        for path, prof in profs:
            note = profile_hardware_note(prof, sm.device, source=path)
            if note:
                typer.echo(f"warning: {note}", err=True)
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
    with user_errors():
        if report:
            _write_text(report, br.render_markdown(result, command=shlex.join(command)))
            typer.echo(f"wrote {report}")
        if as_json:
            _write_text(as_json, br.report_json(result))
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
        help="Also cost these precision-draft schemes per sublayer, e.g. fp16,int8 (CPU) or int8,int4,fp8 (CUDA).")
    ] = None,
) -> None:
    """Measure this device's cost profile (per-sublayer cost, fixed part and LM head, v(k)) for re-planning."""
    import shlex

    import torch

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
            raise ConfigError("--schemes must name precision schemes, e.g. fp16,int8")
        for name in scheme_names:  # an unknown scheme fails before the model loads
            from skipsearch.methods.precision import PrecisionParams

            PrecisionParams(scheme=name)
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
            from skipsearch.methods.precision import measure_scheme_costs

            measured = tuple(SchemeCosts(m.scheme, m.attn_seconds, m.mlp_seconds, m.head_saving_seconds)
                             for m in measure_scheme_costs(sm, context, scheme_names, repeats=repeats))
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
             "a prompt-lookup one's K from its match record.")] = None,
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
    from skipsearch import plan as planner
    from skipsearch.profile import check_profile_target

    _warnings_to_stderr()
    with user_errors():
        # Where the results go is checked first, so that a bad path fails before the measuring does.
        for path in (plot, report):
            if path:
                check_profile_target(path, force=True)  # any writable file will do: not a profile
        given = {"--alpha": alpha, "--beta": beta, "--c": c, "--cs": cs}
        if any(v is not None for v in given.values()) or verify is not None:
            if medium or small or model or validate or out or profile or study or costs:
                raise ConfigError("give either --alpha --beta --c --cs (analysis), --medium and --small (measured), "
                                  "--profile or --study")
            missing = [k for k, v in given.items() if v is None]
            if missing:
                raise ConfigError(f"analysis needs {', '.join(missing)} as well")
            inputs = planner.PlanInputs(alpha, beta, c, cs, verify=planner.parse_curve(verify or ""))
            result = planner.plan_table(inputs, max_m=max_m, max_n=max_n)
            text, data = planner.format_plan(result), result.to_dict()
            body = f"# Hierarchical planner, given inputs\n\n{text}\n"
        elif profile is not None or study is not None:  # search once, deploy anywhere (skipsearch.replan)
            if (profile is not None and study is not None) or medium or small:
                raise ConfigError("give one of --profile, --study, or --medium and --small")
            if plot and profile is not None:
                raise ConfigError("--plot draws the (m, n) plan of --study or --medium/--small, not a profile's")
            if out:
                check_profile_target(out, force=force)
            result, data, text, body = _plan_portable(
                profile=profile, study=study, costs=costs, model=model, dataset=dataset, n_prompts=n_prompts,
                max_new_tokens=max_new_tokens, max_m=max_m, max_n=max_n, validate=validate is not False,
                repeats=repeats, seed=seed, device=device, dtype=dtype, out=out)
        else:
            from skipsearch import hierplan

            if medium is None or small is None:
                raise ConfigError("give --alpha --beta --c --cs (analysis), both --medium and --small (measured), "
                                  "--profile or --study")
            if costs:
                raise ConfigError("--costs plans --profile or --study for another device; --medium/--small are "
                                  "measured here")
            if out:
                check_profile_target(out, force=force)
            rep, sm = hierplan.plan_from_profiles(
                medium, small, model=model, dataset=dataset, n_prompts=n_prompts, max_new_tokens=max_new_tokens,
                max_m=max_m, max_n=max_n, run_validation=bool(validate), repeats=repeats, seed=seed, device=device,
                dtype=dtype, on_stage=lambda msg: typer.echo(msg, err=True),
            )
            result, data = rep.plan, rep.to_dict()
            text = body = hierplan.render_markdown(rep, num_layers=sm.num_layers,
                                                   command=" ".join(["skipsearch", *sys.argv[1:]]))
            if out:
                _save_profile_kept(hierplan.build_profile(rep, sm, rep.chosen()), out)
        if plot:
            planner.plot_plan(result, str(plot))
        if report:
            _write_text(report, body)
    typer.echo(json.dumps(data) if as_json else text)
    for path, what in ((plot, "plot"), (report, "report"), (out, "profile")):
        if path:
            typer.echo(f"wrote {what} {path}", err=True)


def _plan_portable(*, profile: str | None, study: str | None, costs: str | None, model: str | None, dataset: str,
                   n_prompts: int, max_new_tokens: int, max_m: int, max_n: int, validate: bool, repeats: int,
                   seed: int, device: str, dtype: str, out: Path | None) -> tuple:
    """``plan --profile`` (no model: replayed under --costs) or ``plan --study`` (levels from the study's front):
    (plan or None, JSON data, text, Markdown body). Inside user_errors; --out was checked."""
    from skipsearch import replan
    from skipsearch.costs import load_costs

    command = " ".join(["skipsearch", *sys.argv[1:]])
    if profile is not None:
        prof = load_profile(profile)
        target = load_costs(costs) if costs else replan.own_costs(prof, source=profile)
        new, planned = replan.replan_profile(prof, target, source=profile, costs_source=costs or profile)
        text = replan.format_replan(prof, new, planned, target)
        if out:
            _save_profile_kept(new, out)
        body = f"# Re-planned profile\n\n```\n{command}\n```\n\n{text}\n"
        return None, replan.replan_to_dict(new, planned), text, body
    from skipsearch import hierplan
    from skipsearch.costs import check_costs_for
    from skipsearch.data import encode_prompt
    from skipsearch.models import load_model
    from skipsearch.study import load_study
    from skipsearch.surrogate import calibrate

    target = load_costs(costs) if costs else None
    label, records, attrs = load_study(study_dir=study)
    _check_study_for_model(label, attrs, model or "smollm2-135m")
    skip_sets = {(c.skip_attn, c.skip_mlp) for c in replan.layer_skip_configs(records)}
    if len(skip_sets) < 2:
        raise ConfigError(f"study {label} has {len(skip_sets) or 'no'} evaluated layer-skip skip set"
                          f"{'s' if len(skip_sets) != 1 else ''}: planning two levels needs at least two distinct ones")
    prompts = load_prompts(dataset, split="calib", n=n_prompts, seed=seed)
    sm = load_model(model or "smollm2-135m", device=device, dtype=dtype)
    if target is not None:
        check_costs_for(target, sm, source=costs)
        _warn_costs_hardware(target, sm, costs)
    say = lambda msg: typer.echo(msg, err=True)  # noqa: E731
    say(f"calibrating: {len(prompts)} prompts x {max_new_tokens} tokens")
    cal = calibrate(sm, [encode_prompt(sm.tokenizer, p) for p in prompts], max_new_tokens=max_new_tokens)
    sp = hierplan.plan_from_study(sm, cal, records, study=label, dataset=dataset,
                                  costs=target.cost_model() if target else None, seed=seed, max_m=max_m, max_n=max_n,
                                  run_validation=validate, repeats=repeats, on_stage=say)
    text = hierplan.render_study_markdown(sp, num_layers=sm.num_layers, command=command)
    if out:
        pick = sp.report.chosen()
        if (pick.medium.skip_attn, pick.medium.skip_mlp) == (pick.small.skip_attn, pick.small.skip_mlp):
            raise ConfigError(f"study {label}: the planner's two levels are the same skip set; no hierarchical "
                              f"profile written (the study needs more distinct evaluated skip sets)")
        chosen = hierplan.build_profile(sp.report, sm, pick)
        _save_profile_kept(dataclasses.replace(chosen, search=dataclasses.replace(chosen.search, study=label)), out)
    data = {"study": label, "front": [dataclasses.asdict(p) for p in sp.front],
            "pairs": [dataclasses.asdict(p) for p in sp.pairs], "report": sp.report.to_dict()}
    return sp.report.plan, data, text, text


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
        if top < 0:
            raise StudyError(f"--top must be >= 0, got {top}")
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
