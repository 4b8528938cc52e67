"""``skipsearch optimize`` as two library functions, one job each.

- ``optimize_study``: check the input, load the model, search a study and return the profile to ship;
- ``rerank_study`` (``--budget 0 --costs C``): no new trials; the study's evaluated layer-skip configs re-ranked
  under another device's cost file, optionally timed here, and the profile to ship there.

Both check everything that can be wrong with the input before the model loads, and neither writes the profile:
the caller does, where it can say what happened to it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from skipsearch.api.checks import check_model_arg, check_prompts_fit, check_study_for_model, costs_hardware_note
from skipsearch.config import ConfigError
from skipsearch.engine.calibration import calibrate_on, calibration_prompts, calibration_workload
from skipsearch.kernels import check_kernel, parse_kernel
from skipsearch.model.placement import choose_placement
from skipsearch.model.target import check_precision
from skipsearch.profile import Profile, check_profile_target, load_profile
from skipsearch.search.optimize import SearchSettings

if TYPE_CHECKING:
    from skipsearch.files.cost_profile import CostProfile
    from skipsearch.search.optimize import OptimizeResult
    from skipsearch.search.replan import Reranking
    from skipsearch.search.study import TrialRecord

Stage = Callable[[str, "int | None"], None]  # (title, total steps or None) as a stage opens
Progress = Callable[[int, "int | None"], None]  # (done, total) within the open stage


@dataclass(frozen=True)
class SearchRun:
    result: OptimizeResult  # the profile to ship (and its companions), the timed records, the verdict
    path: Path  # where the profile goes (checked writable)
    study: str | None  # the study directory, where a profile that cannot be written is kept instead


@dataclass(frozen=True)
class Reranked:
    label: str  # the study, as messages name it
    reranking: Reranking  # every config, best predicted first (timed here where asked)
    profile: Profile
    verdict: str
    target: CostProfile  # the cost file re-ranked under
    path: Path  # where the profile goes (checked writable)
    study: str | None  # the study directory


def optimize_study(
    o: SearchSettings,
    *,
    on_trial: Callable[[TrialRecord, TrialRecord | None], None] | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> SearchRun:
    """Search ``o.strategy``'s candidates in the study and return the profile to ship (``optimize.optimize``).

    The input is checked before the model loads: the profile's path, the model argument, the storage,
    the prompts, the warm-start profiles and the strategy's options (on a deep stand-in, as the model's
    depth is not known yet; ``optimize`` checks them again against the model).
    """
    from skipsearch.model.loader import load_model
    from skipsearch.search import optimize as opt
    from skipsearch.search.study import check_storage

    # 1. everything that can be wrong with the input fails here, before the model loads
    study = o.study_dir
    path = o.out or Path(study or ".") / "best.yaml"
    check_profile_target(path, force=o.force or o.out is None)  # a default path: the study's own
    check_model_arg(o.model)
    check_storage(study_dir=None if o.storage else study, storage=o.storage)  # driver, file, permissions
    prompts = calibration_prompts(o.dataset, n_prompts=o.n_prompts, seed=o.seed)
    warm = [load_profile(p) for p in o.warm_start]
    # Before the model loads its depth is unknown: check the options on a deep stand-in (the warm start's
    # depth when there is one).
    layers = warm[0].model.num_layers if warm else 128
    # The options are checked against what the strategy declares (``Strategy.options``), whose flags messages name.
    strategy, _ = opt.build_strategy(o.space_for(layers), o, warm_start=tuple(p.draft for p in warm))
    _check_resumed_study(study, o.model, strategy.name, o.target_precision)
    # Every prompt fits the model's context (a megabyte is refused by its length, untokenized); the longest sizes
    # the KV cache the memory check counts.
    longest = check_prompts_fit(o.model, prompts, max_new_tokens=o.max_new_tokens)
    placement = choose_placement(o.device, o.dtype)
    check_kernel(parse_kernel(o.kernel), placement.device)
    check_precision(o.target_precision, device=None if placement.device == "auto" else placement.device, dtype=o.dtype)
    # 2. the model; 3. the search, sized by its depth: calibrate, search, time the shortlist, choose what ships
    if o.threads:
        import torch

        torch.set_num_threads(o.threads)
    sm = load_model(o.model, device=o.device, dtype=o.dtype, max_tokens=longest + o.max_new_tokens,
                    precision=o.target_precision)
    result = opt.optimize(sm, o, on_trial=on_trial, on_stage=on_stage)
    return SearchRun(result, path, study)


def _check_resumed_study(study_dir: str | None, model: str, strategy: str, precision: str = "native") -> None:
    """A local study made by another strategy, for a model of another depth or for another target precision,
    refused before the model loads (the search would refuse each, but only once the model had loaded)."""
    from skipsearch.checkpoints import find_checkpoint
    from skipsearch.model.loader import read_config
    from skipsearch.search.study import (
        STRATEGY_ATTR,
        StudyError,
        check_study_model,
        check_study_precision,
        load_study,
    )

    if not study_dir or not (Path(study_dir) / "study.db").is_file():
        return  # a new study, or one in a --storage database (the search checks that one)
    try:
        label, _records, attrs = load_study(study_dir=study_dir)
    except StudyError:  # an empty file: the search makes the study in it (check_storage refused a broken one)
        return
    made_by = attrs.get(STRATEGY_ATTR)
    if made_by is not None and made_by != strategy:
        raise StudyError(f"study {label} was made by strategy '{made_by}', not '{strategy}': resume it with "
                         f"'{made_by}' or start another study")
    check_study_precision(label, attrs, precision)
    check_study_model(label, attrs, model=model, num_layers=read_config(find_checkpoint(model)).num_hidden_layers)


def rerank_study(
    o: SearchSettings,
    *,
    on_stage: Stage | None = None,
    on_progress: Progress | None = None,
    on_note: Callable[[str], None] | None = None,
) -> Reranked:
    """``optimize --study S --costs C --budget 0``: the study's layer-skip configs re-ranked under C, no new trials
    (``device_replan.rerank_study``); with ``o.time_shortlist`` the ``o.shortlist`` best are timed here, each against
    plain decoding in the same rounds. ``on_note`` gets a line when C was measured on other hardware."""
    from skipsearch.files.cost_profile import check_costs_target, load_costs
    from skipsearch.model.loader import load_model
    from skipsearch.search import replan as device_replan
    from skipsearch.search.study import load_study

    stage, progress = on_stage or (lambda _t, _n: None), on_progress or (lambda _d, _n: None)
    # 1. the input, before the model loads
    target = load_costs(o.costs)
    check_costs_target(target, o.target_precision, source=o.costs, what=f"model {o.model}")
    study = o.study_dir
    label, records, attrs = load_study(study_dir=study, storage=o.storage, study_name=o.study_name)
    check_study_for_model(label, attrs, o.model, force=o.force)
    if not device_replan.plain_configs(records):
        raise ConfigError(f"study {label} has no evaluated layer-skip config to re-rank")
    path = o.out or Path(study or ".") / f"rerank-{Path(o.costs).stem}.yaml"
    check_profile_target(path, force=o.force or o.out is None)  # a default path: the study's own
    prompts = calibration_prompts(o.dataset, n_prompts=o.n_prompts, seed=o.seed)  # a bad file fails before loading
    check_prompts_fit(o.model, prompts, max_new_tokens=o.max_new_tokens)
    # 2. trace the study's skip sets on the model and replay every config under the other costs
    sm = load_model(o.model, device=o.device, dtype=o.dtype, precision=o.target_precision)
    note = costs_hardware_note(target, sm, o.costs)
    if note and on_note:
        on_note(note)
    cal = calibrate_on(sm, dataset=o.dataset, n_prompts=o.n_prompts, max_new_tokens=o.max_new_tokens, seed=o.seed)
    stage("tracing skip sets", None)
    workload = calibration_workload(o.dataset, o.n_prompts, o.max_new_tokens)
    rr = device_replan.rerank_study(sm, cal, records, target, costs_source=o.costs, shortlist=o.shortlist,
                                    workload=workload, on_progress=progress)
    if o.time_shortlist:  # 3. time the shortlist here, each against plain decoding in the same rounds
        total = min(o.shortlist, len(rr.rows))
        stage("timing the shortlist", total)
        done: list[object] = []
        timed = device_replan.time_rows(sm, cal, rr.rows[:o.shortlist], repeats=o.repeats,
                                        on_row=lambda row: (done.append(row), progress(len(done), total)))
        rr = dataclasses.replace(rr, rows=timed + rr.rows[o.shortlist:])
    # 4. the profile to ship on C's device
    prof, verdict = device_replan.reranked_profile(sm, rr, target, study=label, dataset=f"{o.dataset} (calib split)",
                                                   n_prompts=o.n_prompts, max_new_tokens=o.max_new_tokens, seed=o.seed)
    return Reranked(label, rr, prof, verdict, target, path, study)


__all__ = ["Reranked", "SearchRun", "SearchSettings", "optimize_study", "rerank_study"]
