"""Hierarchical's re-plan: m and n re-chosen by the planner's closed forms under another device's costs.

Its record is two numbers the profile keeps in ``measured`` (``skipsearch plan`` writes them): α (M_q's tokens
accepted by the full model) and β (M_s's tokens accepted by M_q), teacher-forced on the model, with no hardware in
them. The cost file gives c, c_s and v(k) for its two levels.
"""

from __future__ import annotations

from skipsearch.config import DraftConfig
from skipsearch.files.errors import ProfileError
from skipsearch.measure import Measurement
from skipsearch.methods.base import Replanned, Replanning
from skipsearch.methods.hierarchical.closed_form import PlanInputs, plan_table
from skipsearch.methods.hierarchical.params import Hierarchy, hierarchy_from_profile, hierarchy_to_profile_fields

NOTE = ("α and β are the profile's (teacher-forced on the model: no hardware in them); c, c_s and v(k) the "
        "cost file's; the medium level's verify curve is taken to be the full model's")


def replan(job: Replanning) -> Replanned:
    """m and n re-chosen by the planner's closed forms (``plan_table``) from the α and β the profile measured and
    the cost file's costs for its two levels; the re-planned profile's c, c_s and v(k) are the cost file's."""
    profile, target = job.profile, job.target
    extra = job.extra
    alpha, beta = extra.get("alpha"), extra.get("beta")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x <= 1 for x in (alpha, beta)):
        raise ProfileError(f"{job.source}: keeps no α and β (measured.alpha, measured.beta) in [0, 1]: make it again "
                           f"with skipsearch plan")
    job.check_costs(job.weights_architecture)
    old = hierarchy_from_profile(profile)
    cm = target.cost_model()
    c = cm.draft_ratio(old.medium)
    cs = cm.draft_ratio(old.small) / c if c > 0 else 0.0
    table = plan_table(PlanInputs(float(alpha), float(beta), c, cs, verify=tuple(target.costs.verify_ratio)))

    def measured(r) -> Measurement:
        return Measurement("surrogate", r.speedup, predicted_speedup=r.speedup, tau=r.tokens, alpha=float(alpha),
                           cost_ratio=c)

    def draft_of(r) -> DraftConfig:
        return hierarchy_to_profile_fields(Hierarchy(old.medium, old.small, r.m, r.n))[0]

    best_per_n = sorted((max((r for r in table.rows if r.n == n), key=lambda r: r.speedup)
                         for n in sorted({r.n for r in table.rows})), key=lambda r: -r.speedup)
    best = table.best
    draft, params = hierarchy_to_profile_fields(Hierarchy(old.medium, old.small, best.m, best.n))
    note = (f"m={best.m}, n={best.n} ({'three' if best.n else 'two'} levels; the third level "
            f"{'pays' if table.third_level_pays else 'does not pay'} here"
            + ("" if best.speedup > 1.0 else "; no (m, n) beats plain decoding: decode without a profile")
            + f"); {NOTE}")
    options = tuple((draft_of(r), measured(r)) for r in best_per_n)
    redone = (("c", round(c, 4)), ("cs", round(cs, 4)),
              ("verify_cost_v", [round(v, 3) for v in target.costs.verify_ratio]))
    return Replanned(draft, measured(best), draft, options, note, method_params=params, extra=redone,
                     basis="its α and β, the best m per n (K = m·(n+1)): "
                           + ", ".join(str(d.max_draft_tokens) for d, _ in options))


__all__ = ["NOTE", "replan"]
