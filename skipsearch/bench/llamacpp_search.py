"""llama.cpp's own speculative settings searched on its own server (``skipsearch optimize --engine llama.cpp``).

What a setting does in llama.cpp depends on llama.cpp's verify cost, draft cost and scheduling, not skipsearch's:
the bench found its speculative settings, a profile's export among them, slower than its plain decoding on several
CPUs. So the search times llama.cpp itself: every setting of a grid (its self-drafts at Q8_0 and Q4_0, n-gram
lookups of several sizes, both together, ``--spec-default``, and a profile's own export) in a ``llama-server`` of
its own (``llamacpp.run_setting``), over ``runs`` passes, the second in reverse order with plain last, so that a
drift of the machine's speed does not favour the settings timed early. Each output is checked against HF greedy
(an F32 target) or llama.cpp's plain decoding of its Q8_0 target, token for token.

The grid's draft models are the model's own copies at Q8_0 and Q4_0, and, where ``shallow_drafts`` gives them, its
layer-skip drafts as llama.cpp can load them: shallow GGUFs of the model's kept whole layers (at Q4_0), the layers
to drop chosen by CLaSp's dynamic program (``methods/clasp_dynamic/dp.py``) on the calibration prompts, dropping
``SHALLOW`` of the skippable layers (a tenth, a fifth).

A setting ships only if it stayed identical on every prompt of every pass and beat plain by ``margin`` (3%) in
every pass, its speedup being the worse pass's ratio of its tokens/s (prefill included: a draft model prefills too)
to plain's in the same pass. Where none does, plain ships, and the record says what was fastest and by how much.
So a setting that differed, failed or fell short of the margin in one pass can no longer ship: with ``margin``
given, later passes time only plain and the settings still in reach (``in_reach``), and the others keep the
figures of the passes they ran (``rank``).
"""

from __future__ import annotations

import datetime
import subprocess
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from skipsearch.bench import engine_rank as er
from skipsearch.bench import llamacpp as lp
from skipsearch.bench import llamacpp_ggufs as lg
from skipsearch.bench.engine_rank import MARGIN, Ranked, choose
from skipsearch.files.engine_runs import DRAFT_GGUF, EngineRun

RUNS = 2
N_MAX = (2, 4, 8)  # draft lengths (--spec-draft-n-max, --spec-ngram-simple-size-m)
NGRAM_N = (2, 3, 4)  # n-gram sizes (--spec-ngram-simple-size-n)
DRAFTS = ("q8_0", "q4_0")  # the model's own GGUF copies as draft models
SHALLOW = (0.1, 0.2)  # shallow self-drafts: the share of the model's layers each drops
SHALLOW_DRAFT = "q4_0"  # their GGML type: the cheapest draft token llama.cpp has
KINDS = (lp.PLAIN, lp.DRAFT, lp.NGRAM, lp.BOTH, lp.DEFAULT, lp.EXPORT)


def _draft_of(setting: lp.Setting) -> str | None:
    if setting.kind not in (lp.DRAFT, lp.BOTH):
        return None
    return next((d for d in lp.DRAFT_SCHEMES if f"draft {d} " in setting.name), None)


def _flags(setting: lp.Setting) -> tuple[str, ...]:
    return tuple(DRAFT_GGUF if a.endswith(".gguf") else a for a in setting.args)


def _timed(r: lp.SettingResult, prompts: int) -> er.Timed:
    return er.Timed(r.setting.name, r.setting.kind, _flags(r.setting), _draft_of(r.setting), r.throughput,
                    r.identical, prompts, r.error, r.setting.draft_layers)


def rank(passes: Sequence[lp.LlamaCppResult]) -> tuple[Ranked, ...]:
    """Every setting that ran in the first pass, over every pass, plain first; the fastest clean setting next. A
    setting the later passes left out (``in_reach``: it could no longer ship) keeps the figures of the passes it
    ran."""
    timed = [[_timed(r, p.prompts) for r in p.settings] for p in passes]
    ranked = er.rank(timed)
    ran = [{t.name for t in p} for p in timed]
    leading = {r.name: next((k for k, names in enumerate(ran) if r.name not in names), len(ran)) for r in ranked}
    cut = {k for name, k in leading.items() if 0 < k < len(ran)}  # the passes a setting ran before it was left out
    if not cut:
        return ranked
    through = {k: {r.name: r for r in er.rank(timed[:k])} for k in cut}
    return er.ordered([through[leading[r.name]][r.name] if 0 < leading[r.name] < len(ran) and r.kind != lp.PLAIN
                       else r for r in ranked])


