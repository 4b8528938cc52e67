"""Does vLLM's CPU build serve a shallow self-draft, and what does it run at? The model without a tenth and a fifth
of its layers (CLaSp's DP on the calibration prompts, as ``optimize --engine llama.cpp`` picks its shallow GGUFs),
written as a Hugging Face checkpoint in fp32 (``export/shallow.write_shallow_checkpoint``), served as
``method: draft_model`` beside the fp32 model, against plain decoding in the same run, outputs against HF greedy.
One pass, one request at a time: whether it starts and stays identical, and its tokens/s and acceptance.

Usage (alone on the machine): .venv/bin/python studies/vllm-engine/shallow_probe.py --python .venv-vllm/bin/python
       [--k 2,4] [--out studies/vllm-engine/shallow-TAG]
"""

import argparse
import json
import tempfile
from pathlib import Path

import torch

from skipsearch.bench import llamacpp_search as ls
from skipsearch.bench.vllm import run_setting
from skipsearch.checkpoints import ensure_embedded, find_checkpoint
from skipsearch.data import context_of, encode_all_within, encode_prompt, load_prompts
from skipsearch.engine.decoding import hf_generate
from skipsearch.export.shallow import write_shallow_checkpoint
from skipsearch.model.loader import load_model
from skipsearch.servers.process import ServerError

ap = argparse.ArgumentParser()
ap.add_argument("--python", required=True)
ap.add_argument("--k", default="2,4")
ap.add_argument("--n-prompts", type=int, default=4)
ap.add_argument("--max-new-tokens", type=int, default=48)
ap.add_argument("--out", default="studies/vllm-engine/shallow")
args = ap.parse_args()
torch.set_num_threads(2)
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
sm = load_model("smollm2-135m", device="cpu", dtype="float32")
calib = encode_all_within(sm.tokenizer, load_prompts("mtbench,humaneval", split="calib", n=6, seed=0),
                          context=context_of(sm.hf.config), max_new_tokens=64)
with torch.inference_mode():
    shallow = ls.shallow_drafts(sm, calib, [hf_generate(sm, p, max_new_tokens=64) for p in calib])
    ids = [encode_prompt(sm.tokenizer, p) for p in load_prompts("mtbench,humaneval", split="heldout",
                                                                 n=args.n_prompts)]
    reference = [hf_generate(sm, p, max_new_tokens=args.max_new_tokens) for p in ids]
rows = {}
with tempfile.TemporaryDirectory() as tmp:
    settings = [("plain", None)]
    for draft in shallow:
        where = Path(tmp) / f"shallow-{len(draft.layers)}"
        write_shallow_checkpoint(where, sm, find_checkpoint("smollm2-135m").path, draft.layers)
        settings += [(f"draft_model fp32 {len(draft.layers)}/{draft.of} K {k}",
                      {"method": "draft_model", "model": str(where), "num_speculative_tokens": int(k)})
                     for k in args.k.split(",")]
    model_dir = ensure_embedded("smollm2-135m")
    for name, spec in settings:
        try:
            row = run_setting(args.python, model_dir, name, spec, ids, reference, max_new_tokens=args.max_new_tokens,
                              log_dir=out, threads=2, memory_fraction=0.25)
            accepted = row.accepted / row.drafted if row.drafted else None
            rows[name] = {"identical": f"{row.identical}/{row.prompts}", "tokens_per_s": round(row.tokens_per_s, 2),
                          "drafted": row.drafted, "accepted": row.accepted,
                          "acceptance": None if accepted is None else round(accepted, 3)}
        except ServerError as e:
            rows[name] = {"error": str(e)}
        print(f"{name}: {rows[name]}", flush=True)
(out / "rows.json").write_text(json.dumps({"layers": {f"{len(d.layers)}/{d.of}": list(d.layers) for d in shallow},
                                           "rows": rows}, indent=2) + "\n")
