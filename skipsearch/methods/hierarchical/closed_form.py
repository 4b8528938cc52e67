"""The hierarchical planner: how many medium (m) and small (n per medium) draft tokens pay, in closed form.

Three levels of one model (Chen, "An Exploration of Hierarchical Speculative Decoding"):
M_p the full model verifies; M_q, a medium draft, skips a few sublayers; M_s, a small draft, skips many.
Two acceptance processes are modelled here, both under the paper's i.i.d. assumption.

- ``paper``: Algorithm 2 as written. A cycle drafts a fixed block of m(n+1) tokens, each group n M_s
  tokens then one M_q token, and M_p checks every token itself: M_s tokens pass with β, M_q tokens
  with α, up to the first rejection. Expected tokens per cycle: Theorem 3.2; time improvement with
  free verification: Theorem 3.4.
- ``composed``: the decoder we run (drafter.py), lossless by composition. Each of m rounds,
  M_s drafts n tokens and M_q verifies them by standard speculative decoding, so a round yields
  G = A + 1 M_q tokens (A ~ leading β-successes, at most n). M_p then verifies the whole block of
  B = G_1 + ... + G_m tokens, each an M_q token, so each passes with α. Here β is M_s's acceptance
  by M_q, not by M_p.

Costs are in full-model single-token steps. The paper charges 1 + m·c + m·n·c·c_s per cycle, that is,
it takes a forward over many tokens to cost no more than a forward over one. Our generalisation
charges what the composed decoder does:
    E[v(B + 1)]         M_p's one forward over the pending token and the block
  + m · c · v_q(n + 1)  M_q's forward over its pending token and the n small drafts, once per round
  + m · n · c · c_s     M_s's single-token steps
with v(k) the measured cost of a k-token forward of M_p relative to one step and v_q(k) the same for
M_q. With v ≡ v_q ≡ 1 this is exactly the paper's denominator.

Nothing here needs torch: the maths is pure, and a Monte-Carlo simulator of each process is the
oracle the closed forms are tested against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from skipsearch.config import ConfigError


# -- inputs --------------------------------------------------------------------------------------------
def _check_rate(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value <= 1.0:
        raise ConfigError(f"{name} must be in [0, 1], got {value!r}")


def check_shape(m: int, n: int) -> None:
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ConfigError(f"m (medium tokens per cycle) must be an integer >= 1, got {m!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ConfigError(f"n (small tokens per medium token) must be an integer >= 0, got {n!r}")


def _check_curve(name: str, curve: Sequence[float]) -> tuple[float, ...]:
    out = tuple(float(v) for v in curve)
    if any(not math.isfinite(v) or v <= 0 for v in out):
        raise ConfigError(f"{name} must list positive costs v(1), v(2), ..., got {list(curve)}")
    return out


@dataclass(frozen=True)
class PlanInputs:
    """The measured (or assumed) figures the planner works from."""

    alpha: float  # acceptance of an M_q token by M_p
    beta: float  # acceptance of an M_s token by the level that checks it (M_q in our decoder)
    c: float  # one M_q step / one M_p step
    cs: float  # one M_s step / one M_q step
    verify: tuple[float, ...] = ()  # v(k), k = 1..: M_p forward over k tokens / one M_p step; () = free
    verify_medium: tuple[float, ...] = ()  # v_q(k): M_q forward over k tokens / one M_q step; () = as verify

    def __post_init__(self) -> None:
        _check_rate("alpha", self.alpha)
        _check_rate("beta", self.beta)
        for name in ("c", "cs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ConfigError(f"{name} must be a cost ratio >= 0, got {value!r}")
        object.__setattr__(self, "verify", _check_curve("verify", self.verify))
        object.__setattr__(self, "verify_medium", _check_curve("verify_medium", self.verify_medium))

    def v(self, k: int) -> float:
        return curve_at(self.verify, k)

    def v_medium(self, k: int) -> float:
        return curve_at(self.verify_medium or self.verify, k)


def curve_at(curve: Sequence[float], k: int) -> float:
    """v(k) from a measured curve v(1..K), extended linearly past K; 1.0 (free) for an empty curve."""
    if not curve:
        return 1.0
    if k <= len(curve):
        return curve[k - 1]
    slope = (curve[-1] - curve[0]) / max(len(curve) - 1, 1)
    return curve[-1] + slope * (k - len(curve))


def parse_curve(text: str) -> tuple[float, ...]:
    """"1,1.1,1.25" -> (1.0, 1.1, 1.25): a verify curve given on the command line; "" is free."""
    try:
        return _check_curve("verify", [float(v) for v in text.split(",")]) if text.strip() else ()
    except ValueError:
        raise ConfigError(f"a verify curve must be numbers separated by commas, got {text!r}") from None


def _geometric(x: float, k: int) -> float:
    """1 + x + ... + x^(k-1), summed term by term: exact at x = 1 where (1 - x^k)/(1 - x) is 0/0."""
    return sum(x**i for i in range(k))


# -- the paper: Algorithm 2 ----------------------------------------------------------------------------
def expected_tokens(alpha: float, beta: float, m: int, n: int) -> float:
    """Theorem 3.2: E[tokens per cycle] = (1−β^{n+1})/(1−β) · (1−Q^m)/(1−Q) + Q^m, Q = α·β^n."""
    _check_rate("alpha", alpha)
    _check_rate("beta", beta)
    check_shape(m, n)
    q = alpha * beta**n
    return _geometric(beta, n + 1) * _geometric(q, m) + q**m


def time_improvement(alpha: float, beta: float, c: float, cs: float, m: int, n: int) -> float:
    """Theorem 3.4: expected tokens / (1 + m·c + m·n·c·c_s), verification taken as free."""
    PlanInputs(alpha, beta, c, cs)  # validates
    return expected_tokens(alpha, beta, m, n) / (1 + m * c + m * n * c * cs)


def paper_tokens_distribution(alpha: float, beta: float, m: int, n: int) -> tuple[float, ...]:
    """Table A.1: P(X = x) for x = 1 .. m(n+1)+1, written out as the paper's appendix does."""
    _check_rate("alpha", alpha)
    _check_rate("beta", beta)
    check_shape(m, n)
    probs = []
    for i in range(m):  # group i: n small positions, then the medium one
        lead = beta ** (n * i) * alpha**i
        probs += [lead * beta**j * (1 - beta) for j in range(n)]
        probs.append(lead * beta**n * (1 - alpha))
    probs.append(beta ** (n * m) * alpha**m)
    return tuple(probs)


