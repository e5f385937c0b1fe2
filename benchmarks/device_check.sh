#!/usr/bin/env bash
# The whole GPU check in one run, for a fresh, offline NVIDIA machine (Python 3.12 with torch,
# transformers, onnx, numba and cupy, but no mnn, llmexport, pyopencl or vulkan):
#   1. installs the wheels (and Vulkan loader .debs) that tools/fetch_device_wheels.py put in
#      benchmarks/wheels/, into $SITE with pip --target;
#   2. runs every CUDA op test and CUDA's continuous-batching test (tests/backend/test_batch_cuda.py),
#      then the conformance suites on every fixture for cuda, vulkan (on the NVIDIA driver) and opencl
#      (where an NVIDIA ICD exists), while the 0.5B-shaped bench model is built from random weights
#      and exported in the background (tools/make_bench_model.py);
#   3. runs transformers eager bf16 on the bench model's HuggingFace source
#      (benchmarks/hf_eager_bench.py) as the side-by-side peer, then `mnngpu bench` on the model for
#      each backend, and CUDA's continuous batching at 1, 2 and 4 slots (benchmarks/batch_speed.py);
#   4. profiles a prefill and a decode step op by op on CUDA (benchmarks/cuda_profile.py) and
#      dispatch by dispatch on Vulkan (benchmarks/vulkan_profile.py);
#   5. prints every figure and a summary, and copies the summary and logs into $OUT if it is set.
# Each stage has a time limit inside an overall budget (BUDGET seconds, default 350), and a failing
# stage does not stop the later ones. BACKENDS, PROMPT, DECODE and REPEAT change what runs; PEER=0
# leaves the transformers peer out.
# Usage: bash benchmarks/device_check.sh
set -u

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(dirname "$HERE")
WHEELS=${WHEELS:-$HERE/wheels}
SITE=${SITE:-/tmp/site}
WORK=${WORK:-/tmp/mnngpu_device_check}
PY=${PYTHON:-python3}
BUDGET=${BUDGET:-350}
PROMPT=${PROMPT:-512}
DECODE=${DECODE:-128}
REPEAT=${REPEAT:-3}
BACKENDS=${BACKENDS:-cuda,vulkan,opencl}

START=$(date +%s)
mkdir -p "$WORK"
LOG=$WORK/device_check.log
SUMMARY=$WORK/summary.txt
: >"$LOG"
: >"$SUMMARY"
export PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp} XDG_CACHE_HOME=$WORK/cache
cd "$REPO" || exit 1

say() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $((BUDGET - ($(date +%s) - START))); }

# stage NAME LIMIT COMMAND...: run a command with the smaller of LIMIT and the budget left as its
# time limit (a function of this script runs unlimited), log its output, record its outcome.
stage() {
    local name=$1 limit=$2 rc began
    shift 2
    local budget_left
    budget_left=$(left)
    if [ "$budget_left" -lt 10 ]; then
        say "[$name] skipped: the ${BUDGET}s budget is spent"
        return 1
    fi
    [ "$limit" -gt "$budget_left" ] && limit=$budget_left
    echo "===== $name (limit ${limit}s, at $(($(date +%s) - START))s)" | tee -a "$LOG"
    began=$(date +%s)
    if declare -F "$1" >/dev/null; then  # a function of this script runs in this shell (its exports stay)
        "$@" > >(tee -a "$LOG") 2>&1
    else
        timeout --kill-after=5 "$limit" "$@" > >(tee -a "$LOG") 2>&1
    fi
    rc=$?
    say "[$name] exit $rc in $(($(date +%s) - began))s$([ "$rc" = 124 ] && echo ' (time limit)')"
    return "$rc"
}

