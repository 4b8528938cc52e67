"""The tested set of versions: the lock shipped in the package, its id, and how an install differs from it.

``constraints.txt`` beside this module is a pip constraints file of exact versions: the set the test
suite last passed on, which ``scripts/setup.sh`` installs by default (``--latest`` installs the newest
releases instead). ``skipsearch --version`` names it, and ``python -m skipsearch.tested`` compares the
running environment with it (setup.sh's last line) or writes a new one from it (``--freeze``).
"""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass
from importlib import metadata, resources

LOCK_FILE = "constraints.txt"
# Installed by venv or pip itself, never by setup.sh: neither locked nor checked.
_BOOTSTRAP = frozenset({"pip", "setuptools", "wheel", "skipsearch"})
_HEADER = """\
# The tested set: exact versions of everything scripts/setup.sh installs (base and --dev), as a pip
# constraints file. setup.sh installs from it by default; `setup.sh --latest` (or SKIPSEARCH_LATEST=1)
# installs the newest releases instead. torch is locked too, but a torch already in the venv is kept.
# Made by `python -m skipsearch.tested --freeze` in a venv whose test suite passed (see README).
"""


def normalize(name: str) -> str:
    """A distribution name as pip compares them (PEP 503): lower case, runs of -_. as one -."""
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_text() -> str:
    return resources.files("skipsearch").joinpath(LOCK_FILE).read_text(encoding="utf-8")


def lock_id() -> str:
    """The lock file's name and a short hash of its bytes: which tested set an install came from."""
    return f"{LOCK_FILE} {hashlib.sha256(lock_text().encode()).hexdigest()[:10]}"


def locked() -> dict[str, str]:
    """Normalized name -> exact version, from the lock's ``name==version`` lines."""
    out = {}
    for line in lock_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[normalize(name)] = version.strip()
    return out


def installed() -> dict[str, str]:
    """Normalized name -> version of every distribution this interpreter sees (bootstrap tools left out)."""
    out = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and normalize(name) not in _BOOTSTRAP:
            out.setdefault(normalize(name), dist.version)
    return out


def same_version(have: str, locked_version: str) -> bool:
    # A lock line without a local label (torch==2.13.0) matches any build of it (2.13.0+cpu), as pip's == does.
    return have == locked_version or ("+" not in locked_version and have.split("+", 1)[0] == locked_version)


@dataclass(frozen=True)
class Comparison:
    differ: tuple[tuple[str, str, str], ...]  # (name, installed, locked)
    unlocked: tuple[tuple[str, str], ...]  # (name, installed): in the environment, not in the lock
    kept: tuple[tuple[str, str, str], ...]  # (name, installed, locked): differs, but the user's (torch and its deps)

    @property
    def exact(self) -> bool:
        return not self.differ and not self.unlocked


def _requirement_closure(root: str, have: dict[str, str]) -> set[str]:
    """``root`` and every installed distribution it requires, transitively (extras' requirements left out)."""
    seen, todo = set(), [root]
    while todo:
        name = todo.pop()
        if name in seen or name not in have:
            continue
        seen.add(name)
        for req in metadata.requires(name) or ():
            if "extra ==" in req.replace('"', "").replace("'", ""):
                continue
            todo.append(normalize(re.split(r"[\s;<>=!~\[(]", req.strip(), maxsplit=1)[0]))
    return seen


def _torch_closure(have: dict[str, str]) -> set[str]:
    """torch and what it requires, transitively, in this environment: what a torch the user installed brought."""
    return _requirement_closure("torch", have) | {"torch"}


def constraints(*, kept_torch: bool = False) -> str:
    """The lock's pins less torch (setup.sh pins the torch it installed or kept), and with ``kept_torch``
    less what that torch requires too (a CUDA build may need another sympy or triton than the CPU wheel)."""
    lock = locked()
    drop = _torch_closure(installed()) if kept_torch else {"torch"}
    return "".join(f"{n}=={v}\n" for n, v in lock.items() if n not in drop)


def compare(*, kept_torch: bool = False) -> Comparison:
    """How the running environment differs from the lock. ``kept_torch``: a torch the user installed first
    was kept, so torch and what it requires (CUDA libraries, triton) are reported as kept, not as faults."""
    have, lock = installed(), locked()
    mine = _torch_closure(have) if kept_torch else set()
    differ, unlocked, kept = [], [], []
    for name, version in sorted(have.items()):
        if name in lock and same_version(version, lock[name]):
            continue
        if name in mine:
            kept.append((name, version, lock.get(name, "-")))
        elif name in lock:
            differ.append((name, version, lock[name]))
        else:
            unlocked.append((name, version))
    return Comparison(tuple(differ), tuple(unlocked), tuple(kept))


def describe(result: Comparison, *, limit: int = 6) -> str:
    """One line: does this environment hold exactly the tested set, and if not, where it differs."""
    parts = [f"{n} {have} (tested {want})" for n, have, want in result.differ]
    parts += [f"{n} {have} (not in the tested set)" for n, have in result.unlocked]
    kept = "".join(f"; kept your {n} {have}" for n, have, _ in result.kept if n == "torch")
    if not parts:
        return f"exactly the tested set ({lock_id()}){kept}"
    more = f", and {len(parts) - limit} more" if len(parts) > limit else ""
    return f"{len(parts)} package(s) differ from the tested set ({lock_id()}): {', '.join(parts[:limit])}{more}{kept}"


def version_text() -> str:
    """What ``skipsearch --version`` prints: the package version, the tested set, and whether this is it."""
    from skipsearch import __version__

    lock = locked()
    key = ", ".join(f"{n} {lock[n]}" for n in ("torch", "transformers", "optuna", "torchao") if n in lock)
    return (f"skipsearch {__version__}\ntested set: {lock_id()} ({key}, {len(lock)} packages)\n"
            f"this environment: {describe(compare(kept_torch=True))}")


def freeze() -> str:
    """A new lock from the running environment (what ``--freeze`` writes). A local build label is dropped
    (torch 2.13.0+cpu is locked as 2.13.0), so that the lock also resolves where that build's index is not set up."""
    return _HEADER + "".join(f"{n}=={v.split('+', 1)[0]}\n" for n, v in sorted(installed().items()))


def main(argv: list[str] | None = None) -> int:
    """``python -m skipsearch.tested [--kept-torch] [--latest] | --constraints [--kept-torch] | --freeze``:
    compare with the lock (exit 1 when a locked install differs), print the pins setup.sh installs with, or a new lock.
    Standard library only, so that setup.sh can run it from the checkout before anything is installed."""
    args = sys.argv[1:] if argv is None else argv
    if "--freeze" in args:
        sys.stdout.write(freeze())
        return 0
    if "--constraints" in args:
        sys.stdout.write(constraints(kept_torch="--kept-torch" in args))
        return 0
    result = compare(kept_torch="--kept-torch" in args)
    if "--latest" in args:
        print(f"the newest releases (untested): {describe(result)}")
        return 0
    print(describe(result))
    return 0 if result.exact else 1


if __name__ == "__main__":
    sys.exit(main())
