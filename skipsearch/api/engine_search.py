"""``skipsearch optimize --engine llama.cpp|vllm`` as a library function: the serving engine's own speculative
settings, timed on its own server against its own plain decoding (``bench/llamacpp_search.py``,
``bench/vllm_search.py``), and the profile that records what it measured (``measured.engines``), so that ``export
--engine E`` writes that setting, or refuses where nothing beat plain.

The profile is ``profile`` (whose own export joins the grid) with the record added, or, without one, a profile
of the model that decodes plainly in skipsearch and carries the record. Everything that can be wrong with the input
fails before the model loads; nothing is written here (the caller writes ``EngineSearched.profile``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from skipsearch.api.checks import check_model_arg, check_prompts_fit
from skipsearch.config import NO_EXIT, ConfigError, DraftConfig
from skipsearch.files.engine_runs import EngineRun
from skipsearch.hardware import cpu_signature
from skipsearch.methods import PLAIN as PLAIN_METHOD
from skipsearch.model.target import NATIVE, check_precision
from skipsearch.profile import (
    Environment,
    Measured,
    ModelRef,
    Profile,
    check_model,
    check_profile_target,
    load_profile,
    with_engine_run,
    without_engine_run,
)

LLAMA, VLLM = "llama.cpp", "vllm"
ENGINES = (LLAMA, VLLM)  # what --engine takes here


@dataclass(frozen=True)
class EngineSearchSettings:
    engine: str = "llama.cpp"
    out: str | os.PathLike = "llama.cpp.yaml"
    model: str | None = None
    profile: str | None = None  # the profile the record is added to (its own export joins the grid)
    dataset: str = "mtbench,humaneval"
    n_prompts: int = 8
    max_new_tokens: int = 64
    seed: int = 0
    threads: int | None = None  # llama-server -t (None: torch's intra-op threads)
    target_precision: str | None = None  # native: an F32 target; int8: the model at Q8_0 (None: the profile's)
    server: str | None = None  # the llama-server (None: $SKIPSEARCH_LLAMA_SERVER, else PATH)
    # llama.cpp's target GGUF (``llamacpp_ggufs.TARGETS``: f32, exact, q8_0; None: the precision's, F32 or Q8_0)
    llama_target: str | None = None
    vllm_python: str | None = None  # the Python of vLLM's venv (None: $SKIPSEARCH_VLLM_PYTHON)
    log_dir: str | None = None  # vLLM: where each server's log goes (None: beside --out, <out stem>-logs)
    runs: int = 2
    margin: float = 1.03
    force: bool = False
    # requests in flight at once the chosen setting is checked at (besides 1, where the grid is timed): it ships
    # only if at least as fast as plain at every one
    concurrency: tuple[int, ...] = (2, 4)


@dataclass(frozen=True)
class EngineSearched:
    profile: Profile  # to write at ``path``
    path: Path
    run: EngineRun
    ranked: tuple  # engine_rank.Ranked alone (C = 1), plain first, then the fastest clean setting
    verdict: str  # one line
    # vLLM: (C, the settings ranked with C requests in flight) for each concurrency its grid was timed at
    by_level: tuple = ()


def optimize_engine(s: EngineSearchSettings, *, on_setting: Callable[[int, str, int, int], None] | None = None,
                    on_note: Callable[[str], None] | None = None) -> EngineSearched:
    """Search ``s.engine``'s settings for the model and return the profile that records them (see the module)."""
    import torch

    from skipsearch.data import context_of, encode_all_within, load_prompts
    from skipsearch.engine.calibration import calibration_workload
    from skipsearch.model.loader import load_model

    # 1. the input, before the model loads
    if s.engine not in ENGINES:
        raise ConfigError(f"--engine {s.engine}: optimize searches {', '.join(ENGINES)} settings here")
    if s.runs < 1 or s.n_prompts < 1 or s.max_new_tokens < 1:
        raise ConfigError("--n-prompts and --max-new-tokens must be >= 1")
    if not s.concurrency or any(c < 1 or c > 64 for c in s.concurrency):
        raise ConfigError(f"--concurrency takes requests in flight from 1 to 64, got {s.concurrency}")
    check_model_arg(s.model)
    path = check_profile_target(s.out, force=s.force)
    base = load_profile(s.profile) if s.profile else None
    if base is not None and s.model not in (None, base.model.name):
        raise ConfigError(f"--model {s.model} differs from the profile's model {base.model.name}")
    precision = s.target_precision or (base.model.target_precision if base is not None else NATIVE)
    check_precision(precision, device="cpu", dtype="float32")
    if s.engine == VLLM and precision != NATIVE:
        raise ConfigError("--engine vllm serves the model's own checkpoint in fp32; its 8-bit peer is llama.cpp's "
                          "Q8_0 (--engine llama.cpp --target-precision int8)")
    if s.llama_target is not None:
        from skipsearch.bench.llamacpp_ggufs import target_for

        if s.engine != LLAMA:
            raise ConfigError(f"--llama-target goes with --engine {LLAMA}, not --engine {s.engine}")
        target_for(precision, s.llama_target)  # a name it does not know, or one the int8 target has not: one line
    found = _find(s)
    name = base.model.name if base is not None else (s.model or "smollm2-135m")
    prompts = load_prompts(s.dataset, split="calib", n=s.n_prompts, seed=s.seed)
    check_prompts_fit(name, prompts, max_new_tokens=s.max_new_tokens)
    if base is not None:
        check_model(base, precision=precision, source=s.profile)
    # 2. the model: the reference outputs, and the files the engine decodes
    if s.threads:
        torch.set_num_threads(s.threads)
    threads = s.threads or torch.get_num_threads()
    sm = load_model(name, device="cpu", dtype="float32", precision=precision)
    if base is not None:
        check_model(base, num_layers=sm.num_layers, fingerprint=sm.fingerprint, source=s.profile)
    ids = encode_all_within(sm.tokenizer, prompts, context=context_of(sm.hf.config), max_new_tokens=s.max_new_tokens)
    # the profile's own setting (not one an earlier search recorded for it)
    own = without_engine_run(base, s.engine) if base is not None else None
    env = Environment.current("cpu", placement=sm.placement)
    hardware = (f"{env.cpu_model or 'unknown CPU'}, {env.cpu_capability or 'unknown ISA'}, {threads} thread(s), "
                f"{cpu_signature()}")
    found_run = _llamacpp if s.engine == LLAMA else _vllm
    run, ranked, verdict, by_level = found_run(
        s, sm, ids, name=name, own=own, found=found, threads=threads, hardware=hardware,
        workload=calibration_workload(s.dataset, s.n_prompts, s.max_new_tokens), on_setting=on_setting)
    # 3. the profile that carries the record
    if base is None:
        base = Profile(model=ModelRef.of(sm), method=PLAIN_METHOD, draft=DraftConfig(max_draft_tokens=0, exit=NO_EXIT),
                       environment=env,
                       measured=Measured(source=f"optimize --engine {s.engine}", dataset=s.dataset,
                                         n_prompts=s.n_prompts, max_new_tokens=s.max_new_tokens, seed=s.seed,
                                         device="cpu", notes=f"decodes plainly in skipsearch; carries what "
                                                             f"{s.engine} measured (measured.engines)"))
    profile = with_engine_run(base, run)  # a fresh profile names the int8 target through ModelRef.of(sm)
    if on_note:
        on_note(run.summary())
    return EngineSearched(profile, path, run, ranked, verdict, by_level)


