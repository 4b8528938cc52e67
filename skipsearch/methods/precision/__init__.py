"""``precision``: the model drafts with reduced-precision copies of its own sublayers (QuantSpec, ML-SpecQD).

Each sublayer's draft role is skipped (the draft config's skip sets), full, or quantized in the
profile's ``scheme`` (``method_params``); so is the LM head (``quant_head``). The draft runs the
model's own embeddings, norms and KV cache with quantized stand-ins swapped in
(``SkippableModel.substituted``), so it reads the full model's context KV and keeps no cache of its
own; verification is the plain full forward, so greedy output is the full model's and sampling
stays exact. Schemes and their kernels: ``params.SCHEMES``; a device without the kernel is refused
in one line before the model loads (``check_device``). The ``precision`` strategy searches it;
the surrogate is teacher-forced agreement replayed with the measured per-sublayer scheme costs. Its record
(``record.py``): the draft's traces; its re-plan (``replan.py``): c re-priced from another device's scheme costs.
As a hybrid's fallback it drafts alone, and its traces (``Method.traces``) are replayed there.
"""

from __future__ import annotations

from skipsearch.config import NO_EXIT, Candidate, ConfigError, DraftConfig
from skipsearch.methods.base import DraftModel, Method, ParamsError, Setting, Speculation, Traced, Tracing
from skipsearch.methods.precision.params import SCHEMES, PrecisionParams, Scheme, device_scheme
from skipsearch.methods.precision.record import PRECISION_KEY, PrecisionRecord, precision_from_dict, precision_to_dict
from skipsearch.methods.precision.replan import RECORD, keep_traced, read_draft, replan, variants


def check_scheme(scheme: str, device) -> None:
    """A one-line ConfigError unless ``device`` has real kernels for ``scheme`` (torch is imported here)."""
    from skipsearch.methods.precision.linears import check_scheme as check

    check(scheme, device)


def check_device(candidate: Candidate, device: str) -> None:
    """A one-line ConfigError unless ``device`` runs the candidate's scheme (before any weight is read).
    ``device`` "auto" (layers spread over the GPUs) is checked on the first GPU."""
    if not candidate.is_autoregressive:
        check_scheme(candidate.param("scheme", ""), "cuda:0" if device == "auto" else device)


def _drafter(candidate: Candidate, sm, *, batch: bool = False):
    """The candidate's drafter: a ``PrecisionDrafter``, or with ``batch`` the batched engine's
    ``PrecisionBatchDrafter`` (None: plain decoding)."""
    from skipsearch.methods.precision.copy import quantized_copy

    params = METHOD.parse(candidate.params, draft=candidate.draft, num_layers=sm.num_layers)
    candidate.draft.check_layers(sm.num_layers)
    if candidate.draft.is_autoregressive:
        return None
    try:
        qcopy = quantized_copy(sm, params.scheme)
    except ParamsError:
        raise
    except ConfigError as e:
        raise ParamsError(f"precision: {e}") from None
    if batch:
        from skipsearch.methods.precision.batch import PrecisionBatchDrafter as make
    else:
        from skipsearch.methods.precision.drafter import PrecisionDrafter as make
    try:
        return make(candidate.draft, params, qcopy, sm)
    except ParamsError:
        raise
    except ConfigError as e:
        raise ParamsError(f"precision: {e}") from None


def _predict(objective, candidate: Candidate):
    from skipsearch.methods.precision.surrogate import predict

    return predict(objective, candidate)


def traces_and_ratio(objective, candidate: Candidate) -> tuple[list, float]:
    """The candidate's teacher-forced traces over the objective's calibration data, and its c (for a
    method that drafts through a precision draft, e.g. hybrid's fallback)."""
    from skipsearch.methods.precision.surrogate import draft_ratio, draft_traces, head_saving, scheme_cost

    sm = objective.sm
    params = METHOD.parse(candidate.params, draft=candidate.draft, num_layers=sm.num_layers)
    c = draft_ratio(scheme_cost(objective, params.scheme), candidate.draft, params, sm.num_layers,
                    saving=head_saving(objective, params))
    return draft_traces(objective, candidate.draft, params), c


def _traces(objective, candidate: Candidate) -> Traced:
    traces, c = traces_and_ratio(objective, candidate)
    return Traced(tuple(traces), c)


def build_drafts_aside(sm, schemes) -> None:
    """Start building the compiled graphs that ``schemes``' costs are timed on (each scheme's whole-model draft) in
    children of this process, side by side, before the first is needed: each build is about one core's work (20 s
    of wall time and 22 s of CPU for smollm2-135m's int8 draft on a Zen 5, ``studies/startup-cpu.md``), so on two
    cores a search's int8 and int4 drafts build in about the time of one. Nothing is timed until they are done
    (``engine/harness``); where the kernel is not compiled, or keeps them already, nothing happens. Each scheme's
    copy is built here, which refuses one the device has no kernel for in one line."""
    from skipsearch.methods.precision.surrogate import build_drafts_aside as build

    build(sm, schemes)