def paper_cycle_cost(inputs: PlanInputs, m: int, n: int) -> float:
    """Algorithm 2's cycle with our verify costs: a fixed block of m(n+1) tokens."""
    check_shape(m, n)
    return inputs.v(m * (n + 1) + 1) + m * inputs.c * inputs.v_medium(n + 1) + m * n * inputs.c * inputs.cs


# -- ours: the composed, lossless decoder --------------------------------------------------------------
def round_distribution(beta: float, n: int) -> tuple[float, ...]:
    """P(G = g), g = 1..n+1: M_q tokens from one round (A accepted small drafts, then M_q's own)."""
    _check_rate("beta", beta)
    return tuple([beta**a * (1 - beta) for a in range(n)] + [beta**n])


def block_distribution(beta: float, m: int, n: int) -> tuple[float, ...]:
    """P(B = b), b = 0..m(n+1): the block M_p verifies is the sum of m independent rounds."""
    check_shape(m, n)
    g = np.array((0.0, *round_distribution(beta, n)))  # index = tokens in the round
    b = np.array([1.0])
    for _ in range(m):
        b = np.convolve(b, g)
    return tuple(float(x) for x in b)


def composed_expected_tokens(alpha: float, beta: float, m: int, n: int) -> float:
    """E[tokens per cycle] of the composed decoder, in closed form.

    Given a block of B tokens, M_p emits Σ_{i=0}^{B} α^i on average, (1 − α^{B+1})/(1 − α). The rounds
    are independent, so E[α^B] = E[α^G]^m with E[α^G] = α·[(1−β)·Σ_{a<n}(αβ)^a + (αβ)^n], and
    E = (1 − α·E[α^G]^m)/(1 − α). At α = 1 every token passes: E = 1 + m·E[G].
    """
    _check_rate("alpha", alpha)
    _check_rate("beta", beta)
    check_shape(m, n)
    if alpha == 1.0:
        return 1.0 + m * _geometric(beta, n + 1)
    g = alpha * ((1 - beta) * _geometric(alpha * beta, n) + (alpha * beta) ** n)
    return (1 - alpha * g**m) / (1 - alpha)


