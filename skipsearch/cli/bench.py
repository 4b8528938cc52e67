"""``skipsearch bench``: every profile and the HF peers side by side, and the reports."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from skipsearch.cli import options
from skipsearch.cli.edge import LazyProgress, line, save_profile_kept, user_errors, warnings_to_stderr, write_text
from skipsearch.cli.options import renamed
from skipsearch.files.figures import check_plot_target
from skipsearch.files.targets import BENCH_JSON, BENCH_REPORT

# the command's own options (those several commands share are in options.py)
MoreProfiles = Annotated[
    list[str] | None, typer.Argument(help="More profiles (so that `--profiles dir/*.yaml` works unquoted).")
]
Profiles = Annotated[
    list[str] | None, typer.Option(help="Profiles to bench: repeat, comma-separate or give a glob.")
]
Peers = Annotated[str, typer.Option(help="HF peers: hf-greedy (always run), hf-prompt-lookup, hf-early-exit, "
    "hf-assisted-quantized, hf-generate+profile (each profile inside HF "
    "generate); llama.cpp (llama-server), vllm (vLLM's server, its CPU build: plain and each profile's vLLM "
    "setting), both after the timed rows.")]
LlamaSettings = Annotated[str | None, typer.Option(
    help="With --peers llama.cpp: comma-separated settings, e.g. 'plain,draft q4_0 n=8,ngram 3/2,export' "
    "(default: plain, draft q8_0 n=4, ngram 3/4, ngram 3/4 + draft q8_0 n=4, export).")]
SweepPrompts = Annotated[
    int, typer.Option(min=0, help="Calib-split prompts each peer's knob is swept on; 0: no sweep.")
]
BatchKs = Annotated[str | None, typer.Option(
    help="With --batch-sizes: the fixed K to bench, e.g. 1,2,3,4 (default: those the profile's schedule "
    "considered, else 1,2,3,4).")]
Strict = Annotated[bool, typer.Option(
    help="With --batch-sizes: stop at the first batch whose output differs from plain batched decoding "
    "(exit 1).")]
Plot = Annotated[Path | None, typer.Option(
    help="Draw each method's and peer's speedup over HF greedy, by workload, to this PNG (--force replaces an "
    "earlier plot). Earlier --json-out reports draw with scripts/plot_bench.py.")]
ByCategory = Annotated[bool, typer.Option(help="Also print one table per task category.")]
WriteMeasured = Annotated[
    bool, typer.Option(help="Fill each profile's measured block from its row (identical output only).")
]
Force = Annotated[bool, typer.Option(help="Use profiles despite a model fingerprint mismatch, and replace --report "
    "and --json-out where they hold an earlier bench report (another kind "
    "of file is never replaced).")]


def bench(
    more_profiles: MoreProfiles = None,
    profiles: Profiles = None,
    model: options.Model = None,
    peers: Peers = "hf-greedy,hf-prompt-lookup,hf-early-exit,hf-assisted-quantized",
    llama_server: options.LlamaServer = None,
    llama_settings: LlamaSettings = None,
    llama_target: options.LlamaTarget = None,
    vllm_python: options.VllmPython = None,
    dataset: options.Dataset = options.DATASET,
    split: options.Split = options.SPLIT,
    n_prompts: options.NPrompts = options.N_PROMPTS,
    max_new_tokens: options.MaxNewTokens = options.MAX_NEW_TOKENS,
    repeats: options.Repeats = options.REPEATS,
    sweep_prompts: SweepPrompts = 2,
    seed: options.Seed = options.SEED,
    device: options.Device = options.DEVICE,
    dtype: options.DType = options.DTYPE,
    target_precision: options.TargetPrecision = options.TARGET_PRECISION,
    threads: options.Threads = None,
    kernel: options.Kernel = options.KERNEL,
    batch_sizes: options.BatchSizes = None,
    batch_ks: BatchKs = None,
    strict: Strict = False,
    report: options.Report = None,
    as_json: options.Json = False,
    json_out: options.JsonOut = None,
    plot: Plot = None,
    by_category: ByCategory = False,
    write_measured: WriteMeasured = False,
    force: Force = False,
) -> None:
    """Every profile and the HF peers side by side: speed, τ, acceptance, memory, identical output.

    HF greedy and skipsearch's own autoregressive loop always run. Exit code 1 (after the tables and every report are
    written, with one line on stderr naming the rows) when any of skipsearch's outputs (a profile, in skipsearch's
    engine or inside HF generate) differs from HF greedy; such a row gets no speedup. An HF peer's or a llama.cpp
    setting's differences are reported but leave the exit code alone: another runtime's numerics, not
    skipsearch's. Bad input is exit code 2. A missing llama-server is one line in the report.
    """
    from skipsearch import api
    from skipsearch.bench.plot import plot_reports
    from skipsearch.engine.harness import LosslessnessError

    warnings_to_stderr()
    more_profiles, json_out, as_json = _old_json_spelling(as_json, list(more_profiles or []), json_out)
    with user_errors():
        kernel = options.reject_fastest(kernel)
    options_ = api.BenchOptions(
        profiles=(*(profiles or []), *more_profiles), model=model, peers=peers, dataset=dataset, split=split,
        n_prompts=n_prompts, max_new_tokens=max_new_tokens, repeats=repeats, sweep_prompts=sweep_prompts, seed=seed,
        device=device, dtype=dtype, threads=threads,
        target_precision=options.precision_of(target_precision),
        kernel=None if kernel == "auto" else kernel, report=report,
        as_json=json_out, write_measured=write_measured, force=force, llama_server=llama_server,
        llama_settings=llama_settings, llama_target=llama_target, vllm_python=vllm_python, batch_sizes=batch_sizes,
        batch_ks=batch_ks, strict=strict,
    )
    with user_errors():
        if plot:
            check_plot_target(plot, replace=force)
        # 1. the input is checked before the model loads; 2. the run, with a progress bar per stage on stderr
        try:
            run = _run(options_)
        except LosslessnessError as exc:  # --strict: a wrong output is no result to report
            typer.echo(f"error: {line(exc)}", err=True)
            raise typer.Exit(1) from None
    # 3. print and write at the edge; 4. the verdict as the exit code
    _print_bench(run, by_category=by_category, report=report, json_out=json_out, as_json=as_json,
                 write_measured=write_measured, replace=force)
    if plot:
        with user_errors():
            plot_reports([run.report], plot)
        typer.echo(f"wrote {plot}", err=as_json)
    differing = differs_from_hf_greedy(run.report)
    if differing:
        typer.echo(f"error: output differs from hf-greedy in {len(differing)} of skipsearch's rows: "
                   f"{', '.join(differing)} (exit code 1)", err=True)
        raise typer.Exit(1)


def _run(options_):
    """The bench, with a progress bar per stage on stderr (a line per stage in a pipe or a log)."""
    from rich.console import Console
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

    from skipsearch import api

    with LazyProgress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TextColumn("{task.fields[last]}"), TimeElapsedColumn(), console=Console(stderr=True)) as bar:
        return api.bench_profiles(
            options_, on_stage=lambda title, total: bar.stage(title, total, last=""),
            on_progress=lambda done, _total, what: bar.update(bar.task, completed=done, last=what),
            on_note=lambda note: typer.echo(f"warning: {note}", err=True),
        )


def differs_from_hf_greedy(result) -> tuple[str, ...]:
    """The rows of skipsearch's own output (a profile, in its engine or inside HF generate) that differ from HF
    greedy; an HF peer's row is HF's own numerics, and llama.cpp's settings are not rows."""
    from skipsearch.bench.peers import BASELINE

    return tuple(r.method for r in result.rows if r.flagged and r.family != "hf" and r.method != BASELINE)


