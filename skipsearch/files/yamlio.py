"""The YAML toolkit every skipsearch file (draft profiles, cost files) shares: one safe, bounded reader, one
dumper, one atomic writer that fsyncs, the dataclass-section checker, and one one-line error base.

A file's every problem is one line naming the file and the key, so each reader passes its own
``OneLineError`` subclass (``ProfileError``, ``CostsError``) as ``error=``.
"""

from __future__ import annotations

import errno
import numbers
import os
import secrets
import stat
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml

from skipsearch.config import ConfigError, ExitRule

# A profile or cost file is a few hundred bytes. The caps keep a hostile or mistaken file from costing
# minutes and gigabytes: on the file itself, and on the document as its aliases expand it (a 1 KB
# "billion laughs" of nested aliases is a billion nodes to anything that walks or prints it).
MAX_BYTES = 1 << 20
MAX_EXPANDED_SIZE = 1 << 20  # nodes plus scalar characters, with every alias counted in full


class OneLineError(ValueError):
    """A file that cannot be read, written or used. str() is one line: ``<file>: <problem>``."""

    def __init__(self, message: str) -> None:
        # Collapsed here so that nothing quoted into a message (a YAML error, a repr) can span lines.
        super().__init__(" ".join(str(message).split()))


# -- messages ------------------------------------------------------------------------------------------------
def short(value: Any, limit: int = 60) -> str:
    """repr(value) for a message, at most ``limit`` characters. A value from a file may be huge (or
    share itself many times over through YAML aliases), so the repr is bounded while it is built."""
    text = bounded_repr(value, limit + 1)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def bounded_repr(value: Any, budget: int) -> str:
    # Returns at least min(len(repr(value)), budget) characters of repr(value), or a stand-in for
    # what repr cannot show briefly. Each nesting level costs one character of the budget, so a deep
    # or self-referencing value stops too.
    if budget <= 0:
        return ""
    if isinstance(value, (str, bytes)):
        return repr(value[:budget])
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * budget:
        return f"<an integer of {value.bit_length()} bits>"  # repr would be long, or raise past 4300 digits
    if isinstance(value, (list, tuple, dict, set, frozenset)) and value:
        opening, closing = {dict: "{}", list: "[]", tuple: "()"}.get(type(value), "{}")
        items = value.items() if isinstance(value, dict) else value
        text = opening
        for item in items:
            if len(text) >= budget:
                return text  # cut: short adds "..."
            left = budget - len(text) - 1
            if isinstance(value, dict):
                key = bounded_repr(item[0], left)
                text += key + ": " + bounded_repr(item[1], left - len(key) - 2) + ", "
            else:
                text += bounded_repr(item, left) + ", "
        return (text[:-2] if text.endswith(", ") else text) + closing
    return repr(value)  # numbers, booleans, None, dates: short by nature


# -- reading: checks against a dataclass ------------------------------------------------------------------
def mapping(value: Any, path: str, source: str, *, error: type[OneLineError] = OneLineError) -> dict:
    """``value`` if it is a mapping with string keys; else ``error("<source>: <path> ...")``."""
    if not isinstance(value, dict):
        raise error(f"{source}: {path} must be a mapping, got {short(value)}")
    for key in value:
        if not isinstance(key, str):
            raise error(f"{source}: {path} has a non-string key {short(key)}")
    return value


_KIND_WORDS = {"bool": "true or false", "int": "an integer", "float": "a number", "str": "a string",
               "tuple[int, ...]": "a list of layer indices"}


def coerce(value: Any, kind: str, path: str, source: str, *, error: type[OneLineError] = OneLineError) -> Any:
    # bool is an int to Python, but `max_draft_tokens: true` is a mistake, never an intent.
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if kind == "int" and real and isinstance(value, numbers.Integral):
        return int(value)
    if kind == "float" and real:
        return float(value)  # ints too, so a hand-written `threshold: 1` compares equal to 1.0
    if (kind == "bool" and isinstance(value, bool)) or (kind == "str" and isinstance(value, str)):
        return value
    if kind == "tuple[int, ...]" and isinstance(value, (list, tuple)):
        return tuple(value)  # DraftConfig itself rejects non-integer and negative indices
    if kind == "ExitRule":
        return build(ExitRule, section(ExitRule, value, path, source, error=error)[0], "draft.", source, error=error)
    raise error(f"{source}: {path} must be {_KIND_WORDS[kind]}, got {short(value)}")


