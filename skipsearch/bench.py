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
- each peer runs at its best setting, which ``sweep_peer`` finds on other prompts (the calib split).
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from skipsearch import timing
from skipsearch.config import ConfigError
from skipsearch.data import Prompt
from skipsearch.decoding import hf_generate
from skipsearch.equivalence import DIFFERENT, IDENTICAL, TIES, Verdict, check, worst
from skipsearch.harness import (
    OURS_AR,
    Contender,
    ContenderOutput,
    Progress,
    Run,
    engine_method,
    first_difference,
    method_seconds,
    ours_autoregressive,
    run_rounds,
)
from skipsearch.kernels import Kernel
from skipsearch.memory import memory_probe
from skipsearch.models import SkippableModel

BASELINE = "hf-greedy"  # the speed baseline and the reference output


@dataclass(frozen=True)
class Peer:
    """An HF ``generate`` decoding mode that users would otherwise pick, and the values of its knob."""

    name: str
    option: str | None  # the ``generate`` argument that is swept; None: nothing to set
    values: Callable[[int], tuple[int, ...]] = field(compare=False, repr=False)  # num_layers -> candidates


def early_exit_layers(num_layers: int) -> tuple[int, ...]:
    """Exit after about 1/8, 1/4 and 1/2 of the layers (4, 8, 15 for a 30-layer model)."""
    return tuple(sorted({min(max(1, round(num_layers * f)), num_layers - 1) for f in (1 / 8, 1 / 4, 1 / 2)}))


# hf-assisted-quantized: HF assisted generation whose assistant is a reduced-precision copy of the model
# itself (the peer a user can assemble from stock parts). Its knob is the assistant's schedule: 0 is HF's
# heuristic schedule (starting at 5 tokens, +2 after a full accept, -1 otherwise), k > 0 a constant k tokens.
ASSISTED = "hf-assisted-quantized"
HEURISTIC = 0
# hf-generate+profile: each benched profile exported for transformers (``skipsearch export --engine hf``) and run
# by model.generate through that custom_generate directory: a row per profile, beside the profile's own row.
HF_PROFILE = "hf-generate+profile"
PROFILE_IN_HF = "hf-profile"  # its rows' family: a skipsearch profile, run by HF generate; not an HF peer

# hf-compiled: HF generate with a static KV cache and torch.compile of the model's forward, the recipe transformers
# documents for its fastest greedy decoding, with the inductor settings skipsearch's compiled kernel uses (frozen
# weights, CPU GEMM templates), so that what compilation alone gains is measured apart from what speculation adds.
HF_COMPILED = "hf-compiled"

PEERS: dict[str, Peer] = {
    BASELINE: Peer(BASELINE, None, lambda n: ()),
    HF_COMPILED: Peer(HF_COMPILED, None, lambda n: ()),
    "hf-prompt-lookup": Peer("hf-prompt-lookup", "prompt_lookup_num_tokens", lambda n: (2, 4, 10)),
    "hf-early-exit": Peer("hf-early-exit", "assistant_early_exit", early_exit_layers),
    ASSISTED: Peer(ASSISTED, "num_assistant_tokens", lambda n: (HEURISTIC, 4, 6, 8)),
    HF_PROFILE: Peer(HF_PROFILE, None, lambda n: ()),
}


# -- methods ---------------------------------------------------------------------------------------
@dataclass
class _Forwards:
    full: int = 0  # forwards through every layer
    fed: int = 0  # positions those forwards processed
    draft: int = 0  # forwards with the layer count lowered (HF's early-exit draft)
    unknown: bool = False  # a forward without input_ids: counts cannot be trusted


@contextlib.contextmanager
def _count_forwards(sm: SkippableModel) -> Iterator[_Forwards]:
    """Count the HF model's forwards. HF's early-exit assistant is the model itself with
    ``config.num_hidden_layers`` lowered, so a lowered count marks a draft forward."""
    counts = _Forwards()
    base = getattr(sm.hf, sm.hf.base_model_prefix)

    def hook(module, args, kwargs) -> None:
        if base.config.num_hidden_layers < sm.num_layers:
            counts.draft += 1
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        counts.full += 1
        if ids is None:
            counts.unknown = True
        else:
            counts.fed += int(ids.shape[-1])

    handle = sm.hf.register_forward_pre_hook(hook, with_kwargs=True)
    layers = base.config.num_hidden_layers
    try:
        yield counts
    finally:
        handle.remove()
        # HF's early-exit drafter lowers the layer count without try/finally: an exception
        # inside it must not leave a truncated model for the methods that run next.
        base.config.num_hidden_layers = layers


