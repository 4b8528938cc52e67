"""``skipsearch bench``: every method and the HF peers side by side, in one run, on the same prompt ids.

The timing itself is ``harness.run_rounds``, the one harness (warm-up, rotated rounds, every call
timed whole; its docstring has the rules). What bench adds:
- the HF peers as contenders (``model.generate`` with a forward counter, for τ and acceptance);
  profiles decode through ``methods.build_drafter`` + ``decoding.generate`` (the one engine),
  whatever their method;
- HF greedy is both the speed baseline and the reference output, in the same rounds. Every other
  output gets a verdict from ``equivalence.check`` (the model teacher-forced over it): identical,
  equal up to numerical ties (16-bit dtypes only), or different. A method that is different on any
  prompt is flagged and gets no speedup figure; tie-equal rows get one, with their tie count;
- each peer runs at its best setting, which ``sweep_peer`` finds on other prompts (the calib split);
- llama.cpp and vLLM, when asked for (``llamacpp_bench``, ``vllm_bench``), run after every timed round, on the same
  prompt ids, against HF greedy's outputs of the baseline row.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from skipsearch.bench.batched import BatchedBench, BatchedPlan, bench_batched, prepare
from skipsearch.bench.llamacpp import LlamaCppResult
from skipsearch.bench.llamacpp_bench import LlamaPlan, bench_llamacpp
from skipsearch.bench.peers import (
    BASELINE,
    HF_COMPILED,
    HF_PROFILE,
    PEERS,
    hf_compiled_method,
    hf_profile_method,
    peer_method,
    profile_method,
)
from skipsearch.bench.rows import BenchRow, model_verdicts, summarize
from skipsearch.bench.vllm_bench import VllmPlan, VllmResult, bench_vllm
from skipsearch.config import ConfigError
from skipsearch.data import Prompt
from skipsearch.engine import timing
from skipsearch.engine.equivalence import IDENTICAL
from skipsearch.engine.harness import (
    Contender,
    Progress,
    ours_autoregressive,
    run_rounds,
)
from skipsearch.kernels import Kernel
from skipsearch.memory import memory_probe
from skipsearch.model.skippable import SkippableModel


# -- the peer sweep --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sweep:
    """Every value of one peer's knob, timed against HF greedy on the sweep prompts."""

    peer: str
    option: str
    rows: tuple[BenchRow, ...]  # one per value, in the order tried
    best: int  # the chosen value: fastest among those with identical output (fastest overall if none)


def sweep_peer(
    sm: SkippableModel, peer: str, prompt_ids: Sequence[Sequence[int]], *, max_new_tokens: int,
    values: Sequence[int] | None = None, on_progress: Progress | None = None,
) -> Sweep:
    spec = PEERS.get(peer)
    if spec is None or spec.option is None:
        raise ConfigError(f"peer '{peer}' has no setting to sweep")
    values = tuple(values) if values is not None else spec.values(sm.num_layers)
    if not values:
        raise ConfigError(f"no values to sweep for {peer}")
    tried = [peer_method(sm, peer, v) for v in values]
    named = [Contender(f"{peer}[{v}]", m.family, m.setting, m.decode) for v, m in zip(values, tried, strict=True)]
    methods = [peer_method(sm, BASELINE), *named]
    runs = run_rounds(methods, prompt_ids, max_new_tokens=max_new_tokens, device=sm.device, on_progress=on_progress)
    rows = summarize(methods, runs, [str(i) for i in range(len(prompt_ids))],
                     verdicts=model_verdicts(sm, runs, prompt_ids))[1:]
    clean = [(r.tokens_per_s, v) for r, v in zip(rows, values, strict=True) if not r.flagged]
    best = max(clean or [(r.tokens_per_s, v) for r, v in zip(rows, values, strict=True)])[1]
    return Sweep(peer, spec.option, rows, best)


# -- one bench run ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchSettings:
    model: str
    device: str
    dtype: str
    dataset: str
    split: str
    n_prompts: int
    max_new_tokens: int
    repeats: int
    threads: int  # torch intra-op threads during the run
    sweep_prompts: int  # prompts each peer's sweep ran on (the calib split in the CLI)
    memory_kind: str  # what peak_memory_mib measures
    kernel: str = "eager"  # what ran skipsearch's own rows (skipsearch.kernels)
    precision: str = "native"  # the target's (model/target.py): int8 for the int8 weight-only model


