"""The int8 target (weight-only: fp32 activations) against the int8-dynamic target (the same int8 weights, each
row of activations rounded to int8: torchao's Int8DynamicActivationInt8WeightConfig) in one process: each loaded
on the same kernel, their plain loops interleaved prompt by prompt with the order rotated, so that both see the
same machine. Prints the step (ms a token after the first, prefill excluded), each target's streamed bytes and
memory time at the bandwidth measured at the end, and whether the int8-dynamic target's greedy tokens equal those
of HF ``generate`` over a fresh copy of the model quantized by torchao itself.

    .venv/bin/python studies/int8-target/dynamic_step_ab.py --kernel panel-c2 [--prompts 4 --tokens 96 --rounds 3]
    (alone on the machine)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step import bandwidth, interleaved_steps, streamed_bytes  # noqa: E402  (the int8 study's own measures)


def torchao_reference(checkpoint_name: str, prompts: list, tokens: int) -> list[list[int]]:
    """Greedy tokens of HF generate over the fp32 model quantized by torchao's own int8-dynamic config."""
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_
    from transformers import AutoModelForCausalLM

    from skipsearch.checkpoints import find_checkpoint

    model = AutoModelForCausalLM.from_pretrained(find_checkpoint(checkpoint_name).path, torch_dtype=torch.float32)
    model.eval()
    quantize_(model, Int8DynamicActivationInt8WeightConfig(set_inductor_config=False))
    out = []
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            g = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=tokens, do_sample=False)
            out.append(g[0, len(ids):].tolist())
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kernel", default="panel-c2")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(a.threads)
    from skipsearch.data import encode_prompt, load_prompts
    from skipsearch.model.loader import load_model

    targets = {}
    for precision in ("int8", "int8-dynamic"):
        sm = load_model("smollm2-135m", device="cpu", dtype="float32", precision=precision)
        sm.use_kernel(a.kernel, capacity=1024)
        targets[precision] = sm
    prompts = [encode_prompt(targets["int8"].tokenizer, q) for q in
               load_prompts("mtbench,humaneval", split="heldout", n=a.prompts, seed=0)]
    steps, outputs = interleaved_steps({k: (sm, None) for k, sm in targets.items()}, prompts, rounds=a.rounds,
                                       tokens=a.tokens)
    gbs = bandwidth()
    out = {"kernel": a.kernel, "threads": a.threads, "bandwidth_gb_s": round(gbs, 2), "prompts": len(prompts),
           "tokens": a.tokens, "rounds": a.rounds}
    for name, sm in targets.items():
        b = streamed_bytes(sm)
        step = statistics.median(steps[name])
        out[name] = {"streamed_mb": round(b / 1e6, 1), "memory_time_ms": round(b / gbs / 1e6, 2),
                     "step_ms": round(step * 1e3, 2), "step_ms_each": [round(x * 1e3, 2) for x in steps[name]],
                     "step_over_memory_time": round(step / (b / gbs / 1e9), 2)}
    ref = torchao_reference("smollm2-135m", prompts, a.tokens)
    out["int8_dynamic_identical_to_torchao_hf_greedy"] = sum(
        x == y for x, y in zip(outputs["int8-dynamic"], ref, strict=True))
    out["int8_dynamic_first_difference_from_torchao"] = [
        next((i for i, (x, y) in enumerate(zip(ours, theirs, strict=False)) if x != y), None)
        for ours, theirs in zip(outputs["int8-dynamic"], ref, strict=True)]
    out["int8_dynamic_equal_to_int8"] = sum(
        x == y for x, y in zip(outputs["int8-dynamic"], outputs["int8"], strict=True))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
