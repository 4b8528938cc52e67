"""``measured.engines``: what a serving engine measured for a profile's model on one machine, so that an export to
that engine writes the setting the engine itself ran fastest, and refuses (``export``) where the engine ran nothing
faster than its own plain decoding.

One record per engine (``skipsearch optimize --engine llama.cpp|vllm`` writes it). llama.cpp's::

    measured:
      engines:
        llama.cpp:
          version: "version: 0.5.0-dev (build 1, commit 0c1e570)"
          hardware: "AMD EPYC, AVX512, f26m2, 2 threads"
          target: target-f32.gguf          # what the engine decoded (its own file of the model)
          setting: ngram 3/4               # what it ships: a setting's name, or plain
          kind: ngram-simple               # plain, draft, ngram-simple, ngram+draft, default, export
          args: [--spec-type, ngram-simple, ...]   # its flags; a self-draft's GGUF as DRAFT.gguf
          draft: null                      # the self-draft those flags load: f16, q8_0, q4_0, or none
                                           # (kind export: the profile's own draft, which its export writes)
          draft_layers: [0, 1, 4, ...]     # only for a shallow self-draft: the decoder layers it keeps (a
                                           # layer-skip draft as a GGUF of its own); absent: every layer
          concurrency: 1
          runs: 2                          # timed passes over every setting, the second in reverse order
          at_concurrency: [[2, 1.04], [4, 1.01]]   # the shipped setting over plain with 2, 4 requests in flight
          plain_tokens_per_s: [143.1, 141.9]   # per pass, prefill included
          tokens_per_s: [160.2, 158.8]          # the shipped setting's, per pass
          speedup: 1.119                   # the worse pass's ratio of the two
          margin: 1.03                     # what a setting had to beat plain by in every pass to ship
          best_tried: ngram 3/4            # the fastest identical speculative setting, shipped or not
          best_tried_speedup: 1.119
          identical: 12                    # prompts equal to the reference in every pass
          prompts: 12
          checked_against: HF greedy
          workload: "mtbench,humaneval (calib split), 12 prompts x 96 tokens"
          date: "2026-11-30"

vLLM's has the same keys; its kind is plain or lookup, its args ``[--speculative-config, JSON]``: the config it
ran, with its draft length per batch size (``num_speculative_tokens_per_batch_size``, from the K that won at each
concurrency), and ``draft`` is null::

        vllm:
          version: vllm 0.32.0
          setting: ngram 2-4 K 4@1 2@2-3 0@4+
          kind: lookup
          args: [--speculative-config, '{"method": "ngram", "num_speculative_tokens": 4, ...}']
          at_concurrency: [[2, 1.05], [4, 1.0]]

No torch here: this is a file format. Every problem is one ``ProfileError`` line naming the key.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from typing import Any

from skipsearch.files.errors import ProfileError
from skipsearch.files.records import record_mapping

ENGINES_KEY = "engines"  # measured.<key>
DRAFT_GGUF = "DRAFT.gguf"  # in ``args``: where the self-draft's GGUF goes
PLAIN = "plain"
KINDS = ("plain", "draft", "ngram-simple", "ngram+draft", "default", "export")  # llama.cpp's
ENGINE_KINDS = {"llama.cpp": KINDS, "vllm": ("plain", "lookup")}  # vllm: its args are --speculative-config JSON
VLLM_FLAG = "--speculative-config"
DRAFTS = ("f16", "q8_0", "q4_0")  # the self-drafts a grid setting loads (bench/llamacpp.DRAFT_SCHEMES)
EXPORT = "export"  # the profile's own translation: its export writes its own draft file
MAX_RUNS = 16
MAX_ARGS = 64
MAX_LAYERS = 1024


@dataclass(frozen=True)
class EngineRun:
    """One engine's measurement of this profile's model: its plain decoding and the setting it ships."""

    engine: str
    version: str
    hardware: str
    target: str
    setting: str
    kind: str
    args: tuple[str, ...]
    draft: str | None
    concurrency: int
    runs: int
    plain_tokens_per_s: tuple[float, ...]
    tokens_per_s: tuple[float, ...]
    speedup: float
    margin: float
    best_tried: str | None
    best_tried_speedup: float | None
    identical: int
    prompts: int
    checked_against: str
    workload: str
    date: str
    # (C, the shipped setting's worse-pass throughput over plain's with C requests in flight; 0.0: it differed or
    # failed there), for each concurrency C > 1 it was checked at: it ships only if at least 1.0 at every one
    at_concurrency: tuple[tuple[int, float], ...] = ()
    # a shallow self-draft (``draft`` with only these decoder layers, in order); None: the draft keeps every layer
    draft_layers: tuple[int, ...] | None = None

    @property
    def ships_plain(self) -> bool:
        return self.kind == PLAIN

    @property
    def replaces_own(self) -> bool:
        """An export writes this setting instead of the profile's own: a grid setting shipped (the profile's own
        export shipping means the profile's own setting, written as it always is)."""
        return not self.ships_plain and self.kind != EXPORT

    def summary(self) -> str:
        """One line for people: what the engine measured, where, and what ships."""
        plain = "/".join(f"{v:.1f}" for v in self.plain_tokens_per_s)
        tried = ("no speculative setting stayed identical" if self.best_tried is None else
                 f"its fastest identical speculative setting, {self.best_tried}, ran {self.best_tried_speedup:.2f}x "
                 "its plain decoding (worse pass)")
        ships = (f"plain decoding ships (nothing beat plain by {self.margin - 1:.0%} in every pass"
                 + (", at every concurrency)" if self.at_concurrency else ")")
                 if self.ships_plain else f"{self.setting} ships at {self.speedup:.2f}x")
        if self.at_concurrency:
            ships += "; with several requests in flight, " + ", ".join(
                f"{c}: {ratio:.2f}x plain" if ratio else f"{c}: differed or failed" for c, ratio in self.at_concurrency)
        name = self.version if self.version.startswith(self.engine) else f"{self.engine} {self.version}"
        return (f"{name} on {self.hardware}, {self.workload}, target {self.target}: plain "
                f"{plain} tokens/s over {self.runs} pass(es); {tried}; {ships}")