def section(cls: type, raw: Any, path: str, source: str, *, required: tuple[str, ...] = (),
            nonnegative: tuple[str, ...] = (), keep_unknown: bool = False,
            error: type[OneLineError] = OneLineError) -> tuple[dict, dict]:
    """Check one mapping against a dataclass: its field annotations are the schema.
    Returns (the known keys' values, coerced; the unknown keys, with ``keep_unknown``)."""
    known = {f.name: f.type.split("|")[0].strip() for f in fields(cls) if f.name != "extra"}
    values, unknown = {}, {}
    for key, value in mapping(raw, path, source, error=error).items():
        if key not in known and not keep_unknown:
            raise error(f"{source}: unknown key {path}.{key} (known: {', '.join(known)})")
        if key not in known:
            unknown[key] = value
        elif value is not None:  # null means "not given", just as leaving the key out does
            values[key] = coerce(value, known[key], f"{path}.{key}", source, error=error)
    for key in required:
        if key not in values:
            raise error(f"{source}: missing required key {path}.{key}")
    for key in nonnegative:
        if values.get(key, 0) < 0:
            raise error(f"{source}: {path}.{key} must be >= 0, got {values[key]}")
    return values, unknown


def build(cls: type, kwargs: dict, prefix: str, source: str, *, error: type[OneLineError] = OneLineError) -> Any:
    # config.py names a field relative to its own object; a profile's reader needs the full path.
    try:
        return cls(**kwargs)
    except ConfigError as e:
        msg = str(e)
        raise error(f"{source}: {msg if msg.startswith(prefix) else prefix + msg}") from None


class TooLarge(yaml.YAMLError):
    pass


