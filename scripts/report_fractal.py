"""Measure FractalLLM on one model and write the report (default: studies/fractal-smollm2-cpu.md).

    PYTHONPATH=. .venv/bin/python scripts/report_fractal.py                       # the full report
    PYTHONPATH=. .venv/bin/python scripts/report_fractal.py --n-prompts 1 --max-new-tokens 8 \\
        --n 3 --w 3 --out /tmp/fractal-smoke.md                                  # a smoke run

Everything is timed in this one process by the one harness (``skipsearch.engine.harness.run_rounds``:
warm-up, then every method once per round, the order rotated every round so that drift favours
none, HF greedy in the same rounds): HF greedy (``model.generate``), skipsearch's autoregressive
engine, every (n, w) of the grid with the KV cache, the same points without it (``--no-cache`` picks
which), and a layer-skip profile if one is given. Every output must equal HF greedy token for token;
the script exits 1 if one does not.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import torch
from _common import ints_or_exit, prompt_ids, script_model

from skipsearch import api
from skipsearch.bench import BASELINE, peer_method
from skipsearch.engine.harness import Contender, check_outputs, engine_method, first_outputs, method_seconds, run_rounds
from skipsearch.methods.fractal import FractalParams
from skipsearch.methods.fractal.compressed import compressed_model, model_bytes
from skipsearch.methods.fractal.drafter import FractalDrafter
from skipsearch.profile import load_profile

PAPER_DELTA = 0.74  # Appendix A: N + 0.74 tokens accepted per verification (Llama-3 3B, N = 7, GPU, no cache)


@dataclass
class Row:
    """What one method did over all prompts (median seconds over repeats, per prompt, summed)."""

    label: str
    seconds: float = 0.0
    tokens: int = 0
    verify_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    prompts: int = 0
    mismatches: list[str] = field(default_factory=list)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def accepted_per_verify(self) -> float | None:
        return self.accepted / self.verify_steps if self.verify_steps else None

    @property
    def tau(self) -> float | None:
        # emitted tokens per verification; the prefill's token belongs to no verification
        return (self.tokens - self.prompts) / self.verify_steps if self.verify_steps else None


def _rss_mib() -> float | None:
    """Resident memory after returning freed heap to the OS (glibc), so that transient copies do not count."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _methods(sm, args) -> list[Contender]:
    n_values, w_values = ints_or_exit(args.n, "--n"), ints_or_exit(args.w, "--w")
    out = [peer_method(sm, BASELINE), engine_method(sm, "autoregressive", lambda _ids: None)]
    for n in n_values:
        for w in w_values:
            params = FractalParams(n=n, w=w, quantization=args.quantization)
            params.positions(sm.num_layers)
            for kv_cache in (True, False):
                if kv_cache or args.no_cache == "all" or (args.no_cache == "diagonal" and n == w):
                    # without its cache the drafter re-reads the whole sequence, so it needs the prompt
                    out.append(engine_method(
                        sm, f"fractal n={n} w={w}" + ("" if kv_cache else " no-cache"),
                        lambda ids, p=params, kv=kv_cache: FractalDrafter(sm, p, kv_cache=kv, prompt_ids=ids)))
    if args.layer_skip_profile:
        prof = load_profile(args.layer_skip_profile, num_layers=sm.num_layers)
        make = api.drafter_factory(prof, sm)
        out.append(engine_method(sm, f"layer-skip ({Path(args.layer_skip_profile).name})", lambda _ids: make()))
    return out


