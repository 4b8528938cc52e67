"""One line for people per candidate: what search tables, study listings and re-planning reports print."""

from __future__ import annotations

from skipsearch.config import Candidate, DraftConfig
from skipsearch.methods.layer_skip import METHOD as LAYER_SKIP


def candidate_summary(c: Candidate) -> str:
    """One line for people: the method (unless layer-skip), its params, K, the skip sets and exit rule."""
    d = c.draft
    if d.is_autoregressive:
        return "autoregressive"
    # params that are data rather than settings (a trimmed head's encoded ids and checksum) are not shown
    shown = [(k, v) for k, v in c.params if not (isinstance(v, str) and len(v) > 24)]
    parts = [] if c.method == LAYER_SKIP.name else [c.method]
    parts += [f"{k}={v}" for k, v in shown]
    parts.append(f"K={d.max_draft_tokens}")
    if d.skip_attn or d.skip_mlp or c.method == LAYER_SKIP.name:
        parts += [f"attn{list(d.skip_attn)}", f"mlp{list(d.skip_mlp)}"]
    ex = d.exit
    if ex.adaptive:
        parts.append(f"adaptive γ0={ex.threshold:g}")
    elif ex.threshold:
        parts.append(f"γ={ex.threshold:g}")
    elif c.method == LAYER_SKIP.name:
        parts.append("no exit")
    return " ".join(parts)


def config_summary(config: DraftConfig) -> str:
    """``candidate_summary`` of a layer-skip config."""
    return candidate_summary(Candidate(LAYER_SKIP.name, config))


__all__ = ["candidate_summary", "config_summary"]
