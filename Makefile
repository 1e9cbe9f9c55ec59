# ppscope: every target installs what it needs first, into .venv (made with
# --system-site-packages so an existing CUDA torch and SGLang are reused).
#
#   make report            the bottleneck attribution report (works with no GPU and no results)
#   make test              the CPU test suite (GPU tests run too where a GPU is present)
#   make topology | stage-cost | graphs | dispatch    one probe each (GPU machine)
#   make all               every probe this machine can run, then the report
#
# Knobs: MODEL=kimi-k2 PP=8 (the deployment's pipeline size, for stage-cost and graphs)
#        RESULTS=results ARGS="extra flags". topology and dispatch use every visible GPU
#        (ARGS="--pp N" for fewer).

PYTHON  ?= python3
VENV    ?= .venv
VPY     := $(VENV)/bin/python
PPSCOPE := $(VENV)/bin/ppscope
RESULTS ?= results
MODEL   ?= kimi-k2
PP      ?= 8
ARGS    ?=
export PPSCOPE_RESULTS := $(RESULTS)

# What `make report` needs (no torch). Kept in step with pyproject.toml's dependencies.
CORE_DEPS := "numpy>=1.24" "tabulate>=0.9" "nvidia-ml-py>=12.535" "matplotlib>=3.7" "tqdm>=4.60"
# torch for the probes: reuse any installed torch; otherwise 2.13.0 (a CPU machine gets the
# CPU build). A GPU user without torch should install the CUDA build of their choice first.
TORCH_FALLBACK := torch==2.13.0

CORE_STAMP  := $(VENV)/.stamp-core
TORCH_STAMP := $(VENV)/.stamp-torch
GPU_STAMP   := $(VENV)/.stamp-gpu
TEST_STAMP  := $(VENV)/.stamp-test

.PHONY: help report test topology stage-cost graphs dispatch all clean
help:
	@sed -n '1,12p' Makefile

$(VPY):
	$(PYTHON) -m venv --system-site-packages $(VENV)

$(CORE_STAMP): pyproject.toml | $(VPY)
	$(VPY) -m pip install -q $(CORE_DEPS)
	$(VPY) -m pip install -q --no-deps --no-build-isolation -e . 2>/dev/null || \
	  $(VPY) -m pip install -q --no-deps -e .
	@touch $@

$(TORCH_STAMP): $(CORE_STAMP)
	@$(VPY) -c "import torch" 2>/dev/null || $(VPY) -m pip install -q "$(TORCH_FALLBACK)"
	@touch $@

# cupy drives the copy engines in the topology probe; pick the wheel for torch's CUDA major.
$(GPU_STAMP): $(TORCH_STAMP)
	@if command -v nvidia-smi >/dev/null 2>&1 && ! $(VPY) -c "import cupy" 2>/dev/null; then \
	  major=$$($(VPY) -c "import torch; print((torch.version.cuda or '12').split('.')[0])"); \
	  $(VPY) -m pip install -q "cupy-cuda$${major}x" || \
	    echo "warning: could not install cupy-cuda$${major}x; P2P copy-engine rows will be waived"; \
	fi
	@touch $@

$(TEST_STAMP): $(TORCH_STAMP)
	$(VPY) -m pip install -q "pytest>=7" "HolisticTraceAnalysis>=0.2" psutil
	@$(VPY) -c "import triton" 2>/dev/null || $(VPY) -m pip install -q triton || \
	  echo "warning: triton not installed; the Triton kernel CPU tests will be skipped"
	@touch $@

report: $(CORE_STAMP)
	$(PPSCOPE) report $(ARGS)

test: $(TEST_STAMP)
	$(VPY) -m pytest -q tests

topology: $(GPU_STAMP)
	$(PPSCOPE) topology --json $(RESULTS)/topology.json $(ARGS)

stage-cost: $(TORCH_STAMP)
	$(PPSCOPE) stage-cost --model $(MODEL) --pp $(PP) --json $(RESULTS)/stage_cost.json $(ARGS)

graphs: $(TORCH_STAMP)
	$(PPSCOPE) graphs --model $(MODEL) --pp $(PP) --json $(RESULTS)/graphs.json $(ARGS)

dispatch: $(TORCH_STAMP)
	$(PPSCOPE) dispatch --json $(RESULTS)/dispatch.json $(ARGS)

# Every probe this machine can run, then the report. A probe that cannot run here leaves a
# `waived` record and the next one still runs.
all: $(GPU_STAMP)
	-$(MAKE) --no-print-directory topology
	-$(MAKE) --no-print-directory stage-cost
	-$(MAKE) --no-print-directory graphs
	-$(MAKE) --no-print-directory dispatch
	$(MAKE) --no-print-directory report

clean:
	rm -rf $(VENV) build *.egg-info
