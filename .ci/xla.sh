#!/usr/bin/env bash
# The XLA test suite on XLA:CPU (no TPU needed): a separate venv with torch 2.9 + torch_xla 2.9.
#
#   .ci/xla.sh                 build (or reuse) ${XLA_VENV:-.venv-xla}, then run the tests marked xla (a process
#                              per test module)
#   XLA_VENV=/path .ci/xla.sh  use another venv location (an existing one is reused if its marker matches)
#   PYTEST_ARGS="-x -k spmd"   extra pytest arguments
#   XLA_BUILD_ONLY=1 .ci/xla.sh  build (or reuse) the venv and stop (.ci/run builds it while the main suite runs)
#   XLA_JOBS=1 .ci/xla.sh      one test module at a time (default: as many as the cores)
#
# The venv is rebuilt only when the pinned requirements below change (the marker file holds them).
set -euo pipefail

cd "$(dirname "$0")/.."
VENV="${XLA_VENV:-.venv-xla}"
PYTHON_BIN="${PYTHON:-python3}"
PINS="torch==2.9.0 torch_xla==2.9.0"
DEPS="numpy pyyaml opencv-python-headless safetensors tqdm pytest"
MARKER="$VENV/.anysr-xla-marker"
WANT="$PINS | $DEPS"

if [[ -e "$VENV" && ! -f "$MARKER" ]]; then
    # Never delete a folder this script did not build.
    echo "xla.sh: $VENV exists but was not built by this script (no $MARKER);" \
         "remove it or set XLA_VENV to another path" >&2
    exit 2
fi
if [[ ! -x "$VENV/bin/python" || "$(cat "$MARKER" 2>/dev/null)" != "$WANT" ]]; then
    echo "xla.sh: building $VENV ($PINS)"
    rm -rf "$VENV"
    "$PYTHON_BIN" -m venv "$VENV"
    printf 'incomplete' > "$MARKER"  # ours, even if the install below fails: the next run rebuilds it
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    # shellcheck disable=SC2086  # word splitting of the pin lists is intended
    "$VENV/bin/python" -m pip install --quiet $PINS $DEPS
    printf '%s' "$WANT" > "$MARKER"
else
    echo "xla.sh: reusing $VENV"
fi

# The repository itself, without letting pip touch the pinned torch.
"$VENV/bin/python" -m pip install --quiet --no-deps -e .
[[ "${XLA_BUILD_ONLY:-0}" == 1 ]] && exit 0

"$VENV/bin/python" -c "import torch, torch_xla; print('torch', torch.__version__, '| torch_xla', torch_xla.__version__)"
# One pytest process per test module: in one process, torch_xla 2.9's XLA:CPU segfaulted inside a later module's
# sync after the hundreds of graphs the architecture modules compile (tests that passed alone). XLA_JOBS modules
# run at once (default: the cores), each with one host thread (two processes with a thread per core each slow each
# other several times over: benchmarks/contention.md); each module's output is shown when it ends.
jobs="${XLA_JOBS:-$(nproc 2>/dev/null || echo 1)}"
# XLA:CPU compiles each graph through LLVM; the tests' graphs are small and run a few steps, so compiling is most of
# their time: LLVM's optimisation level 0 compiles them 2-3x faster (measured on tests/test_archs_grl.py: 329 s ->
# 122 s). It changes how fast the compiled code runs, not which graphs are built, what falls back or the results
# beyond float rounding; XLA_FLAGS set by the caller come first.
export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_backend_optimization_level=0"
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
thread_env=()
[[ "$jobs" -gt 1 ]] && thread_env=(OMP_NUM_THREADS=1 ANYSR_THREADS=1)
run_module() {
    local f="$1" log="$logs/$(basename "$1").log" rc=0 start=$SECONDS
    # shellcheck disable=SC2086
    env PJRT_DEVICE=CPU "${thread_env[@]}" "$VENV/bin/python" -m pytest -m xla -q -p no:cacheprovider "$f" \
        ${PYTEST_ARGS:-} > "$log" 2>&1 || rc=$?
    echo "== $f (exit $rc, $((SECONDS - start)) s)"
    cat "$log"
    [[ $rc -eq 0 || $rc -eq 5 ]] || { echo "xla.sh: $f failed (exit $rc)" >&2; return 1; }
}
status=0
running=0
# Reverse name order: the test_xla_*.py modules (whole training runs, the longest) start first and the short
# one-test architecture modules fill the lanes at the end, so no long module starts last.
for f in $(printf '%s\n' tests/test_*.py | sort -r); do
    grep -q "mark.xla" "$f" || continue
    if [[ $running -ge $jobs ]]; then
        wait -n || status=1
        running=$((running - 1))
    fi
    run_module "$f" &
    running=$((running + 1))
done
while [[ $running -gt 0 ]]; do
    wait -n || status=1
    running=$((running - 1))
done
exit $status
