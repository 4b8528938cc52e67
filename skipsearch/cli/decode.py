"""``skipsearch decode``: decode prompts with a draft profile (lossless), or plainly with --model."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from skipsearch.cli import options
from skipsearch.cli.edge import finite, user_errors, warnings_to_stderr
from skipsearch.config import ConfigError, SamplingParams
from skipsearch.data import MAX_PROMPTS_BYTES, DataError, Prompt, read_prompts_file
from skipsearch.kernels import choose_kernel
from skipsearch.model.loader import DEFAULT_MODEL
from skipsearch.profile import load_profile


def decode(
    prompt: Annotated[str | None, typer.Option(help="Text to continue (or a user message with --chat).")] = None,
    model: options.Model = None,
    profile: Annotated[str | None, typer.Option(help="Draft profile (YAML); it names its model.")] = None,
    prompts_file: Annotated[
        Path | None, typer.Option(help='JSONL, one {"prompt": ..., "chat": bool} per line.')
    ] = None,
    chat: Annotated[bool, typer.Option(help="Wrap the prompt with the model's chat template.")] = False,
    max_new_tokens: options.MaxNewTokens = options.MAX_NEW_TOKENS,
    temperature: Annotated[float, typer.Option(min=0.0, callback=finite, help="0 is greedy.")] = 0.0,
    top_p: Annotated[float, typer.Option(min=0.0, max=1.0, callback=finite, help="Above 0.")] = 1.0,
    top_k: Annotated[int, typer.Option(min=0)] = 0,
    seed: options.Seed = options.SEED,
    device: options.Device = options.DEVICE,
    dtype: options.DType = options.DTYPE,
    target_precision: options.TargetPrecision = options.TARGET_PRECISION,
    force: Annotated[bool, typer.Option(help="Use a profile despite a model fingerprint mismatch.")] = False,
    kernel: options.Kernel = options.KERNEL,
    threads: options.Threads = None,
    as_json: options.Json = False,
    check: Annotated[bool, typer.Option("--check", help="Greedy only: also decode with HF greedy and print each "
                                                        "output's verdict (identical, equal up to numerical ties, "
                                                        "different) on stderr; with --json, as \"check\".")] = False,
    batch_size: Annotated[int, typer.Option(min=1, help="Decode the prompts B at a time in one batch (greedy, eager; "
                                                        "the profile's method must batch: ngram, precision, hybrid). "
                                                        "1: one at a time, as always.")] = 1,
) -> None:
    """Decode with a draft profile (lossless), or plainly with --model."""
    from skipsearch import api

    warnings_to_stderr()
    with user_errors():
        # 1. all the input is checked before the model loads: a typo costs milliseconds
        prompts, sampling = _read_input(prompt, prompts_file, chat=chat, check=check, temperature=temperature,
                                        top_p=top_p, top_k=top_k)
        kernel = options.reject_fastest(kernel)
        if model is None and profile is None:
            model = DEFAULT_MODEL
        api.check_model_arg(model)
        # every prompt fits the model's context (a megabyte is refused by its length, untokenized), before it loads
        api.check_prompts_fit(model or load_profile(profile).model.name, prompts, max_new_tokens=max_new_tokens)
        if threads:
            import torch

            torch.set_num_threads(threads)
        kernel = None if kernel == "auto" else kernel  # auto: the profile's kernel, else eager
        if batch_size > 1 and not sampling.greedy:
            raise ConfigError("batched decoding is greedy only: leave --temperature at 0, or decode with "
                              "--batch-size 1")
        if batch_size > 1 and profile is not None:
            api.check_batch_profile(profile)
        sm, prof = api.open_model(model=model, profile=profile, device=device, dtype=dtype, force=force,
                                  kernel=kernel, precision=options.precision_of(target_precision))
        if batch_size > 1:
            _decode_batched(sm, prof, prompts, profile=profile, kernel=kernel, batch_size=batch_size,
                            max_new_tokens=max_new_tokens, as_json=as_json, check=check)
            return
        drafters = api.drafter_factory(prof, sm)
        chosen = choose_kernel(kernel, prof.kernel if prof is not None else None)  # its compile shows on stderr

        def show(_: int, text: str) -> None:
            sys.stdout.write(text)
            sys.stdout.flush()

        # 2. every prompt is encoded and checked against the context here, before the first decodes
        results = api.decode_prompts(
            sm, prompts, drafters=drafters, sampling=sampling, max_new_tokens=max_new_tokens, seed=seed,
            on_text=None if as_json else show, kernel=chosen,
        )
        if sm.kernel_report is not None:
            typer.echo(f"kernel {sm.kernel_report.kernel}: built or loaded in {sm.kernel_report.compile_seconds:.0f} s "
                       f"for {sm.kernel_report.threads} thread(s)", err=True)
        # the input is all checked: now, before any output, a profile measured elsewhere says so
        note = api.profile_hardware_note(prof, sm.device, source=profile)
        if note:  # a warning, never a refusal: the output is lossless anywhere, only the speed may differ
            typer.echo(f"warning: {note}", err=True)
        # 3. each result is written (and flushed) as soon as its prompt is done: Ctrl-C or a failure
        # later keeps every finished one
        for d in results:
            _print_decoded(sm, d, as_json=as_json, check=check, max_new_tokens=max_new_tokens)


def _read_input(prompt: str | None, prompts_file: Path | None, *, chat: bool, check: bool, temperature: float,
                top_p: float, top_k: int) -> tuple[tuple[Prompt, ...], SamplingParams]:
    """The prompts to decode, from --prompt or --prompts-file (exactly one), and the sampling settings, each refused
    in one line before anything loads: an empty prompt, a bad setting or file, or --check with sampling."""
    if (prompt is None) == (prompts_file is None):
        raise DataError("give exactly one of --prompt or --prompts-file")
    if prompt == "":
        raise DataError("--prompt is empty: give the text to continue")
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
    if check and not params.greedy:
        raise ConfigError("--check compares greedy output with HF greedy: leave --temperature at 0")
    prompts = (  # the bound is read here, where a test can lower it
        read_prompts_file(prompts_file, chat_default=chat, limit=MAX_PROMPTS_BYTES) if prompts_file
        else (Prompt("", prompt, chat, "", "--prompt"),)
    )
    return prompts, params


def _print_decoded(sm, d, *, as_json: bool, check: bool, max_new_tokens: int) -> None:
    """One finished prompt: a JSON line on stdout, or its stats on stderr (its text was streamed); with --check,
    its verdict against HF greedy."""
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


def _decode_batched(sm, prof, prompts, *, profile: str | None, kernel: str | None, batch_size: int,
                    max_new_tokens: int, as_json: bool, check: bool) -> None:
    """``decode --batch-size B`` (B > 1): each batch's outputs, row by row, then the batch's stats on stderr."""
    from skipsearch import api
    from skipsearch.engine.equivalence import check_against_hf

    chosen = choose_kernel(kernel, prof.kernel if prof is not None else None)
    batches = api.decode_batches(sm, prompts, profile=prof, batch_size=batch_size, max_new_tokens=max_new_tokens,
                                 kernel=chosen)
    note = api.profile_hardware_note(prof, sm.device, source=profile)
    if note:
        typer.echo(f"warning: {note}", err=True)
    for batch in batches:
        s = batch.result.stats
        for prompt, ids, out, text in zip(batch.prompts, batch.prompt_token_ids, batch.result.token_ids, batch.texts,
                                          strict=True):
            verdict = check_against_hf(sm, ids, out, max_new_tokens=max_new_tokens) if check else None
            if as_json:
                row = {"prompt": prompt.text, "prompt_token_ids": list(ids), "token_ids": list(out), "text": text,
                       "batch_stats": dataclasses.asdict(s),
                       **({"check": verdict.to_dict()} if verdict is not None else {})}
                typer.echo(json.dumps(row))
            else:
                sys.stdout.write(text + "\n")
                sys.stdout.flush()
            if verdict is not None:
                typer.echo(f"[check: {verdict.describe()}]", err=True)
        acc = f"{s.accepted_tokens / s.drafted_tokens:.2f}" if s.drafted_tokens else "-"
        typer.echo(f"[batch of {s.batch_size}: {s.new_tokens} tokens, {s.seconds:.2f}s, {s.tokens_per_s:.1f} tok/s "
                   f"together, k {s.k}, {s.verify_steps} verify steps, {s.draft_steps} draft steps, acceptance {acc}]",
                   err=True)


def _check_decoded(sm, decoded, max_new_tokens: int):
    """``decode --check``: the output against HF greedy's, judged by skipsearch.engine.equivalence."""
    from skipsearch.engine.equivalence import check_against_hf

    return check_against_hf(sm, decoded.prompt_token_ids, decoded.result.token_ids, max_new_tokens=max_new_tokens)
