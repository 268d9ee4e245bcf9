# Two commands: `make repro` runs the pipeline, `make test` runs the tests. Both set up .venv first
# (idempotent: the install is skipped while .venv/.installed is newer than pyproject.toml).
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# the test tools on top (pytest, ruff, the SFTP remote and ONNX Runtime the tests use): `make repro` does without
DEV_STAMP := $(VENV)/.installed-dev
# No telemetry, ever; the embedded default needs no hub, so fail fast instead of waiting on one.
export HF_HUB_DISABLE_TELEMETRY := 1
export DO_NOT_TRACK := 1
export TOKENIZERS_PARALLELISM := false
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: setup setup-dev repro embedded-results test test-slow test-all bench gpu-check deps params-style clean

setup: $(STAMP)
setup-dev: $(DEV_STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	# torch first and pinned: a plain `torch` requirement would pull a multi-GB CUDA build here.
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -e .
	@touch $(STAMP)

$(DEV_STAMP): $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	@touch $(DEV_STAMP)

repro: setup
	$(VENV)/bin/dvc repro

# after `make repro` on a fresh clone: its report, dated and with the machine named, as docs/embedded-results.md
# (REPRO_TIME="14 min 2 s" adds the measured time); a test fails while it was made from other params.yaml values
embedded-results: setup
	$(VENV)/bin/distillpipe embedded-results $(if $(REPRO_TIME),--repro-time "$(REPRO_TIME)")

test: setup-dev
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(VENV)/bin/pytest

# the proofs of the trust promises (kills at random moments, code edits that rebuild a store, `dvc exp run -S`, remotes):
# the tests marked slow, which `make test` leaves out; CI (.ci/run) runs them after `make test`
test-slow: setup-dev
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(VENV)/bin/pytest -m slow

test-all: setup-dev
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(VENV)/bin/pytest -m ""

bench: setup-dev
	@for b in benchmarks/[!_]*.py; do case $$b in *gpu_check.py|*dvc_at_size.py) continue;; esac; echo "== $$b"; $(PY) $$b || exit 1; done

# (dvc_at_size.py writes a 20 GB store and needs ~41 GB free: run it by hand.)
# On a machine with a GPU (DEVELOPERS.md): the CUDA tests and the GPU measurements, one JSON and a table.
# Uses this checkout's .venv when there is one, else the machine's python3 (a lent GPU machine has torch).
GPU_PY ?= $(if $(wildcard $(PY)),$(PY),python3)
gpu-check:
	PYTHONPATH=$(CURDIR)/src:$(CURDIR)/benchmarks$${PYTHONPATH:+:$$PYTHONPATH} HF_HUB_OFFLINE=1 $(GPU_PY) benchmarks/gpu_check.py

# The stages' code fingerprints (fingerprints/, git-tracked; `dvc repro` writes them too) and dvc.yaml's code deps
# on them (after adding a stage), and params.yaml in the style `dvc exp run -S` writes it (after editing it by hand):
# docs/code-deps.md. Tests fail until these are run.
deps: setup
	$(VENV)/bin/distillpipe dvc-deps
	$(VENV)/bin/distillpipe fingerprint

params-style: setup
	$(VENV)/bin/distillpipe params-style

clean:
	rm -rf $(VENV) .pytest_cache
