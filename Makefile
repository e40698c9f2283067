# etmlx: `make demo` sets up .venv and exports + runs an example; `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: install native demo test test-vision test-wheel test-sanitize fuzz fuzz-sanitize bench clean

$(INSTALLED): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(INSTALLED)

install: $(INSTALLED)

# The native backend (libetmlx_backend) and etmlx_run, into build/native; incremental.
native: $(INSTALLED)
	$(VENV)/bin/etmlx build-native

demo: native
	$(PY) examples/demo.py

# One worker per core, each with one BLAS and torch thread (two workers whose pools each
# take every core ran the model tests ~6% slower); a file's tests stay together (its last
# test checks they covered every rule of its family).
test: native
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n auto --dist loadfile --ignore=tests/sweep

# The sweeps (tests/sweep): transformers' image families, the hybrid language-model
# families and more vision-language ones, each exported and run on both runtimes against eager.
test-vision: native
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n auto tests/sweep

# What a pip user gets: the wheel, installed with its dependencies into a fresh venv,
# exports and runs a model on both runtimes, building the native backend from the
# installed package, serves a tiny language model, transcribes with a tiny Whisper and asks
# a tiny LLaVA about an image (tests/wheel/smoke.py). The build
# goes to a cache inside build/wheel.
WHEEL_DIR := build/wheel
test-wheel: $(INSTALLED)
	rm -rf $(WHEEL_DIR) build/lib build/bdist.*   # setuptools would ship what an earlier build left there
	$(PY) -m pip wheel --quiet --no-deps --no-build-isolation -w $(WHEEL_DIR)/dist .
	$(PYTHON) -m venv $(WHEEL_DIR)/venv
	$(WHEEL_DIR)/venv/bin/python -m pip install --quiet "$$(ls $(WHEEL_DIR)/dist/etmlx-*.whl)[native,serve,llm]"
	cd $(WHEEL_DIR) && XDG_CACHE_HOME=$(CURDIR)/$(WHEEL_DIR)/cache venv/bin/python $(CURDIR)/tests/wheel/smoke.py

# The native tests again, with the backend built under AddressSanitizer and UBSan
# (loaded into Python with the sanitizer runtime preloaded).
SANITIZER_PRELOAD = $(shell gcc -print-file-name=libasan.so) $(shell gcc -print-file-name=libstdc++.so)
test-sanitize: $(INSTALLED)
	$(VENV)/bin/etmlx build-native --build-dir build/native-asan --sanitize
	ETMLX_NATIVE_LIBRARY=build/native-asan/libetmlx_backend.so LD_PRELOAD="$(SANITIZER_PRELOAD)" \
	ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	$(PY) -m pytest -q tests/native tests/lowering/test_indexing.py tests/models/test_kv_cache.py \
	  tests/models/test_kv_cache_growth.py tests/models/test_quantized_kv_cache.py tests/generation/test_prompt_cache.py \
	  tests/lowering/test_linear_attention.py

# Mutated .pte files loaded and run on both runtimes in child processes: every case must
# run or raise a documented error (fuzz/run.py). FUZZ_CASES=... FUZZ_SEED=... to vary.
FUZZ_CASES ?= 10000
FUZZ_SEED ?= 0
fuzz: native
	$(PY) fuzz/run.py --cases $(FUZZ_CASES) --seed $(FUZZ_SEED)

# The same with the native backend built under AddressSanitizer and UBSan.
fuzz-sanitize: $(INSTALLED)
	$(VENV)/bin/etmlx build-native --build-dir build/native-asan --sanitize
	ETMLX_NATIVE_LIBRARY=build/native-asan/libetmlx_backend.so LD_PRELOAD="$(SANITIZER_PRELOAD)" \
	ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	$(PY) fuzz/run.py --cases $(FUZZ_CASES) --seed $(FUZZ_SEED) --runtimes executorch

$(VENV)/.bench-installed: $(INSTALLED)
	$(PY) -m pip install --quiet -e '.[test,bench]'
	touch $@

bench: $(VENV)/.bench-installed native
	$(PY) bench/bench_encoder_block.py
	$(PY) bench/bench_attention.py
	$(PY) bench/bench_runtimes.py
	$(PY) bench/bench_bounds_checks.py
	$(PY) bench/bench_export.py
	$(PY) bench/bench_export.py --models llama:1024:8:2048 --rounds 1
	$(PY) bench/bench_export_llm.py
	$(PY) bench/bench_llm.py
	$(PY) bench/bench_tensor_parallel.py
	$(PY) bench/bench_llm.py --hidden 1024 --layers 8 --new-tokens 64 --max-cache 2048 --quantize int4 --group-size 64
	$(PY) bench/bench_load.py
	$(PY) bench/bench_vision.py
	$(PY) bench/bench_moe.py
	$(PY) bench/bench_moe.py --quantize int4 --group-size 64
	$(PY) bench/bench_hybrid.py --family qwen3_5
	$(PY) bench/bench_hybrid.py --family lfm2
	$(PY) bench/bench_hybrid.py --family mamba2
	$(PY) bench/bench_serve.py
	$(PY) bench/bench_grammar.py
	$(PY) bench/bench_speculative.py --noise 0.0 0.1 0.2
	$(PY) bench/bench_whisper.py
	$(PY) bench/bench_vlm.py

clean:
	rm -rf $(VENV) out build *.egg-info
