"""vLLM's own speculative settings searched on its own server (``skipsearch optimize --engine vllm``), with the
draft length chosen per number of requests in flight.

What a setting does in vLLM depends on vLLM's verify cost, its proposer and its scheduler, not skipsearch's, and
it changes with load: a K that pays with one request can lose with four in flight. So each setting of a grid
(vLLM's n-gram lookup at several draft lengths, and a profile's own ``export --engine vllm`` where it is a lookup)
gets a server of its own (``bench.vllm.run_levels``) and is timed at every concurrency of ``levels`` there, in
``runs`` passes, the second in reverse order with plain last. Every output is checked against HF greedy's.

At each concurrency C the settings are ranked as any engine's are (``engine_rank``: identical on every prompt of
every pass, worse pass's ratio to plain's throughput in the same pass). For each lookup, its K at each C is the K
of that lookup that beat plain there by ``margin`` in every pass, or 0 where none did (``k_by_level``); the lookup
whose table gains most ships it (``best_schedule``), as vLLM's ``num_speculative_tokens_per_batch_size``
(``scheduled``), K = 0 past the largest C measured. That config is timed once more as it would ship, against plain,
at every C: it ships only if it stayed identical and ran at least as fast as plain at every one (``engine_run``).
"""

from __future__ import annotations

import datetime
import json
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from skipsearch.bench import engine_rank as er
from skipsearch.bench.vllm import VllmRow, run_levels
from skipsearch.export.vllm import METHODS, PER_BATCH, check_batch_ranges, is_lookup
from skipsearch.files.engine_runs import VLLM_FLAG as FLAG
from skipsearch.files.engine_runs import EngineRun
from skipsearch.servers.process import ServerError

ENGINE = "vllm"
LOOKUP = "lookup"  # a setting's kind: vLLM's prompt lookup (its config's method is vLLM's word for it)
KS = (2, 4, 6)  # draft lengths of the grid's lookups
LOOKUPS = ((2, 4),)  # (prompt_lookup_min, prompt_lookup_max) of the grid's lookups
LEVELS = (1, 2, 4)


@dataclass(frozen=True)
class Served:
    """One setting's server in one pass: a row per concurrency, or the one-line error that stopped it."""

    name: str
    kind: str  # plain, or lookup
    config: dict | None  # its --speculative-config; None: plain decoding
    rows: tuple[VllmRow, ...] = ()
    error: str | None = None

    def at(self, level: int) -> VllmRow | None:
        return next((r for r in self.rows if r.concurrency == level), None)


def lookup_config(k: int, lookup: tuple[int, int]) -> dict:
    return {"method": METHODS["lookup"], "num_speculative_tokens": int(k), "prompt_lookup_min": int(lookup[0]),
            "prompt_lookup_max": int(lookup[1])}


def label(config: dict) -> str:
    """A grid setting's name: ``ngram 2-4 K 4``."""
    return f"ngram {config['prompt_lookup_min']}-{config['prompt_lookup_max']} K {config['num_speculative_tokens']}"


def grid(ks: Sequence[int] = KS, lookups: Sequence[tuple[int, int]] = LOOKUPS,
         exports: Sequence[tuple[str, dict]] = ()) -> list[tuple[str, str, dict | None]]:
    """(name, kind, config) of every setting: plain first, each lookup at each K, then each profile's export (a
    lookup config; one the grid holds already is not served twice)."""
    out = [(er.PLAIN, er.PLAIN, None)]
    out += [(label(c), LOOKUP, c) for lk in lookups for c in (lookup_config(k, lk) for k in ks)]
    for name, config in exports:
        if all(config != c for _, _, c in out):
            out.append((f"{name} export", LOOKUP, config))
    return out


def family(config: dict | None) -> tuple | None:
    """What a config is but for its draft length: settings of one family differ only in K."""
    if not config:
        return None
    return tuple(sorted((k, json.dumps(v)) for k, v in config.items() if k not in ("num_speculative_tokens",
                                                                                   PER_BATCH)))


