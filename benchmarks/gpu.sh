#!/usr/bin/env bash
# The GPU benchmark in one go (<= 10 minutes on one GPU), from any directory:
#
#   bash benchmarks/gpu.sh               # on a machine with a CUDA GPU
#   bash benchmarks/gpu.sh --cpu-check   # the same steps on the CPU, tiny sizes (CI: tests/test_gpu_script.py)
#
# Steps: (1) environment report (nvidia-smi, torch, device capability); (2) the CUDA tests (pytest -m cuda);
# (3) BasicSR 1.4.2 in its own package folder over this Python's packages (`pip install --target`, no
# dependencies, so it never pulls another torch) -- skipped with a note when pip cannot get it;
# (4) benchmarks/bench_gpu.py: per network and variant the training step's it/s, peak memory and TFLOP/s against
# the device's dense bf16 peak, then short real trainings (data-loader stall share) in anysr and BasicSR;
# (5) the Real-ESRNet step breakdown with the synthesis in the step and in the loader (benchmarks/realworld.md),
# then BSRGAN's (its dataset's degrade_in: step vs loader) while time is left.
# Results: $GPU_BENCH_OUT (default benchmarks/gpu-results/): env.txt, gpu.json, gpu.md (paste it into
# benchmarks/gpu.md), realworld.md, logs. Python: $PYTHON, else .venv/bin/python, else python3; it needs torch
# (with CUDA) and anysr's dependencies already installed: nothing here downloads torch.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
BUDGET_S=${GPU_BENCH_BUDGET_S:-600}
DEADLINE=$((START + BUDGET_S - 15))
CPU_CHECK=0
[ "${1:-}" = "--cpu-check" ] && CPU_CHECK=1
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3; fi
OUT=${GPU_BENCH_OUT:-benchmarks/gpu-results}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
step() { echo; echo "== [$(( $(date +%s) - START )) s] $*"; }
left() { echo $(( DEADLINE - $(date +%s) )); }

step "1. environment"
{
  date -u '+%Y-%m-%d %H:%M UTC'
  uname -srm
  echo "CPU cores: $(nproc 2>/dev/null || echo ?); load average: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
  else
    echo "nvidia-smi: not found"
  fi
  "$PY" - <<'EOF'
import torch
print(f"python torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"cuda:{i} {p.name}, capability {p.major}.{p.minor}, {p.total_memory / 2**30:.1f} GiB, "
          f"{p.multi_processor_count} SMs, bf16 supported: {torch.cuda.is_bf16_supported()}")
if not torch.cuda.is_available():
    print("no CUDA device visible to torch")
EOF
} 2>&1 | tee "$OUT/env.txt"
if ! "$PY" -c "import anysr.cli" 2>"$OUT/import-error.txt"; then
  echo "gpu.sh: anysr does not import with $PY ($(tail -1 "$OUT/import-error.txt")); install its dependencies" \
       "first: $PY -m pip install -e . (torch is not reinstalled)" >&2
  exit 2
fi
rm -f "$OUT/import-error.txt"
if [ "$CPU_CHECK" = 0 ] && ! "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
  echo "gpu.sh: torch sees no CUDA GPU; run on a GPU machine, or use --cpu-check for the CPU-side check" >&2
  exit 2
fi

step "2. CUDA tests (pytest -m cuda)"
if [ "$CPU_CHECK" = 1 ]; then
  echo "--cpu-check: skipped (they need a GPU; the suite runs them only where one is)" | tee "$OUT/pytest-cuda.txt"
else
  timeout 180 "$PY" -m pytest -q -m cuda -p no:cacheprovider tests/test_cuda.py 2>&1 | tail -15 \
    | tee "$OUT/pytest-cuda.txt"
fi

step "3. BasicSR 1.4.2"
BASICSR_ARGS=()
if [ "$CPU_CHECK" = 1 ]; then
  echo "--cpu-check: BasicSR comparison skipped"
else
  # its own package folder on top of this Python's packages (a venv over a venv would not see the venv's torch)
  BDIR=${BASICSR_DIR:-/tmp/anysr-basicsr-1.4.2}
  NOTE=""
  if ! PYTHONPATH="$BDIR" "$PY" -c "import basicsr" >/dev/null 2>&1; then
    if ! "$PY" -c "import torchvision" >/dev/null 2>&1; then
      NOTE="not run: torchvision is not installed beside this torch (BasicSR imports it; pulling it from PyPI would replace torch)"
    elif ! timeout 150 "$PY" -m pip install -q --retries 1 --timeout 10 --no-deps --no-build-isolation \
           --target "$BDIR" basicsr==1.4.2 \
           addict future lmdb yapf >"$OUT/basicsr-pip.txt" 2>&1; then
      NOTE="not run: pip install basicsr==1.4.2 failed ($(tail -1 "$OUT/basicsr-pip.txt" | cut -c1-160))"
    fi
  fi
  if [ -z "$NOTE" ] && ! PYTHONPATH="$BDIR" "$PY" -c "
import sys, torchvision.transforms.functional as f; sys.modules.setdefault('torchvision.transforms.functional_tensor', f)
import basicsr.train" >"$OUT/basicsr-import.txt" 2>&1; then
    NOTE="not run: basicsr 1.4.2 does not import ($(tail -1 "$OUT/basicsr-import.txt" | cut -c1-160))"
  fi
  if [ -z "$NOTE" ]; then
    BASICSR_ARGS=(--basicsr-python "$PY" --basicsr-path "$BDIR" --basicsr-note "1.4.2 from $BDIR (fp32, its own loop)")
    echo "BasicSR 1.4.2 ready in $BDIR"
  else
    BASICSR_ARGS=(--basicsr-note "$NOTE")
    echo "BasicSR: $NOTE; going on without it"
  fi
fi

step "4. training speed, memory, TFLOP/s, loader stalls ($(left) s left)"
if [ "$CPU_CHECK" = 1 ]; then
  "$PY" benchmarks/bench_gpu.py --cpu-check --out "$OUT" --deadline $((DEADLINE - 20)) ${BASICSR_ARGS[@]+"${BASICSR_ARGS[@]}"}
else
  # keep ~100 s for the Real-ESRNet breakdown
  "$PY" benchmarks/bench_gpu.py --out "$OUT" --deadline $((DEADLINE - 100)) ${BASICSR_ARGS[@]+"${BASICSR_ARGS[@]}"}
fi
STATUS=$?

step "5. Real-ESRNet step breakdown ($(left) s left)"
if [ "$CPU_CHECK" = 1 ]; then
  timeout $(( $(left) > 5 ? $(left) : 5 )) "$PY" benchmarks/bench_realesrnet_breakdown.py --tiny --iters 2 \
    --accelerator cpu --out "$OUT/realworld.md" || STATUS=1
elif [ "$(left)" -gt 40 ]; then
  timeout "$(left)" "$PY" benchmarks/bench_realesrnet_breakdown.py --iters 20 --accelerator cuda --workers 6 \
    --out "$OUT/realworld.md" || STATUS=1
  if [ "$(left)" -gt 40 ]; then  # BSRGAN's degradation on the GPU in the step vs in the loader workers
    timeout "$(left)" "$PY" benchmarks/bench_realesrnet_breakdown.py --iters 10 --accelerator cuda --workers 6 \
      --degradation bsrgan --out "$OUT/realworld_bsrgan.md" || STATUS=1
  fi
else
  echo "no time left for the breakdown"
fi

step "done: $OUT (gpu.md, gpu.json, realworld.md, env.txt, logs)"
exit $STATUS