@dataclass(frozen=True)
class PromptResult:
    """One method on one prompt: the per-prompt record behind every row."""

    method: str
    prompt_id: str  # "<source>:<id>"
    category: str
    new_tokens: int
    seconds: float  # median over repeats
    identical: bool  # equals HF greedy's output on this prompt
    verdict: str = IDENTICAL  # equivalence's verdict against HF greedy's output (every repeat)
    tie_tokens: int = 0  # tokens decided by a numerical tie (verdict TIES)


@dataclass(frozen=True)
class BenchReport:
    settings: BenchSettings
    environment: tuple[tuple[str, str | None], ...]
    rows: tuple[BenchRow, ...]
    categories: tuple[tuple[str, tuple[BenchRow, ...]], ...]  # (category, rows over its prompts)
    sweeps: tuple[Sweep, ...]
    prompts: tuple[PromptResult, ...]
    wall_seconds: float
    llama: LlamaCppResult | None = None  # the llama.cpp peer; None: not asked for
    llama_sweep: LlamaCppResult | None = None  # its settings on the sweep prompts, where it chose among several
    # the llama.cpp peer on each further target GGUF (--llama-target's after the first), with its sweep
    llama_more: tuple[tuple[LlamaCppResult, LlamaCppResult | None], ...] = ()
    batched: BatchedBench | None = None  # the section by batch size (bench --batch-sizes); None: not asked for
    vllm: VllmResult | None = None  # the vLLM peer; None: not asked for

    def row(self, method: str) -> BenchRow | None:
        return next((r for r in self.rows if r.method == method), None)


