# Two commands on a fresh machine:  `make demo` (train + compare with bicubic)  and  `make test`.
# `make clean` deletes the environment, experiments/ and results/ (it says so first).
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
TORCH  ?= torch==2.13.0
# -n auto: one test process per core (pytest-xdist), each with one thread (tests/conftest.py); --dist worksteal: a
# worker that runs out of tests takes some of the other's (the long training tests do not leave one core idle at
# the end); --durations: the slowest tests are listed at the end (what to cut when the suite grows); --timeout: a
# test that hangs (seen: a forked DataLoader worker stuck in a library's thread pool) fails with its stack after 20
# minutes instead of stalling the run (the longest test takes about 3)
PYTEST_ARGS ?= -q -n auto --dist worksteal -m "not xla and not jax and not cuda" --durations=25 --timeout=1200
# How a CPU without AVX-512 computes (torch's and oneDNN's kernels capped at AVX2), on any x86 machine.
AVX2_ENV = ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2

.PHONY: install demo test test-avx2 test-xla test-jax lint clean

# Two steps, each saying what it does before it starts. `make demo` needs only torch and anysr's own dependencies
# (+ lmdb for the README's `anysr prepare lmdb`); `make test` (and `make install`, what CI calls) adds the `dev`
# extra. torch comes from PyTorch's CPU-only index as PyTorch documents it (the public index's Linux build is the
# CUDA one, several GB more); where that index cannot be reached, pip's own index is asked instead.
# `make demo TORCH_INDEX=` asks pip's own index only (a CUDA build on Linux).
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
PIP_QUIET   ?= -q --progress-bar off
# pip's output goes to $(VENV)/pip.log and is shown only when a step fails (setuptools' notes on editable installs
# are for packaging developers).
PIP_LOG      = $(VENV)/pip.log
QUIET_PIP    = $(PY) -m pip install $(PIP_QUIET)
LOGGED       = >>$(PIP_LOG) 2>&1 || { cat $(PIP_LOG); echo "make: pip failed (above; also in $(PIP_LOG))"; exit 1; }

$(VENV)/.demo: pyproject.toml
	@echo "make: creating the virtual environment $(VENV): a few minutes and 1.1 GB with torch (the dev extra of"
	@echo "      \`make test\` adds 0.5 GB); nothing more is printed while pip works (its log: $(PIP_LOG))"
	$(PYTHON) -m venv $(VENV)
	@$(QUIET_PIP) --upgrade pip $(LOGGED)
	@if [ -n "$(TORCH_INDEX)" ] && $(PY) -c "import urllib.request as u; u.urlopen('$(TORCH_INDEX)/torch/', timeout=15)" \
	     >/dev/null 2>&1; then \
	  echo "make: installing $(TORCH), CPU build, from $(TORCH_INDEX) (about 200 MB) ..."; \
	  $(QUIET_PIP) "$(TORCH)" --index-url $(TORCH_INDEX) >>$(PIP_LOG) 2>&1 || \
	  { echo "make: that failed ($(PIP_LOG)); asking pip's own index for $(TORCH) instead"; \
	    $(QUIET_PIP) "$(TORCH)" $(LOGGED); }; \
	else \
	  echo "make: installing $(TORCH) from pip's own index$(if $(TORCH_INDEX), ($(TORCH_INDEX) cannot be reached),)" \
	       "(on Linux the public index's build is CUDA's: several GB) ..."; \
	  $(QUIET_PIP) "$(TORCH)" $(LOGGED); \
	fi
	@echo "make: installing anysr (editable) and its dependencies (numpy, opencv, pyyaml, safetensors, tqdm, lmdb) ..."
	@$(QUIET_PIP) -e ".[lmdb]" $(LOGGED)
	@touch $@

$(VENV)/.installed: $(VENV)/.demo
	@echo "make: installing the test tools and optional packages the tests use (the dev extra) ..."
	@$(QUIET_PIP) -e ".[dev]" $(LOGGED)
	@touch $@

install: $(VENV)/.installed

demo: $(VENV)/.demo
	$(PY) examples/quickstart.py

test: $(VENV)/.installed
	$(PY) -m pytest $(PYTEST_ARGS)

# The suite again with AVX2 kernels (no slow runs): fixture comparisons must hold on every instruction set (the
# modules that compare numbers; tests/conftest.py: ANYSR_TEST_KERNELS_ONLY). Only where torch computes with AVX-512:
# on any other CPU `make test` has just run these modules with kernels other than AVX-512's, so it says so and stops.
test-avx2: $(VENV)/.installed
	@cap="$$($(PY) -c 'import torch; print(torch.backends.cpu.get_cpu_capability())')"; \
	if [ "$${cap#AVX512}" = "$$cap" ]; then \
	  echo "make test-avx2: torch computes with $$cap kernels here, not AVX-512: \`make test\` already ran these checks without AVX-512"; \
	else \
	  $(AVX2_ENV) ANYSR_TEST_KERNELS_ONLY=1 $(PY) -m pytest -q -n auto --dist worksteal --timeout=1200 \
	    -m "not xla and not jax and not cuda and not slow"; \
	fi

test-xla:
	bash .ci/xla.sh

# accelerator: xla through torchax (PyTorch on JAX) on JAX's CPU backend, in its own venv (.venv-jax)
test-jax:
	bash .ci/jax.sh

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check anysr tests examples benchmarks tools

# What `make clean` deletes, said before it goes: the virtual environment, every trained run (experiments/ holds the
# weights) and results, the editable install's egg-info and anysr's cache (measured choices, ONNX exports).
# To measure the precision / memory-format choices again, `anysr bench -opt FILE --remeasure` is enough.
ANYSR_CACHE = $${ANYSR_CACHE_DIR:-$${XDG_CACHE_HOME:-$$HOME/.cache}/anysr}
clean:
	@echo "make clean: deleting $(VENV)/ experiments/ results/ tb_logger/ anysr.egg-info/ and $(ANYSR_CACHE)/{choices.json,onnx/}"
	rm -rf $(VENV) experiments results tb_logger anysr.egg-info
	rm -rf "$(ANYSR_CACHE)/choices.json" "$(ANYSR_CACHE)/onnx"
