"""Two builds of one low-bit product in one process, switched prompt by prompt, so both sides see the same machine:
copies built from two commits' source (or one and this tree's), timed inside whole decodes.

    .venv/bin/python studies/int8-target/prefetch_inprocess.py --old 1223490 --new 680d4f3 [--product fp32|dq8]

``--new`` left out: this tree's source. Each copy is compiled with the extension's flags and its op namespace
renamed (``ss_old``, ``ss_new``) into a temporary folder. skipsearch's own CPU kernel of the op is then replaced by
a Python function that calls the selected copy (``torch.library``), so both sides pay the same Python call for each
product; the compiled graphs call the op through the dispatcher, so they run whichever copy is selected.

- ``fp32``: ``skipsearch::f32_panel_linear`` (``lowbit.cpp``), the fp32 target's plain step on `panel-c8`.
- ``dq8``: ``skipsearch::int8_dq_linear`` (``dq.cpp``, the VNNI int8 product of precision drafts), the shipped
  ``cpu-float32-mixed-zen5-panel-c8.yaml`` (lookups, the int8 copy drafting 6 on a miss) on `panel-c8`; its
  fallback drafts' seconds per drafted token, as the drafter reports them, and the decode's step.

Decode-only, 96 tokens of held-out prompts; prints one JSON line with each side's medians and the outputs'
agreement. Alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

import torch

CSRC = "skipsearch/kernels/lowbit/csrc"
PRODUCTS = {"fp32": ("lowbit.cpp", "skipsearch_lowbit", "f32_panel_linear"),
            "dq8": ("dq.cpp", "skipsearch_dq", "int8_dq_linear")}
PROFILE = "profiles/smollm2-135m/cpu-float32-mixed-zen5-panel-c8.yaml"


def build_copy(text: str, namespace: str, tag: str, folder: Path) -> None:
    from torch.utils import cpp_extension

    from skipsearch.kernels.lowbit.build import CFLAGS, LDFLAGS

    text = (text.replace("TORCH_LIBRARY_FRAGMENT(skipsearch,", f"TORCH_LIBRARY_FRAGMENT({tag},")
            .replace("TORCH_LIBRARY_IMPL(skipsearch,", f"TORCH_LIBRARY_IMPL({tag},")
            .replace(namespace, f"{tag}_{namespace}"))
    src = folder / f"{tag}.cpp"
    src.write_text(text)
    out = folder / tag
    out.mkdir()
    cpp_extension.load(f"{tag}_{namespace}", [str(src)], extra_cflags=list(CFLAGS), extra_ldflags=list(LDFLAGS),
                       build_directory=str(out), is_python_module=False)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--old", default="1223490")
    p.add_argument("--new", default=None, help="a commit (default: this tree's file)")
    p.add_argument("--product", choices=tuple(PRODUCTS), default="fp32")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--tokens", type=int, default=96)
    a = p.parse_args()
    torch.set_num_threads(2)
    root = Path(__file__).resolve().parents[2]
    name, namespace, op = PRODUCTS[a.product]

    def source(rev: str | None) -> str:
        if rev is None:
            return (root / CSRC / name).read_text()
        return subprocess.run(["git", "-C", str(root), "show", f"{rev}:{CSRC}/{name}"], check=True,
                              capture_output=True, text=True).stdout

    from skipsearch.api.decode import drafter_factory
    from skipsearch.data import encode_prompt, load_prompts
    from skipsearch.engine.decoding import generate
    from skipsearch.kernels.lowbit import check_lowbit
    from skipsearch.model.loader import load_model
    from skipsearch.profile import load_profile

    check_lowbit()
    with tempfile.TemporaryDirectory() as tmp:
        build_copy(source(a.old), namespace, "ss_old", Path(tmp))
        build_copy(source(a.new), namespace, "ss_new", Path(tmp))
    copies = {"old": getattr(torch.ops.ss_old, op), "new": getattr(torch.ops.ss_new, op)}
    chosen = {"side": "new"}

    def product(*args):
        return copies[chosen["side"]](*args)

    lib = torch.library.Library("skipsearch", "IMPL")
    lib.impl(op, product, "CPU")

    sm = load_model("smollm2-135m", device="cpu", dtype="float32")
    sm.use_kernel("panel-c8", capacity=1024)
    drafters = drafter_factory(load_profile(root / PROFILE), sm) if a.product == "dq8" else (lambda: None)
    first = drafters()
    if first is not None:
        first.warm(sm)
    prompts = [encode_prompt(sm.tokenizer, q) for q in
               load_prompts("mtbench,humaneval", split="heldout", n=a.prompts, seed=0)]
    for side in copies:  # warm-up: each copy's first calls
        chosen["side"] = side
        generate(sm, prompts[0], drafter=drafters(), max_new_tokens=8)
    steps: dict[str, list[float]] = {side: [] for side in copies}
    drafts: dict[str, list[float]] = {side: [] for side in copies}
    outputs: dict[str, list] = {side: [] for side in copies}
    for r in range(a.rounds):
        for i, ids in enumerate(prompts):
            for side in (("old", "new") if (r + i) % 2 == 0 else ("new", "old")):
                chosen["side"] = side
                res = generate(sm, ids, drafter=drafters(), max_new_tokens=a.tokens)
                s = res.stats
                steps[side].append((s.seconds - s.prefill_seconds) / (s.new_tokens - 1) * 1e3)
                report = dict(s.drafter_stats)
                if report.get("fallback_drafted"):
                    drafts[side].append(report["fallback_seconds"] / report["fallback_drafted"] * 1e3)
                if r == 0:
                    outputs[side].append(res.token_ids)
    med = {side: statistics.median(v) for side, v in steps.items()}
    out = {"product": a.product, "old": a.old, "new": a.new or "this tree", "rounds": a.rounds, "prompts": len(prompts),
           "ms_per_token": {side: round(v, 3) for side, v in med.items()},
           "range_ms": {side: [round(min(v), 2), round(max(v), 2)] for side, v in steps.items()},
           "new_over_old": round(med["new"] / med["old"], 3),
           "identical": sum(x == y for x, y in zip(outputs["old"], outputs["new"], strict=True))}
    if all(drafts.values()):
        fb = {side: statistics.median(v) for side, v in drafts.items()}
        out["fallback_ms_per_drafted_token"] = {side: round(v, 3) for side, v in fb.items()}
        out["fallback_new_over_old"] = round(fb["new"] / fb["old"], 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