def search_vllm(python: str | Path, model_dir: str | Path, prompt_ids: Sequence[Sequence[int]],
                reference: Sequence[Sequence[int]], *, max_new_tokens: int, log_dir: Path,
                settings: Sequence[tuple[str, str, dict | None]], levels: Sequence[int] = LEVELS, runs: int = 2,
                threads: int | None = None, start_timeout: float = 900.0, memory_fraction: float | None = 0.25,
                on_setting: Callable[[int, str, int, int], None] | None = None) -> tuple[tuple[Served, ...], ...]:
    """``runs`` passes over ``settings`` (``grid``), odd passes reversed with plain last; each setting one server,
    timed at every concurrency of ``levels``. A setting whose server fails is kept with its error; a pass whose
    plain decoding fails ends the search with it (run first, it ends the pass there too)."""
    passes = []
    for i in range(runs):
        order = list(settings) if i % 2 == 0 else [*[s for s in settings[::-1] if s[1] != er.PLAIN],
                                                   *[s for s in settings if s[1] == er.PLAIN]]
        served = []
        for j, (name, kind, config) in enumerate(order):
            if on_setting:
                on_setting(i, name, j, len(order))
            try:
                rows = run_levels(python, model_dir, name, config, prompt_ids, reference,
                                  max_new_tokens=max_new_tokens, log_dir=log_dir, levels=levels, threads=threads,
                                  start_timeout=start_timeout, memory_fraction=memory_fraction)
                served.append(Served(name, kind, config, rows))
            except ServerError as e:
                served.append(Served(name, kind, config, error=f"{name}: {e}"))
                if kind == er.PLAIN:  # plain first: a server that cannot decode plainly fails every setting as slowly
                    break
        if on_setting:
            on_setting(i, "", len(order), len(order))
        passes.append(tuple(served))
        plain = next(s for s in served if s.kind == er.PLAIN)
        if plain.error:
            break
    return tuple(passes)


def ranked_at(passes: Sequence[Sequence[Served]], level: int) -> tuple[er.Ranked, ...]:
    """The settings ranked at ``level`` requests in flight (``engine_rank.rank``)."""
    def timed(s: Served) -> er.Timed:
        row = s.at(level)
        flags = (FLAG, json.dumps(s.config, sort_keys=True)) if s.config else ()
        if row is None:
            return er.Timed(s.name, s.kind, flags, None, None, 0, 0, s.error or f"{s.name}: not timed at {level}")
        return er.Timed(s.name, s.kind, flags, None, row.tokens_per_s, row.identical, row.prompts, s.error)

    return er.rank([[timed(s) for s in p] for p in passes])


def k_by_level(passes: Sequence[Sequence[Served]], chosen: str, levels: Sequence[int],
               margin: float = er.MARGIN) -> tuple[tuple[int, int, float], ...]:
    """(C, K, its ratio to plain) for each concurrency: the K of ``chosen``'s lookup that beat plain by ``margin``
    in every pass at C and ran fastest there, or (C, 0, 1.0) where none did."""
    configs = {s.name: s.config for s in passes[0]}
    mine = family(configs[chosen])
    out = []
    for level in sorted(levels):
        kin = [r for r in ranked_at(passes, level) if r.kind != er.PLAIN and family(configs[r.name]) == mine
               and r.clean and r.worst >= margin]
        best = max(kin, key=lambda r: r.worst, default=None)
        out.append((level, configs[best.name]["num_speculative_tokens"], round(best.worst, 4)) if best is not None
                   else (level, 0, 1.0))
    return tuple(out)


def best_schedule(passes: Sequence[Sequence[Served]], levels: Sequence[int],
                  margin: float = er.MARGIN) -> tuple[dict, tuple[tuple[int, int], ...]] | None:
    """The lookup whose K per concurrency gains most over plain (summed over the concurrencies where a K won), as
    (its config with that table as ``num_speculative_tokens_per_batch_size``, the (C, K) table); None where no K
    of any lookup beat plain at any concurrency."""
    best, score, seen = None, 0.0, set()
    for s in passes[0]:
        if not s.config or family(s.config) in seen:
            continue
        seen.add(family(s.config))
        table = k_by_level(passes, s.name, levels, margin)
        gain = sum(ratio - 1.0 for _, k, ratio in table if k)
        if gain > score:
            base = {k: v for k, v in s.config.items() if k != PER_BATCH}
            best, score = (scheduled(base, [(c, k) for c, k, _ in table]), tuple((c, k) for c, k, _ in table)), gain
    return best


def batch_ranges(ks: Sequence[tuple[int, int]]) -> list[list[int]]:
    """vLLM's ``[start, end, k]`` ranges of a (C, K) table: each K from its C up to the next C, K = 0 past the
    largest C (never measured there), neighbours of one K merged."""
    out: list[list[int]] = []
    table = sorted(ks)
    for i, (level, k) in enumerate(table):
        end = table[i + 1][0] - 1 if i + 1 < len(table) else level
        if out and out[-1][2] == k:
            out[-1][1] = end
        else:
            out.append([level, end, k])
    if out[-1][2] != 0:
        out.append([out[-1][1] + 1, out[-1][1] + 1, 0])
    return out