install_packages() {
    if compgen -G "$WHEELS/gl/*.deb" >/dev/null; then
        for deb in "$WHEELS"/gl/*.deb; do dpkg -x "$deb" / || return 1; done
        ldconfig
    fi
    if ! compgen -G "$WHEELS/*.whl" >/dev/null && ! compgen -G "$WHEELS/*.whl.tar.xz" >/dev/null; then
        echo "no wheels in $WHEELS: run python -m tools.fetch_device_wheels --vulkan-loader first"
        return 1
    fi
    if compgen -G "$WHEELS/*.whl" >/dev/null; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
            "$WHEELS"/*.whl || return 1
    fi
    # a wheel fetch_device_wheels.py --compact stored as .tar.xz: its files, unpacked as pip would
    for packed in "$WHEELS"/*.whl.tar.xz; do
        [ -e "$packed" ] || continue
        mkdir -p "$SITE" && tar -xJf "$packed" -C "$SITE" || return 1
    done
}

# The drivers' loaders: Vulkan's ICD file where the loader finds none, and an OpenCL ICD file for
# NVIDIA's library where one exists (the loader bundled in pyopencl reads OCL_ICD_VENDORS).
find_drivers() {
    local icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json lib
    if [ -f "$icd" ] && [ -z "${VK_DRIVER_FILES:-}" ]; then
        export VK_DRIVER_FILES=$icd
        export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
    fi
    lib=$(ls /usr/local/nvidia/lib64/libnvidia-opencl.so.1 /usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.1 \
        /usr/local/nvidia/lib/libnvidia-opencl.so.1 2>/dev/null | head -1)
    if [ -n "$lib" ]; then
        mkdir -p "$WORK/icd"
        echo "$lib" >"$WORK/icd/nvidia.icd"
        export OCL_ICD_VENDORS=$WORK/icd
    fi
    echo "vulkan ICD: ${VK_DRIVER_FILES:-loader default}; OpenCL ICD: ${lib:-none found}"
}

# mnngpu.backends and mnngpu.shaders are mapped by pyproject's package-dir; a checkout that is not
# pip-installed gets the same layout through links, removed again at exit.
LINKED=()
make_importable() {
    if "$PY" -c "import mnngpu.backends.cpu, mnngpu.shaders" 2>/dev/null; then return 0; fi
    for part in backends shaders; do
        if [ ! -e "mnngpu/$part" ]; then
            ln -s "../$part" "mnngpu/$part" && LINKED+=("mnngpu/$part")
        fi
    done
    "$PY" -c "import mnngpu.backends.cpu, mnngpu.shaders; print('mnngpu importable from', mnngpu.__file__)"
}
cleanup() { for link in "${LINKED[@]}"; do rm -f "$link"; done; }
trap cleanup EXIT

# The MNN converter's telemetry module must be disabled in the --target install too.
check_telemetry_guard() {
    "$PY" - "$SITE" <<'EOF'
import sys
from tools.mnn_export import disable_converter_telemetry
patched = disable_converter_telemetry()
print("telemetry guard in", patched)
if not str(patched).startswith(sys.argv[1]):
    sys.exit(f"error: patched {patched}, not the MNN installed under {sys.argv[1]}")
EOF
}

# Vulkan's memory types: which are device-local, host-visible, host-cached (readbacks use a
# host-cached one), and their heaps.
report_vulkan_memory() {
    "$PY" - <<'EOF'
from mnngpu.backends.vulkan.device import shared_device
device = shared_device()
vk, props = device.vk, device.memory_properties
names = {vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT: "device-local", vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT: "host-visible",
         vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT: "coherent", vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT: "cached"}
for i in range(props.memoryTypeCount):
    kind = props.memoryTypes[i]
    flags = " ".join(name for bit, name in names.items() if kind.propertyFlags & bit) or "-"
    print(f"vulkan memory type {i}: {flags}; heap {kind.heapIndex} of {props.memoryHeaps[kind.heapIndex].size >> 20} MiB")
EOF
}

report_backends() {
    "$PY" - "$BACKENDS" <<'EOF'
import sys
from mnngpu.backend import BackendConfig, create_backend
from mnngpu.errors import BackendUnavailableError
for name in sys.argv[1].split(","):
    try:
        backend = create_backend(name, BackendConfig(precision="high"))
        device = getattr(backend, "device", None)
        print(f"{name}: available ({getattr(device, 'name', device)})")
    except BackendUnavailableError as exc:
        print(f"{name}: UNAVAILABLE: {exc}")
EOF
}

# Counts per backend from pytest's junit file: what the summary needs to say at a glance.
junit_counts() {
    "$PY" - "$1" <<'EOF'
import collections, re, sys, xml.etree.ElementTree as ET
counts = collections.defaultdict(collections.Counter)
for case in ET.parse(sys.argv[1]).iter("testcase"):
    match = re.search(r"[\[-](cuda|vulkan|opencl|cpu)[\]-]", case.get("name", ""))
    backend = match.group(1) if match else "all"
    outcome = "failed" if case.find("failure") is not None or case.find("error") is not None else \
        "skipped" if case.find("skipped") is not None else "passed"
    counts[backend][outcome] += 1
for backend, c in sorted(counts.items()):
    print(f"  {backend}: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped")
EOF
}

# Stand-in for `mnngpu bench` while that command is missing: cuda prefill/decode tok/s alone.
cuda_speed_fallback() {
    "$PY" - "$1" "$PROMPT" "$DECODE" <<'EOF'
import sys, time
import numpy as np
from mnngpu import llm as mnngpu_llm
model_dir, prompt, decode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
model = mnngpu_llm.create(f"{model_dir}/config.json")
model.set_config({"backend_type": "cuda"})
model.load()
ids = list(np.random.default_rng(0).integers(0, 1000, prompt))
model.forward(ids[:8]); model.forward([1]); model.reset()          # warm-up: kernels built, graph captured
start = time.perf_counter(); logits = model.forward(ids); prefill = time.perf_counter() - start
token, start = int(np.argmax(logits[0, -1])), time.perf_counter()
for _ in range(decode):
    token = int(np.argmax(model.forward([token])[0, -1]))
elapsed = time.perf_counter() - start
print(f"mnngpu cuda (fallback timing): prefill({prompt}) {prompt / prefill:.1f} tok/s, decode({decode}) {decode / elapsed:.2f} tok/s")
EOF
}

# Continuous batching on CUDA: aggregate tok/s at 1, 2 and 4 slots, its rows copied into the summary.
cuda_batch_speed() {
    local limit=$1
    [ "$(left)" -lt "$limit" ] && limit=$(left)
    timeout --kill-after=5 "$limit" "$PY" -m benchmarks.batch_speed "$2" --backends cuda --slots 1 2 4 \
        --tokens 32 --rounds 2 | tee -a "$SUMMARY"
    return "${PIPESTATUS[0]}"
}

# ---------------------------------------------------------------------------------------------------
say "device check of $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo 'this tree') on $(hostname)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$SUMMARY"
"$PY" -c "import sys, cupy; print('python', sys.version.split()[0], 'cupy', cupy.__version__)" 2>&1 | tee -a "$SUMMARY"

stage install 90 install_packages
export PYTHONPATH=$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}  # the benchmarks import mnngpu from the checkout
export PATH=$SITE/bin:$PATH
find_drivers > >(tee -a "$SUMMARY") 2>&1
stage importable 20 make_importable
stage telemetry-guard 30 check_telemetry_guard
TELEMETRY_OK=$?
stage backends 60 report_backends
case ",$BACKENDS," in *,vulkan,*) stage vulkan-memory 30 report_vulkan_memory ;; esac

MODEL=$WORK/bench_model
HF=$WORK/hf
if [ "$TELEMETRY_OK" = 0 ]; then
    (timeout 240 "$PY" -m tools.make_bench_model --out "$MODEL" >"$WORK/make_bench_model.log" 2>&1
     echo $? >"$WORK/make_bench_model.rc") &
    MODEL_PID=$!
else
    MODEL_PID=
fi
(timeout 240 "$PY" -c "import sys; from tools.make_bench_model import build_hf_model; \
from pathlib import Path; build_hf_model(Path(sys.argv[1]))" "$HF" >"$WORK/hf_build.log" 2>&1
 echo $? >"$WORK/hf_build.rc") &
HF_PID=$!

# pytest-xdist spreads the tests over the machine's cores where it is installed.
PARALLEL=()
"$PY" -c "import xdist" 2>/dev/null && PARALLEL=(-n "${WORKERS:-8}")
stage cuda-ops 120 "$PY" -m pytest -q -rs --tb=short -p no:cacheprovider "${PARALLEL[@]}" \
    tests/backend/test_ops.py tests/backend/test_cuda_ops.py tests/test_cuda_kernels_compile.py -k cuda \
    --junitxml="$WORK/cuda_ops.xml"
[ -f "$WORK/cuda_ops.xml" ] && junit_counts "$WORK/cuda_ops.xml" | tee -a "$SUMMARY"
case ",$BACKENDS," in *,cuda,*) stage cuda-batch 90 "$PY" -m pytest -q -rs --tb=short -p no:cacheprovider \
    tests/backend/test_batch_cuda.py ;; esac
stage conformance 150 "$PY" -m pytest -q -rs --tb=short -p no:cacheprovider "${PARALLEL[@]}" \
    tests/conformance/test_fixture_models.py tests/conformance/test_speculative_models.py \
    tests/conformance/test_sliding_window.py tests/conformance/test_vision_model.py \
    tests/conformance/test_audio_model.py -k "cuda or vulkan or opencl" --junitxml="$WORK/conformance.xml"
[ -f "$WORK/conformance.xml" ] && junit_counts "$WORK/conformance.xml" | tee -a "$SUMMARY"

# The peer first: its source is built sooner than the MNN export, which goes on meanwhile.
wait "$HF_PID"
say "[hf-build] exit $(cat "$WORK/hf_build.rc" 2>/dev/null || echo '?')"
cat "$WORK/hf_build.log" >>"$LOG"
HF_ARGS=()
[ -f "$HF/config.json" ] && HF_ARGS=(--hf "$HF")
[ "${PEER:-1}" = 1 ] && stage hf-eager 90 "$PY" -m benchmarks.hf_eager_bench "${HF_ARGS[@]}" -p "$PROMPT" -n "$DECODE" -rep "$REPEAT" \
    --json "$WORK/hf_eager.json"

if [ -n "$MODEL_PID" ]; then
    echo "===== waiting for the bench model (at $(($(date +%s) - START))s)" | tee -a "$LOG"
    wait "$MODEL_PID"
    cat "$WORK/make_bench_model.log" >>"$LOG"
    say "[make-bench-model] exit $(cat "$WORK/make_bench_model.rc" 2>/dev/null || echo '?')"
fi
if [ ! -f "$MODEL/llm.mnn" ]; then
    say "[mnngpu-bench] skipped: no bench model (see make_bench_model.log)"
elif "$PY" -m mnngpu bench --help >/dev/null 2>&1; then
    for backend in ${BACKENDS//,/ }; do  # one at a time, so a slow one cannot take the others' figures
        stage "bench-$backend" 100 "$PY" -m mnngpu bench -m "$MODEL" -a "$backend" -p "$PROMPT" -n "$DECODE" \
            -rep "$REPEAT"
    done
else
    say "[mnngpu-bench] 'mnngpu bench' is not available in this tree: timing cuda alone"
    stage cuda-speed 100 cuda_speed_fallback "$MODEL"
fi

case ",$BACKENDS," in *,cuda,*)
    BATCH_MODEL=$MODEL
    [ -f "$MODEL/llm.mnn" ] || BATCH_MODEL=$REPO/mnngpu/demo/model
    stage cuda-batch-speed 90 cuda_batch_speed 90 "$BATCH_MODEL" ;;
esac

# Where the time goes: op by op on CUDA, dispatch by dispatch on Vulkan.
if [ -f "$MODEL/llm.mnn" ]; then
    case ",$BACKENDS," in *,cuda,*) stage cuda-profile 90 "$PY" -m benchmarks.cuda_profile "$MODEL" \
        --prompt "$PROMPT" --repeats "$REPEAT" ;; esac
    case ",$BACKENDS," in *,vulkan,*) stage vulkan-profile 90 "$PY" -m benchmarks.vulkan_profile "$MODEL" \
        --prompt 128 --repeats "$REPEAT" ;; esac
fi

say "----- figures (tok/s lines of the log)"
grep -E "tok/s" "$LOG" | grep -v "^=====" >>"$SUMMARY"
say "total $(($(date +%s) - START))s"
echo "=================== summary"
cat "$SUMMARY"

if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    cp "$SUMMARY" "$LOG" "$OUT"/ 2>/dev/null
    for f in cuda_ops.xml conformance.xml hf_eager.json make_bench_model.log; do
        [ -f "$WORK/$f" ] && cp "$WORK/$f" "$OUT"/
    done
fi