def measure(sm, prompts: list[list[int]], methods: list[Contender], *, max_new_tokens: int, repeats: int,
            say: Callable[[str], None]) -> dict[str, Row]:
    """Time every method through the one harness; one Row each, HF greedy the reference."""

    def progress(done: int, total: int, what: str) -> None:
        if done % len(methods) == 0:  # a round is complete
            say(f"round {done // len(methods)}/{total // len(methods)} done")

    runs = run_rounds(methods, prompts, max_new_tokens=max_new_tokens, device=sm.device, repeats=repeats,
                      warmup_tokens=8, reference=BASELINE, on_progress=progress)
    seconds = method_seconds(runs)
    checks = check_outputs(runs, reference=BASELINE)
    rows = {}
    for m in methods:
        row = Row(m.name, seconds=seconds[m.name], prompts=len(prompts),
                  mismatches=[f"prompt {i}" for i, _ in checks[m.name].mismatches])
        for out in first_outputs(runs, m.name):
            row.tokens += len(out.token_ids)
            row.verify_steps += out.verify_steps or 0
            row.drafted += out.drafted or 0
            row.accepted += out.accepted or 0
            row.draft_seconds += out.draft_seconds or 0.0
            row.verify_seconds += out.verify_seconds or 0.0
        rows[m.name] = row
    return rows


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def render(sm, args, rows: dict[str, Row], *, prompt_lens: list[int], memory: dict[str, float | None]) -> str:
    hf = rows["hf-greedy"]
    n_values, w_values = ints_or_exit(args.n, "--n"), ints_or_exit(args.w, "--w")

    def speedup(label: str) -> float | None:
        row = rows.get(label)
        return hf.seconds / row.seconds if row and row.seconds else None

    lines = [
        f"# FractalLLM on {sm.name}, {sm.device} {sm.dtype_name}",
        "",
        f"Generated by `scripts/report_fractal.py` on {date.today().isoformat()}: "
        f"`{' '.join(['scripts/report_fractal.py', *sys.argv[1:]])}`.",
        "",
        "## Setup",
        f"- model: {sm.name} ({sm.num_layers} layers), {sm.dtype_name}, torch threads {torch.get_num_threads()}, "
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}",
        f"- prompts: {len(prompt_lens)} from `{args.dataset}` (heldout split, seed {args.seed}), "
        f"{min(prompt_lens)}-{max(prompt_lens)} tokens; {args.max_new_tokens} new tokens each; greedy",
        f"- timing: one process, the one harness (skipsearch.engine.harness): every method once per round, HF greedy "
        f"included, order rotated every round; median of {args.repeats} run(s) per prompt and method, summed over "
        "prompts; speedup = HF greedy seconds / method seconds",
        f"- baseline: HF `generate(do_sample=False)` on the same model, {hf.tok_s:.2f} tok/s here; skipsearch's "
        f"autoregressive engine: {rows['autoregressive'].tok_s:.2f} tok/s ({_fmt(speedup('autoregressive'), '.3f')}x)",
        "- every output below equals HF greedy token for token: "
        + ("yes" if not any(r.mismatches for r in rows.values()) else
           "NO: " + "; ".join(f"{r.label}: {', '.join(r.mismatches)}" for r in rows.values() if r.mismatches)),
        "- fractal layers at the paper's even spacing (0-based positions "
        + ", ".join(f"n={n}: {list(FractalParams(n=n, w=1).positions(sm.num_layers))}" for n in n_values) + ")",
        "",
        "## Memory added by the compressed copy",
        f"- scheme `{memory['scheme']}`; model parameters {memory['model_mib']:.1f} MiB; compressed copy "
        f"{memory['copy_mib']:.1f} MiB (+{100 * memory['copy_mib'] / memory['model_mib']:.0f}%), counted from its "
        "tensors (int8 weights, scales, fp32 norms and biases)",
        f"- process RSS grew by {_fmt(memory['rss_mib'], '.1f')} MiB when the copy was built (model weights paged in "
        "first, freed heap trimmed; includes the int8 kernels' packing overhead)",
        "",
        "## Speedup over HF greedy, with the KV cache (rows n, columns w)",
        "",
        "| n \\ w | " + " | ".join(str(w) for w in w_values) + " |",
        "|---|" + "---|" * len(w_values),
    ]
    for n in n_values:
        lines.append(f"| {n} | " + " | ".join(_fmt(speedup(f"fractal n={n} w={w}"), ".3f") + "x"
                                             for w in w_values) + " |")
    lines += [
        "",
        "## Tokens accepted per verification against n",
        "",
        "Accepted draft tokens per verification (the first draft token is the full model's own next token, so it "
        f"is accepted whenever float noise allows); tau adds the verifier's own token. The paper reports N + "
        f"{PAPER_DELTA} for N = 7 on Llama-3 3B (GPU, no cache): that figure is quoted, not measured here.",
        "",
        "| n | w | accepted / verification | minus n | tau | acceptance rate | draft share of time |",
        "|---|---|---|---|---|---|---|",
    ]
    for n in n_values:
        for w in w_values:
            r = rows[f"fractal n={n} w={w}"]
            apv = r.accepted_per_verify
            share = r.draft_seconds / (r.draft_seconds + r.verify_seconds) if r.draft_seconds else None
            lines.append(f"| {n} | {w} | {_fmt(apv)} | {_fmt(None if apv is None else apv - n, '+.2f')} | "
                         f"{_fmt(r.tau)} | {_fmt(r.accepted / r.drafted if r.drafted else None)} | {_fmt(share)} |")
    no_cache = [label for label in rows if label.endswith("no-cache")]
    lines += ["", "## With and without the KV cache", ""]
    if no_cache:
        lines += [
            "Without the cache the draft pass recomputes the whole sequence through every layer, as the paper did; "
            "verification still uses the engine's cache in both columns, and the baseline is HF greedy with its cache.",
            "",
            "| n | w | speedup, cache | speedup, no cache | tok/s, cache | tok/s, no cache | accepted/verify, cache "
            "| no cache |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for label in no_cache:
            cached = rows[label.removesuffix(" no-cache")]
            plain = rows[label]
            nw = label.removeprefix("fractal ").removesuffix(" no-cache").replace("n=", "").replace(" w=", " | ")
            lines.append(f"| {nw} | {_fmt(speedup(cached.label), '.3f')}x | {_fmt(speedup(label), '.3f')}x | "
                         f"{cached.tok_s:.2f} | {plain.tok_s:.2f} | {_fmt(cached.accepted_per_verify)} | "
                         f"{_fmt(plain.accepted_per_verify)} |")
    else:
        lines.append("Not measured in this run (`--no-cache none`).")
    fractal_rows = [r for label, r in rows.items() if label.startswith("fractal") and not label.endswith("no-cache")]
    best = max(fractal_rows, key=lambda r: speedup(r.label) or 0.0)
    skip = [r for label, r in rows.items() if label.startswith("layer-skip")]
    lines += ["", "## Best fractal profile against the best layer-skip profile", ""]
    table = ["| method | speedup over HF greedy | tok/s | tau |", "|---|---|---|---|"]
    for r in [best, *skip]:
        table.append(f"| {r.label} | {_fmt(speedup(r.label), '.3f')}x | {r.tok_s:.2f} | {_fmt(r.tau)} |")
    lines += table
    if not skip:
        lines += ["", "No layer-skip profile was given (`--layer-skip-profile`), so none was timed in this run."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dataset", default="mtbench,humaneval")
    ap.add_argument("--n-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--n", default="3,5,7", help="numbers of fractal layers")
    ap.add_argument("--w", default="3,5,7", help="draft windows")
    ap.add_argument("--no-cache", choices=("diagonal", "all", "none"), default="diagonal",
                    help="which grid points also run without the KV cache (diagonal: w = n)")
    ap.add_argument("--quantization", default="auto")
    ap.add_argument("--layer-skip-profile", default=None, help="a layer-skip profile to time in the same run")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="studies/fractal-smollm2-cpu.md")
    args = ap.parse_args(argv)
    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    sm = script_model(args.model, threads=args.threads, device="auto", dtype="auto")
    with torch.no_grad():  # the weights are memory-mapped: page them all in, or the copy's reads would count
        for t in sm.hf.parameters():
            t.sum()
    rss0 = _rss_mib()
    cm = compressed_model(sm, args.quantization)
    rss1 = _rss_mib()
    memory = {"scheme": cm.scheme, "model_mib": model_bytes(sm) / 2**20, "copy_mib": cm.nbytes / 2**20,
              "rss_mib": None if rss0 is None or rss1 is None else rss1 - rss0}
    prompts = prompt_ids(sm, args.dataset, split="heldout", n=args.n_prompts, seed=args.seed)
    methods = _methods(sm, args)
    say(f"{len(methods)} methods x {len(prompts)} prompts x {args.repeats} repeat(s), {args.max_new_tokens} tokens")
    rows = measure(sm, prompts, methods, max_new_tokens=args.max_new_tokens, repeats=args.repeats, say=say)
    text = render(sm, args, rows, prompt_lens=[len(p) for p in prompts], memory=memory)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    say(f"wrote {out}")
    return 1 if any(r.mismatches for r in rows.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
