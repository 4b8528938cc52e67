"""What the engine asks of a draft source: the ``Draft`` it returns and the ``Drafter`` base every method's
drafter subclasses; and, for the batched engine (``skipsearch.engine.batched``), the ``BatchDrafter`` base. No torch at
import, so a method's record and params module can name its drafter's base without loading it; the engines
themselves (``skipsearch.engine.decoding``, ``skipsearch.engine.batched``) do."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from skipsearch.config import SamplingParams
    from skipsearch.model.skippable import SkippableModel


@dataclass(frozen=True)
class Draft:
    tokens: tuple[int, ...]
    probs: torch.Tensor | None  # q for each drafted token: [k, V], processed; None when greedy
    # the draft model's forwards this draft took (DecodeStats.draft_steps): None, one a token (a model that drafts
    # token by token); 0 for tokens read from the text so far (prompt lookup), which run no model
    forwards: int | None = None

    @property
    def steps(self) -> int:
        return len(self.tokens) if self.forwards is None else self.forwards


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

    def warm(self, sm: SkippableModel) -> None:
        """Build now what the first draft would build (a compiled draft's graph: a minute or more), so that no
        decode pays it inside its time. Changes nothing the drafts depend on; the default has nothing to build."""

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


class DraftStep(Protocol):
    """What a batch drafter runs its draft model through (``batched.BatchStep`` is the engine's): ``step(tokens)``,
    one batched one-token forward of the model as it stands, each row's token at its next draft position;
    logits [B, V]."""

    def __call__(self, tokens: Sequence[int]) -> torch.Tensor: ...


class BatchDrafter:
    """A batched draft source: proposes up to ``limits[i]`` tokens for each row i of a batch (greedy only).

    Only ``draft`` is required; the other hooks have no-op defaults. A batch drafter is built for one batch
    (``begin`` tells it the number of rows) and drafts for every row each cycle; a row may get fewer tokens
    than its limit, or none (that row verifies its pending token alone). A draft model runs through ``step``,
    one batched one-token forward of the model as it stands (inside the drafter's own contexts: skipped
    sublayers, stand-ins), which leaves draft-only KV in the batch's cache; the engine crops it.
    """

    # With ``wants_tokens`` the engine passes ``history=``: per row, the sequence so far (prompt, output, ending
    # with the pending token), as lists the drafter must not change (e.g. prompt lookup).
    wants_tokens: bool = False

    def begin(self, rows: int) -> None:
        """A batch of ``rows`` sequences starts (called once, before its first ``draft``)."""

    def draft(self, sm: SkippableModel, step: DraftStep, *, pending: Sequence[int], limits: Sequence[int],
              **kwargs) -> tuple[tuple[int, ...], ...]:
        """Per row, up to ``limits[i]`` tokens after ``pending[i]`` (a limit of 0: that row drafts nothing, it is
        finished or at its last token). ``kwargs`` holds ``history`` with ``wants_tokens``."""
        raise NotImplementedError

    def observe(self, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        """Per row, what the full model kept of the last draft (called after every cycle that drafted)."""

    def single(self) -> Drafter | None:
        """The same draft as a one-sequence ``Drafter``: a batch of one decodes through ``decoding.generate`` with
        it (today's path and speed, the compiled kernel included). None: a batch of one runs the batched loop."""
        return None


__all__ = ["BatchDrafter", "Draft", "DraftStep", "Drafter"]