@dataclass(frozen=True)
class PlanRow:
    m: int
    n: int
    block_tokens: float  # E[B]: M_q tokens M_p verifies per cycle (composed)
    tokens: float  # E[tokens per cycle] of the composed decoder: the predicted τ
    cost: float  # E[cycle cost] in full steps, with the verify curves
    speedup: float  # tokens / cost: the predicted speedup over plain decoding
    paper_tokens: float  # Theorem 3.2 with the same α, β
    paper_speedup: float  # Theorem 3.4 (verification free)


def plan_row(inputs: PlanInputs, m: int, n: int) -> PlanRow:
    check_shape(m, n)
    a, b = inputs.alpha, inputs.beta
    blocks = block_distribution(b, m, n)
    verify = sum(p * inputs.v(k + 1) for k, p in enumerate(blocks) if p > 0)
    cost = verify + m * inputs.c * inputs.v_medium(n + 1) + m * n * inputs.c * inputs.cs
    tokens = composed_expected_tokens(a, b, m, n)
    return PlanRow(
        m=m, n=n, block_tokens=m * _geometric(b, n + 1), tokens=tokens, cost=cost, speedup=tokens / cost,
        paper_tokens=expected_tokens(a, b, m, n), paper_speedup=time_improvement(a, b, inputs.c, inputs.cs, m, n),
    )


@dataclass(frozen=True)
class Plan:
    inputs: PlanInputs
    rows: tuple[PlanRow, ...]  # every (m, n) on the grid, m-major
    best: PlanRow  # the highest predicted speedup of the composed decoder
    best_two_level: PlanRow  # the best with n = 0: plain self-speculative decoding with M_q
    best_three_level: PlanRow | None  # the best with n >= 1 (None when the grid has no n >= 1)
    third_level_pays: bool  # best_three_level predicted faster than best_two_level
    # The third level pays iff c_s is below this, all else fixed. None: no c_s decides it, because
    # not even a free M_s pays, or because with c = 0 an M_s step costs nothing whatever c_s is.
    break_even_cs: float | None
    # ... and at every β from this one up to 1 (on a 0.005 grid that also holds the given β).
    # None: not at β = 1. Bigger blocks cost more to verify, so paying need not grow with β.
    break_even_beta: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def plan_table(inputs: PlanInputs, *, max_m: int = 8, max_n: int = 4) -> Plan:
    """Predict every (m, n) in 1..max_m × 0..max_n and say whether the third level pays."""
    check_shape(max_m, max_n)
    rows = tuple(plan_row(inputs, m, n) for m in range(1, max_m + 1) for n in range(max_n + 1))
    two = max((r for r in rows if r.n == 0), key=lambda r: r.speedup)
    three_rows = [r for r in rows if r.n >= 1]
    three = max(three_rows, key=lambda r: r.speedup) if three_rows else None
    # The verdict and both break-evens come from one comparison: does some n >= 1 row beat the best
    # n = 0 row? Neither c_s nor β changes an n = 0 row (no M_s in it), so that bar stays put.
    pays = three is not None and three.speedup > two.speedup
    # For n >= 1 a row's speedup tokens / (rest + m·n·c·c_s) falls as c_s grows (for c > 0), so each
    # row beats the bar iff c_s is below a closed-form limit, and the third level pays iff c_s is
    # below the largest: the same inequality as `pays`, solved for c_s. With c = 0, c_s cancels out.
    cs_limits = [(r.tokens / two.speedup - (r.cost - r.m * r.n * inputs.c * inputs.cs)) / (r.m * r.n * inputs.c)
                 for r in three_rows if inputs.c > 0]
    best_cs = max(cs_limits, default=None)
    # β moves both the tokens and the verify cost (bigger blocks), so it is found by a scan, down from
    # β = 1 while the third level still pays; the given β is on the scan, so the verdict agrees with it.
    beta_even = None
    for beta in sorted({i / 200 for i in range(201)} | {inputs.beta}, reverse=True) if three_rows else ():
        trial = PlanInputs(inputs.alpha, beta, inputs.c, inputs.cs, inputs.verify, inputs.verify_medium)
        if not any(plan_row(trial, r.m, r.n).speedup > two.speedup for r in three_rows):
            break
        beta_even = beta
    return Plan(
        inputs=inputs, rows=rows, best=max(rows, key=lambda r: r.speedup), best_two_level=two,
        best_three_level=three, third_level_pays=pays,
        break_even_cs=best_cs if best_cs is not None and best_cs > 0 else None, break_even_beta=beta_even,
    )