def _find(s: EngineSearchSettings) -> str:
    """The engine's server binary (llama.cpp) or its venv's Python (vLLM); one line where there is none."""
    if s.engine == LLAMA:
        from skipsearch.bench.llamacpp import find_server

        found, missing = find_server(s.server)
    else:
        from skipsearch.servers.vllm import find_python

        found, missing = find_python(s.vllm_python)
    if found is None:
        raise ConfigError(missing)
    return found


def _verdict(s: EngineSearchSettings, run: EngineRun, checks, alone: str | None) -> str:
    """One line: what ships, or why plain does. ``checks``: (C, ratio) of the chosen setting with C in flight;
    ``alone``: the chosen setting alone, as ``name (1.07x)``, where it was checked."""
    lost = [f"{c} request{'s' if c > 1 else ''} in flight: "
            + (f"{ratio:.2f}x" if ratio else "an output differed from the reference, or a request failed")
            for c, ratio in checks if ratio < 1.0]
    if lost and alone:
        return (f"{s.engine}'s chosen setting, {alone}, lost to its plain decoding with "
                f"{', '.join(lost)}: plain ships")
    if run.ships_plain:
        return (f"{s.engine} ran nothing faster than its plain decoding by {s.margin - 1:.0%} in every pass: plain "
                f"ships" + (f" (fastest identical: {run.best_tried}, {run.best_tried_speedup:.2f}x)"
                            if run.best_tried else ""))
    return (f"{s.engine} ships {run.setting}: {run.speedup:.2f}x its plain decoding (the worse of {run.runs} "
            f"passes)" + "".join(f"; {c} requests in flight: {ratio:.2f}x" for c, ratio in checks))


