"""Decode with a llama.cpp export and check its output (issue 27): llama-server with the exported flags against
llama-server without them and against HF greedy, on the same prompt token ids.

The target is the model itself as an all-F32 GGUF (``gguf_draft.write_draft_gguf`` with every sublayer and the head
at full precision), so llama.cpp computes with the weights HF computes with; the draft and the flags are what
``skipsearch export --engine llama.cpp`` wrote. Needs a llama-server binary (a llama.cpp build: the one vendored in
llama-cpp-python's sdist builds with ``cmake -B build -DLLAMA_BUILD_SERVER=ON && ninja -C build llama-server``).

    python scripts/llamacpp_decode_check.py --server PATH/llama-server --export /tmp/lx --n-prompts 4 \\
        --max-new-tokens 48 --out studies/llamacpp-decode-check.md
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from _common import named_prompt_ids, script_model

from skipsearch.checkpoints import find_checkpoint
from skipsearch.decoding import hf_generate
from skipsearch.export.gguf_draft import write_draft_gguf


def _serve(server: str, target: Path, extra: list[str], port: int, threads: int) -> subprocess.Popen:
    cmd = [server, "-m", str(target), "--port", str(port), "-t", str(threads), "-c", "2048", "-np", "1",
           "--no-warmup", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"llama-server exited: {proc.stderr.read()[-2000:]}")
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("llama-server did not become healthy")


def _complete(port: int, ids: list[int], n: int) -> tuple[list[int], dict]:
    body = json.dumps({"prompt": ids, "n_predict": n, "temperature": 0.0, "top_k": 1, "cache_prompt": False,
                       "return_tokens": True, "ignore_eos": False}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.loads(r.read())
    return list(out.get("tokens") or []), out.get("timings", {})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--export", required=True, help="a `skipsearch export --engine llama.cpp` directory")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dataset", default="mtbench,humaneval")
    ap.add_argument("--n-prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    export = Path(a.export)
    flags = shlex.split((export / "llama-args.txt").read_text())
    sm = script_model(a.model, device="cpu", dtype="float32")
    target = export.parent / f"{export.name}-target-f32.gguf"
    every = tuple(range(sm.num_layers))
    write_draft_gguf(target, sm, find_checkpoint(a.model).path, scheme="fp16", quant_head=False, full_attn=every,
                     full_mlp=every)
    prompts = named_prompt_ids(sm, a.dataset, split="all", n=a.n_prompts, seed=0)
    hf = {name: list(hf_generate(sm, ids, max_new_tokens=a.max_new_tokens)) for name, ids in prompts}
    rows = []
    for label, extra, port in (("plain", [], 8091), ("exported flags", flags, 8092)):
        proc = _serve(a.server, target, extra, port, a.threads)
        try:
            for name, ids in prompts:
                toks, t = _complete(port, ids, a.max_new_tokens)
                rows.append((label, name, toks, t))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    plain = {name: toks for label, name, toks, _ in rows if label == "plain"}
    lines = ["# llama.cpp decode check: a skipsearch export run by llama-server", "",
             f"`python scripts/llamacpp_decode_check.py {' '.join(shlex.quote(x) for x in (argv or sys.argv[1:]))}`",
             "", f"Target: the model as an all-F32 GGUF; flags from `{export / 'llama-args.txt'}`: "
             f"`{' '.join(flags)}`.",
             f"{len(prompts)} prompts of {a.dataset} (seed 0), {a.max_new_tokens} new tokens, greedy "
             "(temperature 0, top-k 1), prompts sent as token ids.", "",
             "| run | prompt | tokens | equal to llama.cpp plain | equal to HF greedy (first difference) | drafted "
             "| accepted |",
             "|---|---|---|---|---|---|---|"]
    for label, name, toks, t in rows:
        ref = hf[name][:len(toks)]
        first = next((i for i, (x, y) in enumerate(zip(toks, ref, strict=False)) if x != y), None)
        lines.append(f"| {label} | {name} | {len(toks)} | {'yes' if toks == plain[name] else 'NO'} | "
                     f"{'yes' if first is None and len(toks) == len(hf[name]) else f'no (token {first})'} | "
                     f"{t.get('draft_n', '-')} | {t.get('draft_n_accepted', '-')} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
