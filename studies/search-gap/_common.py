"""What the noise scripts share: smollm2-135m on ``panel-c8`` at 2 threads, the calibration prompts a README search
draws (mtbench and humaneval, calib split, seed 0), and the cost context ``unit_probe.py`` uses (the first prompt
and 48 more tokens, as ``Calibration.cost_context`` has)."""

from __future__ import annotations

import torch


def setup(threads: int = 2):
    """(model on panel-c8, the 8 encoded calibration prompts, the cost context)."""
    torch.set_num_threads(threads)
    from skipsearch.data import encode_prompt, load_prompts
    from skipsearch.model.loader import load_model

    sm = load_model("smollm2-135m", device="cpu", dtype="float32")
    sm.use_kernel("panel-c8", capacity=1024)
    prompts = [encode_prompt(sm.tokenizer, p) for p in load_prompts("mtbench,humaneval", split="calib", n=8, seed=0)]
    context = tuple(prompts[0]) + tuple(range(100, 148))
    return sm, prompts, context


def spread(label: str, xs) -> str:
    import statistics

    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{label} n={len(xs)} mean {statistics.mean(xs):.3f} sd {sd:.3f} min {min(xs):.3f} max {max(xs):.3f}"


def real_speedup(sm, prompts, drafters, max_new_tokens: int = 96) -> float:
    """A profile's real decode over our plain loop on ``prompts``: each prompt decoded plainly, then with a fresh
    drafter from ``drafters``, outputs checked identical; decode time a token (prefill excluded), summed."""
    from skipsearch.engine.decoding import generate

    plain = spec = 0.0
    plain_tokens = spec_tokens = 0
    for ids in prompts:
        a = generate(sm, ids, max_new_tokens=max_new_tokens)
        b = generate(sm, ids, drafter=drafters(), max_new_tokens=max_new_tokens)
        assert a.token_ids == b.token_ids
        plain += a.stats.seconds - a.stats.prefill_seconds
        plain_tokens += len(a.token_ids) - 1
        spec += b.stats.seconds - b.stats.prefill_seconds
        spec_tokens += len(b.token_ids) - 1
    return (plain / plain_tokens) / (spec / spec_tokens)


def shipped_hybrid(path: str = "profiles/smollm2-135m/cpu-float32-mixed-zen5-panel-c8.yaml"):
    """What the prediction scripts share: ``setup()``, the profile at ``path``, the search's objective on the 8
    calibration prompts x 96 tokens, and a factory of the profile's drafters, warmed by one short decode.
    Returns (sm, prompts, profile, objective, drafters)."""
    from skipsearch.api.decode import drafter_factory
    from skipsearch.engine.decoding import generate
    from skipsearch.engine.surrogate import calibrate
    from skipsearch.profile import load_profile
    from skipsearch.search.objective import ModelObjective

    profile = load_profile(path)
    sm, prompts, _ = setup()
    objective = ModelObjective(sm, calibrate(sm, prompts, max_new_tokens=96))
    drafters = drafter_factory(profile, sm)
    generate(sm, prompts[0], drafter=drafters(), max_new_tokens=16)
    return sm, prompts, profile, objective, drafters


def alternate(reps: int, sides: dict) -> None:
    """Call each of ``sides`` (name -> a call returning (speedup, v(7), c); "real" the real decode, the rest
    predictions) in turn, ``reps`` times, printing each result, then each side's spread and every prediction's mean
    over the real decode's mean."""
    import statistics

    out: dict[str, list[tuple[float, float, float]]] = {name: [] for name in sides}
    for _ in range(reps):
        for name, call in sides.items():
            v = call()
            out[name].append(v)
            print(f"{name:12s} speedup {v[0]:.3f}  v(7) {v[1]:.3f}  c {v[2]:.3f}", flush=True)
    for name, vs in out.items():
        print(spread(f"{name:12s} speedup", [v[0] for v in vs]))
        if name != "real":
            print(spread(f"{name:12s} v(7)   ", [v[1] for v in vs]))
            print(spread(f"{name:12s} c      ", [v[2] for v in vs]))
    real = statistics.mean(v[0] for v in out["real"])
    print("prediction over the real decode, mean:",
          {name: round(statistics.mean(v[0] for v in out[name]) / real, 3) for name in out if name != "real"})


def predict_with(objective, candidate, costs, scheme_cost) -> float:
    """The objective's predicted speedup for ``candidate`` with ``costs`` as its cost model and ``scheme_cost`` as
    the int8 scheme's costs (what a search would have measured in their place)."""
    from skipsearch.methods.precision import surrogate as precision

    objective._costs = costs
    memo = precision._memo(objective)
    memo.costs.clear()
    memo.costs["int8"] = scheme_cost
    memo.head_savings.clear()
    return objective.predict(candidate).speedup