_TEXT = ("engine", "version", "hardware", "target", "setting", "kind", "checked_against", "workload", "date")


def _text(raw: dict, key: str, path: str, source: str, *, optional: bool = False) -> str | None:
    value = raw.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > 400:
        raise ProfileError(f"{source}: {path}.{key} must be a non-empty string of at most 400 characters")
    return value


def _number(raw: dict, key: str, path: str, source: str, *, optional: bool = False, integer: bool = False,
            least: float = 0.0) -> Any:
    value = raw.get(key)
    if value is None and optional:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= least
    if not ok or (integer and not isinstance(value, int)):
        raise ProfileError(f"{source}: {path}.{key} must be {'an integer' if integer else 'a finite number'} "
                           f">= {least:g}, got {str(value)[:40]}")
    return value


def _rates(raw: dict, key: str, path: str, source: str, runs: int) -> tuple[float, ...]:
    value = raw.get(key)
    if (not isinstance(value, list) or len(value) != runs
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
                       for v in value)):
        raise ProfileError(f"{source}: {path}.{key} must list {runs} positive tokens/s, one per pass")
    return tuple(float(v) for v in value)


def engine_run_from_dict(raw: Any, engine: str, *, source: str) -> EngineRun:
    path = f"measured.{ENGINES_KEY}.{engine}"
    raw = record_mapping(raw, path, source)
    known = {f.name for f in fields(EngineRun)} - {"engine"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ProfileError(f"{source}: unknown key {path}.{unknown[0][:40]}")
    text = {k: _text(raw, k, path, source) for k in _TEXT if k != "engine"}
    kinds = ENGINE_KINDS.get(engine, KINDS)
    if text["kind"] not in kinds:
        raise ProfileError(f"{source}: {path}.kind must be one of {', '.join(kinds)}, got {text['kind'][:40]!r}")
    args = raw.get("args")
    if (not isinstance(args, list) or len(args) > MAX_ARGS
            or not all(isinstance(a, str) and 0 < len(a) <= 200 for a in args)):
        raise ProfileError(f"{source}: {path}.args must list at most {MAX_ARGS} flags (strings)")
    if (text["kind"] == PLAIN) != (not args):
        raise ProfileError(f"{source}: {path}.args must be empty exactly when kind is plain")
    if engine == "vllm" and args:
        _check_vllm_args(args, path, source)
    draft = raw.get("draft")
    if draft is not None and draft not in DRAFTS:
        raise ProfileError(f"{source}: {path}.draft must be one of {', '.join(DRAFTS)} or null, got {str(draft)[:40]}")
    if text["kind"] != EXPORT and (draft is not None) != (DRAFT_GGUF in args):
        raise ProfileError(f"{source}: {path}.draft names a self-draft exactly when args load {DRAFT_GGUF}")
    if text["kind"] == EXPORT and draft is not None:
        raise ProfileError(f"{source}: {path}.draft must be null for kind export (the profile's own draft)")
    runs = _number(raw, "runs", path, source, integer=True, least=1)
    if runs > MAX_RUNS:
        raise ProfileError(f"{source}: {path}.runs must be at most {MAX_RUNS}")
    plain, rates = _rates(raw, "plain_tokens_per_s", path, source, runs), _rates(raw, "tokens_per_s", path, source,
                                                                                  runs)
    identical, prompts = (_number(raw, k, path, source, integer=True) for k in ("identical", "prompts"))
    if identical > prompts or prompts < 1:
        raise ProfileError(f"{source}: {path}.identical must be at most prompts (>= 1)")
    pairs = raw.get("at_concurrency", [])
    if (not isinstance(pairs, list) or len(pairs) > 8 or not all(
            isinstance(x, list) and len(x) == 2 and isinstance(x[0], int) and not isinstance(x[0], bool)
            and 2 <= x[0] <= 1024 and isinstance(x[1], (int, float)) and not isinstance(x[1], bool)
            and math.isfinite(x[1]) and x[1] >= 0 for x in pairs)):
        raise ProfileError(f"{source}: {path}.at_concurrency must list at most 8 [concurrency >= 2, speedup >= 0] "
                           "pairs")
    at_concurrency = tuple((int(c), float(r)) for c, r in pairs)
    layers = raw.get("draft_layers")
    if layers is not None:
        if (draft is None or not isinstance(layers, list) or not 0 < len(layers) <= MAX_LAYERS
                or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < MAX_LAYERS for i in layers)
                or layers != sorted(set(layers))):
            raise ProfileError(f"{source}: {path}.draft_layers must list the layers a shallow self-draft keeps "
                               f"(ascending, distinct, 0 to {MAX_LAYERS - 1}), and only beside a draft")
        layers = tuple(layers)
    best = _text(raw, "best_tried", path, source, optional=True)
    best_speedup = _number(raw, "best_tried_speedup", path, source, optional=True)
    if (best is None) != (best_speedup is None):
        raise ProfileError(f"{source}: {path}.best_tried and best_tried_speedup go together")
    return EngineRun(engine=engine, args=tuple(args), draft=draft, runs=runs, plain_tokens_per_s=plain,
                     at_concurrency=at_concurrency, draft_layers=layers,
                     tokens_per_s=rates, identical=identical, prompts=prompts, best_tried=best,
                     best_tried_speedup=best_speedup,
                     concurrency=_number(raw, "concurrency", path, source, integer=True, least=1),
                     speedup=_number(raw, "speedup", path, source), margin=_number(raw, "margin", path, source,
                                                                                   least=1.0),
                     **{k: v for k, v in text.items() if k not in ("best_tried",)})