def _llamacpp(s: EngineSearchSettings, sm, ids, *, name, own, found, threads, hardware, workload, on_setting):
    """llama.cpp's grid in two passes, the chosen setting checked with requests in flight; (record, ranked,
    verdict, ())."""
    from skipsearch.bench import llamacpp as lp
    from skipsearch.bench import llamacpp_ggufs as lg
    from skipsearch.bench import llamacpp_search as ls
    from skipsearch.checkpoints import find_checkpoint
    from skipsearch.engine.decoding import hf_generate

    exports = [(Path(s.profile).stem, own)] if own is not None and own.draft.max_draft_tokens else []
    checkpoint = find_checkpoint(name).path
    # the fp32 model's greedy outputs: what an F32 target's outputs are checked against, and the tokens CLaSp's
    # DP picks the shallow self-drafts' layers on
    source = lg.gguf_source(sm, checkpoint)
    greedy = [hf_generate(source, x, max_new_tokens=s.max_new_tokens) for x in ids]
    shallow = ls.shallow_drafts(source, ids, greedy)
    # an F32 target is HF's numbers, checked against HF greedy; exact and Q8_0 against their own plain decoding
    target = lg.target_type(sm, s.llama_target)
    passes = ls.search_llamacpp(sm, ids, max_new_tokens=s.max_new_tokens, threads=threads, server=found,
                                checkpoint=checkpoint, profiles=exports, runs=s.runs, on_setting=on_setting,
                                shallow=shallow, reference=greedy if target == lg.F32 else None,
                                margin=s.margin, target=target)
    if passes and passes[-1].unavailable:
        raise ConfigError(passes[-1].unavailable)
    if not passes or passes[0].setting(lp.PLAIN) is None or passes[0].setting(lp.PLAIN).error:
        why = passes[0].setting(lp.PLAIN).error if passes and passes[0].setting(lp.PLAIN) else "it did not run"
        raise ConfigError(f"llama.cpp's plain decoding failed, so nothing can be timed against it: {why}")
    ranked = ls.rank(passes)
    ships, _ = ls.choose(ranked, s.margin)
    checks = []
    if ships is not None:  # the chosen setting against plain with several requests in flight, where users serve
        reference = [c.tokens for c in passes[0].setting(lp.PLAIN).completions]  # HF greedy's, or Q8_0's own
        for c in sorted(set(s.concurrency) - {1}):
            at = ls.search_llamacpp(sm, ids, max_new_tokens=s.max_new_tokens, threads=threads, server=found,
                                    checkpoint=checkpoint, runs=s.runs,
                                    profiles=exports if ships.kind == lp.EXPORT else (), names={lp.PLAIN, ships.name},
                                    concurrency=c, reference=reference,
                                    shallow=[sh for sh in shallow if sh.layers == ships.draft_layers], target=target,
                                    on_setting=(lambda i, n, j, t, c=c: on_setting(i, f"{n} @{c}", j, t))
                                    if on_setting else None)
            checks.append((c, ls.at_concurrency(at, ships.name)))
    run = ls.engine_run(passes, ranked, version=ls.server_version(found), hardware=hardware, workload=workload,
                        margin=s.margin, concurrency=checks)
    alone = f"{ships.name} ({ships.worst:.2f}x)" if ships is not None else None
    return run, ranked, _verdict(s, run, checks, alone), ()


