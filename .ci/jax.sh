#!/usr/bin/env bash
# The torchax backend's tests (accelerator: xla through torchax, PyTorch on JAX) on JAX's CPU backend: no TPU needed.
#
#   .ci/jax.sh                  build (or reuse) ${JAX_VENV:-.venv-jax}, then run the tests marked jax (test_jax*.py,
#                               one module per process) with two virtual CPU devices
#   JAX_VENV=/path .ci/jax.sh   use another venv location (an existing one is reused if its marker matches)
#   PYTEST_ARGS="-x -k resume"  extra pytest arguments
#   JAX_BUILD_ONLY=1 .ci/jax.sh build (or reuse) the venv and stop
#   JAX_JOBS=1 .ci/jax.sh       one test process at a time (default: as many as the cores)
#
# The venv is rebuilt only when the pinned requirements below change (the marker file holds them). torchax 0.0.13
# does not import with torch 2.13 (it names aten overloads torch removed); the 0.0.14 pre-release pinned here does.
set -euo pipefail

cd "$(dirname "$0")/.."
VENV="${JAX_VENV:-.venv-jax}"
PYTHON_BIN="${PYTHON:-python3}"
PINS="torch==2.13.0 jax[cpu]==0.10.2 torchax==0.0.14.dev20261026"
DEPS="numpy pyyaml opencv-python-headless safetensors tqdm pytest"
MARKER="$VENV/.anysr-jax-marker"
WANT="$PINS | $DEPS"

if [[ -e "$VENV" && ! -f "$MARKER" ]]; then
    # Never delete a folder this script did not build.
    echo "jax.sh: $VENV exists but was not built by this script (no $MARKER);" \
         "remove it or set JAX_VENV to another path" >&2
    exit 2
fi
if [[ ! -x "$VENV/bin/python" || "$(cat "$MARKER" 2>/dev/null)" != "$WANT" ]]; then
    echo "jax.sh: building $VENV ($PINS)"
    rm -rf "$VENV"
    "$PYTHON_BIN" -m venv "$VENV"
    printf 'incomplete' > "$MARKER"  # ours, even if the install below fails: the next run rebuilds it
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    # shellcheck disable=SC2086  # word splitting of the pin lists is intended
    "$VENV/bin/python" -m pip install --quiet --pre $PINS $DEPS
    printf '%s' "$WANT" > "$MARKER"
else
    echo "jax.sh: reusing $VENV"
fi

# The repository itself, without letting pip touch the pinned torch.
"$VENV/bin/python" -m pip install --quiet --no-deps -e .
[[ "${JAX_BUILD_ONLY:-0}" == 1 ]] && exit 0

"$VENV/bin/python" -c "import torch, jax, torchax; print('torch', torch.__version__, '| jax', jax.__version__,
'| torchax', getattr(torchax, '__version__', '?'))"
# Two virtual CPU devices: the data-parallel tests shard each batch over them (a test process that asks for one
# device sets its own XLA_FLAGS). Every module in its own process, JAX_JOBS at once, one host thread each.
export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_force_host_platform_device_count=2"
jobs="${JAX_JOBS:-$(nproc 2>/dev/null || echo 1)}"
logs="$(mktemp -d)"
cache="$(mktemp -d)"
trap 'rm -rf "$logs" "$cache"' EXIT
run_tests() {  # run_tests FILE : one pytest process; 0 when its tests passed
    local log rc=0 start=$SECONDS
    log="$logs/$(basename "$1").log"
    # shellcheck disable=SC2086
    env OMP_NUM_THREADS=1 ANYSR_THREADS=1 ANYSR_JAX_CACHE="$cache/$(basename "$1")" \
        "$VENV/bin/python" -m pytest -m jax -q -p no:cacheprovider "$1" ${PYTEST_ARGS:-} > "$log" 2>&1 || rc=$?
    echo "== $1 (exit $rc, $((SECONDS - start)) s)"
    cat "$log"
    [[ $rc -eq 0 ]] || { echo "jax.sh: $1 failed (exit $rc)" >&2; return 1; }
}
status=0
running=0
for f in tests/test_jax*.py; do
    if [[ $running -ge $jobs ]]; then
        wait -n || status=1
        running=$((running - 1))
    fi
    run_tests "$f" &
    running=$((running + 1))
done
while [[ $running -gt 0 ]]; do
    wait -n || status=1
    running=$((running - 1))
done
exit $status
