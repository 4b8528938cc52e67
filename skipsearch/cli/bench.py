"""``skipsearch bench``: every profile and the HF peers side by side, and the reports."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from skipsearch.cli.edge import LazyProgress, line, save_profile_kept, user_errors, warnings_to_stderr, write_text
from skipsearch.files.bounds import MAX_THREADS
from skipsearch.files.targets import BENCH_JSON, BENCH_REPORT


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
                                            "generate); llama.cpp (llama-server, after the timed rows).")]
    = "hf-greedy,hf-prompt-lookup,hf-early-exit,hf-assisted-quantized",
    llama_server: Annotated[str | None, typer.Option(
        help="With --peers llama.cpp: the llama-server binary (default: $SKIPSEARCH_LLAMA_SERVER, else PATH).")]
    = None,
    llama_settings: Annotated[str | None, typer.Option(
        help="With --peers llama.cpp: comma-separated settings, e.g. 'plain,draft q4_0 n=8,ngram 3/2,export' "
             "(default: plain, draft q8_0 n=4, ngram 3/4, ngram 3/4 + draft q8_0 n=4, export).")] = None,
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
    threads: Annotated[int | None, typer.Option(min=1, max=MAX_THREADS, help="torch intra-op threads.")] = None,
    kernel: Annotated[str | None, typer.Option(
        help="What runs skipsearch's own rows: eager, or inductor[-c<block>] (compiled once; skipsearch/kernels/). "
             "Default: the profiles' kernel when they share one, else eager.")] = None,
    batch_sizes: Annotated[str | None, typer.Option(
        help="Also bench by batch size, e.g. 1,2,4,8,16 (each 1 to 1024; one profile): per B, plain batched decoding, "
             "the profile's schedule, each fixed K and HF's batched generate, in aggregate tokens/s.")] = None,
    batch_ks: Annotated[str | None, typer.Option(
        help="With --batch-sizes: the fixed K to bench, e.g. 1,2,3,4 (default: those the profile's schedule "
             "considered, else 1,2,3,4).")] = None,
    strict: Annotated[bool, typer.Option(
        help="With --batch-sizes: stop at the first batch whose output differs from plain batched decoding "
             "(exit 1).")] = False,
    report: Annotated[Path | None, typer.Option(help="Write the Markdown report here.")] = None,
    as_json: Annotated[Path | None, typer.Option("--json", help="Write the JSON report here.")] = None,
    by_category: Annotated[bool, typer.Option(help="Also print one table per task category.")] = False,
    write_measured: Annotated[
        bool, typer.Option(help="Fill each profile's measured block from its row (identical output only).")
    ] = False,
    force: Annotated[bool, typer.Option(help="Use profiles despite a model fingerprint mismatch, and replace --report "
                                             "and --json where they hold an earlier bench report (another kind of "
                                             "file is never replaced).")] = False,
) -> None:
    """Every profile and the HF peers side by side: speed, τ, acceptance, memory, identical output.

    HF greedy and skipsearch's own autoregressive loop always run. A method whose output differs from
    HF greedy gets no speedup and a warning on stderr; the exit code stays 0 (the report is the result). So does
    a llama.cpp setting whose output differs, and a missing llama-server is one line in the report.
    """
    from rich.console import Console
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

    from skipsearch import api
    from skipsearch.harness import LosslessnessError

    warnings_to_stderr()
    options = api.BenchOptions(
        profiles=(*(profiles or []), *(more_profiles or [])), model=model, peers=peers, dataset=dataset, split=split,
        n_prompts=n_prompts, max_new_tokens=max_new_tokens, repeats=repeats, sweep_prompts=sweep_prompts, seed=seed,
        device=device, dtype=dtype, threads=threads, kernel=kernel, report=report, as_json=as_json,
        write_measured=write_measured, force=force, llama_server=llama_server, llama_settings=llama_settings,
        batch_sizes=batch_sizes, batch_ks=batch_ks, strict=strict,
    )
    with user_errors():
        # 1. the input is checked before the model loads; 2. the run, with a progress bar per stage on stderr
        try:
            with LazyProgress(TextColumn("{task.description}"), BarColumn(),
                              TextColumn("{task.completed}/{task.total}"), TextColumn("{task.fields[last]}"),
                              TimeElapsedColumn(), console=Console(stderr=True)) as bar:
                run = api.bench_profiles(
                    options, on_stage=lambda title, total: bar.stage(title, total, last=""),
                    on_progress=lambda done, _total, what: bar.update(bar.task, completed=done, last=what),
                    on_note=lambda note: typer.echo(f"warning: {note}", err=True),
                )
        except LosslessnessError as exc:  # --strict: a wrong output is no result to report
            typer.echo(f"error: {line(exc)}", err=True)
            raise typer.Exit(1) from None
    # 3. print and write at the edge
    _print_bench(run, by_category=by_category, report=report, as_json=as_json, write_measured=write_measured,
                 replace=force)


def _print_bench(run, *, by_category: bool, report: Path | None, as_json: Path | None, write_measured: bool,
                 replace: bool) -> None:
    """The bench's tables and summary; its reports and measured blocks written; a line per flagged or tied row."""
    import shlex

    from rich.console import Console

    from skipsearch.bench import batched_report
    from skipsearch.bench import report as br
    from skipsearch.bench.peers import BASELINE

    result = run.report
    out = Console(width=None if sys.stdout.isatty() else 200)  # piped: wide enough not to wrap the table
    for table in br.rich_tables(result, by_category=by_category):
        out.print(table)
    for text in br.summary_lines(result):
        typer.echo(text)
    if result.batched is not None:
        for text in batched_report.summary_lines(result.batched):
            typer.echo(text)
    with user_errors():
        if report:
            write_text(report, br.render_markdown(result, command=shlex.join(run.command)), kind=BENCH_REPORT,
                       replace=replace)
            typer.echo(f"wrote {report}")
        if as_json:
            write_text(as_json, br.report_json(result), kind=BENCH_JSON, replace=replace)
            typer.echo(f"wrote {as_json}")
    if write_measured:
        for path, updated in br.measured_updates(result, run.profiles):
            if updated is None:
                typer.echo(f"warning: {path}: output differs from hf-greedy; its measured block is left as it was",
                           err=True)
                continue
            with user_errors():  # --write-measured is the ask to replace each profile (a profile only)
                save_profile_kept(updated, Path(path), replace=True)
            typer.echo(f"updated the measured block of {path}")
    for row in result.rows:
        if row.flagged:
            typer.echo(f"warning: {row.method} output differs from hf-greedy ({row.first_mismatch})", err=True)
        elif row.ties:
            typer.echo(f"note: {row.method} output equals hf-greedy up to numerical ties on {row.ties} of "
                       f"{row.prompts} prompts ({row.tie_tokens} tied tokens; identical on {row.identical})", err=True)
    for text in batched_report.flagged_lines(result.batched.rows if result.batched is not None else ()):
        typer.echo(text, err=True)
    labels = [p.prompt_id for p in result.prompts if p.method == BASELINE]
    for llama in (result.llama_sweep, result.llama):
        for r in llama.settings if llama is not None else ():
            if r.error is None and not r.ok:
                typer.echo(f"warning: llama.cpp {r.setting.name} output differs from hf-greedy "
                           f"({r.first_mismatch(labels if llama is result.llama else None)})", err=True)
