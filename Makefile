# Two commands on a fresh machine:  `make demo` (train + compare with bicubic)  and  `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
TORCH  ?= torch==2.13.0
# -n auto: one test process per core (pytest-xdist), each with one thread (tests/conftest.py); --dist worksteal: a
# worker that runs out of tests takes some of the other's (the long training tests do not leave one core idle at
# the end); --durations: the slowest tests are listed at the end (what to cut when the suite grows)
PYTEST_ARGS ?= -q -n auto --dist worksteal -m "not xla and not jax and not cuda" --durations=25
# How a CPU without AVX-512 computes (torch's and oneDNN's kernels capped at AVX2), on any x86 machine.
AVX2_ENV = ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2

.PHONY: install demo test test-avx2 test-xla test-jax lint clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) examples/quickstart.py

test: $(VENV)/.installed
	$(PY) -m pytest $(PYTEST_ARGS)

# The suite again with AVX2 kernels (no slow runs): fixture comparisons must hold on every instruction set (the
# modules that compare numbers; tests/conftest.py: ANYSR_TEST_KERNELS_ONLY).
test-avx2: $(VENV)/.installed
	$(AVX2_ENV) ANYSR_TEST_KERNELS_ONLY=1 $(PY) -m pytest -q -n auto --dist worksteal -m "not xla and not jax and not cuda and not slow"

test-xla:
	bash .ci/xla.sh

# accelerator: xla through torchax (PyTorch on JAX) on JAX's CPU backend, in its own venv (.venv-jax)
test-jax:
	bash .ci/jax.sh

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check anysr tests examples benchmarks

clean:  # also the measured precision / memory-format choices (README: the first run measures)
	rm -rf $(VENV) experiments results tb_logger
	rm -f "$${ANYSR_CACHE_DIR:-$${XDG_CACHE_HOME:-$$HOME/.cache}/anysr}/choices.json"
