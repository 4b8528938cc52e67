"""skipsearch's plain loop on the panel kernel (the model's linears held as its GGUF's blocks) and a profile's decode,
against llama.cpp's plain decoding of the same model's F32 GGUF and of the checkpoint's own GGUF (smollm2-135m's
Q4_1 file, whose blocks the panel kernel streams; or, with ``--model FILE.gguf``, that file), rounds alternating side
by side on the same held-out prompts.

    .venv/bin/python studies/exact-blocks/own_gguf.py --profile P [--model M] [--prompts 12] [--tokens 96] [--rounds 2]
        [--without fit_q4_0]

``--without FIT`` adds a side: the plain loop on a second copy of the model whose kernel was built without that fit
of ``kernels/lowbit/exact.py`` (``fit_q4_0``: a Q4_0 file's linears as fp32 panels, as before the fit).

Needs llama-server (``bash scripts/setup.sh --engines llama.cpp``). Tokens/s over the decode only (the prompt's
time aside: llama.cpp's own counters, skipsearch's stats), summed over the prompts; outputs against skipsearch's
plain loop, which is HF greedy's (the tests check it). Nothing else may run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import warnings
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--profile", required=True)
    p.add_argument("--model", default="smollm2-135m", help="the embedded model, or a GGUF file (its own GGUF)")
    p.add_argument("--kernel", default="panel-c8")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompts", type=int, default=12)
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--without", default=None, help="a fit of kernels/lowbit/exact.py: a side built without it")
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    import importlib.util

    import torch

    torch.set_num_threads(a.threads)
    from skipsearch.api.decode import drafter_factory
    from skipsearch.bench.llamacpp import PLAIN, Setting, context_size, find_server, run_setting
    from skipsearch.bench.llamacpp_ggufs import write_ggufs
    from skipsearch.checkpoints import EMBEDDED, find_checkpoint
    from skipsearch.data import encode_prompt, load_prompts
    from skipsearch.engine.decoding import generate
    from skipsearch.model.loader import load_model
    from skipsearch.profile import load_profile

    server, missing = find_server()
    if server is None:
        raise SystemExit(missing)
    sm = load_model(a.model, device="cpu", dtype="float32")
    sm.use_kernel(a.kernel, capacity=1024)
    models = {"skipsearch plain": sm, "skipsearch profile": sm}
    if a.without:
        from skipsearch.kernels.lowbit import exact

        kept = exact.FORMATS
        exact.FORMATS = tuple(f for f in kept if f[0].__name__ != a.without)
        if exact.FORMATS == kept:
            raise SystemExit(f"no fit {a.without} in kernels/lowbit/exact.py")
        models[f"skipsearch plain without {a.without}"] = load_model(a.model, device="cpu", dtype="float32")
        models[f"skipsearch plain without {a.without}"].use_kernel(a.kernel, capacity=1024)
        exact.FORMATS = kept
    drafters = drafter_factory(load_profile(a.profile), sm)
    ids = [encode_prompt(sm.tokenizer, q) for q in load_prompts("mtbench,humaneval", split="heldout", n=a.prompts,
                                                                seed=0)]
    if a.model.lower().endswith(".gguf"):
        own = Path(a.model)
    else:
        spec = EMBEDDED[a.model]
        own = Path(importlib.util.find_spec(spec.package).origin).parent / spec.gguf_file
    f32, _ = write_ggufs(sm, find_checkpoint(a.model).path, drafts=())
    context = context_size(ids, a.tokens)

    def ours(drafter, model) -> tuple[float, list]:
        generate(model, ids[0], drafter=drafter(), max_new_tokens=8)  # warm
        n = secs = 0.0
        out = []
        for x in ids:
            s = generate(model, x, drafter=drafter(), max_new_tokens=a.tokens)
            n += s.stats.new_tokens
            secs += s.stats.seconds - s.stats.prefill_seconds
            out.append(list(s.token_ids))
        return n / secs, out

    rates: dict[str, list[float]] = {}
    same: dict[str, list[int]] = {}
    reference = None
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            order = [*models, "llama.cpp F32", "llama.cpp own GGUF"]
            for side in order if r % 2 == 0 else order[::-1]:
                if side.startswith("skipsearch"):
                    rate, out = ours(drafters if side.endswith("profile") else (lambda: None), models[side])
                    reference = reference or (out if side == "skipsearch plain" else None)
                    hits = None if reference is None else sum(x == y for x, y in zip(out, reference, strict=True))
                else:
                    gguf = f32 if side.endswith("F32") else own
                    res = run_setting(server, gguf, Setting(PLAIN, PLAIN, ()), ids, reference or (),
                                      max_new_tokens=a.tokens, threads=a.threads, context=context,
                                      log=Path(tmp) / "server.log")
                    if res.error:
                        raise SystemExit(res.error)
                    rate, hits = res.tokens_per_s, res.identical if reference else None
                rates.setdefault(side, []).append(round(rate, 1))
                same.setdefault(side, []).append(hits)
    print(json.dumps({"model": a.model, "profile": a.profile, "kernel": a.kernel, "threads": a.threads,
                      "prompts": a.prompts, "tokens": a.tokens, "decode_tokens_per_s": rates,
                      "identical_to_skipsearch_plain (HF greedy)": same,
                      "own_gguf": own.name}, indent=1))


if __name__ == "__main__":
    main()