def _peer_methods(sm: SkippableModel, peers: Sequence[str], sweep_ids, *, capacity: int, max_new_tokens: int,
                  peer_values: dict[str, Sequence[int]] | None, sweep: bool, on_stage, on_progress
                  ) -> tuple[list[Contender], list]:
    """HF greedy, our autoregressive loop and each peer, a peer with a knob at its best value on the sweep prompts
    (or, unswept, its middle candidate); and the sweeps."""
    sweeps, methods = [], [peer_method(sm, BASELINE), ours_autoregressive(sm)]
    for peer in dict.fromkeys(peers):
        spec = PEERS[peer]
        if peer == HF_COMPILED:
            if on_stage:
                on_stage(f"compile {peer}", 0)
            methods.append(hf_compiled_method(sm, capacity=capacity + 1))
            continue
        if spec.option is None:
            continue
        values = tuple((peer_values or {}).get(peer) or spec.values(sm.num_layers))
        if not sweep:
            # unswept: the middle candidate, and the row says so
            best, note = values[len(values) // 2], " (not swept)"
        elif len(values) > 1:
            if not sweep_ids:
                raise ConfigError(f"sweeping {peer} needs sweep prompts (or one value for it)")
            if on_stage:
                on_stage(f"sweep {peer}", len(sweep_ids) * (len(values) + 1))
            sweeps.append(sweep_peer(sm, peer, sweep_ids, max_new_tokens=max_new_tokens, values=values,
                                     on_progress=on_progress))
            best, note = sweeps[-1].best, f" (best of {', '.join(map(str, values))})"
        else:
            best, note = values[0], ""
        m = peer_method(sm, peer, best)
        methods.append(Contender(m.name, m.family, m.setting + note, m.decode))
    return methods, sweeps


def _profile_methods(sm: SkippableModel, profiles: Sequence[tuple[str, object]], *, hf_profile: bool,
                     taken: Sequence[Contender], exports: contextlib.ExitStack, capacity: int) -> list[Contender]:
    """Each profile's row in skipsearch's engine and, with the hf-generate+profile peer, inside HF generate (its
    export folder lives in ``exports``); a name already taken gets #2, #3, ..."""
    made_all: list[Contender] = []
    for path, profile in profiles:
        made = [profile_method(sm, path, profile)]
        if hf_profile:
            import tempfile

            where = Path(exports.enter_context(tempfile.TemporaryDirectory(prefix="skipsearch-hf-export-")))
            made.append(hf_profile_method(sm, path, profile, where, capacity=capacity))
        for m in made:
            names = {x.name for x in (*taken, *made_all)}
            name = next(n for n in (m.name, *(f"{m.name}#{k}" for k in range(2, 100))) if n not in names)
            made_all.append(Contender(name, m.family, m.setting, m.decode))
    return made_all


def _per_prompt(methods: Sequence[Contender], runs, prompts: Sequence[Prompt], labels: Sequence[str],
                verdicts) -> tuple[PromptResult, ...]:
    """One row per method and prompt: tokens, the median seconds over repeats, whether every repeat's output is
    HF greedy's, and the verdict."""
    out = []
    for m in methods:
        for i, p in enumerate(prompts):
            rs = [r for r in runs if r.method == m.name and r.prompt == i]
            ref = next(r for r in runs if r.method == BASELINE and r.prompt == i).output.token_ids
            v = verdicts[m.name, i]
            out.append(PromptResult(m.name, labels[i], p.category, len(rs[0].output.token_ids),
                                    statistics.median(r.seconds for r in rs),
                                    all(r.output.token_ids == ref for r in rs), v.kind, v.tie_tokens))
    return tuple(out)


def _check_request(peers: Sequence[str], prompts: Sequence[Prompt], profiles: Sequence) -> None:
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise ConfigError(f"unknown peer '{unknown[0]}': use {', '.join(PEERS)}")
    if not prompts:
        raise ConfigError("a bench needs at least one prompt")
    if HF_PROFILE in peers and not profiles:
        raise ConfigError(f"{HF_PROFILE} runs the benched profiles inside HF generate: give --profiles")


def _encoded(sm: SkippableModel, prompts: Sequence[Prompt], sweep_prompts: Sequence[Prompt], *,
             max_new_tokens: int) -> tuple[list, list]:
    """The bench prompts' ids and the sweep prompts', each refused in one line where it cannot fit the model's
    context with ``max_new_tokens`` more (one far too long, by its length alone)."""
    from skipsearch.data import context_of, encode_all_within

    every = encode_all_within(sm.tokenizer, (*prompts, *sweep_prompts), context=context_of(sm.hf.config),
                              max_new_tokens=max_new_tokens)
    return every[:len(prompts)], every[len(prompts):]


def _by_category(methods: Sequence[Contender], runs, prompts: Sequence[Prompt], labels: Sequence[str], *,
                 flagged: frozenset[str], verdicts) -> tuple:
    """The rows again for each task category's prompts, with the flags of the rows over all prompts."""
    cats: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        cats.setdefault(p.category or "(none)", []).append(i)
    return tuple((c, summarize(methods, runs, labels, subset=idx, flagged=flagged, verdicts=verdicts))
                 for c, idx in cats.items())


def _reference(runs, n: int) -> list:
    """HF greedy's tokens on each prompt, from the main run: what an engine's outputs are checked against."""
    return [next(r for r in runs if r.method == BASELINE and r.prompt == i).output.token_ids for i in range(n)]


def _llama_rows(sm: SkippableModel, llama: LlamaPlan, runs, ids, sweep_ids, *, max_new_tokens: int, profiles,
                on_stage, on_progress) -> list[tuple[LlamaCppResult, LlamaCppResult | None]]:
    """llama.cpp's rows (``llamacpp_bench``) on each of its target GGUFs in turn, checked against HF greedy's
    tokens from the main run: [(rows, sweep)] per target."""
    reference = _reference(runs, len(ids))
    return [bench_llamacpp(sm, llama, ids, reference, sweep_ids=sweep_ids, max_new_tokens=max_new_tokens,
                           threads=torch.get_num_threads(), profiles=profiles, on_stage=on_stage,
                           on_progress=on_progress, target=target) for target in llama.targets or (None,)]


def bench(
    sm: SkippableModel,
    prompts: Sequence[Prompt],
    *,
    profiles: Sequence[tuple[str, object]] = (),
    peers: Sequence[str] = (BASELINE,),
    max_new_tokens: int = 128,
    repeats: int = 1,
    sweep_prompts: Sequence[Prompt] = (),
    peer_values: dict[str, Sequence[int]] | None = None,
    sweep: bool = True,
    dataset: str = "",
    split: str = "",
    on_stage: Callable[[str, int], None] | None = None,
    on_progress: Progress | None = None,
    kernel: Kernel | None = None,
    llama: LlamaPlan | None = None,
    batched: BatchedPlan | None = None,
    vllm: VllmPlan | None = None,
) -> BenchReport:
    """Bench ``profiles`` ((path, Profile) pairs) and ``peers`` on ``prompts``; HF greedy and our
    autoregressive path always run. Each peer with a knob is swept on ``sweep_prompts`` (over
    ``peer_values`` or its own candidates); with ``sweep=False`` it runs at its default value.
    ``on_stage(title, total calls)`` opens each stage. ``kernel`` runs skipsearch's own rows (the profiles and our
    autoregressive loop); a compiled one is built here, before any timing (None: what ``sm`` runs now). ``llama``
    adds the llama.cpp peer and ``vllm`` the vLLM peer, after every timed round (``llamacpp_bench``,
    ``vllm_bench``). ``batched`` adds the section by batch size (``bench.batched``), timed after the main rounds on
    the same prompts; what it refuses, it refuses first."""
    _check_request(peers, prompts, profiles)
    t0 = timing.now(sm.device)
    # 0. encode once: every method decodes exactly these ids; a prompt that cannot fit the model's context with
    # max_new_tokens more is refused here, in one line, before anything runs (one far too long, by its length alone)
    ids, sweep_ids = _encoded(sm, prompts, sweep_prompts, max_new_tokens=max_new_tokens)
    capacity = max(map(len, [*ids, *sweep_ids])) + max_new_tokens
    if kernel is not None:
        sm.use_kernel(kernel, capacity=capacity)
    # a method that cannot batch, or a batch that does not fit, is refused before anything is timed
    sizes = prepare(sm, batched, ids, max_new_tokens=max_new_tokens) if batched is not None else None
    # 1. each peer with a knob: sweep it on the sweep prompts and keep its best value
    methods, sweeps = _peer_methods(sm, peers, sweep_ids, capacity=capacity, max_new_tokens=max_new_tokens,
                                    peer_values=peer_values, sweep=sweep, on_stage=on_stage, on_progress=on_progress)
    exports = contextlib.ExitStack()
    if on_stage and profiles:  # a compiled draft's graph is built (or loaded) here
        on_stage("prepare the profiles' drafts", 0)
    methods += _profile_methods(sm, profiles, hf_profile=HF_PROFILE in peers, taken=methods, exports=exports,
                                capacity=capacity)
    # 2. the main run: every method, interleaved over the same prompt ids
    if on_stage:
        on_stage("bench", len(ids) * repeats * len(methods))
    with exports:  # the custom_generate directories live as long as the timed rounds
        runs = run_rounds(methods, ids, max_new_tokens=max_new_tokens, device=sm.device, repeats=repeats,
                          on_progress=on_progress)
    # 3. rows over all prompts, then per category with the same flags
    labels = [f"{p.source}:{p.id}" for p in prompts]
    verdicts = model_verdicts(sm, runs, ids)  # after the timed rounds: checking costs no one's time
    rows = summarize(methods, runs, labels, verdicts=verdicts)
    categories = _by_category(methods, runs, prompts, labels, flagged=frozenset(r.method for r in rows if r.flagged),
                              verdicts=verdicts)
    per_prompt = _per_prompt(methods, runs, prompts, labels, verdicts)
    # 4. by batch size: the engine's batched decoding, its schedule and each fixed K, and HF's batched generate
    section = None if batched is None else bench_batched(
        sm, batched, ids, labels, max_new_tokens=max_new_tokens, repeats=repeats, prepared=sizes, on_stage=on_stage,
        on_progress=on_progress)
    # 5. llama.cpp, last: its servers never share the machine with a timed row
    llamas = [(None, None)] if llama is None else _llama_rows(
        sm, llama, runs, ids, sweep_ids if sweep else (), max_new_tokens=max_new_tokens, profiles=profiles,
        on_stage=on_stage, on_progress=on_progress)
    vllm_result = None if vllm is None else bench_vllm(
        sm, vllm, ids, _reference(runs, len(ids)), max_new_tokens=max_new_tokens, threads=torch.get_num_threads(),
        profiles=profiles, on_stage=on_stage, on_progress=on_progress)
    settings = BenchSettings(
        model=sm.name, device=str(sm.device), dtype=sm.dtype_name, dataset=dataset, split=split,
        n_prompts=len(prompts), max_new_tokens=max_new_tokens, repeats=repeats, threads=torch.get_num_threads(),
        kernel=sm.kernel.label, sweep_prompts=len(sweep_ids), memory_kind=memory_probe(sm.device).kind,
        precision=getattr(sm, "target_precision", "native"))
    return BenchReport(settings=settings, environment=_environment(sm), rows=rows, categories=categories,
                       sweeps=tuple(sweeps), prompts=per_prompt, wall_seconds=timing.now(sm.device) - t0,
                       llama=llamas[0][0], llama_sweep=llamas[0][1], llama_more=tuple(llamas[1:]), batched=section,
                       vllm=vllm_result)


def _environment(sm: SkippableModel) -> tuple:
    """The report's environment: every field of ``hardware.Environment`` for ``sm``'s device, as (key, value)."""
    from skipsearch.hardware import Environment

    env = Environment.current(str(sm.device))
    return tuple((k, getattr(env, k)) for k in env.__dataclass_fields__)
