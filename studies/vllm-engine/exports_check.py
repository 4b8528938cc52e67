"""Every shipped profile's vLLM export served by vLLM's CPU build, its outputs against HF greedy's (issue 63: "every
vLLM export of every shipped draft profile loads in vLLM's CPU build and decodes identically to HF greedy").

Each profile of ``profiles/`` for the default model is exported with ``export --engine vllm --nearest``; exports
that write the same ``--speculative-config`` are served once (a draft model's config is keyed by its scheme, its
checkpoint written by the first profile that needs it). Each distinct config gets a server of its own (fp32, the
model's own checkpoint, its worker bound to 2 CPUs) and decodes the held-out prompts; every output is compared with
HF greedy's, token for token. Timings are not the point here (one pass, few prompts): see search-*.log and bench-*.

Usage: .venv/bin/python studies/vllm-engine/exports_check.py --python .venv-vllm/bin/python [--n-prompts 4]
       [--max-new-tokens 48] [--out studies/vllm-engine/exports-TAG]
"""

import argparse
import glob
import json
import tempfile
from pathlib import Path

import torch

from skipsearch.api.export import export_profile
from skipsearch.bench.vllm import run_setting
from skipsearch.checkpoints import ensure_embedded
from skipsearch.data import encode_prompt, load_prompts
from skipsearch.engine.decoding import hf_generate
from skipsearch.export import ExportError
from skipsearch.hardware import Environment
from skipsearch.model.loader import load_model
from skipsearch.profile import load_profile
from skipsearch.servers.process import ServerError

ROOT = Path(__file__).resolve().parents[2]
ap = argparse.ArgumentParser()
ap.add_argument("--python", required=True)
ap.add_argument("--n-prompts", type=int, default=4)
ap.add_argument("--max-new-tokens", type=int, default=48)
ap.add_argument("--out", default=str(ROOT / "studies/vllm-engine/exports"))
args = ap.parse_args()
torch.set_num_threads(2)
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)

sm = load_model("smollm2-135m", device="cpu", dtype="float32")
ids = [encode_prompt(sm.tokenizer, p) for p in load_prompts("mtbench,humaneval", split="heldout", n=args.n_prompts)]
with torch.inference_mode():
    reference = [hf_generate(sm, p, max_new_tokens=args.max_new_tokens) for p in ids]
del sm

rows, configs = [], {}  # configs: key -> (config, [profiles])
with tempfile.TemporaryDirectory() as tmp:
    for path in sorted(glob.glob(str(ROOT / "profiles/*/*.yaml"))):
        rel = str(Path(path).relative_to(ROOT))
        prof = load_profile(path)
        if prof.model.name != "smollm2-135m":
            rows.append({"profile": rel, "result": f"not served: a profile of {prof.model.name}"})
            continue
        try:
            done = export_profile(path, engine="vllm", out=Path(tmp) / Path(path).stem, nearest=True)
        except ExportError as e:
            rows.append({"profile": rel, "result": f"export refused: {e}"})
            continue
        config = json.loads((Path(tmp) / Path(path).stem / "speculative_config.json").read_text())
        key = json.dumps({k: (Path(v).name if k == "model" else v) for k, v in config.items()}, sort_keys=True)
        configs.setdefault(key, (config, []))[1].append((rel, done.nearest))
    model_dir = ensure_embedded("smollm2-135m")
    for key, (config, profiles) in configs.items():
        label = "plain" if not config else json.dumps(config, sort_keys=True)
        try:
            row = run_setting(args.python, model_dir, label[:60], config or None, ids, reference,
                              max_new_tokens=args.max_new_tokens, log_dir=out, threads=2, memory_fraction=0.25)
            result = (f"identical {row.identical}/{row.prompts}, {row.tokens_per_s:.1f} tokens/s, drafted "
                      f"{row.drafted:g}, accepted {row.accepted:g}")
        except ServerError as e:
            result = f"vLLM failed: {e}"
        print(f"{key} | {len(profiles)} profile(s) | {result}", flush=True)
        for rel, nearest in profiles:
            rows.append({"profile": rel, "config": json.loads(key), "nearest": nearest, "result": result})

doc = {"environment": str(Environment.current("cpu")), "n_prompts": args.n_prompts,
       "max_new_tokens": args.max_new_tokens, "rows": rows}
(out / "rows.json").write_text(json.dumps(doc, indent=2) + "\n")
