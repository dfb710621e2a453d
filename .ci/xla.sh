#!/usr/bin/env bash
# The XLA test suite on XLA:CPU (no TPU needed): a separate venv with torch 2.9 + torch_xla 2.9.
#
#   .ci/xla.sh                 build (or reuse) ${XLA_VENV:-.venv-xla}, then run the tests marked xla (*xla*.py
#                              one module per process, the architecture modules in groups)
#   XLA_VENV=/path .ci/xla.sh  use another venv location (an existing one is reused if its marker matches)
#   PYTEST_ARGS="-x -k spmd"   extra pytest arguments
#   XLA_BUILD_ONLY=1 .ci/xla.sh  build (or reuse) the venv and stop (.ci/run builds it while the main suite runs)
#   XLA_JOBS=1 .ci/xla.sh      one test process at a time (default: as many as the cores)
#   XLA_GROUP=1 .ci/xla.sh     every module in its own process (default: the architecture modules three at a time)
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
# Test processes: torch_xla's import alone takes about 5 s, so the short architecture modules run XLA_GROUP at a
# time in one pytest process (default 3); the modules named *xla* (whole training runs) run one per process. Not
# all in one process: there, torch_xla 2.9's XLA:CPU segfaulted inside a later module's sync after the hundreds of
# graphs the architecture modules compile (tests that passed alone), so a group that dies of a signal is run again
# one module per process and only those results count. XLA_JOBS processes run at once (default: the cores), each
# with one host thread (two processes with a thread per core each slow each other several times over:
# benchmarks/contention.md); each process's output is shown when it ends.
jobs="${XLA_JOBS:-$(nproc 2>/dev/null || echo 1)}"
group="${XLA_GROUP:-3}"
# XLA:CPU compiles each graph through LLVM; the tests' graphs are small and run a few steps, so compiling is most of
# their time: LLVM's optimisation level 0 compiles them 2-3x faster (measured on tests/archs/test_grl.py: 329 s ->
# 122 s). It changes how fast the compiled code runs, not which graphs are built, what falls back or the results
# beyond float rounding; XLA_FLAGS set by the caller come first.
export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_backend_optimization_level=0"
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
thread_env=()
[[ "$jobs" -gt 1 ]] && thread_env=(OMP_NUM_THREADS=1 ANYSR_THREADS=1)
run_tests() {  # run_tests FILE... : one pytest process; 0 when its tests passed (or none was collected)
    local log rc=0 start=$SECONDS
    log="$logs/$(basename "$1")+$#.log"
    # shellcheck disable=SC2086
    env PJRT_DEVICE=CPU "${thread_env[@]}" "$VENV/bin/python" -m pytest -m xla -q -p no:cacheprovider "$@" \
        ${PYTEST_ARGS:-} > "$log" 2>&1 || rc=$?
    echo "== $* (exit $rc, $((SECONDS - start)) s)"
    cat "$log"
    if [[ $rc -ge 128 && $# -gt 1 ]]; then
        echo "xla.sh: the process died of signal $((rc - 128)); its modules again, one per process"
        local f failed=0
        for f in "$@"; do run_tests "$f" || failed=1; done
        return $failed
    fi
    [[ $rc -eq 0 || $rc -eq 5 ]] || { echo "xla.sh: $* failed (exit $rc)" >&2; return 1; }
}
# Reverse name order: the test_xla*.py modules (among the longest) start first and the short architecture groups fill
# the lanes at the end, so no long process starts last.
units=()
pending=()
# The standard checks' XLA step (tests/archs/test_standard.py: one case per card) runs STD_CHUNK cards to a process,
# as the architecture modules did (default 12: hundreds of graphs in one process is what crashed).
std=tests/archs/test_standard.py
mapfile -t std_cases < <(env PJRT_DEVICE=CPU "$VENV/bin/python" -m pytest -m xla -q --collect-only \
    -p no:cacheprovider "$std" 2>/dev/null | grep "::" || true)
chunk="${STD_CHUNK:-12}"
for ((i = 0; i < ${#std_cases[@]}; i += chunk)); do units+=("${std_cases[*]:i:chunk}"); done
for f in $(printf '%s\n' tests/test_*.py tests/*/test_*.py | sort -r); do
    [[ "$f" == "$std" ]] && continue
    grep -q "mark.xla" "$f" || continue
    case "$(basename "$f")" in
        *xla*) units+=("$f") ;;
        *) pending+=("$f")
           if [[ ${#pending[@]} -ge $group ]]; then units+=("${pending[*]}"); pending=(); fi ;;
    esac
done
[[ ${#pending[@]} -gt 0 ]] && units+=("${pending[*]}")
status=0
running=0
for unit in "${units[@]}"; do
    if [[ $running -ge $jobs ]]; then
        wait -n || status=1
        running=$((running - 1))
    fi
    # shellcheck disable=SC2086  # a unit is a space-separated list of test files
    run_tests $unit &
    running=$((running + 1))
done
while [[ $running -gt 0 ]]; do
    wait -n || status=1
    running=$((running - 1))
done
exit $status