# -- two levels, and choosing the levels from a study ----------------------------------------------------
def draft_length_speedup(alpha: float, c: float, k: int, verify: Sequence[float] = ()) -> float:
    """Plain self-speculative decoding, K = k drafts of i.i.d. acceptance α at cost c each, one verify over
    k + 1 tokens: the composed decoder with n = 0 and m = k (every round is one M_q token), so
    (1 − α^{k+1})/(1 − α) / (v(k+1) + k·c)."""
    return plan_row(PlanInputs(alpha, 0.0, c, 0.0, tuple(verify)), k, 0).speedup


def best_draft_length(alpha: float, c: float, verify: Sequence[float] = (), *,
                      k_values: Sequence[int] = (1, 2, 3, 4, 6, 8)) -> int:
    """The K the closed form predicts fastest; 0 when none beats plain decoding. Cheaper drafts (smaller c)
    and cheaper verification (flatter v) never shorten it."""
    speed = {k: draft_length_speedup(alpha, c, k, verify) for k in sorted(k_values)}
    k = max(speed, key=lambda k: speed[k])  # the smallest K of equals
    return k if speed[k] > 1.0 else 0


def pareto_front(points: Sequence[tuple[float, float]]) -> tuple[int, ...]:
    """The indices of the (α, c) points that no other point beats: none has α at least as high and c at least
    as low with one of them strictly better. Cheapest first; of equal points the first is kept."""
    order = sorted(range(len(points)), key=lambda i: (points[i][1], -points[i][0], i))
    front: list[int] = []
    for i in order:  # by c ascending: a point is on the front iff its α beats every cheaper point's
        if not front or points[i][0] > points[front[-1]][0]:
            front.append(i)
    return tuple(front)


# -- the oracle: Monte-Carlo simulation of both acceptance processes -----------------------------------
def _leading_successes(ok: np.ndarray) -> np.ndarray:
    """ok: [N, L] booleans -> [N] count of leading Trues (the accepted prefix)."""
    return np.cumprod(ok, axis=1).sum(axis=1)


def simulate_paper(alpha: float, beta: float, m: int, n: int, *, cycles: int = 100_000,
                   seed: int = 0) -> np.ndarray:
    """Algorithm 2's reject step, cycle by cycle: tokens emitted per cycle, [cycles]."""
    check_shape(m, n)
    rng = np.random.default_rng(seed)
    rates = np.array(([beta] * n + [alpha]) * m)  # [m(n+1)]: acceptance probability by block position
    ok = rng.random((cycles, len(rates))) < rates  # [cycles, m(n+1)]
    return _leading_successes(ok) + 1