def scheduled(config: dict, ks: Sequence[tuple[int, int]]) -> dict | None:
    """``config`` with the (C, K) table as ``num_speculative_tokens_per_batch_size`` (checked by vLLM's rules);
    None where it never drafts."""
    ranges = batch_ranges(ks)
    top = max(k for _, _, k in ranges)
    if top == 0:
        return None
    out = {**config, "num_speculative_tokens": top, PER_BATCH: ranges}
    check_batch_ranges(ranges, top)
    return out


def schedule_label(config: dict) -> str:
    """``ngram 2-4 K 4@1 2@2-3 0@4+``: the lookup and its K per batch size."""
    def span(s: int, e: int, last: bool) -> str:
        return f"{s}+" if last else (f"{s}" if s == e else f"{s}-{e}")

    ranges = config.get(PER_BATCH) or [[1, 1, config["num_speculative_tokens"]]]
    head = f"ngram {config['prompt_lookup_min']}-{config['prompt_lookup_max']}" if is_lookup(config) \
        else str(config.get("method"))
    return head + " K " + " ".join(f"{k}@{span(s, e, i == len(ranges) - 1)}" for i, (s, e, k) in enumerate(ranges))


def server_version(python: str | Path) -> str:
    """``vllm <version>`` of the venv ``python`` runs, or "unknown"."""
    try:
        done = subprocess.run([str(python), "-c", "import vllm; print(vllm.__version__)"], capture_output=True,
                              text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    line = done.stdout.strip().splitlines()[-1:] if done.returncode == 0 else []
    return f"vllm {line[0][:80]}" if line else "unknown"


def engine_run(grid_passes, checked, *, version: str, hardware: str, target: str, workload: str,
               margin: float = er.MARGIN) -> EngineRun:
    """The record the profile keeps. ``checked``: the passes that timed plain and the scheduled config as it would
    ship (None where nothing won alone); it ships only if identical and at least as fast as plain at every C."""
    at_one = ranked_at(grid_passes, 1)
    _, best = er.choose(at_one, margin)
    shipped = None
    levels: tuple[tuple[int, float], ...] = ()
    if checked is not None:
        levels = check_ratios(checked)
        if levels and all(ratio >= 1.0 for _, ratio in levels):  # none: its server never answered
            shipped = next(r for r in ranked_at(checked, 1) if r.kind != er.PLAIN)
    source = checked if shipped is not None else grid_passes
    plain = next(r for r in ranked_at(source, 1) if r.kind == er.PLAIN)
    row = shipped or plain

    def rates(values: tuple[float, ...]) -> tuple[float, ...]:
        return tuple(round(v, 2) for v in values)

    return EngineRun(
        engine=ENGINE, version=version, hardware=hardware, target=target, setting=row.name, kind=row.kind,
        args=row.flags, draft=None, concurrency=1, runs=len(source), plain_tokens_per_s=rates(plain.tokens_per_s),
        tokens_per_s=rates(row.tokens_per_s), speedup=round(row.worst, 4) if shipped is not None else 1.0,
        margin=margin, best_tried=best.name if best is not None else None,
        best_tried_speedup=round(best.worst, 4) if best is not None else None, identical=row.identical,
        prompts=row.prompts, checked_against="HF greedy", workload=workload,
        date=datetime.date.today().isoformat(), at_concurrency=tuple((c, r) for c, r in levels if c > 1))


def check_ratios(checked) -> tuple[tuple[int, float], ...]:
    """(C, the scheduled setting's worse pass over plain's) for every concurrency the check timed (``er.ratio``:
    0.0 where it differed or failed); none where its server never answered."""
    setting = next(s for s in checked[0] if s.kind != er.PLAIN)
    return tuple(sorted((r.concurrency, er.ratio(ranked_at(checked, r.concurrency), setting.name))
                        for r in setting.rows))


__all__ = ["ENGINE", "FLAG", "KS", "LEVELS", "LOOKUP", "LOOKUPS", "PER_BATCH", "Served", "batch_ranges",
           "best_schedule", "check_ratios", "engine_run", "family", "grid", "k_by_level", "label", "lookup_config",
           "ranked_at", "schedule_label", "scheduled", "search_vllm", "server_version"]
