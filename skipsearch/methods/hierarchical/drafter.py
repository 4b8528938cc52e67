"""Hierarchical self-speculative decoding: three depths of one model, lossless by composition.

M_p is the full model, M_q a medium draft (a few sublayers skipped), M_s a small draft (many skipped).
One cycle of the engine (decoding.generate) calls ``HierarchicalDrafter.draft`` once, and that runs m
*rounds*. Each round:
  1. M_s drafts n tokens, one single-token forward each;
  2. M_q verifies them in one forward over its pending token and the n drafts;
  3. standard speculative decoding at the M_q level: greedy keeps the drafts that equal M_q's argmax,
     sampling uses the engine's own rejection sampler with p = M_q and q = M_s;
  4. the cache keeps M_q's KV for the accepted prefix, and M_q's own token is the next round's input.
The rounds' tokens form the block, returned with M_q's processed distributions as the draft
probabilities. The block is a sample from M_q (step 3 is lossless), so the engine's rejection sampling
against M_p is exact, and greedy output is M_p's greedy output whatever the drafts were.

KV cache: the engine hands over a cache with full-model KV for [0, start). M_s's KV is always cropped
before M_q's forward; M_q's KV for accepted tokens stays for later rounds; the engine crops back to
``start`` before M_p verifies. Two rules make this exact, both checked in ``Hierarchy``:
- M_s must skip every attention sublayer M_q skips, so every attention M_s runs has M_q's KV for each
  position in the cycle (no holes);
- with n >= 1, M_q must keep layer 0's attention: transformers sizes the mask of a multi-token forward
  from layer 0's cache length, which must then be the length of every attention that runs.

The measuring half (α, β teacher-forced; c, c_s, v(k) timed with the one timer) and the predicted
against measured run behind ``skipsearch plan`` live in planner.py, its closed forms in closed_form.py.
"""

from __future__ import annotations

import torch

from skipsearch.engine.decoding import Draft, Drafter, accept_greedy, draw, process_logits, rejection_sample
from skipsearch.methods.hierarchical.params import Hierarchy


class HierarchicalDrafter(Drafter):
    """The three-level draft source for decoding.generate; holds per-sequence counters, hence a class."""

    def __init__(self, hierarchy: Hierarchy) -> None:
        self.h = hierarchy
        # (tested, accepted) at each level; tested counts accepted tokens plus the one that was rejected,
        # so accepted / tested estimates the per-token acceptance rate of the i.i.d. model.
        self._p_tested = self._p_accepted = 0
        self._q_tested = self._q_accepted = 0
        self._rounds = self._cycles = self._block_tokens = 0

    def draft(self, sm, cache, *, pending, start, limit, sampling, generator) -> Draft:
        block: list[int] = []
        qs: list[torch.Tensor] = []  # M_q's processed distributions, one row per block token
        token = pending  # the newest token, whose KV is not in the cache yet
        for _ in range(self.h.m):
            room = limit - len(block)
            if room <= 0:
                break
            pos = start + len(block)  # where `token` sits
            n = min(self.h.n, room - 1)  # a round yields at most n + 1 tokens
            # 1. M_s drafts n tokens after `token`
            drafts, s_probs = self._small_drafts(sm, cache, token, pos, n, sampling, generator)
            # 2. M_q verifies [token, *drafts] in one forward, over M_q's KV: first drop M_s's
            sm.crop(cache, pos)
            with sm.drafting(self.h.medium):
                logits = sm.forward(torch.tensor([token, *drafts]), start=pos, cache=cache)  # [n+1, V]
            # 3. accept / resample at the M_q level
            if sampling.greedy:
                a, own = accept_greedy(drafts, logits)  # against M_q's argmax after each prefix
                new = [*drafts[:a], own]
            else:
                a, own = rejection_sample(logits, Draft(tuple(drafts), s_probs), sampling, generator)
                new = [*drafts[:a], own]
                # each block token is distributed as M_q at its position, whichever way it was chosen
                qs.append(process_logits(logits[: a + 1], sampling))  # [a+1, V]
            # 4. keep M_q's KV for `token` and the accepted drafts; M_q's own token goes on to the next round
            sm.crop(cache, pos + 1 + a)
            block.extend(new)
            token = new[-1]
            self._rounds += 1
            self._q_accepted += a
            self._q_tested += a + (1 if a < n else 0)
        self._cycles += 1
        self._block_tokens += len(block)
        return Draft(tuple(block), torch.cat(qs) if qs else None)

    def _small_drafts(self, sm, cache, token, pos, n, sampling, generator) -> tuple[list[int], torch.Tensor | None]:
        drafts: list[int] = []
        probs: list[torch.Tensor] = []
        with sm.drafting(self.h.small):
            for j in range(n):
                logits = sm.forward(torch.tensor([token]), start=pos + j, cache=cache, last_only=True)[-1]  # [V]
                if sampling.greedy:
                    token = int(logits.argmax())
                else:
                    s = process_logits(logits, sampling)  # [V]
                    probs.append(s)
                    token = draw(s, generator)
                drafts.append(token)
        return drafts, (torch.stack(probs) if probs else None)

    def observe(self, drafted: int, accepted: int) -> None:
        self._p_accepted += accepted
        self._p_tested += accepted + (1 if accepted < drafted else 0)

    def report(self) -> tuple[tuple[str, float], ...]:
        """Measured α (M_q tokens by M_p), β (M_s tokens by M_q) and the block sizes, for DecodeStats."""
        out = [("m", float(self.h.m)), ("n", float(self.h.n))]
        if self._p_tested:
            out.append(("alpha", self._p_accepted / self._p_tested))
        if self._q_tested:
            out.append(("beta", self._q_accepted / self._q_tested))
        if self._cycles:
            out.append(("block_tokens", self._block_tokens / self._cycles))
        if self._rounds:
            out.append(("medium_tokens_per_round", self._block_tokens / self._rounds))
        return tuple(out)
