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

app = typer.Typer(
    help="Search, ship and run self-speculative decoding draft profiles.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
profile_app = typer.Typer(help="Check and describe draft profiles.", no_args_is_help=True)
app.add_typer(profile_app, name="profile")

USER_ERRORS: tuple[type[Exception], ...] = (ProfileError, ModelError, DataError, ConfigError)


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
    prompts_file: Annotated[Path | None, typer.Option(help='JSONL, one {"prompt": ..., "chat": bool} per line.')] = None,
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
        config = api.draft_config_for(prof)

        def show(_: int, text: str) -> None:
            sys.stdout.write(text)
            sys.stdout.flush()

        results = api.decode_prompts(
            sm, prompts, config=config, sampling=sampling, max_new_tokens=max_new_tokens, seed=seed,
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


def main() -> None:  # pragma: no cover - console entry for `python -m skipsearch`
    app()