def in_reach(result: lp.LlamaCppResult, margin: float) -> set[str]:
    """The settings of a pass that can still ship: plain, and each that ran every prompt identically to the
    reference at ``margin`` times plain's tokens/s or more (a setting ships on its worse pass)."""
    plain = result.setting(lp.PLAIN)
    base = plain.throughput if plain is not None and not plain.error else None
    return {lp.PLAIN} | {r.setting.name for r in result.settings
                         if r.setting.kind != lp.PLAIN and base and r.ok and (r.throughput or 0.0) >= margin * base}


def shallow_drafts(sm, prompt_ids: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]], *,
                   shares: Sequence[float] = SHALLOW, draft: str = SHALLOW_DRAFT,
                   tokens_per_sequence: int = 16) -> tuple[lg.Shallow, ...]:
    """The shallow self-drafts of ``sm``: for each share s, the model without the round(s x L) whole layers (never
    the first or the last) that CLaSp's static DP finds keep the final hidden state nearest the full model's, over
    ``tokens_per_sequence`` tokens of each prompt's ``continuations`` (its greedy output). One DP gives every
    depth; a share that rounds to a depth already taken (or to none) adds nothing."""
    from skipsearch.methods.clasp_dynamic.dp import static_skip_sets

    allowed = tuple(range(1, sm.num_layers - 1))
    depths = sorted({min(len(allowed), round(share * sm.num_layers)) for share in shares} - {0})
    if not depths:
        return ()
    sets = static_skip_sets(sm, prompt_ids, continuations, allowed=allowed, limits={"layer": depths[-1]},
                            tokens_per_sequence=tokens_per_sequence)
    skip_sets = sets.skip_sets[0]
    out = []
    for m in depths:
        if m < len(skip_sets):
            dropped = set(skip_sets[m])
            out.append(lg.Shallow(draft, tuple(i for i in range(sm.num_layers) if i not in dropped), sm.num_layers))
    return tuple(out)


