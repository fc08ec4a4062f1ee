# Two entry points, both idempotent: `make run` (the main job) and `make test` (the suite).
PYTHON ?= python3
VENV ?= .venv
STAMP := $(VENV)/.installed-stamp

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

.PHONY: venv run test test-fast
venv: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/twinrun ladder --repeats 2 --no-ablations --precision 5 --time-budget 7m

# The suite in two passes: what times nothing on 2 xdist workers (worksteal: test by test, the slow ones first,
# tests/conftest.py; an idle worker takes from the other's queue), then the timing-sensitive tests (marked serial)
# alone; it fails if either pass failed. Both passes share one JAX and one inductor compile cache (no test reads a
# compile time: tests/conftest.py).
test: $(STAMP)
	cache=$$(mktemp -d -t twinrun-test-caches-XXXXXX); \
	export JAX_COMPILATION_CACHE_DIR=$$cache/jax TWINRUN_SHARED_INDUCTOR_CACHE=$$cache/inductor; \
	$(VENV)/bin/python -m pytest -n 2 --dist worksteal -m "not serial"; parallel=$$?; \
	$(VENV)/bin/python -m pytest -p no:xdist -m serial; serial=$$?; \
	rm -rf "$$cache"; test $$parallel -eq 0 -a $$serial -eq 0

# The inner loop (under 3 minutes on 2 cores): every module at unit level, no end-to-end or multi-process run.
test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest -n 2 --dist worksteal -m "not e2e and not multiprocess and not slow and not serial"
