"""Does vLLM's CPU build serve a draft model? The model's own int8 (or int4) copy as ``export --engine vllm`` writes
it (a compressed-tensors checkpoint, ``method: draft_model``), served beside the fp32 model, decoding held-out
prompts, its outputs against HF greedy's. One pass, for whether it loads and stays identical, not for speed.

Usage: .venv/bin/python studies/vllm-engine/draft_model_probe.py --python .venv-vllm/bin/python [--k 3]
       [--out studies/vllm-engine/draft-model-TAG]
"""

import argparse
import json
import tempfile
from pathlib import Path

import torch

from skipsearch.api.export import export_profile
from skipsearch.bench.vllm import run_setting
from skipsearch.checkpoints import ensure_embedded
from skipsearch.data import encode_prompt, load_prompts
from skipsearch.engine.decoding import hf_generate
from skipsearch.model.loader import load_model
from skipsearch.profile import ModelRef, profile_from_dict, save_profile
from skipsearch.servers.process import ServerError

ap = argparse.ArgumentParser()
ap.add_argument("--python", required=True)
ap.add_argument("--k", type=int, default=3)
ap.add_argument("--scheme", default="int8", choices=("int8", "int4"))
ap.add_argument("--n-prompts", type=int, default=4)
ap.add_argument("--max-new-tokens", type=int, default=48)
ap.add_argument("--out", default="studies/vllm-engine/draft-model")
args = ap.parse_args()
torch.set_num_threads(2)
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
sm = load_model("smollm2-135m", device="cpu", dtype="float32")
ids = [encode_prompt(sm.tokenizer, p) for p in load_prompts("mtbench,humaneval", split="heldout", n=args.n_prompts)]
with torch.inference_mode():
    reference = [hf_generate(sm, p, max_new_tokens=args.max_new_tokens) for p in ids]
profile = profile_from_dict({"schema_version": 6, "model": dict(vars(ModelRef.of(sm))), "method": "precision",
                             "draft": {"max_draft_tokens": args.k, "exit": {"threshold": 0.0, "adaptive": False}},
                             "method_params": {"scheme": args.scheme}})
del sm
rows = {}
with tempfile.TemporaryDirectory() as tmp:
    path = save_profile(profile, Path(tmp) / "int8-copy.yaml")
    export_profile(str(path), engine="vllm", out=Path(tmp) / "export")
    config = json.loads((Path(tmp) / "export" / "speculative_config.json").read_text())
    config["model"] = str(Path(tmp) / "export" / Path(config["model"]).name)
    model_dir = ensure_embedded("smollm2-135m")
    for name, spec in (("plain", None), (f"draft_model {args.scheme} K {args.k}", config)):
        try:
            row = run_setting(args.python, model_dir, name, spec, ids, reference, max_new_tokens=args.max_new_tokens,
                              log_dir=out, threads=2, memory_fraction=0.25)
            rows[name] = (f"identical {row.identical}/{row.prompts}, {row.tokens_per_s:.1f} tokens/s, drafted "
                          f"{row.drafted:g}, accepted {row.accepted:g}")
        except ServerError as e:
            rows[name] = f"vLLM failed: {e}"
        print(f"{name}: {rows[name]}", flush=True)
(out / f"rows-{args.scheme}.json").write_text(json.dumps({"config": {**config, "model": f"draft-{args.scheme}"},
                                                          "rows": rows}, indent=2) + "\n")
