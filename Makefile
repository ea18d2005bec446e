# v4serve: every target installs what it needs into .venv first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install codegen check-generated lint test test-unit serve train-tiny bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

codegen: install  ## regenerate generated/ from specs/*.yaml
	$(PY) -m codegen

check-generated: install  ## fail if generated/ differs from what specs/ generate
	$(PY) -m codegen --check

lint: install  ## ruff over the hand-written code (generated/ is checked by check-generated)
	$(VENV)/bin/ruff check contract codegen runtime server tests bench

test: lint  ## lint, then the whole test suite
	$(PY) -m pytest -q

test-unit: install  ## the fast tests only (no engine runs, servers or compiles), 2-3 minutes
	$(PY) -m pytest -q -m "not slow"

serve: check-generated  ## serve the embedded default model (models/tiny) on 127.0.0.1:8000
	$(VENV)/bin/v4serve serve --spec tiny

train-tiny: install  ## retrain models/tiny on this interpreter's standard library (~45 min)
	$(PY) -m pip install --quiet -e '.[train]'
	$(PY) bench/train_tiny.py --out models/tiny

bench: install  ## offline and serving benchmarks on the tiny spec (prints tables)
	$(PY) bench/offline.py
	$(PY) bench/serve.py

clean:
	rm -rf $(VENV) build *.egg-info
