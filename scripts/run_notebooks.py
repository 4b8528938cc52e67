"""Execute the notebooks in ``notebooks/`` top to bottom and write each back with its outputs (text and figures), so
that they show what they draw where people browse them; tests/test_notebooks.py checks that they still run.

    PYTHONPATH=. .venv/bin/python scripts/run_notebooks.py                 # every notebook
    PYTHONPATH=. .venv/bin/python scripts/run_notebooks.py notebooks/skip_map.ipynb --timeout 300

The kernel is ``python3`` run by this interpreter (jupyter_client starts the kernel spec's ``python`` as
``sys.executable``), in the notebook's own folder, with matplotlib's inline backend: figures are stored as PNGs at
the inline backend's modest resolution. A notebook that fails is left as it was and the script exits 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 1_000_000  # bytes: a notebook larger than this with its outputs is too heavy to browse


def execute(path: Path, *, cwd: Path | None = None, timeout: int = 600):
    """Run the notebook at ``path`` in folder ``cwd`` (default: its own) and return it with its outputs
    (``nbformat.NotebookNode``). A failing cell raises nbclient's CellExecutionError, with the cell and its traceback.
    The kernel inherits this process's environment."""
    import nbclient
    import nbformat

    book = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(book, timeout=timeout, kernel_name="python3", record_timing=False,
                                     resources={"metadata": {"path": str(cwd or path.parent)}})
    client.execute()
    return book


def text_of(book) -> str:
    """Everything the code cells printed or showed as text (errors' tracebacks included), in order."""
    out = []
    for cell in book.cells:
        for o in cell.get("outputs", []) if cell.cell_type == "code" else ():
            out += [o.get("text", ""), o.get("data", {}).get("text/plain", ""), *o.get("traceback", [])]
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", type=Path, help="default: every notebook in notebooks/")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    a = ap.parse_args(argv)
    import nbformat

    # The kernel inherits the environment: figures through the inline backend (not a file-only one set for tests),
    # this checkout importable.
    os.environ.pop("MPLBACKEND", None)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    # tqdm.auto (imported by optuna) warns in a kernel without ipywidgets, with the path of its install: nothing a
    # notebook's reader needs, and a path of this machine in a committed file.
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"),
                                                          "ignore:IProgress not found"]))
    failed = 0
    for path in a.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb")):
        try:
            book = execute(path, timeout=a.timeout)
        except Exception as e:  # noqa: BLE001 - nbclient's errors vary; the next notebook still runs
            print(f"{path}: failed: {str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__}",
                  file=sys.stderr)
            failed += 1
            continue
        local = [where for where in {str(ROOT), sys.prefix, str(Path.home())} if where in text_of(book)]
        if local:
            print(f"{path}: its outputs name {', '.join(sorted(local))}: not written", file=sys.stderr)
            failed += 1
            continue
        nbformat.write(book, path)
        size = path.stat().st_size
        print(f"wrote {path} ({size / 1e3:.0f} kB)" + ("; over 1 MB: draw smaller figures" if size > LIMIT else ""))
        failed += size > LIMIT
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
