"""vLLM's CPU build driven by skipsearch (``skipsearch.bench.vllm``): plain decoding and each shipped profile's
``export --engine vllm --nearest`` config, on held-out prompts, every output against HF greedy's (fp32), two runs
with the order of the settings reversed in the second. One server per setting and run, started and stopped here.

Usage: .venv/bin/python studies/engines/vllm_cpu.py --python .venv-vllm/bin/python [--n-prompts 12]
       [--max-new-tokens 96] [--profiles a.yaml,b.yaml] [--out studies/engines/vllm-cpu]"""

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
from skipsearch.hardware import Environment
from skipsearch.model.loader import load_model

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = "profiles/smollm2-135m/cpu-float32-mixed-zen5-panel-c8.yaml,profiles/smollm2-135m/cpu-float32-code.yaml"

ap = argparse.ArgumentParser()
ap.add_argument("--python", required=True)
ap.add_argument("--n-prompts", type=int, default=12)
ap.add_argument("--max-new-tokens", type=int, default=96)
ap.add_argument("--profiles", default=SHIPPED)
ap.add_argument("--out", default=str(ROOT / "studies/engines/vllm-cpu"))
args = ap.parse_args()
torch.set_num_threads(2)

sm = load_model("smollm2-135m", device="cpu", dtype="float32")
prompts = load_prompts("mtbench,humaneval", split="heldout", n=args.n_prompts)
ids = [encode_prompt(sm.tokenizer, p) for p in prompts]
with torch.inference_mode():
    reference = [hf_generate(sm, p, max_new_tokens=args.max_new_tokens) for p in ids]
del sm

settings = {"plain": None}
with tempfile.TemporaryDirectory() as tmp:
    for path in filter(None, args.profiles.split(",")):
        out = Path(tmp) / Path(path).stem
        done = export_profile(str(ROOT / path), engine="vllm", out=out, nearest=True)
        config = json.loads((out / "speculative_config.json").read_text())
        settings[f"{Path(path).stem} export ({done.nearest or 'exact'})"[:160]] = config
    model_dir = ensure_embedded("smollm2-135m")
    log_dir = Path(args.out)
    log_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for run in range(2):
        order = list(settings) if run == 0 else list(settings)[::-1]
        for name in order:
            row = run_setting(args.python, model_dir, name, settings[name], ids, reference,
                              max_new_tokens=args.max_new_tokens, log_dir=log_dir, memory_fraction=0.25)
            rows.append((run, row))
            print(f"run {'AB'[run]} | {name} | {row.tokens_per_s:.1f} tok/s | identical {row.identical}/{row.prompts}"
                  f" | drafted {row.drafted:g} accepted {row.accepted:g}", flush=True)

env = Environment.current("cpu")
doc = {"environment": str(env), "n_prompts": args.n_prompts, "max_new_tokens": args.max_new_tokens,
       "rows": [{"run": "AB"[run], "setting": r.setting, "speculative": r.speculative, "tokens": r.tokens,
                 "wall_ms": r.wall_ms, "tokens_per_s": r.tokens_per_s, "identical": r.identical,
                 "prompts": r.prompts, "drafted": r.drafted, "accepted": r.accepted} for run, r in rows]}
(log_dir / "rows.json").write_text(json.dumps(doc, indent=2) + "\n")
