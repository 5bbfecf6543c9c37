# Two commands for a new user: `make run` and `make test`. Everything else is optional.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: run test install lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

## Start the whole product on its embedded default at http://127.0.0.1:8000/
run: $(STAMP)
	$(PY) manage.py migrate --noinput
	$(PY) manage.py setupdemo
	$(PY) manage.py runstack

## Install what tests need and run the whole suite
test: $(STAMP)
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) bench/retrieval_quality.py
	$(PY) bench/retrieval_latency.py

clean:
	rm -rf data .pytest_cache .mypy_cache .ruff_cache