def hf_method(sm: SkippableModel, name: str, *, setting: str = "", before: Callable[[], None] | None = None,
              **generate_kwargs) -> Contender:
    """An HF ``generate`` mode as a method; τ and acceptance come from counting its forwards.
    ``before`` runs ahead of every call (to reset state HF keeps between calls, e.g. an assistant's schedule)."""

    def decode(prompt_ids: Sequence[int], max_new_tokens: int) -> ContenderOutput:
        if before is not None:
            before()
        with _count_forwards(sm) as n:
            ids = hf_generate(sm, prompt_ids, max_new_tokens=max_new_tokens, **generate_kwargs)
        if n.unknown or n.full == 0:
            return ContenderOutput(ids)
        # Every full forward emits (its accepted drafts + 1) tokens. The first one also reads the
        # prompt, whose last token plays the part that the pending token plays in later forwards.
        drafted = n.fed - (len(prompt_ids) - 1) - n.full
        return ContenderOutput(
            ids, verify_steps=n.full - 1, drafted=drafted, accepted=max(len(ids) - n.full, 0),
            draft_steps=n.draft,
        )

    return Contender(name, "hf", setting or "model.generate(do_sample=False)", decode)


def peer_method(sm: SkippableModel, peer: str, value: int | None = None) -> Contender:
    """The peer ``peer`` at one value of its knob (the row name carries the value)."""
    spec = PEERS.get(peer)
    if spec is None:
        raise ConfigError(f"unknown peer '{peer}': use {', '.join(PEERS)}")
    if peer == ASSISTED:
        return _assisted_method(sm, HEURISTIC if value is None else value)
    if spec.option is None or value is None:
        return hf_method(sm, spec.name)
    return hf_method(sm, spec.name, setting=f"{spec.option}={value}", **{spec.option: value})


def hf_compiled_method(sm: SkippableModel, *, capacity: int) -> Contender:
    """HF greedy ``generate`` on a StaticCache of ``capacity`` positions, the model's forward compiled by
    torch.compile (dynamic prompt lengths, one-token steps static) inside the compiled kernel's inductor settings.
    Compiled here, on two warm-up prompts of different lengths, so that no timed call compiles."""
    import torch
    from transformers import StaticCache

    from skipsearch.kernels.inductor import inductor_settings

    cache = StaticCache(config=sm.hf.config, max_cache_len=capacity)
    compiled = torch.compile(sm.hf.forward)

    def generate_compiled(prompt_ids: Sequence[int], max_new_tokens: int, **kwargs):
        sm.hf.forward = compiled  # generate calls the module, which calls this instance's forward
        try:
            with torch.inference_mode():
                cache.reset()
            with inductor_settings():
                return hf_generate(sm, prompt_ids, max_new_tokens=max_new_tokens, cache=cache, **kwargs)
        finally:
            del sm.hf.forward

    for length in (3, 7):  # the first prefill compiles static, the second dynamic; the step compiles once
        generate_compiled([1] * length, 2)
    def decode(prompt_ids: Sequence[int], max_new_tokens: int) -> ContenderOutput:
        return ContenderOutput(generate_compiled(prompt_ids, max_new_tokens))  # forwards uncounted: compiled

    return Contender(HF_COMPILED, "hf", "generate(cache=StaticCache), torch.compile(model.forward)", decode)


def _assisted_method(sm: SkippableModel, value: int) -> Contender:
    """HF assisted generation with the model's own reduced-precision copy (fp16 weights on a CPU, int8 on a
    GPU: the schemes of the precision draft, their real kernels) as the assistant, at one schedule."""
    from skipsearch.methods.precision import quantized_assistant

    assistant, scheme = quantized_assistant(sm)
    schedule = "heuristic" if value == HEURISTIC else "constant"

    def reset() -> None:  # HF's heuristic schedule moves num_assistant_tokens on the assistant's own config
        assistant.generation_config.num_assistant_tokens_schedule = schedule
        assistant.generation_config.num_assistant_tokens = 5 if value == HEURISTIC else value

    setting = f"assistant={scheme} copy, {schedule}" + ("" if value == HEURISTIC else f" {value}")
    return hf_method(sm, ASSISTED, setting=setting, before=reset, assistant_model=assistant)


