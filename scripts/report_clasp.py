"""CLaSp report: static vs dynamic CLaSp vs a tpe profile, LOI and M sweeps, DP vs brute force.

Everything is measured in this one process, on held-out prompts (not the calibration half), against
HF greedy ``generate`` as the baseline; every method's tokens are checked equal to HF's.

    python scripts/report_clasp.py --static profiles/smollm2-135m/cpu-float32-clasp.yaml \\
        --dynamic profiles/smollm2-135m/cpu-float32-clasp-dynamic.yaml \\
        --tpe profiles/smollm2-135m/cpu-float32-tpe.yaml --out studies/clasp-smollm2-cpu.md

Check it on tiny settings first: ``--n-prompts 1 --max-new-tokens 8 --lois 2 --ms 2 --bf-tokens 2
--bf-max-m 2 --out /tmp/r.md``.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace
from pathlib import Path

import torch

from skipsearch import timing
from skipsearch.api import drafter_factory
from skipsearch.clasp import ClaspDynamicDrafter, ModelLayers, approximation_check, dp_skip_sets, dynamic_params
from skipsearch.data import encode_prompt, load_prompts
from skipsearch.decoding import generate, hf_generate
from skipsearch.models import load_model
from skipsearch.profile import load_profile


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def run_method(sm, prompts, make_drafter, *, max_new_tokens: int, refs) -> dict:
    """Decode every prompt with a fresh drafter; return totals and check output against HF."""
    secs = draft = verify = dp = 0.0
    tokens = drafted = accepted = cycles = 0
    for ids, (ref, _) in zip(prompts, refs, strict=True):
        res = generate(sm, ids, drafter=make_drafter(), max_new_tokens=max_new_tokens)
        if res.token_ids != ref:
            raise SystemExit(f"output differs from HF greedy: {res.token_ids[:8]}... vs {ref[:8]}...")
        s = res.stats
        secs += s.seconds
        draft += s.draft_seconds
        verify += s.verify_seconds
        dp += dict(s.drafter_stats).get("dp_seconds", 0.0)
        tokens += s.new_tokens
        drafted += s.drafted_tokens
        accepted += s.accepted_tokens
        cycles += s.verify_steps
    base = sum(t for _, t in refs)
    return {"speedup": base / secs, "tau": (tokens - len(prompts)) / cycles if cycles else 1.0,
            "acceptance": accepted / drafted if drafted else float("nan"), "dp_share": dp / secs,
            "draft_share": draft / secs, "verify_share": verify / secs, "seconds": secs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--static", help="clasp static profile (layer-skip)")
    ap.add_argument("--dynamic", required=True, help="clasp-dynamic profile")
    ap.add_argument("--tpe", help="the best tpe profile, for comparison")
    ap.add_argument("--dataset", default="mtbench,humaneval")
    ap.add_argument("--n-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--lois", default="1,2,4,8,16,32")
    ap.add_argument("--ms", default="2,4,6,8,10,12")
    ap.add_argument("--sub-range", default="10-19", help="layers first-last for the brute-force check")
    ap.add_argument("--bf-tokens", type=int, default=8, help="tokens the brute-force check averages over")
    ap.add_argument("--bf-max-m", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="studies/clasp-smollm2-cpu.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    sm = load_model(args.model)
    dyn = load_profile(args.dynamic, num_layers=sm.num_layers)
    params = dynamic_params(dyn, source=args.dynamic)
    prompts = [encode_prompt(sm.tokenizer, p) for p in load_prompts(args.dataset, split="heldout", n=args.n_prompts)]
    n = args.max_new_tokens
    hf_generate(sm, prompts[0], max_new_tokens=min(n, 8))  # warm-up
    refs = []
    for ids in prompts:
        t0 = timing.now(sm.device)
        ref = hf_generate(sm, ids, max_new_tokens=n)
        refs.append((ref, timing.now(sm.device) - t0))
    lines = [f"# CLaSp on {args.model} (CPU, {args.threads} thread)", "",
             f"Held-out prompts: {len(prompts)} from {args.dataset} (heldout split), {n} new tokens each. Baseline: "
             f"HF greedy `generate`, same process ({sum(t for _, t in refs):.2f} s in all). Every method's tokens "
             "were checked equal to HF's. Shares are of each method's own wall time.", "",
             "| method | speedup | tau | acceptance | draft | verify | DP |", "|---|---|---|---|---|---|---|"]

    def row(label, r):
        lines.append(f"| {label} | {r['speedup']:.3f}x | {r['tau']:.2f} | {r['acceptance']:.2f} | "
                     f"{r['draft_share']:.0%} | {r['verify_share']:.0%} | {r['dp_share']:.1%} |")

    # 1. static vs dynamic vs tpe
    for label, path in (("static CLaSp", args.static), ("dynamic CLaSp", args.dynamic), ("tpe", args.tpe)):
        if path:
            prof = load_profile(path, num_layers=sm.num_layers)
            row(f"{label} (`{Path(path).name}`)", run_method(sm, prompts, drafter_factory(prof, sm),
                                                            max_new_tokens=n, refs=refs))

    # 2. LOI and M sweeps of the dynamic profile
    def dynamic(p):
        return lambda: ClaspDynamicDrafter(p, dyn.draft, num_layers=sm.num_layers)

    lines += ["", f"## Dynamic CLaSp against LOI (M = {params.num_skips}, {params.sublayer})", "",
              "| LOI | speedup | tau | acceptance | draft | verify | DP |", "|---|---|---|---|---|---|---|"]
    for loi in _ints(args.lois):
        row(str(loi), run_method(sm, prompts, dynamic(replace(params, loi=loi)), max_new_tokens=n, refs=refs))
    lines += ["", f"## Dynamic CLaSp against M (LOI = {params.loi}, {params.sublayer})", "",
              "| M | speedup | tau | acceptance | draft | verify | DP |", "|---|---|---|---|---|---|---|"]
    for m in _ints(args.ms):
        row(str(m), run_method(sm, prompts, dynamic(replace(params, num_skips=m)), max_new_tokens=n, refs=refs))

    # 3. the DP's cost: sequence-parallel against the naive double loop, one token as in decoding
    ids = list(prompts[0]) + list(refs[0][0])
    cache = sm.new_cache()
    _, hidden = sm.forward_hidden(torch.tensor(ids), start=0, cache=cache)
    pos = len(ids) - 1
    layers = ModelLayers(sm, [cache], [torch.tensor([pos])], sublayer=params.sublayer)
    allowed = range(1, sm.num_layers - 1)
    timings = {}
    dp_ms = sorted({params.num_skips, max(_ints(args.ms))})  # the batching only pays where M > 1 states exist
    for m in dp_ms:
        for batched in (True, False):
            t, res = timing.time_call(lambda b=batched, m=m: dp_skip_sets(hidden[:, pos : pos + 1], layers.run,
                                                                          max_skips=m, allowed=allowed,
                                                                          skip=layers.skip, batched=b),
                                      device=sm.device, repeats=3)
            timings[m, batched] = (t.median, res.layer_calls)

    def one_step():
        sm.crop(cache, pos)
        sm.forward(torch.tensor([ids[-1]]), start=pos, cache=cache, last_only=True)

    step, _ = timing.time_call(one_step, device=sm.device, repeats=5)
    sm.crop(cache, pos + 1)
    lines += ["", f"## DP cost (one token at context {pos}, {params.sublayer})", "",
              "| M | DP | median seconds | layer calls | vs one full decode step |", "|---|---|---|---|---|"]
    for m in dp_ms:
        for batched, label in ((True, "sequence-parallel (one call per layer)"), (False, "naive double loop")):
            secs, calls = timings[m, batched]
            lines.append(f"| {m} | {label} | {secs:.4f} | {calls} | {secs / step.median:.2f}x |")
    lines.append("\nSequence-parallel against the naive loop: "
                 + ", ".join(f"{timings[m, False][0] / timings[m, True][0]:.2f}x faster at M = {m}" for m in dp_ms)
                 + f"; one full decode step here takes {step.median:.4f} s.")

    # 4. the approximation: DP vs brute force on a sub-range of middle layers, the others always run
    first, last = _ints(args.sub_range.replace("-", ","))
    sub_range = list(range(first, last + 1))
    n_tok = min(args.bf_tokens, len(refs[0][0]))
    tok_pos = torch.tensor(sorted({len(prompts[0]) - 1 + (k * len(refs[0][0])) // n_tok for k in range(n_tok)}))
    targets = hidden[:, tok_pos]
    check = approximation_check(targets, ModelLayers(sm, [cache], [tok_pos], sublayer="layer"), sub_range=sub_range,
                                num_skips=range(1, min(args.bf_max_m, len(sub_range)) + 1))
    lines += ["", f"## DP vs brute force (whole layers {first}-{last}; mean cosine with h_L over {len(tok_pos)} "
              "tokens; paper Fig. 3b)", "",
              "| m | DP | brute force | random (mean of all subsets) | worst | same set | DP set | best set |",
              "|---|---|---|---|---|---|---|---|"]
    for r in check:
        lines.append(f"| {r['m']} | {r['dp']:.4f} | {r['brute']:.4f} | {r['random_mean']:.4f} | {r['worst']:.4f} | "
                     f"{'yes' if r['same_set'] else 'no'} | {list(r['dp_set'])} | {list(r['brute_set'])} |")
    gaps = [r["brute"] - r["dp"] for r in check]
    lines.append(f"\nLargest DP gap to the optimum: {max(gaps):.4f}; median {statistics.median(gaps):.4f}.")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