class BoundedLoader(yaml.SafeLoader):
    """safe_load that refuses a document whose aliases expand it past MAX_EXPANDED_SIZE (or into
    itself), and turns a value that Python cannot construct (a 5000-digit integer, February 30)
    into a YAML error with its line."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._sizes: dict[int, int] = {}  # id(node) -> expanded size, for nodes composed so far

    def compose_node(self, parent, index):
        is_alias = self.check_event(yaml.AliasEvent)
        mark = self.peek_event().start_mark
        node = super().compose_node(parent, index)
        if is_alias:
            if id(node) not in self._sizes:  # the anchor is still open: an alias to its own ancestor
                raise yaml.composer.ComposerError(None, None, "an alias refers to a node that contains it", mark)
            return node  # an alias adds nothing new; its parent counts it in full
        if isinstance(node, yaml.ScalarNode):
            size = 1 + len(node.value)
        elif isinstance(node, yaml.SequenceNode):
            size = 1 + sum(self._sizes[id(child)] for child in node.value)
        else:
            size = 1 + sum(self._sizes[id(k)] + self._sizes[id(v)] for k, v in node.value)
        if size > MAX_EXPANDED_SIZE:
            raise TooLarge(f"at line {node.start_mark.line + 1} the document expands through its aliases past "
                            f"{MAX_EXPANDED_SIZE} nodes and characters (these files have a few hundred)")
        self._sizes[id(node)] = size
        return node

    def construct_mapping(self, node, deep=False):
        # A key given twice would be read as its last value while a person reviewing the file reads the first.
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
                if key is not None and key != "<<" and (key_node.tag, key) in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"key {short(key)} is given twice",
                                                            key_node.start_mark)
                seen.add((key_node.tag, key))
        return super().construct_mapping(node, deep)

    def construct_object(self, node, deep=False):
        try:
            value = super().construct_object(node, deep)
        except (ValueError, OverflowError) as e:  # YAMLError is not a ValueError: only Python's own
            raise yaml.constructor.ConstructorError(None, None, str(e), node.start_mark) from None
        if isinstance(value, int) and value.bit_length() > 256:  # e.g. 0xfff...: too long to even print
            raise yaml.constructor.ConstructorError(None, None, f"an integer of {value.bit_length()} bits",
                                                    node.start_mark)
        return value


def read_yaml(path: str | os.PathLike, source: str, *, error: type[OneLineError] = OneLineError,
              what: str = "profile") -> Any:
    """The parsed document of a ``what`` file (at most MAX_BYTES), with every way of failing as one ``error`` line."""
    try:
        # O_NONBLOCK: opening a named pipe must not wait for a writer; only a regular file is read at all
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise error(f"{source}: cannot read the {what}: not a regular file")
            with open(fd, "rb", closefd=False) as f:
                data = f.read(MAX_BYTES + 1)  # never more, whatever the file holds
        finally:
            os.close(fd)
        if len(data) > MAX_BYTES:
            raise error(f"{source}: refused: larger than {MAX_BYTES >> 20} MiB (a {what} is a few hundred bytes)")
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"{source}: cannot read the {what}: {getattr(e, 'strerror', None) or e}") from None
    try:
        return yaml.load(text, Loader=BoundedLoader)  # noqa: S506 - a SafeLoader subclass
    except TooLarge as e:
        raise error(f"{source}: refused: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = "; ".join(filter(None, (getattr(e, "context", None), getattr(e, "problem", None)))) or str(e)
        problem = problem if len(problem) <= 200 else problem[:197] + "..."
        raise error(f"{source}: malformed YAML{where}: {problem}") from None
    except RecursionError:
        raise error(f"{source}: malformed YAML: nested too deeply") from None


# -- writing -------------------------------------------------------------------------------------------------
def plain(value: Any) -> Any:
    # safe_dump refuses numpy scalars and would write tuples as lists anyway: hand it plain YAML types.
    if is_dataclass(value):
        out = {f.name: plain(getattr(value, f.name)) for f in fields(value)
               if f.name != "extra" and getattr(value, f.name) is not None}  # None is the same as left out
        return {**out, **{k: plain(v) for k, v in getattr(value, "extra", ())}}
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return int(value) if isinstance(value, numbers.Integral) else float(value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value  # anything else that YAML cannot hold is refused, with the file named, by the writer


class Dumper(yaml.SafeDumper):
    """safe_dump, but lists of scalars in flow style (`skip_attn: [3, 7]`), as people write them."""


Dumper.add_representer(list, lambda dumper, data: dumper.represent_sequence(
    "tag:yaml.org,2002:seq", data, flow_style=all(not isinstance(v, (list, dict)) for v in data)))


def write_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` so that a crash never leaves a half-written file: a temporary file beside it,
    fsynced, then renamed over it. OSError if it cannot be written (the temporary file is removed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    # os.open with 0o666 honours the umask, unlike mkstemp's 0o600, so shared files stay readable.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the rename makes them the file
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path



def replace_dir(path: str | os.PathLike, build: Callable[[Path], Any]) -> Any:
    """Make the directory ``path`` whole or not at all: ``build(staging)`` fills a fresh directory beside it, which
    then takes its place (what was there is renamed aside first and removed last). If ``build`` raises, the staging
    directory is removed and what was at ``path`` stays as it was. Returns what ``build`` returns."""
    import shutil

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tag = f"{os.getpid()}.{secrets.token_hex(4)}"
    stage = path.with_name(f".{path.name}.{tag}.tmp")
    stage.mkdir()
    try:
        result = build(stage)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    old = path.with_name(f".{path.name}.{tag}.old")
    had = path.exists()
    try:
        if had:
            os.replace(path, old)
        os.replace(stage, path)
    except BaseException:
        if had and old.exists() and not path.exists():
            os.replace(old, path)  # put the good one back
        shutil.rmtree(stage, ignore_errors=True)
        raise
    if had:
        shutil.rmtree(old, ignore_errors=True)
    return result

__all__ = ["MAX_BYTES", "MAX_EXPANDED_SIZE", "BoundedLoader", "Dumper", "OneLineError", "TooLarge", "bounded_repr",
           "build", "coerce", "mapping", "plain", "read_yaml", "replace_dir", "section", "short", "write_atomic"]