def server_version(server: str) -> str:
    """``llama-server --version``'s first line ("version: 0.5.0-dev (build 1, commit 0c1e570)"), or "unknown"."""
    try:
        done = subprocess.run([server, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    lines = [ln.strip() for ln in (done.stdout + "\n" + done.stderr).splitlines() if ln.strip().startswith("version")]
    return lines[0][:200] if lines else "unknown"


def at_concurrency(passes: Sequence[lp.LlamaCppResult], name: str) -> float:
    """``name``'s worse pass's throughput over plain's at one concurrency (``search_llamacpp(concurrency=C,
    names=...)``'s passes); 0.0 where it differed from the reference, failed, or did not run."""
    return er.ratio(rank(passes), name)


def engine_run(passes: Sequence[lp.LlamaCppResult], ranked: Sequence[Ranked], *, version: str, hardware: str,
               workload: str, margin: float = MARGIN,
               concurrency: Sequence[tuple[int, float]] = ()) -> EngineRun:
    """The record the profile keeps: plain, what ships and the fastest clean setting tried. ``concurrency`` holds
    (C, the chosen setting's ``at_concurrency``) for each concurrency C > 1 it was checked at: it ships only if it
    ran at least as fast as plain at every one."""
    ships, best = choose(ranked, margin)
    if ships is not None and any(ratio < 1.0 for _, ratio in concurrency):
        ships = None  # slower than plain with several requests in flight: a loss where users serve
    plain = next(r for r in ranked if r.kind == lp.PLAIN)
    shipped = ships or plain

    def rates(values: tuple[float, ...]) -> tuple[float, ...]:  # as the file keeps them
        return tuple(round(v, 2) for v in values)

    return EngineRun(
        engine=lp.FAMILY, version=version, hardware=hardware, target=passes[0].target,
        setting=shipped.name, kind=shipped.kind, args=shipped.flags, draft=shipped.draft, concurrency=1,
        runs=len(passes), plain_tokens_per_s=rates(plain.tokens_per_s), tokens_per_s=rates(shipped.tokens_per_s),
        speedup=round(shipped.worst, 4) if ships is not None else 1.0, margin=margin,
        best_tried=best.name if best is not None else None,
        best_tried_speedup=round(best.worst, 4) if best is not None else None,
        identical=shipped.identical, prompts=shipped.prompts, checked_against=passes[0].checked_against,
        workload=workload, date=datetime.date.today().isoformat(),
        at_concurrency=tuple((c, round(ratio, 4)) for c, ratio in concurrency), draft_layers=shipped.draft_layers)


def search_llamacpp(sm, prompt_ids: Sequence[Sequence[int]], *, max_new_tokens: int, threads: int,
                    server: str, checkpoint: str | Path | None = None,
                    profiles: Sequence[tuple[str, object]] = (), runs: int = RUNS, n_max: Sequence[int] = N_MAX,
                    ngram_n: Sequence[int] = NGRAM_N, drafts: Sequence[str] = DRAFTS,
                    cache: str | Path | None = None, start_timeout: float = 300.0,
                    names: Collection[str] | None = None, concurrency: int = 1,
                    reference: Sequence[Sequence[int]] | None = None,
                    on_setting: Callable[[int, str, int, int], None] | None = None,
                    shallow: Sequence[lg.Shallow] = (), margin: float | None = None, target: str | None = None,
                    ) -> tuple[lp.LlamaCppResult, ...]:
    """``runs`` passes of the whole grid (each shallow self-draft of ``shallow`` too, and each profile's export) on
    ``prompt_ids``, odd passes reversed;
    ``names`` keeps only the grid settings it names, ``concurrency`` C > 1 runs each with C requests in flight,
    ``reference`` is what outputs are checked against (default: HF greedy's for an F32 target, else the first
    pass's plain decoding). ``target`` is llama.cpp's target GGUF (``llamacpp_ggufs.TARGETS``; None: the model's
    precision's). ``on_setting(pass, name, index, total)`` opens each setting. With ``margin``, a pass
    after the first times only plain and what is still ``in_reach`` after the passes before it (the exports too),
    and none is run where nothing is. A pass that could not run (its ``unavailable``) ends the search with it."""
    passes: list[lp.LlamaCppResult] = []
    if reference is None and lg.target_type(sm, target) == lg.F32:
        from skipsearch.engine.decoding import hf_generate

        reference = [hf_generate(sm, ids, max_new_tokens=max_new_tokens) for ids in prompt_ids]
    exports = list(profiles)
    for i in range(runs):
        step = (lambda name, j, n, i=i: on_setting(i, name, j, n)) if on_setting else None
        result = lp.llamacpp_rows(sm, prompt_ids, max_new_tokens=max_new_tokens, threads=threads, server=server,
                                  reference=reference, checkpoint=checkpoint, profiles=exports, drafts=drafts,
                                  n_max=n_max, ngram_n=ngram_n, kinds=KINDS, cache=cache, names=names,
                                  start_timeout=start_timeout, reverse=i % 2 == 1, concurrency=concurrency,
                                  on_setting=step, shallow=shallow, target=target)
        passes.append(result)
        if on_setting and result.settings:
            on_setting(i, "", len(result.settings), len(result.settings))  # the pass is done
        if result.unavailable:
            break
        if reference is None:  # a Q8_0 target: its own plain decoding of the first pass is the reference
            plain = result.setting(lp.PLAIN)
            if plain is None or plain.error:
                break
            reference = [c.tokens for c in plain.completions]
        if margin is not None:  # what can no longer ship is not timed again
            reach = in_reach(result, margin)
            names = reach if names is None else set(names) & reach
            exports = [(label, p) for label, p in exports if f"{lp.EXPORT} {label}" in reach]
            if names == {lp.PLAIN} and not exports:
                break
    return tuple(passes)


__all__ = ["DRAFTS", "KINDS", "MARGIN", "NGRAM_N", "N_MAX", "RUNS", "SHALLOW", "SHALLOW_DRAFT", "Ranked",
           "at_concurrency", "choose", "engine_run", "in_reach", "rank", "search_llamacpp", "server_version",
           "shallow_drafts"]
