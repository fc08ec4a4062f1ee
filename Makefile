# Two entry points, both idempotent: `make run` (the main job) and `make test` (the suite).
PYTHON ?= python3
VENV ?= .venv
STAMP := $(VENV)/.installed-stamp

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

.PHONY: venv run test
venv: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/twinrun ladder --repeats 2 --precision 5 --time-budget 7m

test: $(STAMP)
	$(VENV)/bin/python -m pytest
