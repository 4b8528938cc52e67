"""The `panel` kernel's inductor settings as shipped against the same settings with some changed, in one process:
the same target loaded twice, one copy's graphs built under each side's settings, their plain loops (or a profile's
drafts) interleaved prompt by prompt with the order rotated (``step.interleaved_steps``). Prints each side's step
(ms a token after the first, prefill excluded), the ratio, and whether both decoded the same tokens.

    .venv/bin/python studies/int8-target/settings_ab.py --set cpp.min_chunk_size=4096      (alone on the machine)
    .venv/bin/python studies/int8-target/settings_ab.py --set cpp.min_chunk_size=4096 --precision native \
        --kernel panel-c8 --profile profiles/smollm2-135m/cpu-float32-mixed-zen5-panel-c8.yaml

A side whose graphs are not kept yet builds them first (a minute or so, once per machine): nothing is timed until
both sides are warm.
"""

from __future__ import annotations

import ast
import json
import sys
import warnings


def main() -> None:
    from step import ab_options, loaded_side, timed_ab  # this folder's options, sides and one interleaved loop

    changed = {}
    while "--set" in sys.argv:  # --set KEY=VALUE, any number of them, before ab_options reads the rest
        i = sys.argv.index("--set")
        key, value = sys.argv[i + 1].split("=", 1)
        changed[key] = ast.literal_eval(value)
        del sys.argv[i:i + 2]
    a = ab_options()
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(a.threads)

    from skipsearch.kernels import panel

    shipped = dict(panel.SETTINGS)
    sides = {}
    for name, settings in (("shipped", shipped), ("changed", {**shipped, **changed})):
        panel.SETTINGS = settings
        sides[name] = loaded_side(a)  # its graphs, and its drafts', built under this side's settings
    panel.SETTINGS = shipped
    med, same = timed_ab(sides, a)
    print(json.dumps({"changed": changed, "precision": a.precision, "kernel": a.kernel, "profile": a.profile,
                      "threads": a.threads, "prompts": a.prompts, "tokens": a.tokens, "rounds": a.rounds,
                      "step_ms": {k: round(v, 3) for k, v in med.items()},
                      "changed_over_shipped": round(med["changed"] / med["shipped"], 3),
                      "same_tokens": same}, indent=1))


if __name__ == "__main__":
    main()
