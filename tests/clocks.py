"""Clocks a test injects into the one timer (``skipsearch.engine.timing.use_clock``), so that what the cost model, the
harness and a search *do* with timings is checked the same way on a quiet machine and on a loaded one.

- ``ManualClock``: time moves only when the test moves it (``advance``), e.g. where a real test would sleep.
- ``work_clock(sm)``: time moves only when the model works. Each forward of a decoder layer's attention or MLP,
  of the LM head and of the embedding advances it by a fixed cost, scaled by the rows it ran, so a timing is a
  deterministic function of what ran: a skipped sublayer costs nothing, a k-token verify costs more than a
  one-token step, and a search that picks from timings picks the same on any machine. Stand-ins (a precision
  draft's copies, a trimmed head) are other modules and cost nothing.

Real runs never use these: they read ``time.perf_counter``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from skipsearch.engine import timing


class ManualClock:
    """A clock that stands still until ``advance`` moves it."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock never goes back")
        self.t += seconds


@dataclass(frozen=True)
class WorkCosts:
    """Seconds per call of each hooked module at one row, and the extra share each further row adds."""

    attn: float = 0.001  # one layer's attention
    mlp: float = 0.002  # one layer's MLP
    head: float = 0.001  # the LM head
    embed: float = 0.0005  # the embedding: what every forward pays besides its sublayers
    per_row: float = 0.05  # a forward over T rows costs (1 + per_row * (T - 1)) times a one-row one

    def seconds(self, unit: float, rows: int) -> float:
        return unit * (1.0 + self.per_row * max(rows - 1, 0))


def _rows(output) -> int:
    out = getattr(output, "logits", output)  # a causal LM's output: its logits [B, T, V]
    out = out[0] if isinstance(out, tuple) else out  # attention returns (output, weights)
    return int(out.shape[-2]) if isinstance(out, torch.Tensor) and out.dim() >= 2 else 1


@contextlib.contextmanager
def work_clock(sm=None, costs: WorkCosts = WorkCosts()) -> Iterator[ManualClock]:
    """Inside the block, every timing reads a clock that only models' work moves.

    Any model's attention and MLP modules (by class name: ``...Attention``, ``...MLP``; a precision draft's
    stand-ins are such copies and cost the same) and embeddings are charged, so a model a command loads
    inside the block is covered too. The LM head is ``sm``'s own head where ``sm`` (a SkippableModel) is
    given, so a draft's other head (trimmed, quantized) costs nothing; otherwise every causal LM's forward
    is charged one head for the rows of logits it returns."""
    clock = ManualClock()
    head = sm.hf.get_output_embeddings() if sm is not None else None

    def charge(module, _args, output):
        kind = type(module).__name__
        if kind.endswith("Attention"):
            unit = costs.attn
        elif kind.endswith("MLP"):
            unit = costs.mlp
        elif isinstance(module, torch.nn.Embedding):
            unit = costs.embed
        elif module is head or (head is None and kind.endswith("ForCausalLM")):
            unit = costs.head
        else:
            return
        clock.advance(costs.seconds(unit, _rows(output)))

    handle = torch.nn.modules.module.register_module_forward_hook(charge)
    try:
        with timing.use_clock(clock):
            yield clock
    finally:
        handle.remove()