def profile_method(sm: SkippableModel, path: str, profile) -> Contender:
    """A profile of any registered method, decoded through the one engine with a fresh drafter per prompt."""
    from skipsearch import methods

    name = f"{profile.method}:{Path(path).stem}"
    candidate = profile.candidate
    methods.build_drafter(candidate, sm)  # parameters that do not fit the model fail here, before any timing
    return engine_method(sm, name, lambda _ids: methods.build_drafter(candidate, sm), setting=str(path))


def hf_profile_method(sm: SkippableModel, path: str, profile, directory: Path, *, capacity: int) -> Contender:
    """``profile`` exported for transformers into ``directory`` and decoded by ``model.generate(custom_generate=
    directory)``, as a user runs it: transformers loads the directory's generate.py on every call, and that runs the
    engine. τ and acceptance come from the engine's stats, which the exported function hands back. It runs the
    kernel our own rows run (``sm.kernel``), built for the bench's ``capacity`` as theirs is, by the exported
    function itself (a second compile, in the warm-up: a user's process compiles it once too)."""
    from skipsearch.export import hf

    hf.write(directory, profile)
    name = f"{HF_PROFILE}:{Path(path).stem}"
    kernel = sm.kernel.label

    def decode(prompt_ids: Sequence[int], max_new_tokens: int) -> ContenderOutput:
        stats = []
        ids = hf_generate(sm, prompt_ids, max_new_tokens=max_new_tokens, custom_generate=str(directory),
                          trust_remote_code=True, skipsearch_stats=stats.append, skipsearch_kernel=kernel,
                          skipsearch_capacity=capacity)
        s = stats[0]
        return ContenderOutput(ids, verify_steps=s.verify_steps, drafted=s.drafted_tokens, accepted=s.accepted_tokens,
                               draft_steps=s.draft_steps, draft_seconds=s.draft_seconds,
                               verify_seconds=s.verify_seconds, drafter_stats=s.drafter_stats)

    return Contender(name, PROFILE_IN_HF, f"model.generate(custom_generate=export of {path})", decode)


# -- summaries -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchRow:
    method: str
    family: str
    setting: str
    prompts: int
    identical: int  # prompts whose output equals HF greedy's, token for token (every repeat)
    new_tokens: int
    seconds: float  # sum over prompts of the median over repeats: the method's wall time
    tokens_per_s: float
    speedup: float | None  # HF greedy seconds / this method's seconds; None when its output differs
    vs_ours_ar: float | None  # our autoregressive path's seconds / this method's seconds (same rule)
    tau: float | None  # tokens emitted per full-model forward after the first (as ``decode`` reports)
    acceptance_rate: float | None  # accepted / drafted draft tokens
    peak_memory_mib: float | None  # the largest per-call peak (see BenchSettings.memory_kind)
    added_memory_mib: float | None  # the largest per-call peak above what was in use before the call
    draft_ms: float | None  # mean draft forward, skipsearch methods only
    verify_ms: float | None  # mean verify forward (pending + drafts), skipsearch methods only
    first_mismatch: str | None  # "prompt <id>, token <j>[: why]": the first position outside tolerance
    ties: int = 0  # prompts not identical but equal to HF greedy up to numerical ties (equivalence.py)
    tie_tokens: int = 0  # tokens decided by a tie, summed over those prompts

    @property
    def flagged(self) -> bool:
        """Different from HF greedy on some prompt: no speedup figure."""
        return self.identical + self.ties < self.prompts

    @property
    def verdict(self) -> str:
        """The row's verdict over its prompts: the worst of theirs."""
        return DIFFERENT if self.flagged else TIES if self.ties else IDENTICAL


Verdicts = dict[tuple[str, int], Verdict]  # (method, prompt index) -> its output against HF greedy's


def exact_verdicts(runs: Sequence[Run], *, reference: str = BASELINE) -> Verdicts:
    """Verdicts without a model: identical, or different at the first differing token. For runs whose
    model is gone; ``model_verdicts`` tells ties apart."""
    return _verdicts(runs, reference, lambda i, got, want: Verdict(
        DIFFERENT, len(got), "", (), first_difference(got, want), first_difference(got, want)))


