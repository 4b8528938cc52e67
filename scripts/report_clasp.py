"""CLaSp report: static vs dynamic CLaSp vs a tpe profile, LOI and M sweeps, DP vs brute force.

Everything is measured in this one process, on held-out prompts (not the calibration half), in one
run of the one harness (``skipsearch.engine.harness.run_rounds``): every method of every table, and HF greedy
``generate`` as the baseline, once per round, the order rotated every round. Every method's tokens are
checked equal to HF's. The DP's cost is micro-timed with ``skipsearch.engine.timing.time_call``.

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
from _common import ints_or_exit, prompt_ids, script_model

from skipsearch.api import drafter_factory
from skipsearch.bench import BASELINE, peer_method
from skipsearch.engine import timing
from skipsearch.engine.harness import (
    Contender,
    LosslessnessError,
    Run,
    engine_method,
    first_outputs,
    method_seconds,
    run_rounds,
)
from skipsearch.methods.clasp_dynamic import METHOD as CLASP_DYNAMIC
from skipsearch.methods.clasp_dynamic.dp import ModelLayers, approximation_check, dp_skip_sets
from skipsearch.methods.clasp_dynamic.drafter import ClaspDynamicDrafter
from skipsearch.profile import load_profile


def summarize(runs: list[Run] | tuple[Run, ...], name: str) -> dict:
    """One method's row: speedup over HF greedy (same rounds), tau, acceptance, time shares."""
    seconds = method_seconds(runs)
    secs = seconds[name]
    outs = first_outputs(runs, name)
    tokens = sum(len(o.token_ids) for o in outs)
    drafted = sum(o.drafted or 0 for o in outs)
    accepted = sum(o.accepted or 0 for o in outs)
    cycles = sum(o.verify_steps or 0 for o in outs)
    draft = sum(o.draft_seconds or 0.0 for o in outs)
    verify = sum(o.verify_seconds or 0.0 for o in outs)
    dp = sum(dict(o.drafter_stats).get("dp_seconds", 0.0) for o in outs)
    return {"speedup": seconds[BASELINE] / secs, "tau": (tokens - len(outs)) / cycles if cycles else 1.0,
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
    sm = script_model(args.model, threads=args.threads, device="auto", dtype="auto")
    dyn = load_profile(args.dynamic, num_layers=sm.num_layers)
    params = CLASP_DYNAMIC.parse(dyn.method_params, draft=dyn.draft, num_layers=sm.num_layers)
    prompts = prompt_ids(sm, args.dataset, split="heldout", n=args.n_prompts)
    n = args.max_new_tokens

    # 0. every method of the three tables, named by table, and HF greedy: one harness run
    def dynamic(p):
        return lambda _ids: ClaspDynamicDrafter(p, dyn.draft, num_layers=sm.num_layers)

    methods: list[Contender] = [peer_method(sm, BASELINE)]
    main_rows = []
    for label, path in (("static CLaSp", args.static), ("dynamic CLaSp", args.dynamic), ("tpe", args.tpe)):
        if path:
            make = drafter_factory(load_profile(path, num_layers=sm.num_layers), sm)
            methods.append(engine_method(sm, f"{label} (`{Path(path).name}`)", lambda _ids, make=make: make()))
            main_rows.append(methods[-1].name)
    lois, ms = ints_or_exit(args.lois, "--lois"), ints_or_exit(args.ms, "--ms")
    methods += [engine_method(sm, f"LOI {loi}", dynamic(replace(params, loi=loi))) for loi in lois]
    methods += [engine_method(sm, f"M {m}", dynamic(replace(params, num_skips=m))) for m in ms]
    try:
        runs = run_rounds(methods, prompts, max_new_tokens=n, device=sm.device, warmup_tokens=8,
                          reference=BASELINE, strict=True)
    except LosslessnessError as e:
        raise SystemExit(f"output differs from HF greedy: {e}") from None
    base_s = method_seconds(runs)[BASELINE]
    ref0 = first_outputs(runs, BASELINE)[0].token_ids
    lines = [f"# CLaSp on {args.model} (CPU, {args.threads} thread)", "",
             f"Held-out prompts: {len(prompts)} from {args.dataset} (heldout split), {n} new tokens each. Baseline: "
             f"HF greedy `generate`, same process and same rounds as every method ({base_s:.2f} s in all). Every "
             "method's tokens were checked equal to HF's. Shares are of each method's own wall time.", "",
             "| method | speedup | tau | acceptance | draft | verify | DP |", "|---|---|---|---|---|---|---|"]

    def row(label, name):
        r = summarize(runs, name)
        lines.append(f"| {label} | {r['speedup']:.3f}x | {r['tau']:.2f} | {r['acceptance']:.2f} | "
                     f"{r['draft_share']:.0%} | {r['verify_share']:.0%} | {r['dp_share']:.1%} |")

    # 1. static vs dynamic vs tpe
    for name in main_rows:
        row(name, name)

    # 2. LOI and M sweeps of the dynamic profile
    lines += ["", f"## Dynamic CLaSp against LOI (M = {params.num_skips}, {params.sublayer})", "",
              "| LOI | speedup | tau | acceptance | draft | verify | DP |", "|---|---|---|---|---|---|---|"]
    for loi in lois:
        row(str(loi), f"LOI {loi}")
    lines += ["", f"## Dynamic CLaSp against M (LOI = {params.loi}, {params.sublayer})", "",
              "| M | speedup | tau | acceptance | draft | verify | DP |", "|---|---|---|---|---|---|---|"]
    for m in ms:
        row(str(m), f"M {m}")

    # 3. the DP's cost: sequence-parallel against the naive double loop, one token as in decoding
    ids = list(prompts[0]) + list(ref0)
    cache = sm.new_cache()
    _, hidden = sm.forward_hidden(torch.tensor(ids), start=0, cache=cache)
    pos = len(ids) - 1
    layers = ModelLayers(sm, [cache], [torch.tensor([pos])], sublayer=params.sublayer)
    allowed = range(1, sm.num_layers - 1)
    timings = {}
    dp_ms = sorted({params.num_skips, max(ms)})  # the batching only pays where M > 1 states exist
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
    first, last = ints_or_exit(args.sub_range.replace("-", ","), "--sub-range")
    sub_range = list(range(first, last + 1))
    n_tok = min(args.bf_tokens, len(ref0))
    tok_pos = torch.tensor(sorted({len(prompts[0]) - 1 + (k * len(ref0)) // n_tok for k in range(n_tok)}))
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
