"""The fp32 target's plain step with two builds of its panel product in one process: copies built from two
commits' ``lowbit.cpp`` (or one and this tree's), switched prompt by prompt, so both sides see the same machine.

    .venv/bin/python studies/int8-target/prefetch_inprocess.py --old 1223490 --new 680d4f3 [--rounds 4]

(``--new`` left out: this tree's source.) Each copy is compiled with the extension's flags and its op namespace
renamed (``ss_old``, ``ss_new``) into a temporary folder. skipsearch's own CPU kernel of
``skipsearch::f32_panel_linear`` is then replaced by a Python function that calls the selected copy
(``torch.library``), so both sides pay the same Python call for each linear; the `panel-c8` graphs call the op
through the dispatcher, so they run whichever copy is selected. Decode-only steps
of 96 tokens on held-out prompts; prints one JSON line with each side's median step and the outputs' agreement.
Alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = "skipsearch/kernels/lowbit/csrc/lowbit.cpp"


def build_copy(text: str, tag: str, folder: Path) -> None:
    from torch.utils import cpp_extension

    from skipsearch.kernels.lowbit.build import CFLAGS, LDFLAGS

    text = (text.replace("TORCH_LIBRARY_FRAGMENT(skipsearch,", f"TORCH_LIBRARY_FRAGMENT({tag},")
            .replace("TORCH_LIBRARY_IMPL(skipsearch,", f"TORCH_LIBRARY_IMPL({tag},")
            .replace("skipsearch_lowbit", f"{tag}_lowbit"))
    src = folder / f"{tag}.cpp"
    src.write_text(text)
    out = folder / tag
    out.mkdir()
    cpp_extension.load(f"{tag}_lowbit", [str(src)], extra_cflags=list(CFLAGS), extra_ldflags=list(LDFLAGS),
                       build_directory=str(out), is_python_module=False)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--old", default="1223490")
    p.add_argument("--new", default=None, help="a commit (default: this tree's file)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--tokens", type=int, default=96)
    a = p.parse_args()
    torch.set_num_threads(2)
    root = Path(__file__).resolve().parents[2]
    def source(rev: str | None) -> str:
        if rev is None:
            return (root / SOURCE).read_text()
        return subprocess.run(["git", "-C", str(root), "show", f"{rev}:{SOURCE}"], check=True, capture_output=True,
                              text=True).stdout
    from skipsearch.data import encode_prompt, load_prompts
    from skipsearch.engine.decoding import generate
    from skipsearch.kernels.lowbit import check_lowbit
    from skipsearch.model.loader import load_model

    check_lowbit()
    with tempfile.TemporaryDirectory() as tmp:
        build_copy(source(a.old), "ss_old", Path(tmp))
        build_copy(source(a.new), "ss_new", Path(tmp))
    copies = {"old": torch.ops.ss_old.f32_panel_linear, "new": torch.ops.ss_new.f32_panel_linear}
    chosen = {"side": "new"}

    def f32_panel_linear(x, w, bias, n):
        return copies[chosen["side"]](x, w, bias, n)

    lib = torch.library.Library("skipsearch", "IMPL")
    lib.impl("f32_panel_linear", f32_panel_linear, "CPU")

    sm = load_model("smollm2-135m", device="cpu", dtype="float32")
    sm.use_kernel("panel-c8", capacity=1024)
    prompts = [encode_prompt(sm.tokenizer, q) for q in
               load_prompts("mtbench,humaneval", split="heldout", n=a.prompts, seed=0)]
    for side in copies:  # warm-up: each copy's first calls
        chosen["side"] = side
        generate(sm, prompts[0], max_new_tokens=8)
    steps: dict[str, list[float]] = {side: [] for side in copies}
    outputs: dict[str, list] = {side: [] for side in copies}
    for r in range(a.rounds):
        for i, ids in enumerate(prompts):
            for side in (("old", "new") if (r + i) % 2 == 0 else ("new", "old")):
                chosen["side"] = side
                s = generate(sm, ids, max_new_tokens=a.tokens)
                steps[side].append((s.stats.seconds - s.stats.prefill_seconds) / (s.stats.new_tokens - 1) * 1e3)
                if r == 0:
                    outputs[side].append(s.token_ids)
    med = {side: statistics.median(v) for side, v in steps.items()}
    print(json.dumps({"old": a.old, "new": a.new or "this tree", "rounds": a.rounds, "prompts": len(prompts),
                      "step_ms": {side: round(v, 3) for side, v in med.items()},
                      "range_ms": {side: [round(min(v), 2), round(max(v), 2)] for side, v in steps.items()},
                      "new_over_old": round(med["new"] / med["old"], 3),
                      "identical": sum(x == y for x, y in zip(outputs["old"], outputs["new"], strict=True))}))


if __name__ == "__main__":
    main()