def _check_vllm_args(args: list, path: str, source: str) -> None:
    """A vLLM record's args: ``--speculative-config`` and the JSON object of the config it ran."""
    ok = len(args) == 2 and args[0] == VLLM_FLAG
    try:
        config = json.loads(args[1]) if ok else None
    except ValueError:
        config = None
    if not isinstance(config, dict) or not isinstance(config.get("method"), str) \
            or not isinstance(config.get("num_speculative_tokens"), int):
        raise ProfileError(f"{source}: {path}.args must be [{VLLM_FLAG}, the JSON object of a speculative config "
                           "with method and num_speculative_tokens]")


def vllm_config(run: EngineRun) -> dict | None:
    """The ``--speculative-config`` a vLLM record ran (validated when read); None for plain decoding."""
    return json.loads(run.args[1]) if run.args else None


def engine_runs_from_dict(raw: Any, *, source: str) -> dict[str, EngineRun]:
    """``measured.engines``: engine name -> its record, each validated."""
    raw = record_mapping(raw, f"measured.{ENGINES_KEY}", source)
    return {name: engine_run_from_dict(value, name, source=source) for name, value in raw.items()}


def engine_run_to_dict(run: EngineRun) -> dict:
    out: dict[str, Any] = {}
    for f in fields(run):
        if f.name == "engine":
            continue
        value = getattr(run, f.name)
        out[f.name] = [list(v) if isinstance(v, tuple) else v for v in value] if isinstance(value, tuple) else value
    if not out["at_concurrency"]:
        del out["at_concurrency"]  # a record checked at one concurrency, as every record before it
    if out["draft_layers"] is None:
        del out["draft_layers"]  # a self-draft of every layer, as every record before shallow drafts
    for key in ("plain_tokens_per_s", "tokens_per_s"):
        out[key] = [round(v, 2) for v in out[key]]
    for key in ("speedup", "best_tried_speedup"):
        if out[key] is not None:
            out[key] = round(out[key], 4)
    return out


__all__ = ["DRAFTS", "DRAFT_GGUF", "ENGINES_KEY", "ENGINE_KINDS", "EXPORT", "KINDS", "PLAIN", "VLLM_FLAG",
           "EngineRun", "engine_run_from_dict", "engine_run_to_dict", "engine_runs_from_dict", "vllm_config"]