def _old_json_spelling(as_json: bool, more: list[str],
                       json_out: Path | None) -> tuple[list[str], Path | None, bool]:
    """``--json PATH``, the old spelling of ``--json-out PATH``: ``--json`` is a flag now, so the path arrives among
    the profiles; a ``.json`` file there (never a profile) is taken as before, with a notice."""
    if not as_json or json_out is not None:
        return more, json_out, as_json
    old = [p for p in more if p.lower().endswith(".json")]
    if len(old) != 1:
        return more, json_out, as_json
    renamed("--json PATH", "--json-out PATH (--json alone: the JSON report on stdout)")
    more.remove(old[0])
    return more, Path(old[0]), False


def _print_bench(run, *, by_category: bool, report: Path | None, json_out: Path | None, as_json: bool,
                 write_measured: bool, replace: bool) -> None:
    """The bench's tables and summary (on stderr with ``--json``, whose report alone goes to stdout); its reports
    and measured blocks written; a line per flagged or tied row."""
    import shlex

    from rich.console import Console

    from skipsearch.bench import batched_report
    from skipsearch.bench import report as br
    from skipsearch.bench.peers import BASELINE

    result = run.report
    say = (lambda text: typer.echo(text, err=True)) if as_json else typer.echo
    stream = sys.stderr if as_json else sys.stdout
    out = Console(file=stream, width=None if stream.isatty() else 200)  # piped: wide enough not to wrap the table
    for table in br.rich_tables(result, by_category=by_category):
        out.print(table)
    for text in br.summary_lines(result):
        say(text)
    if result.batched is not None:
        for text in batched_report.summary_lines(result.batched):
            say(text)
    with user_errors():
        if report:
            write_text(report, br.render_markdown(result, command=shlex.join(run.command)), kind=BENCH_REPORT,
                       replace=replace)
            say(f"wrote {report}")
        if json_out:
            write_text(json_out, br.report_json(result), kind=BENCH_JSON, replace=replace)
            say(f"wrote {json_out}")
    if as_json:
        sys.stdout.write(br.report_json(result).rstrip("\n") + "\n")
        sys.stdout.flush()
    if write_measured:
        for path, updated in br.measured_updates(result, run.profiles):
            if updated is None:
                typer.echo(f"warning: {path}: output differs from hf-greedy; its measured block is left as it was",
                           err=True)
                continue
            with user_errors():  # --write-measured is the ask to replace each profile (a profile only)
                save_profile_kept(updated, Path(path), replace=True)
            say(f"updated the measured block of {path}")
    for row in result.rows:
        if row.flagged:
            typer.echo(f"warning: {row.method} output differs from hf-greedy ({row.first_mismatch})", err=True)
        elif row.ties:
            typer.echo(f"note: {row.method} output equals hf-greedy up to numerical ties on {row.ties} of "
                       f"{row.prompts} prompts ({row.tie_tokens} tied tokens; identical on {row.identical})", err=True)
    for text in batched_report.flagged_lines(result.batched.rows if result.batched is not None else ()):
        typer.echo(text, err=True)
    labels = [p.prompt_id for p in result.prompts if p.method == BASELINE]
    main = {id(result.llama), *(id(more) for more, _ in result.llama_more)}  # on the bench prompts, not a sweep's
    for llama in (result.llama_sweep, result.llama, *(x for pair in result.llama_more for x in pair[::-1])):
        for r in llama.settings if llama is not None else ():
            if r.error is None and not r.ok:
                against = "hf-greedy" if llama.checked_against == "HF greedy" else "its own plain decoding"
                on = "" if llama.kind == "f32" else f" on {llama.target}"
                typer.echo(f"warning: llama.cpp {r.setting.name}{on} output differs from {against} "
                           f"({r.first_mismatch(labels if id(llama) in main else None)})", err=True)
    for r in result.vllm.rows if result.vllm is not None else ():
        if r.identical != r.prompts:
            typer.echo(f"warning: vllm {r.setting} output differs from hf-greedy on {r.prompts - r.identical} of "
                       f"{r.prompts} prompts", err=True)
