"""The llama.cpp peer's part of a bench report (``bench.llamacpp``): its markdown table in the bench report's style,
its line for the summary, its entry in the JSON report. Every figure is the server's own (its ``timings``)."""

from __future__ import annotations

from collections.abc import Sequence

from skipsearch.bench.llamacpp import EXPORT, FAMILY, PLAIN, LlamaCppResult, SettingResult
from skipsearch.bench.llamacpp_ggufs import F32, Q8_0, TARGETS

COLUMNS = ("llama.cpp setting", "flags", "tokens/s (decode)", "tokens/s (with prompt)", "vs HF greedy", "acceptance",
           "identical")


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _identical(r: SettingResult, labels: Sequence[str] | None) -> str:
    if r.error is not None:
        return f"{r.identical}/{len(r.completions)} FAILED: {r.error}"
    mismatch = r.first_mismatch(labels)
    return f"{r.identical}/{len(r.completions)}" + (f" DIFFERS ({mismatch})" if mismatch else "")


def row_cells(result: LlamaCppResult, r: SettingResult, *, labels: Sequence[str] | None = None,
              baseline_tokens_per_s: float | None = None) -> tuple[str, ...]:
    """One setting's cells. ``vs HF greedy``: its tokens/s with the prompt over ``baseline_tokens_per_s`` (HF
    greedy's row in the same bench), for settings equal to HF greedy everywhere."""
    with_prompt = r.tokens_per_s_with_prompt
    vs = (f"{with_prompt / baseline_tokens_per_s:.2f}x" if r.ok and with_prompt and baseline_tokens_per_s else
          "no (output differs)" if r.error is None and not r.ok else "-")
    name = r.setting.name + (" (chosen)" if r.setting.name == result.best else "")
    return (name, r.setting.flags, _f(r.tokens_per_s, 1), _f(with_prompt, 1), vs, _f(r.acceptance),
            _identical(r, labels))


def summary_line(result: LlamaCppResult) -> str:
    """The peer in one line: why nothing ran, or plain and the best speculative setting."""
    if result.unavailable:
        return result.unavailable
    plain = next((r for r in result.settings if r.setting.kind == PLAIN), None)
    parts = [] if plain is None or plain.error is not None else [f"plain {_f(plain.tokens_per_s, 1)} tokens/s"]
    best = result.setting(result.best) if result.best else None
    grid = [r for r in result.settings if r.setting.kind not in (PLAIN, EXPORT)]
    if best is not None:
        parts.append(f"best {best.setting.name} {_f(best.tokens_per_s, 1)} tokens/s, acceptance {_f(best.acceptance)}")
    elif grid:
        parts.append(f"no speculative setting equal to {result.checked_against} on every prompt")
    for r in result.settings:  # each profile's export, as `export --engine llama.cpp` writes it
        if r.setting.kind == EXPORT and r.ok:
            parts.append(f"{r.setting.name} {_f(r.tokens_per_s, 1)} tokens/s ({r.setting.flags})")
    differs = [r.setting.name for r in result.settings if r.error is None and not r.ok]
    if differs:
        parts.append(f"differs: {', '.join(differs)}")
    failed: dict[str, list[str]] = {}  # why -> the settings that failed so (a server that never starts: all of them)
    for r in result.settings:
        if r.error is not None:
            failed.setdefault(r.error.removeprefix(f"{r.setting.name}: "), []).append(r.setting.name)
    parts += [f"{', '.join(names)} failed: {why}" for why, names in failed.items()]
    if result.plain_as_hf is not None and plain is not None and plain.error is None:
        parts.append(f"plain equal to HF greedy on {result.plain_as_hf}/{len(plain.completions)} prompts")
    return f"{_family(result)} (server timings): " + "; ".join(parts)


def _family(result: LlamaCppResult) -> str:
    """How the rows name the peer: llama.cpp, with its target where that is not the model in F32."""
    return FAMILY if result.kind == F32 else f"{FAMILY}, {result.kind} target"


def _target(result: LlamaCppResult) -> str:
    types = ", ".join(f"{t} x{n}" for t, n in result.types)
    what = "the model, all F32" if result.kind == F32 else TARGETS[result.kind]
    if result.kind == Q8_0:
        what += " (skipsearch's int8 target, where that is the target, has one scale per output row)"
    what += f"; tensors {types}" if types else ""
    if result.checked_against != "HF greedy":
        what += "; its outputs are checked against llama.cpp's own plain decoding of it, not HF greedy's"
    return what


def markdown_lines(result: LlamaCppResult, *, labels: Sequence[str] | None = None,
                   baseline_tokens_per_s: float | None = None) -> list[str]:
    """The llama.cpp section of a bench report, in its table style; one line when nothing ran."""
    if result.unavailable:
        return [result.unavailable, ""]
    cells = [row_cells(result, r, labels=labels, baseline_tokens_per_s=baseline_tokens_per_s)
             for r in result.settings]

    def line(c: Sequence[str]) -> str:
        return "| " + " | ".join(x.replace("|", "\\|") for x in c) + " |"

    return [
        f"llama-server `{result.server}` on `{result.target}` ({_target(result)}), {result.threads} thread(s), "
        f"context {result.context}, one slot, greedy, the same prompt ids, at most {result.max_new_tokens} new "
        f"tokens; each setting in a server of its own after one warm-up request. Tokens/s are the server's own "
        "timings summed over prompts: decode (predicted tokens over predicted ms) and with the prompt's ms added, "
        "which compares with the bench's tokens/s (wall time, prefill included). The chosen setting is the fastest "
        f"speculative one equal to {result.checked_against} on every prompt.",
        "",
        line(COLUMNS), "|" + "---|" * len(COLUMNS), *(line(c) for c in cells),
        "",
        f"- {summary_line(result)}",
        "",
    ]


def result_to_dict(result: LlamaCppResult) -> dict:
    """The JSON report's ``llama.cpp`` entry: settings, the server's figures, each output's verdict."""
    def one(r: SettingResult) -> dict:
        return {"name": r.setting.name, "kind": r.setting.kind, "args": list(r.setting.args), "note": r.setting.note,
                "tokens_per_s": r.tokens_per_s, "tokens_per_s_with_prompt": r.tokens_per_s_with_prompt,
                "drafted": r.drafted, "accepted": r.accepted, "acceptance": r.acceptance, "identical": r.identical,
                "prompts": len(r.completions), "differs_at": list(r.differs_at), "error": r.error,
                "completions": [{"new_tokens": len(c.tokens), "predicted_n": c.predicted_n,
                                 "predicted_ms": c.predicted_ms, "prompt_n": c.prompt_n, "prompt_ms": c.prompt_ms,
                                 "drafted": c.drafted, "accepted": c.accepted, "stop_type": c.stop_type}
                                for c in r.completions]}

    return {"server": result.server, "unavailable": result.unavailable, "best": result.best,
            "target": result.target, "target_kind": result.kind, "target_types": dict(result.types),
            "plain_equal_to_hf_greedy": result.plain_as_hf, "checked_against": result.checked_against,
            "threads": result.threads, "context": result.context,
            "max_new_tokens": result.max_new_tokens, "prompts": result.prompts,
            "settings": [one(r) for r in result.settings]}


__all__ = ["COLUMNS", "markdown_lines", "result_to_dict", "row_cells", "summary_line"]
