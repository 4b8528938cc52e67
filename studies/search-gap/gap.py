"""Where a hybrid profile's surrogate and its real decoding part ways: the same calibration prompts, replayed from the
profile's own records (the lookup record and the precision fallback's traces, as the search's surrogate replays
them) and decoded for real on the kernel, with our plain loop beside it for the unit.

    PYTHONPATH=. .venv/bin/python studies/search-gap/gap.py PROFILE [--kernel panel-c8] [--threads 2]

Prints one JSON object: per side, the cycles, τ, the drafts (by the lookup and by the fallback), and for the real
decode where its time went, in plain steps (our loop's decode time a token, prefill excluded). Nothing else may run
on the machine meanwhile: the real side is timed.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import torch


def replayed(profile, params: dict) -> dict:
    """The surrogate's view: every calibration sequence replayed by the engine's rules from the records alone."""
    from skipsearch.methods import ngram
    from skipsearch.methods.hybrid import recorded_cycles
    from skipsearch.methods.precision.record import precision_from_dict

    extra = dict(profile.measured.extra)
    rec = ngram.lookup_from_dict(extra[ngram.LOOKUP_KEY])
    traces = precision_from_dict(extra["precision_traces"]).decoded()
    k = profile.draft.max_draft_tokens
    fallback = replace(profile.draft, max_draft_tokens=int(params.get("fallback_k", k)))
    cycles, by_fallback = recorded_cycles(rec, k, fallback=fallback, traces=traces, source="precision")
    drafted = sum(c[1] for c in cycles)
    return {"sequences": len(traces), "cycles": len(cycles), "tokens": sum(c[3] for c in cycles),
            "tau": sum(c[3] for c in cycles) / len(cycles), "drafted": drafted,
            "drafted_by_fallback": by_fallback, "drafted_by_lookup": drafted - by_fallback,
            "accepted": sum(c[2] for c in cycles)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("profile")
    ap.add_argument("--kernel", default="panel-c8")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from skipsearch.api.decode import drafter_factory
    from skipsearch.data import encode_prompt, load_prompts
    from skipsearch.engine.decoding import generate
    from skipsearch.model.loader import load_model
    from skipsearch.profile import load_profile

    profile = load_profile(a.profile)
    params = dict(profile.method_params)
    m = profile.measured
    out = {"profile": a.profile, "params": params, "K": profile.draft.max_draft_tokens,
           "cost_model": {"c": dict(m.extra).get("cost_c"), "v": dict(m.extra).get("verify_cost_v")},
           "predicted_speedup": m.predicted_speedup, "timed_speedup": m.speedup, "replayed": replayed(profile, params)}

    sm = load_model("smollm2-135m", device="cpu", dtype="float32")
    sm.use_kernel(a.kernel, capacity=1024)
    drafters = drafter_factory(profile, sm)
    # the calibration prompts the records were made on (optimize's default draw: calib split, seed 0)
    prompts = [encode_prompt(sm.tokenizer, p) for p in load_prompts(m.dataset.split(" (")[0], split="calib",
                                                                       n=m.n_prompts, seed=m.seed)]
    n = m.max_new_tokens
    generate(sm, prompts[0], max_new_tokens=16)  # warm both paths
    generate(sm, prompts[0], drafter=drafters(), max_new_tokens=16)
    real = {"cycles": 0, "tokens": 0, "drafted": 0, "accepted": 0, "fallback_drafted": 0, "seconds": 0.0,
            "prefill_seconds": 0.0, "draft_seconds": 0.0, "verify_seconds": 0.0, "fallback_seconds": 0.0,
            "lookup_seconds": 0.0}
    plain_decode = plain_tokens = 0.0
    same = 0
    for ids in prompts:
        ar = generate(sm, ids, max_new_tokens=n)
        res = generate(sm, ids, drafter=drafters(), max_new_tokens=n)
        same += res.token_ids == ar.token_ids
        plain_decode += ar.stats.seconds - ar.stats.prefill_seconds
        plain_tokens += len(ar.token_ids) - 1
        s, ds = res.stats, dict(res.stats.drafter_stats)
        real["cycles"] += s.verify_steps
        real["tokens"] += s.new_tokens
        real["drafted"] += s.drafted_tokens
        real["accepted"] += s.accepted_tokens
        real["fallback_drafted"] += int(ds.get("fallback_drafted", 0))
        real["fallback_seconds"] += float(ds.get("fallback_seconds", 0.0))
        real["lookup_seconds"] += float(ds.get("ngram_seconds", 0.0))
        for key in ("seconds", "prefill_seconds", "draft_seconds", "verify_seconds"):
            real[key] += getattr(s, key)
    step = plain_decode / plain_tokens  # seconds a plain token, prefill excluded
    real["tau"] = real["tokens"] / real["cycles"]
    rest = real["seconds"] - real["prefill_seconds"] - real["draft_seconds"] - real["verify_seconds"]
    real["in_plain_steps"] = {
        "a_fallback_draft_token": real["fallback_seconds"] / max(real["fallback_drafted"], 1) / step,
        "a_verify_cycle": real["verify_seconds"] / real["cycles"] / step,
        "drafting_outside_the_fallback_a_cycle": (real["draft_seconds"] - real["fallback_seconds"]) / real["cycles"]
        / step,
        "outside_draft_and_verify_a_cycle": rest / real["cycles"] / step,
    }
    real["decode_speedup_over_plain"] = (plain_decode / plain_tokens) / (
        (real["seconds"] - real["prefill_seconds"]) / (real["tokens"] - len(prompts)))
    out.update(plain_ms_a_token=step * 1e3, real=real, identical=f"{same}/{len(prompts)}")
    print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
