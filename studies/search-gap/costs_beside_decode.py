"""The cost model (25 rounds) beside the shipped hybrid profile's real decode of the 8 calibration prompts, in ms,
N times in one process: the model's unit, verify of 7 and int8 draft step; then the loop's own plain token, verify
cycle and fallback draft token, with the real decode's speedup over our plain loop. Alone on the machine.

    PYTHONPATH=. .venv/bin/python studies/search-gap/costs_beside_decode.py 3
"""

from __future__ import annotations

import sys

from _common import setup

PROFILE = "profiles/smollm2-135m/cpu-float32-mixed-zen5-panel-c8.yaml"


def main() -> None:
    from skipsearch.api.decode import drafter_factory
    from skipsearch.engine import surrogate
    from skipsearch.engine.decoding import generate
    from skipsearch.methods.precision.surrogate import measure_scheme
    from skipsearch.profile import load_profile

    profile = load_profile(PROFILE)
    sm, prompts, context = setup()
    drafters = drafter_factory(profile, sm)
    generate(sm, prompts[0], drafter=drafters(), max_new_tokens=16)
    for _ in range(int(sys.argv[1])):
        cm = surrogate.measure_costs(sm, context, repeats=25)
        sc = measure_scheme(sm, context, "int8", repeats=25)
        unit, v7 = cm.step_seconds * 1e3, cm.verify_ratio[6]
        print(f"model: unit {unit:.2f} ms, v(7) {v7:.3f} -> {v7 * unit:.2f} ms, draft {sc.whole_seconds * 1e3:.2f} ms "
              f"c {sc.whole_seconds / cm.step_seconds:.3f} (its own rounds' unit {sc.unit * 1e3:.2f})", flush=True)
        t = dict.fromkeys(("plain", "spec", "verify", "draft", "fallback"), 0.0)
        n = dict.fromkeys(("plain", "spec", "cycles", "fallback"), 0)
        for ids in prompts:
            a = generate(sm, ids, max_new_tokens=96)
            b = generate(sm, ids, drafter=drafters(), max_new_tokens=96)
            s, ds = b.stats, dict(b.stats.drafter_stats)
            t["plain"] += a.stats.seconds - a.stats.prefill_seconds
            n["plain"] += len(a.token_ids) - 1
            t["spec"] += s.seconds - s.prefill_seconds
            n["spec"] += len(b.token_ids) - 1
            t["verify"] += s.verify_seconds
            n["cycles"] += s.verify_steps
            t["draft"] += s.draft_seconds
            t["fallback"] += float(ds.get("fallback_seconds", 0))
            n["fallback"] += int(ds.get("fallback_drafted", 0))
        u = t["plain"] / n["plain"]
        verify, fallback = t["verify"] / n["cycles"], t["fallback"] / n["fallback"]
        other = (t["spec"] - t["verify"] - t["draft"]) / n["cycles"]
        print(f"real: plain {u * 1e3:.2f} ms/token, verify {verify * 1e3:.2f} ms/cycle ({verify / u:.3f}), fallback "
              f"{fallback * 1e3:.2f} ms/token ({fallback / u:.3f}), other {other * 1e3:.2f} ms/cycle, speedup "
              f"{u / (t['spec'] / n['spec']):.3f}, cycles {n['cycles']}", flush=True)


if __name__ == "__main__":
    main()
