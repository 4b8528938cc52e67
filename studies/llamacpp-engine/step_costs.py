"""llama.cpp's own costs on this machine, the figures its speculative decoding lives on: a decode step of each GGUF
(the target, and each draft model a search tries), and the target's verify of k tokens at once, v(k) (k new tokens
after a cached prompt, as a verify after an accepted draft sees them), each over several repeats, medians; then
each draft model at n-max 4 on the 6 calibration prompts, for its acceptance (llama.cpp's draft_n_accepted /
draft_n) and its tokens/s against plain's.

    .venv/bin/python studies/llamacpp-engine/step_costs.py --out studies/llamacpp-engine/step-costs-zen5.json

Run it alone on the machine (it times). The GGUFs are the ones ``optimize --engine llama.cpp`` writes into
skipsearch's cache (the target F32, the Q8_0 and Q4_0 self-drafts, the shallow self-drafts of ``shallow_drafts``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

from skipsearch.bench import llamacpp as lp
from skipsearch.bench import llamacpp_ggufs as lg
from skipsearch.bench import llamacpp_search as ls
from skipsearch.checkpoints import find_checkpoint
from skipsearch.data import context_of, encode_all_within, load_prompts
from skipsearch.engine.decoding import hf_generate
from skipsearch.model.loader import load_model
from skipsearch.servers import process
from skipsearch.servers.llamacpp import LlamaCppError, free_port, parse_completion, serving


def ask(port: int, ids, n: int) -> object:
    body = {"prompt": [int(t) for t in ids], "n_predict": n, "temperature": 0.0, "top_k": 1, "cache_prompt": True,
            "return_tokens": True, "stream": False}
    return parse_completion(process.post_json(port, "/completion", body, timeout=600, name="llama-server",
                                              error=LlamaCppError))


def measure(server: str, gguf: Path, prompt: list[int], extra: list[int], *, threads: int, ks, repeats: int,
            log: Path) -> dict:
    port = free_port()
    cmd = lp.server_command(server, gguf, (), port=port, threads=threads, context=1024)
    out = {"gguf": gguf.name, "step_ms": [], "verify_ms": {}}
    with serving(cmd, port, log=log):
        ask(port, prompt, 4)  # warm-up
        for _ in range(repeats):
            done = ask(port, prompt + extra[:1], 33)  # a new prefix: 32 decode steps after the first token
            out["step_ms"].append(done.predicted_ms / max(1, done.predicted_n))
        for k in ks:
            times = []
            for _ in range(repeats):
                ask(port, prompt, 1)  # the cache holds the prompt
                done = ask(port, prompt + extra[:k], 1)  # k new tokens in one batch
                if done.prompt_n != k:
                    raise SystemExit(f"{gguf.name}: asked for {k} new tokens, the server processed {done.prompt_n}")
                times.append(done.prompt_ms)
            out["verify_ms"][k] = statistics.median(times)
    out["step_ms"] = statistics.median(out["step_ms"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    server, missing = lp.find_server(None)
    if server is None:
        raise SystemExit(missing)
    sm = load_model("smollm2-135m", device="cpu", dtype="float32")
    checkpoint = find_checkpoint("smollm2-135m").path
    prompts = load_prompts("mtbench,humaneval", split="calib", n=6, seed=0)
    ids = encode_all_within(sm.tokenizer, prompts, context=context_of(sm.hf.config), max_new_tokens=64)
    greedy = [hf_generate(sm, x, max_new_tokens=64) for x in ids]
    target, drafts = lg.write_ggufs(sm, checkpoint)
    shallow = lg.write_shallow(sm, checkpoint, ls.shallow_drafts(sm, ids, greedy))
    prompt, extra = list(ids[0]), list(greedy[0])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, gguf in (("target f32", target), *((f"draft {d}", p) for d, p in drafts.items()),
                           *((f"draft {sh.name}", p) for sh, p in shallow.items())):
            ks = range(1, 10) if name == "target f32" else ()
            row = {"name": name, **measure(server, gguf, prompt, extra, threads=a.threads, ks=ks,
                                           repeats=a.repeats, log=Path(tmp) / "server.log")}
            if name != "target f32":
                context = lp.context_size(ids, 64)
                runs = {}
                for label, args in (("plain", ()), ("n4", tuple(lp.spec_args(draft=(gguf, 4))))):
                    runs[label] = lp.run_setting(server, target, lp.Setting(label, lp.DRAFT, args), ids, greedy,
                                                 max_new_tokens=64, threads=a.threads, context=context,
                                                 log=Path(tmp) / "server.log")
                row.update(acceptance=runs["n4"].acceptance, identical=runs["n4"].identical,
                           tokens_per_s=runs["n4"].tokens_per_s, plain_tokens_per_s=runs["plain"].tokens_per_s)
            rows.append(row)
            print(json.dumps(row), flush=True)
    Path(a.out).write_text(json.dumps({"server": ls.server_version(server), "threads": a.threads,
                                       "prompt_tokens": len(prompt), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
