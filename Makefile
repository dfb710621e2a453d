# Two commands on a fresh machine:  `make demo` (train + compare with bicubic)  and  `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
TORCH  ?= torch==2.13.0
PYTEST_ARGS ?= -q -m "not xla and not cuda"

.PHONY: install demo test test-xla lint clean

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

test-xla:
	bash .ci/xla.sh

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check anysr tests examples benchmarks

clean:
	rm -rf $(VENV) experiments results tb_logger
