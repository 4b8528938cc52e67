"""The README search's calibration (8 prompts of mtbench,humaneval's calib split x 96 tokens) decoded eagerly and on
the panel-c8 kernel, as ``search/optimize`` now decodes it: whether the continuations are the same tokens, and how
long each took. Alone on the machine.
    .venv/bin/python studies/startup/calibration_kernel_check.py"""

import time

import torch

from skipsearch.engine.calibration import calibrate_on
from skipsearch.model.loader import load_model

torch.set_num_threads(2)
sm = load_model("smollm2-135m")
t = time.perf_counter()
eager = calibrate_on(sm, dataset="mtbench,humaneval", n_prompts=8, max_new_tokens=96)
t_eager = time.perf_counter() - t
t = time.perf_counter()
kernel = calibrate_on(sm, dataset="mtbench,humaneval", n_prompts=8, max_new_tokens=96, kernel="panel-c8")
t_kernel = time.perf_counter() - t
same = sum(a == b for a, b in zip(eager.continuations, kernel.continuations, strict=True))
print(f"eager {t_eager:.1f} s; on panel-c8 {t_kernel:.1f} s (its graphs loaded or built included); "
      f"the same continuations on {same} of {len(eager.continuations)} prompts")
