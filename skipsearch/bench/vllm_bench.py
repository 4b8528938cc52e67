"""The vLLM peer inside ``skipsearch bench --peers vllm``: vLLM's own server (its CPU build, in a venv of its own)
decoding the bench's prompt ids plainly and with each benched profile's vLLM setting, after every timed round of
the bench's own rows, so that no vLLM server competes with a timed row. Its section of the report lives here too.

A profile's vLLM setting is what vLLM itself measured fastest for it where the profile has that record
(``optimize --engine vllm``: the config with its draft length per batch size), else its ``export --engine vllm``
config where that is a lookup (the nearest, where vLLM cannot run the profile whole). A record that ships plain
decoding is no row: the export refuses it, and the report says so. Every output is checked against HF greedy's
row of the same bench; the speed is the client's (``bench.vllm``): tokens over the wall time of the requests,
prompts included, one request at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from skipsearch.bench.vllm import VllmRow, run_setting
from skipsearch.model.target import NATIVE
from skipsearch.servers.process import ServerError

PEER = "vllm"  # the name --peers takes; not an HF contender, so not in peers.PEERS
PLAIN = "plain"


@dataclass(frozen=True)
class VllmPlan:
    """What ``--peers vllm`` asks for."""

    python: str | None = None  # the Python of vLLM's venv; None: $SKIPSEARCH_VLLM_PYTHON
    threads: int | None = None  # the CPUs its worker binds; None: the bench's torch threads
    log_dir: str | None = None  # where each server's log goes; None: a temporary directory


@dataclass(frozen=True)
class VllmResult:
    """The peer's rows, or the one line saying why none ran."""

    python: str | None = None
    version: str | None = None
    rows: tuple[VllmRow, ...] = ()
    errors: tuple[tuple[str, str], ...] = ()  # (setting, its one-line error)
    notes: tuple[str, ...] = ()  # e.g. a profile whose vLLM record ships plain decoding
    threads: int | None = None
    max_new_tokens: int = 0
    unavailable: str | None = None
    sources: dict = field(default_factory=dict)  # setting -> where its config came from

    def row(self, setting: str) -> VllmRow | None:
        return next((r for r in self.rows if r.setting == setting), None)


def profile_settings(profiles: Sequence[tuple[str, object]]) -> tuple[list[tuple[str, dict, str]], list[str]]:
    """([(label, config, source)], notes) for the benched profiles (see the module)."""
    from skipsearch.export import vllm as ev
    from skipsearch.files.engine_runs import vllm_config
    from skipsearch.profile import engine_run

    out, notes = [], []
    for path, prof in profiles:
        stem = Path(path).stem
        run = engine_run(prof, PEER)
        if run is not None and run.ships_plain:
            notes.append(f"{stem}: vLLM measured nothing faster than its plain decoding ({run.summary()}); its "
                         "export refuses, so it has no row")
            continue
        if run is not None:
            out.append((f"{stem} (vLLM's measured {run.setting})", vllm_config(run),
                        f"measured.engines.vllm ({run.hardware})"))
            continue
        config, nearest = ev.nearest_config(prof)
        if not config:  # plain decoding: vLLM's plain row is its export
            continue
        if not ev.is_lookup(config):
            notes.append(f"{stem}: its vLLM export is a draft model, not served here")
            continue
        out.append((f"{stem} export{' (nearest)' if nearest else ''}", config, "export --engine vllm"))
    return out, notes


def bench_vllm(sm, plan: VllmPlan, prompt_ids: Sequence[Sequence[int]], reference: Sequence[Sequence[int]], *,
               max_new_tokens: int, threads: int, profiles: Sequence[tuple[str, object]] = (),
               on_stage: Callable[[str, int], None] | None = None,
               on_progress: Callable[[int, int, str], None] | None = None) -> VllmResult:
    """vLLM plain and each profile's vLLM setting on ``prompt_ids``, each in a server of its own, against
    ``reference`` (HF greedy's outputs). No vLLM: one line in ``unavailable``, and the bench goes on."""
    import tempfile

    from skipsearch.bench.vllm_search import server_version
    from skipsearch.checkpoints import ensure_embedded
    from skipsearch.servers.vllm import find_python

    if getattr(sm, "target_precision", NATIVE) != NATIVE:
        return VllmResult(unavailable=f"{PEER}: vLLM serves the model's own fp32 checkpoint here, not the "
                                      f"{sm.target_precision} target (its 8-bit peer is llama.cpp's Q8_0)")
    python, missing = find_python(plan.python)
    if python is None:
        return VllmResult(unavailable=f"{PEER}: {missing}")
    settings, notes = profile_settings(profiles)
    settings = [(PLAIN, None, "vLLM's plain decoding"), *settings]
    rows, errors = [], []
    with tempfile.TemporaryDirectory(prefix="skipsearch-vllm-") as tmp:
        log_dir = Path(plan.log_dir or tmp)
        log_dir.mkdir(parents=True, exist_ok=True)
        model_dir = ensure_embedded(sm.name)
        if on_stage:
            on_stage(PEER, len(settings))
        for i, (name, config, _) in enumerate(settings):
            if on_progress:
                on_progress(i, len(settings), name)
            try:
                rows.append(run_setting(python, model_dir, name, config, prompt_ids, reference,
                                        max_new_tokens=max_new_tokens, log_dir=log_dir,
                                        threads=plan.threads or threads, memory_fraction=0.25))
            except ServerError as e:
                errors.append((name, str(e)))
                if name == PLAIN:  # no baseline, and a server that cannot decode plainly fails every export as slowly
                    break
    return VllmResult(python=python, version=server_version(python), rows=tuple(rows), errors=tuple(errors),
                      notes=tuple(notes), threads=plan.threads or threads, max_new_tokens=max_new_tokens,
                      sources={name: source for name, _, source in settings})


