"""One process that decodes on the ``panel`` kernel, for tests/test_graph_cache.py: its compiled graphs come from
(or go to) the kept-graph cache under $SKIPSEARCH_CACHE.

Usage: python -m tests.graph_worker THREADS CAPACITY [EDIT [aside]]
Builds the tiny Llama of tests/conftest.py (with EDIT, its LM head moved by that much noise: other weights, the
same shapes; with ``aside``, the int8 draft's graph built by a child first, as a search's drafts are:
``methods.precision.build_drafts_aside``), runs plain
steps, an 8-token verify block and a compiled int8 draft on ``panel-c4``, and prints one JSON line: the tokens
decoded with the draft, HF greedy's, the precompiled calls loaded or built, and
dynamo's graphs and inductor's and AOTAutograd's cache counters. skipsearch's notices go to stderr, as the CLI's."""

from __future__ import annotations

import json
import logging
import sys

import torch


def main(threads: int, capacity: int, edit: float, aside: bool = False) -> None:
    from torch._dynamo.utils import counters

    from skipsearch import methods
    from skipsearch.config import NO_EXIT, DraftConfig
    from skipsearch.engine.decoding import generate, hf_generate
    from skipsearch.kernels import precompiled
    from tests.conftest import make_tiny_model

    torch.set_num_threads(threads)  # after conftest, which sets its own
    log = logging.getLogger("skipsearch")
    log.addHandler(logging.StreamHandler(sys.stderr))
    log.setLevel(logging.INFO)

    sm = make_tiny_model(vocab_size=64, num_layers=4, seed=3)
    if edit:
        with torch.no_grad():
            head = sm.hf.lm_head.weight
            head.add_(edit * torch.randn(head.shape, generator=torch.Generator().manual_seed(11)))
    sm.use_kernel("panel-c4", capacity=capacity)
    if aside:
        from skipsearch.methods.precision import build_drafts_aside

        build_drafts_aside(sm, ("int8",))
    m = methods.get("precision")
    cfg = DraftConfig(max_draft_tokens=3, exit=NO_EXIT)
    drafter = methods.build_drafter(m.candidate(cfg, m.parse({"scheme": "int8"}, draft=cfg, num_layers=4)), sm)
    prompt = [7, 1, 1, 8, 3, 12, 40]
    tokens = generate(sm, prompt, drafter=drafter, max_new_tokens=16).token_ids
    plain = generate(sm, prompt, max_new_tokens=16).token_ids
    reference = hf_generate(sm, prompt, max_new_tokens=16)
    inductor = {k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}
    print(json.dumps({"tokens": list(tokens), "plain": list(plain), "reference": list(reference),
                      "fx": inductor, "calls": dict(precompiled.COUNTS),
                      "dynamo": counters["stats"]["unique_graphs"],
                      "aot": {k: v for k, v in counters["aot_autograd"].items() if "cache" in k},
                      "folder": sm.kernel_report.cache_dir}))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else 0.0,
         len(sys.argv) > 4 and sys.argv[4] == "aside")
