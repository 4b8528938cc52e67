"""Decode with a llama.cpp export and check its output (issue 27): llama-server with the exported flags against
llama-server without them and against HF greedy, on the same prompt token ids.

The running is the llama.cpp peer's (``skipsearch.bench.llamacpp``): the target is the model itself as an all-F32
GGUF, so llama.cpp computes with the weights HF computes with; the draft and the flags are what ``skipsearch export
--engine llama.cpp`` wrote. Needs a llama-server binary (the peer's docstring has the one command that builds it);
its figures are not printed here: this checks outputs only.

    python scripts/llamacpp_decode_check.py --server PATH/llama-server --export /tmp/lx --n-prompts 4 \\
        --max-new-tokens 48 --out studies/llamacpp-decode-check.md
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from _common import named_prompt_ids, script_model

from skipsearch.bench.llamacpp import EXPORT, PLAIN, llamacpp_rows
from skipsearch.engine.decoding import hf_generate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", default=None, help="llama-server (else $SKIPSEARCH_LLAMA_SERVER, else PATH)")
    ap.add_argument("--export", required=True, help="a `skipsearch export --engine llama.cpp` directory")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dataset", default="mtbench,humaneval")
    ap.add_argument("--n-prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    sm = script_model(a.model, device="cpu", dtype="float32")
    prompts = named_prompt_ids(sm, a.dataset, split="all", n=a.n_prompts, seed=0)
    ids = [i for _, i in prompts]
    hf = [list(hf_generate(sm, i, max_new_tokens=a.max_new_tokens)) for i in ids]
    res = llamacpp_rows(sm, ids, max_new_tokens=a.max_new_tokens, threads=a.threads, server=a.server, reference=hf,
                        export_dirs=[a.export], kinds=(PLAIN, EXPORT))
    if res.unavailable:
        print(res.unavailable, file=sys.stderr)
        return 1
    plain, exported = res.settings
    lines = ["# llama.cpp decode check: a skipsearch export run by llama-server", "",
             f"`python scripts/llamacpp_decode_check.py {' '.join(shlex.quote(x) for x in (argv or sys.argv[1:]))}`",
             "", f"Target: the model as an all-F32 GGUF; flags from `{Path(a.export) / 'llama-args.txt'}`: "
             f"`{' '.join(exported.setting.args)}`.",
             f"{len(prompts)} prompts of {a.dataset} (seed 0), {a.max_new_tokens} new tokens, greedy "
             "(temperature 0, top-k 1), prompts sent as token ids.", "",
             "| run | prompt | tokens | equal to llama.cpp plain | equal to HF greedy (first difference) | drafted "
             "| accepted |",
             "|---|---|---|---|---|---|---|"]
    for label, r in (("plain", plain), ("exported flags", exported)):
        if r.error:
            lines.append(f"| {label} | - | - | - | failed: {r.error} | - | - |")
        for (name, _), c, plain_c, diff in zip(prompts, r.completions, plain.completions, r.differs_at, strict=False):
            lines.append(f"| {label} | {name} | {len(c.tokens)} | {'yes' if c.tokens == plain_c.tokens else 'NO'} | "
                         f"{'yes' if diff is None else f'no (token {diff})'} | "
                         f"{c.drafted if c.drafted else '-'} | {c.accepted if c.drafted else '-'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