def simulate_composed(alpha: float, beta: float, m: int, n: int, *, cycles: int = 100_000,
                      seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The composed decoder: (tokens emitted per cycle, block size B per cycle), each [cycles]."""
    check_shape(m, n)
    rng = np.random.default_rng(seed)
    small_ok = rng.random((cycles, m, n)) < beta  # [cycles, m, n]: M_q's verdicts on M_s drafts
    rounds = np.cumprod(small_ok, axis=2).sum(axis=2) + 1  # [cycles, m]: M_q tokens per round
    block = rounds.sum(axis=1)  # [cycles]
    medium_ok = rng.random((cycles, m * (n + 1))) < alpha  # [cycles, max block]: M_p's verdicts
    accepted = np.minimum(_leading_successes(medium_ok), block)  # only the first B positions exist
    return accepted + 1, block


# -- presentation (pure text; the CLI prints it and --report writes it) --------------------------------
def format_plan(plan: Plan) -> str:
    """The table over (m, n) and the verdict, as Markdown."""
    i = plan.inputs
    free = "free (the paper's assumption)"
    lines = [
        f"inputs: α {i.alpha:.3f} (M_q vs M_p), β {i.beta:.3f} (M_s vs M_q), c {i.c:.3f}, c_s {i.cs:.3f}",
        "v(k) M_p: " + (", ".join(f"{v:.2f}" for v in i.verify[:12]) if i.verify else free),
        "v_q(k) M_q: " + (", ".join(f"{v:.2f}" for v in i.verify_medium[:12]) if i.verify_medium
                          else ("as M_p's" if i.verify else free)),
        "",
        "| m | n | E[block] | τ (ours) | cost (ours) | speedup (ours) | τ (Thm 3.2) | speedup (Thm 3.4) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in plan.rows:
        mark = " **best**" if r == plan.best else ""
        lines.append(f"| {r.m} | {r.n} | {r.block_tokens:.2f} | {r.tokens:.3f} | {r.cost:.3f} | "
                     f"{r.speedup:.3f}x{mark} | {r.paper_tokens:.3f} | {r.paper_speedup:.3f}x |")
    two, three = plan.best_two_level, plan.best_three_level
    lines += ["", f"best: m={plan.best.m}, n={plan.best.n}: predicted {plan.best.speedup:.3f}x",
              f"best two-level (n=0, plain SD with M_q): m={two.m}: predicted {two.speedup:.3f}x"]
    if three is not None:
        verdict = "pays" if plan.third_level_pays else "does not pay"
        lines.append(f"best three-level (n>=1): m={three.m}, n={three.n}: predicted {three.speedup:.3f}x: "
                     f"the third level {verdict} here")
        lines += _break_even_lines(plan)
    return "\n".join(lines)


def _break_even_lines(plan: Plan) -> list[str]:
    """What would change the verdict: each break-even moves one input and holds the others fixed.
    Every line is worded from the same verdict (plan.third_level_pays), so none contradicts it."""
    i, pays = plan.inputs, plan.third_level_pays
    if i.c == 0:
        cs = (f"c_s break-even: none; with c = 0 an M_s step costs nothing whatever c_s is, so the third level "
              f"{'pays' if pays else 'does not pay'} at any c_s (here {i.cs:.3f})")
    elif plan.break_even_cs is not None:
        cs = f"c_s break-even: the third level pays when c_s < {plan.break_even_cs:.3f} (here {i.cs:.3f})"
    else:  # then it does not pay here either: c_s >= 0 is never below a limit <= 0
        cs = f"c_s break-even: none; not even a free M_s (c_s = 0) pays (here {i.cs:.3f})"
    if plan.break_even_beta is not None:
        beta = f"β break-even: the third level pays when β >= {plan.break_even_beta:.3f} (here {i.beta:.3f})"
        if pays and i.beta < plan.break_even_beta:
            beta += "; it pays here too, but not at every β in between (bigger blocks cost more to verify)"
    elif pays:
        beta = (f"β break-even: none; it pays here but not at β = 1 (bigger blocks cost more to verify) "
                f"(here {i.beta:.3f})")
    else:
        beta = f"β break-even: none; not even β = 1 pays (here {i.beta:.3f})"
    return [cs, beta]


def write_text(path, body: str) -> None:
    """Write a report, making its folder; an unwritable path is a one-line ConfigError."""
    from pathlib import Path

    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(body, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None


def plot_plan(plan: Plan, path: str) -> None:
    """Predicted speedup against n, one line per m, ours and the paper's (like its Figure 1)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install matplotlib") from None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    ms = sorted({r.m for r in plan.rows})
    ours = "composed decoder (ours), " + ("v(k) as given" if plan.inputs.verify else "verify free")
    for ax, key, title in ((axes[0], "speedup", ours),
                           (axes[1], "paper_speedup", "Theorem 3.4 (Algorithm 2, free verify)")):
        for m in ms:
            rows = [r for r in plan.rows if r.m == m]
            ax.plot([r.n for r in rows], [getattr(r, key) for r in rows], marker="o", label=f"m={m}")
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("n (small tokens per medium token)")
        ax.set_xticks(sorted({r.n for r in plan.rows}))
        ax.set_title(title, fontsize=10)
    axes[0].set_ylabel("predicted speedup over plain decoding")
    axes[1].legend(fontsize=8, ncol=2)
    i = plan.inputs
    fig.suptitle(f"α={i.alpha:.2f}  β={i.beta:.2f}  c={i.c:.2f}  c_s={i.cs:.2f}", fontsize=11)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        raise ConfigError(f"cannot write plot {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
