# etmlx: `make demo` sets up .venv and exports + runs an example; `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: install native demo test bench clean

$(INSTALLED): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(INSTALLED)

install: $(INSTALLED)

# The native backend (libetmlx_backend) and etmlx_run, into build/native; incremental.
native: $(INSTALLED)
	$(PY) native/build.py

demo: native
	$(PY) examples/demo.py

test: native
	$(PY) -m pytest -q

$(VENV)/.bench-installed: $(INSTALLED)
	$(PY) -m pip install --quiet -e '.[test,bench]'
	touch $@

bench: $(VENV)/.bench-installed native
	$(PY) bench/bench_encoder_block.py
	$(PY) bench/bench_attention.py
	$(PY) bench/bench_runtimes.py
	$(PY) bench/bench_llm.py

clean:
	rm -rf $(VENV) out build *.egg-info
