# bench: JAX vs PyTorch automatic-differentiation benchmarks.
# `make bench` and `make test` each create/refresh .venv themselves; nothing else is needed on a fresh machine.

PYTHON    ?= python3
VENV      ?= .venv
PY        := $(VENV)/bin/python
HAS_GPU   := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
# On a CPU-only host the CPU build of torch is installed first, so the resolver never pulls a multi-GB CUDA
# build (torch==2.13.0 is the CPU wheel on this machine's local index). GPU hosts take the CUDA builds.
TORCH_CPU ?= torch==2.13.0
JAX_CUDA  ?= cuda12
EXTRAS    ?= dev$(if $(HAS_GPU),$(comma)$(JAX_CUDA),)
comma     := ,
STAMP     := $(VENV)/.bench-installed
# make test in one process (as CI runs it); TEST_WORKERS=N: N pytest-xdist workers, a whole file each at a time
# (a file's module fixtures are built once). docs/testing.md says what 2 workers gain and risk on 2 cores.
TEST_WORKERS ?= 0
# make test-fast, the inner loop, on two workers: its tests are mostly single-threaded config composition, which two
# processes halve (FAST_WORKERS=0: one process, as make test)
FAST_WORKERS ?= 2
PYTEST    := $(PY) -m pytest -q --dist loadfile
# make gpu-wheels: the wheels a lent GPU machine lacks, into .whl/ (ignored by git; it travels with the tree).
# make gpu-check there (docs/gpu.md): the image's python3 (torch, jax with CUDA) with those wheels installed into
# GPU_SITE; GPU_CHECK_DRY=1 runs it tiny on this CPU, in .venv.
GPU_WHEELS ?= .whl
GPU_PYTHON ?= $(if $(GPU_CHECK_DRY),$(PY),python3)
GPU_SITE   ?= /tmp/bench-gpu-site

.DEFAULT_GOAL := help
.PHONY: help setup test test-fast bench perf sweep ops ops-report report dashboard docs lint gpu-wheels gpu-check gpu-lease clean

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@if [ -z "$(HAS_GPU)" ]; then $(PY) -m pip install -q "$(TORCH_CPU)"; fi
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	@touch $(STAMP)

setup: $(STAMP)  ## create/refresh .venv (CPU torch here; JAX_CUDA=cuda12|cuda13 on GPU hosts)

test: $(STAMP)  ## run the whole test suite (CPU; CUDA tests skip without a GPU); TEST_WORKERS=2: two workers
	$(PYTEST) -n $(TEST_WORKERS)

test-fast: $(STAMP)  ## the inner loop (~2 min, two workers): the tests not marked slow (none over ~2 s)
	$(PYTEST) -n $(FAST_WORKERS) -m "not slow"

bench: $(STAMP)  ## default comparison: both frameworks x every mode, prints the table, writes results/
	$(PY) -m bench -m +experiment=default_bench $(if $(HAS_GPU),model=bert_base,)

# make perf: the speed targets' trials into results/ (measured afresh: the latest row of a configuration wins), then
# the check. 16-40 minutes on a 2-core CPU, by how busy the host is (docs/speed.md).
perf: $(STAMP)  ## harness vs a plain loop, JAX's compile at 6 and 24 layers, the modes at bert_base; then the targets
	$(PY) -m bench overhead $(if $(HAS_GPU),--model bert_base,)
	$(PY) -m bench -m +experiment=compile_depth
	$(PY) -m bench -m +experiment=mode_targets
	$(PY) -m bench targets

sweep: $(STAMP)  ## documented multirun example (depth scaling of backprop vs jvp, 2 parallel workers)
	$(PY) -m bench -m +experiment=depth_scaling

ops: $(STAMP)  ## op-level AD micro-benchmarks, torch and jax (CPU: threads 1 and all) -> results/ops.csv
	$(PY) -m bench -m scenario=ops framework=torch,jax $(if $(HAS_GPU),device=cuda ops=large,threads=1$(comma)all)

ops-report: report  ## the report, whose "Op-level AD micro-benchmarks" section is results/ops.csv's

report: $(STAMP)  ## tables and plots from results/ -> results/report.md, and a dated copy in benchmarks/
	$(PY) -m bench report results --benchmarks benchmarks

dashboard: $(STAMP)  ## W&B workspace + report of the runs (offline: spec -> results/dashboard.json; ARGS=--online saves)
	$(PY) -m bench dashboard $(ARGS)

docs: $(STAMP)  ## regenerate docs/options.md from the config schema (a test checks it is current)
	$(PY) -m bench options > docs/options.md

lint: $(STAMP)  ## ruff (format and check), and the import contracts in pyproject.toml (layers, no cycles, no framework in the parent)
	$(PY) -m ruff format --check bench tests examples
	$(PY) -m ruff check bench tests examples
	$(VENV)/bin/lint-imports

gpu-wheels: $(STAMP)  ## the wheels a lent GPU machine lacks (hydra, submitit, the vocabulary) and the commit -> .whl/ (docs/gpu.md)
	$(PY) bench/scenarios/gpu/wheels.py fetch --dest $(GPU_WHEELS)

# The wheels are installed first, by path (importing bench needs hydra, which they bring), then the check runs with
# them on PYTHONPATH; it installs them again (seconds) to record what it ran on. ARGS: its options, e.g. --steps.
gpu-check: $(if $(GPU_CHECK_DRY),$(STAMP))  ## on a GPU host: CUDA tests + the GPU measurements -> results_gpu/ (GPU_CHECK_DRY=1: tiny, CPU)
	$(GPU_PYTHON) bench/scenarios/gpu/wheels.py install --wheels $(GPU_WHEELS) --site $(GPU_SITE)
	PYTHONPATH=$(GPU_SITE):$(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH)) $(GPU_PYTHON) -m bench gpu-check \
	  $(if $(GPU_CHECK_DRY),--dry-run) --wheels $(GPU_WHEELS) --site $(GPU_SITE) $(ARGS)

# One device call of a lease, pasted as it is (docs/gpu.md): the check's --lease reads $OUT from the environment the
# device tool sets, so nothing here needs quoting (make would read $OUT in ARGS as $(O)UT). ARGS adds options.
gpu-lease: $(if $(GPU_CHECK_DRY),$(STAMP))  ## on a lent GPU: one device call, most valuable first, streamed into $OUT, done before its 10 min (docs/gpu.md)
	@$(MAKE) --no-print-directory gpu-check ARGS="--lease $(ARGS)"

clean:  ## remove results, Hydra outputs and caches (keeps .venv)
	rm -rf results outputs multirun .pytest_cache .ruff_cache .cache
