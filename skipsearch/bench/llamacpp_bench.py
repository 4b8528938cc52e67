"""The llama.cpp peer inside ``skipsearch bench --peers llama.cpp``: which settings run (``--llama-settings``) and
the run itself (``bench_llamacpp``), after the timed rounds of the bench's own rows, so that no llama-server ever
competes with a timed row.

The bench's sweep rule holds for llama.cpp too: the speculative settings asked for run on the sweep prompts (the
calib split), the fastest one equal to HF greedy there is chosen (``llamacpp.choose_best``), and only plain, that
one and each benched profile's export then run on the bench prompts, against HF greedy's outputs of the bench's
own baseline row on the same prompt ids. ``llamacpp.py`` has the settings, the servers and the GGUFs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from skipsearch.bench import llamacpp as lp
from skipsearch.bench.llamacpp_ggufs import TARGETS, target_for
from skipsearch.checkpoints import ModelError
from skipsearch.config import ConfigError

PEER = lp.FAMILY  # the name --peers takes; not an HF contender, so not in peers.PEERS
EXPORTS = "export"  # in --llama-settings: each benched profile's own llama.cpp export
DRAFTS = ("q8_0", "q4_0")  # the self-drafts a setting may name
N_MAX = (2, 4, 8)  # the draft lengths a setting may name
# A bench stays short: plain, the Q8_0 self-draft, the n-gram and both at n-max 4, and each profile's export.
DEFAULT_SETTINGS = ("plain", "draft q8_0 n=4", "ngram 3/4", "ngram 3/4 + draft q8_0 n=4", EXPORTS)


@dataclass(frozen=True)
class LlamaPlan:
    """What ``--peers llama.cpp`` asks for."""

    server: str | None = None  # --llama-server; None: $SKIPSEARCH_LLAMA_SERVER, else llama-server on PATH
    settings: tuple[str, ...] = DEFAULT_SETTINGS  # setting names (llamacpp.grid's), EXPORTS for the profiles'
    threads: int | None = None  # llama-server -t; None: torch's intra-op threads during the bench
    checkpoint: str | None = None  # where the model loaded from (its tokenizer goes into the GGUFs); None: found
    cache: str | None = None  # where the GGUFs are kept; None: skipsearch's cache
    start_timeout: float = 300.0  # seconds a server may take to load
    targets: tuple[str, ...] = ()  # llama.cpp's target GGUFs, each a peer of its own (TARGETS); (): the default


def parse_targets(text: str | None, precision: str) -> tuple[str, ...]:
    """``--llama-target``, a comma list of ``TARGETS`` (f32, exact, q8_0), checked against the target precision
    before any model loads; None: () (the precision's default, ``target_for``'s)."""
    if text is None:
        return ()
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise ConfigError(f"--llama-target names no llama.cpp target: use {', '.join(TARGETS)}")
    for n in names:
        target_for(precision, n)
    return names


def known_settings() -> tuple[str, ...]:
    """Every name ``--llama-settings`` takes."""
    kinds = [k for k in lp.KINDS if k != lp.EXPORT]
    grid = lp.grid(drafts={d: f"draft-{d}.gguf" for d in DRAFTS}, n_max=N_MAX, kinds=kinds)
    return (*(s.name for s in grid), EXPORTS)


def parse_settings(text: str | None) -> tuple[str, ...]:
    """``--llama-settings``, a comma list of names, checked (before any model loads); None: the default grid."""
    if text is None:
        return DEFAULT_SETTINGS
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise ConfigError("--llama-settings names no llama.cpp setting")
    known = known_settings()
    for n in names:
        if n not in known:
            raise ConfigError(f"unknown llama.cpp setting '{n}': use {', '.join(known)}")
    return names


def export_labels(profiles: Sequence[tuple[str, object]]) -> list[tuple[str, object]]:
    """(label, profile) for each benched profile's export row: its file's stem, made unique as bench's rows are."""
    out: list[tuple[str, object]] = []
    for path, profile in profiles:
        stem, taken = Path(path).stem, {label for label, _ in out}
        out.append((next(n for n in (stem, *(f"{stem}#{k}" for k in range(2, 100))) if n not in taken), profile))
    return out


def bench_llamacpp(sm, plan: LlamaPlan, prompt_ids: Sequence[Sequence[int]], reference: Sequence[Sequence[int]], *,
                   sweep_ids: Sequence[Sequence[int]] = (), max_new_tokens: int, threads: int,
                   profiles: Sequence[tuple[str, object]] = (),
                   on_stage: Callable[[str, int], None] | None = None,
                   on_progress: Callable[[int, int, str], None] | None = None, target: str | None = None,
                   ) -> tuple[lp.LlamaCppResult, lp.LlamaCppResult | None]:
    """(the llama.cpp rows on ``prompt_ids``, the sweep that chose its setting or None), on llama.cpp's ``target``
    GGUF (``TARGETS``; None: the default). ``reference`` is HF greedy's output on each prompt (the bench's baseline
    row); on ``sweep_ids`` HF greedy decodes here. No binary, or a model that cannot be written as GGUF: one line in
    ``unavailable``, and the bench goes on."""
    found, missing = lp.find_server(plan.server)
    if found is None:
        return lp.LlamaCppResult(server=None, unavailable=missing), None
    grid_names = [n for n in plan.settings if n != EXPORTS]
    speculative = [n for n in grid_names if n != lp.PLAIN]
    common = dict(max_new_tokens=max_new_tokens, threads=plan.threads or threads, server=found,
                  checkpoint=plan.checkpoint, drafts=tuple(d for d in DRAFTS if any(f"draft {d} " in n
                                                                                    for n in grid_names)),
                  n_max=N_MAX, cache=plan.cache, start_timeout=plan.start_timeout, target=target)

    def rows(title: str, ids, names, **kwargs) -> lp.LlamaCppResult:
        if on_stage:
            on_stage(title if target is None else f"{title} ({target})", 0)
        step = (lambda name, i, n: on_progress(i, n, name)) if on_progress else None
        return lp.llamacpp_rows(sm, ids, names=names, on_setting=step, **common, **kwargs)

    try:
        sweep = None
        if sweep_ids and len(speculative) > 1:
            # 1. the speculative settings on the sweep prompts; the fastest equal to HF greedy there is chosen
            sweep = rows("sweep llama.cpp", sweep_ids, speculative, kinds=lp.SPECULATIVE)
            if sweep.unavailable:
                return sweep, None
            speculative = [sweep.best] if sweep.best else []
        # 2. plain, the chosen setting and the exports on the bench prompts, against the baseline row's outputs
        names = [n for n in grid_names if n == lp.PLAIN] + speculative
        exports = export_labels(profiles) if EXPORTS in plan.settings else []
        result = rows("llama.cpp", prompt_ids, names, reference=reference, profiles=exports)
    except (ConfigError, ModelError) as e:
        return lp.LlamaCppResult(server=found, unavailable=f"{PEER}: {e}"), None
    return result, sweep


__all__ = ["DEFAULT_SETTINGS", "EXPORTS", "PEER", "LlamaPlan", "bench_llamacpp", "export_labels", "known_settings",
           "parse_settings", "parse_targets"]
