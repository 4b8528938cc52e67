"""A toy draft method, whole in this one module, as a plug-in would be: its params, its record and its re-plan.
tests/test_replan.py registers it with one line and re-plans its profile through ``skipsearch plan --profile``,
which shows that adding a method touches only its own package and one registry line.

The toy drafts nothing (its drafter is plain decoding); its record is one number, the acceptance α it claims,
and its re-plan prices K by the i.i.d. closed form: τ = (1 - α^(K+1)) / (1 - α) tokens per cycle of cost
v(K + 1) + K·c, with c its ``draft_cost`` parameter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from skipsearch.config import DraftConfig
from skipsearch.files.errors import NoRecordError, ProfileError
from skipsearch.measure import Measurement
from skipsearch.methods import Kept, Method, ParamsError, Record, Replanned, check_keys

NAME = "toy"
KEY = "toy_alpha"  # measured.<key>: its record


@dataclass(frozen=True)
class ToyParams:
    method: ClassVar[str] = NAME
    draft_cost: float = 0.1  # c: one draft token over one full step

    @classmethod
    def parse(cls, raw: Mapping[str, Any], *, draft: DraftConfig, num_layers: int) -> ToyParams:
        check_keys(NAME, raw, cls)
        cost = raw.get("draft_cost", cls.draft_cost)
        if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not 0 <= cost <= 1:
            raise ParamsError(f"{NAME}: method_params.draft_cost must be a number in [0, 1]")
        return cls(float(cost))

    def to_pairs(self) -> tuple[tuple[str, Any], ...]:
        return (("draft_cost", self.draft_cost),)


def read_alpha(raw: Any, *, source: str = "<profile>") -> float:
    if not isinstance(raw, dict) or not isinstance(raw.get("alpha"), float) or not 0 <= raw["alpha"] < 1:
        raise ProfileError(f"{source}: measured.{KEY}.alpha must be a number in [0, 1)")
    return raw["alpha"]


def keep(k) -> Kept:
    return Kept(((KEY, {"alpha": 0.5}),))  # a toy: what a real method measures on the model


def replan(job) -> Replanned:
    if KEY not in job.extra:
        raise NoRecordError(f"{job.source}: keeps no toy record")
    alpha = read_alpha(job.extra[KEY], source=job.source)
    job.check_costs(None)
    c = ToyParams.parse(dict(job.profile.method_params), draft=job.profile.draft, num_layers=1).draft_cost
    cm = job.target.cost_model()
    options = []
    for k in sorted(job.k_values):
        tau = (1 - alpha ** (k + 1)) / (1 - alpha)
        speedup = tau / (cm.verify(k + 1) + k * c)
        options.append((replace(job.profile.draft, max_draft_tokens=k),
                        Measurement("surrogate", speedup, predicted_speedup=speedup, tau=tau, cost_ratio=c)))
    options.sort(key=lambda o: -o[1].speedup)
    best, m = options[0]
    ships = best if m.speedup > 1.0 else replace(best, max_draft_tokens=0)
    return Replanned(ships, m, best, tuple(options), basis=f"its toy record (α {alpha})", column="K")


METHOD = Method(name=NAME, summary="a toy: drafts nothing, re-plans K from the α it claims", params=ToyParams,
                drafter=lambda candidate, sm: None, record=Record(formats=((KEY, read_alpha),), build=keep),
                replan=replan)
