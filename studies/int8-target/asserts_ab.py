"""inductor's input and output size asserts in the `panel` kernel's C++ wrapper, on (as shipped before) and off,
in one process: the same target loaded twice, one copy's graphs built under the kernel's settings with
``size_asserts`` as given, their plain loops interleaved prompt by prompt with the order rotated. Prints each side's
step (ms a token after the first, prefill excluded), the ratio, and whether both decoded the same tokens.

    .venv/bin/python studies/int8-target/asserts_ab.py --precision int8 --kernel panel-c2     (alone on the machine)
    .venv/bin/python studies/int8-target/asserts_ab.py --precision native --kernel panel-c8
    .venv/bin/python studies/int8-target/asserts_ab.py --precision native --kernel panel-c8 \
        --profile profiles/smollm2-135m/cpu-float32-mixed-zen5-panel-c8.yaml

With ``--profile``, both sides decode with that profile's drafts (their graphs built under the side's settings too)
and the figure is the decode's time a token after the first.

A side whose graphs are not kept yet builds them first (minutes, once per machine): nothing is timed until both
sides are warm.
"""

from __future__ import annotations

import json
import warnings


def main() -> None:
    from step import ab_options, loaded_side, timed_ab  # this folder's options, sides and one interleaved loop

    a = ab_options()
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(a.threads)

    from skipsearch.kernels import panel

    shipped = dict(panel.SETTINGS)
    sides = {}
    for name, asserts in (("asserts on", True), ("asserts off", False)):
        panel.SETTINGS = {**shipped, "size_asserts": asserts}
        sides[name] = loaded_side(a)  # its graphs, and its drafts', built under this side's settings
    panel.SETTINGS = shipped
    med, same = timed_ab(sides, a)
    print(json.dumps({"precision": a.precision, "kernel": a.kernel, "profile": a.profile, "threads": a.threads,
                      "prompts": a.prompts, "tokens": a.tokens, "rounds": a.rounds,
                      "step_ms": {k: round(v, 3) for k, v in med.items()},
                      "off_over_on": round(med["asserts off"] / med["asserts on"], 3),
                      "same_tokens": same}, indent=1))


if __name__ == "__main__":
    main()