def _vllm(s: EngineSearchSettings, sm, ids, *, name, own, found, threads, hardware, workload, on_setting):
    """vLLM's grid in two passes at every concurrency, the best lookup's K per concurrency as a schedule, checked as
    it would ship; (record, ranked alone, verdict, ranked at each concurrency)."""
    from skipsearch.bench import engine_rank as er
    from skipsearch.bench import vllm_search as vs
    from skipsearch.checkpoints import ensure_embedded
    from skipsearch.engine.decoding import hf_generate

    levels = tuple(sorted({1, *s.concurrency}))
    exports = [(Path(s.profile).stem, c) for c in (_vllm_lookup(own),) if c is not None]
    model_dir = ensure_embedded(name)
    log_dir = Path(s.log_dir) if s.log_dir else Path(s.out).with_name(f"{Path(s.out).stem}-logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    reference = [hf_generate(sm, p, max_new_tokens=s.max_new_tokens) for p in ids]
    common = dict(max_new_tokens=s.max_new_tokens, log_dir=log_dir, levels=levels, runs=s.runs, threads=threads)
    passes = vs.search_vllm(found, model_dir, ids, reference, settings=vs.grid(exports=exports),
                            on_setting=on_setting, **common)
    why = next((x.error for p in passes for x in p if x.kind == er.PLAIN and x.error), None)
    if why:
        raise ConfigError(f"vLLM's plain decoding failed, so nothing can be timed against it: {why}")
    by_level = tuple((c, vs.ranked_at(passes, c)) for c in levels)
    ranked = dict(by_level)[1]
    found_schedule = vs.best_schedule(passes, levels, s.margin)
    checked = None
    if found_schedule is not None:  # timed again as it would ship, against plain, at every concurrency
        shipped, ks = found_schedule
        as_shipped = [(er.PLAIN, er.PLAIN, None), (vs.schedule_label(shipped), vs.LOOKUP, shipped)]
        checked = vs.search_vllm(found, model_dir, ids, reference, settings=as_shipped,
                                 on_setting=(lambda i, n, j, t: on_setting(i, f"check {n}", j, t))
                                 if on_setting else None, **common)
    run = vs.engine_run(passes, checked, version=vs.server_version(found), hardware=hardware,
                        target=f"{Path(model_dir).name} (fp32 checkpoint)", workload=workload, margin=s.margin)
    checks = list(run.at_concurrency)
    alone = None
    if checked is not None and run.ships_plain:  # where it lost: alone too (0.0: its server never answered)
        checks = [(1, dict(vs.check_ratios(checked)).get(1, 0.0)), *checks]
        alone = f"{vs.schedule_label(shipped)} (K by concurrency {dict(ks)})"
    return run, ranked, _verdict(s, run, checks, alone), by_level


def _vllm_lookup(own: Profile | None) -> dict | None:
    """The profile's own vLLM export where it is a lookup (its nearest, where vLLM cannot run it all); None where
    it is not one (a draft model's export is served by vLLM's draft_model method, not searched here)."""
    if own is None:
        return None
    from skipsearch.export import vllm as ev

    config, _ = ev.nearest_config(own)
    return config if ev.is_lookup(config) else None


__all__ = ["ENGINES", "EngineSearchSettings", "EngineSearched", "optimize_engine"]