def model_verdicts(sm: SkippableModel, runs: Sequence[Run], prompt_ids: Sequence[Sequence[int]], *,
                   reference: str = BASELINE) -> Verdicts:
    """Every method's output on every prompt against the reference's, by ``equivalence.check``: one
    teacher-forced forward per output that is not identical, run after (never inside) the timed rounds."""
    return _verdicts(runs, reference, lambda i, got, want: check(sm, prompt_ids[i], got, want))


def _verdicts(runs: Sequence[Run], reference: str, differs) -> Verdicts:
    ref = {r.prompt: r.output.token_ids for r in runs if r.method == reference and r.repeat == 0}
    outputs: dict[tuple[str, int], list[tuple[int, ...]]] = {}
    for r in runs:
        seen = outputs.setdefault((r.method, r.prompt), [])
        if r.output.token_ids not in seen:
            seen.append(r.output.token_ids)
    out = {}
    for (name, i), outs in outputs.items():
        want = ref.get(i)
        if want is None:  # the reference did not run on this prompt: nothing to be equal to
            out[name, i] = Verdict(DIFFERENT, len(outs[0]), "", reason="no reference output")
            continue
        # every repeat's output is judged; the prompt's verdict is the least equal of them
        out[name, i] = worst([Verdict(IDENTICAL, len(got), "") if got == want else differs(i, got, want)
                              for got in outs])
    return out


def summarize(
    methods: Sequence[Contender], runs: Sequence[Run], prompt_labels: Sequence[str], *,
    subset: Sequence[int] | None = None, flagged: frozenset[str] = frozenset(), verdicts: Verdicts | None = None,
) -> tuple[BenchRow, ...]:
    """One row per method over ``subset`` of the prompts (all by default).

    ``flagged`` names methods that differ somewhere in the run: they get no speedup even on a
    subset where they happen to match. ``verdicts`` (``model_verdicts``) judge each output against
    HF greedy's; without them only identical output counts (``exact_verdicts``).
    """
    prompts = list(range(len(prompt_labels))) if subset is None else list(subset)
    if verdicts is None:
        verdicts = exact_verdicts(runs)
    seconds = method_seconds(runs, prompts=prompts)
    base_s, ar_s = seconds.get(BASELINE), seconds.get(OURS_AR)
    rows = []
    for m in methods:
        mine = [r for r in runs if r.method == m.name and r.prompt in prompts]
        if not mine:
            continue
        ran = sorted({r.prompt for r in mine})
        mine_v = [(i, verdicts[m.name, i]) for i in ran]
        kinds = [v.kind for _, v in mine_v]
        mismatch = next((f"prompt {prompt_labels[i]}, token {v.position}" + (f": {v.reason}" if v.reason else "")
                         for i, v in mine_v if not v.ok), None)
        secs = method_seconds(mine, prompts=ran)[m.name]
        # counts from the first repeat: decoding is deterministic
        outs = [r.output for r in sorted(mine, key=lambda r: r.prompt) if r.repeat == 0]
        tokens = sum(len(o.token_ids) for o in outs)
        clean = DIFFERENT not in kinds and m.name not in flagged
        rows.append(BenchRow(
            method=m.name, family=m.family, setting=m.setting, prompts=len(ran), identical=kinds.count(IDENTICAL),
            new_tokens=tokens, seconds=secs, tokens_per_s=tokens / secs if secs > 0 else 0.0,
            speedup=base_s / secs if clean and base_s and secs > 0 else None,
            vs_ours_ar=ar_s / secs if clean and ar_s and secs > 0 else None,
            tau=_ratio([len(o.token_ids) - 1 for o in outs], [o.verify_steps for o in outs]),
            acceptance_rate=_ratio([o.accepted for o in outs], [o.drafted for o in outs]),
            peak_memory_mib=max(r.peak_bytes for r in mine) / 2**20 or None,
            added_memory_mib=max(r.added_bytes for r in mine) / 2**20,
            draft_ms=_ms([o.draft_seconds for o in outs], [o.draft_steps for o in outs]),
            verify_ms=_ms([o.verify_seconds for o in outs], [o.verify_steps for o in outs]),
            first_mismatch=mismatch, ties=kinds.count(TIES),
            tie_tokens=sum(v.tie_tokens for _, v in mine_v if v.kind == TIES),
        ))
    return tuple(rows)


