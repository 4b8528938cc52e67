"""``skipsearch bench``: every method and the HF peers side by side, in one run, on the same prompt ids.

- ``peers``: the HF peers as contenders (``model.generate`` in each decoding mode, with a forward counter) and
  a profile's own contender;
- ``rows``: a run summarised, a row per method, each output's verdict against HF greedy's;
- ``runner``: one bench run (``bench``) and each peer's sweep for its best setting (``sweep_peer``);
- ``report``: the report, as JSON, Markdown and rich tables, and the profile updates it supports.
"""

from __future__ import annotations

from skipsearch.bench.peers import (
    ASSISTED,
    BASELINE,
    HEURISTIC,
    HF_COMPILED,
    HF_PROFILE,
    PEERS,
    PROFILE_IN_HF,
    Peer,
    early_exit_layers,
    hf_compiled_method,
    hf_method,
    hf_profile_method,
    peer_method,
    profile_method,
)
from skipsearch.bench.rows import BenchRow, Verdicts, exact_verdicts, model_verdicts, summarize
from skipsearch.bench.runner import BenchReport, BenchSettings, PromptResult, Sweep, bench, sweep_peer

__all__ = ["ASSISTED", "BASELINE", "HEURISTIC", "HF_COMPILED", "HF_PROFILE", "PEERS", "PROFILE_IN_HF", "BenchReport",
           "BenchRow", "BenchSettings", "Peer", "PromptResult", "Sweep", "Verdicts", "bench", "early_exit_layers",
           "exact_verdicts", "hf_compiled_method", "hf_method", "hf_profile_method", "model_verdicts", "peer_method",
           "profile_method", "summarize", "sweep_peer"]
