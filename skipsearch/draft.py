"""What the engine asks of a draft source: the ``Draft`` it returns and the ``Drafter`` base every method's
drafter subclasses. No torch at import, so a method's record and params module can name its drafter's
base without loading it; the engine itself (``skipsearch.decoding``, which re-exports both) does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from skipsearch.config import SamplingParams
    from skipsearch.models import SkippableModel


@dataclass(frozen=True)
class Draft:
    tokens: tuple[int, ...]
    probs: torch.Tensor | None  # q for each drafted token: [k, V], processed; None when greedy


class Drafter:
    """A draft source: the base every method's drafter subclasses.

    Only ``draft`` is required. The other hooks have no-op defaults, so the engine calls them on every
    drafter instead of probing for them. ``draft`` may leave draft-only KV in ``cache``; the engine crops it.
    """

    # With ``wants_tokens`` the engine passes ``history=``, the sequence so far (prompt, output, ending with
    # the pending token), as a list the drafter must not change (e.g. prompt lookup).
    wants_tokens: bool = False
    # With ``wants_hidden_states`` the engine calls ``verified`` after each verify step the decode goes on
    # from (the verify pass then keeps its per-layer hidden states).
    wants_hidden_states: bool = False

    def draft(
        self, sm: SkippableModel, cache, *, pending: int, start: int, limit: int,
        sampling: SamplingParams, generator: torch.Generator,
    ) -> Draft:
        """Up to ``limit`` tokens after ``pending`` (at position ``start``); an empty Draft: plain decoding."""
        raise NotImplementedError

    def observe(self, drafted: int, accepted: int) -> None:
        """What the full model kept of the last draft (called only when something was drafted)."""

    @property
    def threshold(self) -> float | None:
        """The draft-exit γ now (adaptive exit moves it); None: no exit rule. Goes to DecodeStats.final_threshold."""
        return None

    def report(self) -> tuple[tuple[str, float], ...]:
        """Method-specific figures for DecodeStats.drafter_stats."""
        return ()

    def verified(self, sm: SkippableModel, cache, *, hidden: torch.Tensor, position: int) -> None:
        """``hidden`` [L+1, H]: the verify pass's per-layer states of the last kept token, at ``position``
        (only with ``wants_hidden_states``). Its time counts in DecodeStats.seconds but in neither
        draft_seconds nor verify_seconds."""


__all__ = ["Draft", "Drafter"]
