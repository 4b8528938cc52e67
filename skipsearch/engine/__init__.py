"""The engine: the one decoding loop and the ``Drafter`` base (``decoding``, ``draft``), the batched engine
(``batched``), the one timing harness and the one timer (``harness``, ``timing``), the surrogate that replays
traces under a cost model (``surrogate``), its calibration on prompts (``calibration``), the lossless check
(``equivalence``), and a cost file measured on a loaded model (``measuring``). Methods draft through it; kernels and
the model adapter are below it.
"""