def _ratio(num: Sequence[int | None], den: Sequence[int | None]) -> float | None:
    if any(v is None for v in (*num, *den)) or not sum(den):
        return None
    return sum(num) / sum(den)


def _ms(seconds: Sequence[float | None], steps: Sequence[int | None]) -> float | None:
    r = _ratio(seconds, steps)  # type: ignore[arg-type]
    return None if r is None else 1000 * r


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

    def row(self, method: str) -> BenchRow | None:
        return next((r for r in self.rows if r.method == method), None)


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
) -> BenchReport:
    """Bench ``profiles`` ((path, Profile) pairs) and ``peers`` on ``prompts``; HF greedy and our
    autoregressive path always run. Each peer with a knob is swept on ``sweep_prompts`` (over
    ``peer_values`` or its own candidates); with ``sweep=False`` it runs at its default value.
    ``on_stage(title, total calls)`` opens each stage. ``kernel`` runs skipsearch's own rows (the profiles and our
    autoregressive loop); a compiled one is built here, before any timing (None: what ``sm`` runs now)."""
    from skipsearch.data import encode_prompt
    from skipsearch.profile import Environment

    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise ConfigError(f"unknown peer '{unknown[0]}': use {', '.join(PEERS)}")
    if not prompts:
        raise ConfigError("a bench needs at least one prompt")
    t0 = timing.now(sm.device)
    # 0. encode once: every method decodes exactly these ids
    ids = [encode_prompt(sm.tokenizer, p) for p in prompts]
    sweep_ids = [encode_prompt(sm.tokenizer, p) for p in sweep_prompts]
    capacity = max(map(len, [*ids, *sweep_ids])) + max_new_tokens
    if kernel is not None:
        sm.use_kernel(kernel, capacity=capacity)
    # 1. each peer with a knob: sweep it on the sweep prompts and keep its best value
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
    if HF_PROFILE in peers and not profiles:
        raise ConfigError(f"{HF_PROFILE} runs the benched profiles inside HF generate: give --profiles")
    exports = contextlib.ExitStack()
    for path, profile in profiles:
        made = [profile_method(sm, path, profile)]
        if HF_PROFILE in peers:
            import tempfile

            where = Path(exports.enter_context(tempfile.TemporaryDirectory(prefix="skipsearch-hf-export-")))
            made.append(hf_profile_method(sm, path, profile, where, capacity=capacity))
        for m in made:
            taken = {x.name for x in methods}
            name = next(n for n in (m.name, *(f"{m.name}#{k}" for k in range(2, 100))) if n not in taken)
            methods.append(Contender(name, m.family, m.setting, m.decode))
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
    flagged = frozenset(r.method for r in rows if r.flagged)
    cats: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        cats.setdefault(p.category or "(none)", []).append(i)
    categories = tuple((c, summarize(methods, runs, labels, subset=idx, flagged=flagged, verdicts=verdicts))
                       for c, idx in cats.items())
    per_prompt = []
    for m in methods:
        for i, p in enumerate(prompts):
            rs = [r for r in runs if r.method == m.name and r.prompt == i]
            ref = next(r for r in runs if r.method == BASELINE and r.prompt == i).output.token_ids
            v = verdicts[m.name, i]
            per_prompt.append(PromptResult(m.name, labels[i], p.category, len(rs[0].output.token_ids),
                                           statistics.median(r.seconds for r in rs),
                                           all(r.output.token_ids == ref for r in rs), v.kind, v.tie_tokens))
    settings = BenchSettings(
        model=sm.name, device=str(sm.device), dtype=sm.dtype_name, dataset=dataset, split=split,
        n_prompts=len(prompts), max_new_tokens=max_new_tokens, repeats=repeats, threads=torch.get_num_threads(),
        kernel=sm.kernel.label,
        sweep_prompts=len(sweep_ids), memory_kind=memory_probe(sm.device).kind,
    )
    env = Environment.current(str(sm.device))
    return BenchReport(
        settings=settings, environment=tuple((k, getattr(env, k)) for k in env.__dataclass_fields__),
        rows=rows, categories=categories, sweeps=tuple(sweeps), prompts=tuple(per_prompt),
        wall_seconds=timing.now(sm.device) - t0,
    )
