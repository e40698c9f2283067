# etmlx: `make demo` sets up .venv and exports + runs an example; `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: install demo test bench clean

$(INSTALLED): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(INSTALLED)

install: $(INSTALLED)

demo: $(INSTALLED)
	$(PY) examples/demo.py

test: $(INSTALLED)
	$(PY) -m pytest -q

$(VENV)/.bench-installed: $(INSTALLED)
	$(PY) -m pip install --quiet -e '.[test,bench]'
	touch $@

bench: $(VENV)/.bench-installed
	$(PY) bench/bench_encoder_block.py
	$(PY) bench/bench_attention.py
	$(PY) bench/bench_llm.py

clean:
	rm -rf $(VENV) out build *.egg-info