# -- its part of the report ----------------------------------------------------------------------------------------
COLUMNS = ("vLLM setting", "speculative config", "tokens/s (with prompt)", "vs vLLM plain", "vs HF greedy",
           "acceptance", "identical")


def _cells(result: VllmResult, r: VllmRow, plain: VllmRow | None, baseline: float | None) -> tuple[str, ...]:
    import json

    ok = r.identical == r.prompts
    rate = r.tokens_per_s
    vs_plain = f"{rate / plain.tokens_per_s:.2f}x" if ok and plain and rate and plain.tokens_per_s else "-"
    vs_hf = (f"{rate / baseline:.2f}x" if ok and rate and baseline else "no (output differs)" if not ok else "-")
    return (r.setting, json.dumps(r.speculative, sort_keys=True) if r.speculative else "none",
            "-" if rate is None else f"{rate:.1f}", vs_plain, vs_hf,
            "-" if r.acceptance is None else f"{r.acceptance:.2f}", f"{r.identical}/{r.prompts}")


def summary_line(result: VllmResult) -> str:
    """The peer in one line."""
    if result.unavailable:
        return result.unavailable
    plain = result.row(PLAIN)
    parts = [] if plain is None or plain.tokens_per_s is None else [f"plain {plain.tokens_per_s:.1f} tokens/s"]
    for r in result.rows:
        if r.setting != PLAIN and r.tokens_per_s:
            same = "identical" if r.identical == r.prompts else f"DIFFERS on {r.prompts - r.identical}"
            ratio = f", {r.tokens_per_s / plain.tokens_per_s:.2f}x plain" if plain and plain.tokens_per_s else ""
            parts.append(f"{r.setting} {r.tokens_per_s:.1f} tokens/s{ratio} ({same})")
    parts += [f"{name} failed: {why}" for name, why in result.errors]
    return f"{PEER} ({result.version}, client wall time): " + "; ".join(parts or ["nothing ran"])


def markdown_lines(result: VllmResult, *, baseline_tokens_per_s: float | None = None) -> list[str]:
    """The vLLM section of a bench report; one line when nothing ran."""
    if result.unavailable:
        return [result.unavailable, ""]
    plain = result.row(PLAIN)

    def line(c: Sequence[str]) -> str:
        return "| " + " | ".join(x.replace("|", "\\|") for x in c) + " |"

    return [
        f"{result.version}'s OpenAI server (`{result.python}`), fp32, its worker bound to {result.threads} CPU(s), "
        f"no prefix cache, greedy, the same prompt ids, at most {result.max_new_tokens} new tokens, one request at a "
        "time; each setting in a server of its own after one warm-up request. Tokens/s: new tokens over the "
        "client's wall time of the requests (prompts included), which compares with the bench's tokens/s. Acceptance "
        "from the server's counters.",
        "",
        line(COLUMNS), "|" + "---|" * len(COLUMNS),
        *(line(_cells(result, r, plain, baseline_tokens_per_s)) for r in result.rows),
        "",
        *(f"- {n}: {result.sources[n]}" for n in (r.setting for r in result.rows) if n != PLAIN),
        *(f"- {name} failed: {why}" for name, why in result.errors),
        *(f"- {n}" for n in result.notes),
        f"- {summary_line(result)}",
        "",
    ]


def result_to_dict(result: VllmResult) -> dict:
    """The JSON report's ``vllm`` entry."""
    return {"python": result.python, "version": result.version, "unavailable": result.unavailable,
            "threads": result.threads, "max_new_tokens": result.max_new_tokens, "notes": list(result.notes),
            "errors": [list(e) for e in result.errors],
            "settings": [{"name": r.setting, "speculative": r.speculative, "source": result.sources.get(r.setting),
                          "tokens": r.tokens, "wall_ms": r.wall_ms, "tokens_per_s": r.tokens_per_s,
                          "identical": r.identical, "prompts": r.prompts, "drafted": r.drafted,
                          "accepted": r.accepted, "acceptance": r.acceptance} for r in result.rows]}


__all__ = ["COLUMNS", "PEER", "VllmPlan", "VllmResult", "bench_vllm", "markdown_lines", "profile_settings",
           "result_to_dict", "summary_line"]