def measure_scheme_costs(sm, context, schemes, *, repeats: int = 9):
    """Each scheme's per-sublayer costs on ``sm``'s device at ``context`` (``surrogate.SchemeCost``, the fields a
    cost file's ``files.costs.SchemeCosts`` keeps; ``skipsearch costs --schemes``), their compiled drafts built side
    by side first (``build_drafts_aside``)."""
    from skipsearch.methods.precision.surrogate import measure_scheme

    for scheme in schemes:  # every scheme refused before any is timed
        check_scheme(scheme, sm.device)
    build_drafts_aside(sm, schemes)
    return tuple(measure_scheme(sm, context, scheme, repeats=repeats) for scheme in schemes)


def _scheme_draft(sm, scheme: str):
    """The whole-model draft in ``scheme``, as the batched precision draft runs it (``Method.scheme_draft``)."""
    from skipsearch.methods.precision.batch import whole_draft

    check_scheme(scheme, sm.device)
    return whole_draft(sm, scheme)


def _replan_schemes(candidate: Candidate, device: str) -> tuple[str, ...]:
    # the draft's own scheme, also where it ships K = 0: re-planned elsewhere it may pay
    scheme = candidate.param("scheme", None)
    return (scheme,) if isinstance(scheme, str) else ()


def _setting(candidate: Candidate) -> Setting:
    """A draft model: the model's own weights in the scheme (what of it no engine runs is flagged)."""
    params, draft = candidate.plain_params(), candidate.draft
    return Setting(draft_model=DraftModel(
        scheme=str(params.get("scheme", PrecisionParams.scheme)), k=draft.max_draft_tokens, exit=draft.exit,
        quant_head=bool(params.get("quant_head", True)), full_attn=tuple(params.get("full_attn") or ()),
        full_mlp=tuple(params.get("full_mlp") or ()), skips=bool(draft.skip_attn or draft.skip_mlp),
        trimmed_head=params.get("vocab_subset") is not None))


def _candidate(setting: Setting) -> Candidate | None:
    """The precision candidate of a draft model alone, every sublayer drafting and the full vocabulary."""
    dm = setting.draft_model
    if dm is None or setting.lookup is not None or dm.skips or dm.trimmed_head:
        return None
    params = PrecisionParams(scheme=dm.scheme, full_attn=dm.full_attn, full_mlp=dm.full_mlp, quant_head=dm.quant_head)
    return Candidate(PrecisionParams.method, DraftConfig(max_draft_tokens=dm.k, exit=dm.exit), params.to_pairs())


def _example(num_layers: int) -> Candidate:
    return Candidate(PrecisionParams.method, DraftConfig(max_draft_tokens=4, exit=NO_EXIT),
                     PrecisionParams(scheme="fp16").to_pairs())


METHOD = Method(
    name=PrecisionParams.method,
    summary="the model itself with its sublayers and head in a reduced-precision copy (fp16/int8/int4/fp8), "
            "some optionally skipped or kept full",
    params=PrecisionParams,
    drafter=_drafter,
    example=_example,
    strategy="precision",
    predict=_predict,
    check_device=check_device,
    draft_weight_bits=lambda candidate: None if candidate.is_autoregressive else SCHEMES[
        candidate.param("scheme", "fp16")].weight_bits,
    copies_weights=lambda candidate: bool(candidate.plain_params().get("vocab_subset")),  # a trimmed head
    cost_schemes=tuple(SCHEMES),
    measure_schemes=measure_scheme_costs,
    record=RECORD,
    replan=replan,
    replan_schemes=_replan_schemes,
    speculation=Speculation(setting=_setting, candidate=_candidate),
    drafts_alone=True,
    traces=Tracing(measure=_traces, keep=keep_traced, read=read_draft, variants=variants),
    batch_drafter=lambda candidate, sm: _drafter(candidate, sm, batch=True),
    scheme_draft=_scheme_draft,
)

__all__ = ["METHOD", "PRECISION_KEY", "SCHEMES", "PrecisionParams", "PrecisionRecord", "Scheme", "build_drafts_aside",
           "check_device", "check_scheme", "device_scheme", "measure_scheme_costs", "precision_from_dict",
           "precision_to_dict", "quantized_assistant", "traces_and_ratio"]


def quantized_assistant(sm):
    """A whole reduced-precision copy of ``sm``'s HF model, for HF assisted generation (bench's peer):
    fp16 weights on a CPU, int8 on a GPU. Built once per model; returns (model, scheme)."""
    from skipsearch.methods.precision.copy import assistant_copy

    return assistant_copy(sm)
