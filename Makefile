# ppscope: every target installs what it needs first, then runs. Where: the active environment
# (a venv, else a conda env, else the python3 on PATH) when it already has torch, so a GPU
# environment with its own CUDA torch, cupy and NCCL is used as it is, with no index needed;
# otherwise .venv (made with --system-site-packages, so a system-wide torch is reused).
# Missing packages are found by importing them, and only those are installed; in your own
# environment pip keeps every version already there (torch is never replaced or upgraded).
#
#   make report            the bottleneck attribution report (works with no GPU and no results)
#   make test              the CPU test suite (GPU tests run too where a GPU is present)
#   make lint              pyflakes' checks (ruff --select F): unused imports, undefined names
#   make topology | stage-cost | graphs | dispatch    one probe each (GPU machine)
#   make sglang ARGS="--log server.log --traces DIR --bench bench.jsonl"   your server's evidence
#   make sglang-lab        SGLang's own PP server (its own venv in .lab/, CPU) with injected
#                          faults, each case read by ppscope: results/lab/ (ARGS="--cases ...")
#   make sglang-lab-test   the live lab as a test tier (CI runs it after make test)
#   make all               every probe this machine can run, then the report
#   make env               which Python the targets use and why, and how to call ppscope
#
# Knobs: MODEL=kimi-k2 PP=8 (the deployment's pipeline size, for stage-cost and graphs)
#        RESULTS=results ARGS="extra flags". topology and dispatch use every visible GPU
#        (ARGS="--pp N" for fewer). PYTHON=path (the interpreter to start from),
#        USE_VENV=1 (always .venv), USE_VENV=0 (the active environment even without torch:
#        enough for report and test), VENV=.venv, STRICT=1 (test: HTA and triton must install).

RESULTS ?= results
MODEL   ?= kimi-k2
PP      ?= 8
ARGS    ?=
VENV    ?= .venv
USE_VENV ?=
STRICT  ?=
export PPSCOPE_RESULTS := $(RESULTS)

# ---- which interpreter ---------------------------------------------------------------------
ifneq ($(filter command line environment%,$(origin PYTHON)),)
  FROM := PYTHON=$(PYTHON)
else ifneq ($(if $(VIRTUAL_ENV),$(wildcard $(VIRTUAL_ENV)/bin/python)),)
  PYTHON := $(VIRTUAL_ENV)/bin/python
  FROM := the active venv $(VIRTUAL_ENV)
else ifneq ($(if $(CONDA_PREFIX),$(wildcard $(CONDA_PREFIX)/bin/python)),)
  PYTHON := $(CONDA_PREFIX)/bin/python
  FROM := the active conda env $(CONDA_PREFIX)
else
  PYTHON := python3
  FROM := python3 on PATH
endif

# One cheap look (no import of torch): has torch?, the interpreter's own path, a key for its
# environment (sys.prefix) so that each environment keeps its own install stamps.
PROBE := $(shell $(PYTHON) -c "import sys, hashlib, importlib.util as u; print(int(u.find_spec('torch') is not None), sys.executable, hashlib.sha1(sys.prefix.encode()).hexdigest()[:12])" 2>/dev/null)
HAS_TORCH := $(word 1,$(PROBE))
FROM_PY   := $(or $(word 2,$(PROBE)),$(PYTHON))

ifeq ($(USE_VENV),1)
  MODE := venv
  WHY  := USE_VENV=1: $(VENV), made from $(FROM) ($(FROM_PY))
else ifeq ($(USE_VENV)$(HAS_TORCH),1)
  MODE := own
  WHY  := $(FROM) ($(FROM_PY)) has torch: ppscope runs there
else ifeq ($(USE_VENV),0)
  MODE := own
  WHY  := USE_VENV=0: $(FROM) ($(FROM_PY)) as it is$(if $(filter 1,$(HAS_TORCH)),, (no torch: the probes cannot run))
else
  MODE := venv
  WHY  := $(FROM) ($(FROM_PY)) has no torch: $(VENV), made from it with --system-site-packages
endif

ifeq ($(MODE),own)
  VPY      := $(FROM_PY)
  STAMPS   := build/ppscope-env/$(word 3,$(PROBE))
  ENV_READY :=
  PIN_WHAT := all
else
  VPY      := $(VENV)/bin/python
  STAMPS   := $(VENV)
  ENV_READY := $(VENV)/bin/python
  PIN_WHAT := torch
endif
PPSCOPE := $(VPY) -m reports.cli

ifeq ($(MAKELEVEL),0)
  ifneq ($(filter-out help env clean,$(or $(MAKECMDGOALS),help)),)
    $(info ppscope: using $(VPY); $(WHY))
  endif
endif

# ---- what gets installed -------------------------------------------------------------------
# module:requirement. A requirement is installed only when its module does not import.
# What `make report` needs (no torch). Kept in step with pyproject.toml's dependencies.
CORE_DEPS := 'numpy:numpy>=1.24' 'tabulate:tabulate>=0.9' 'pynvml:nvidia-ml-py>=12.535' \
             'matplotlib:matplotlib>=3.7' 'tqdm:tqdm>=4.60'
# torch for the probes, only in .venv: reuse any installed torch; otherwise 2.13.0 (a CPU machine
# gets the CPU build). A GPU user without torch should install the CUDA build of their choice first.
TORCH_FALLBACK := torch==2.13.0
# The tests. HolisticTraceAnalysis (the trace cross-check) goes in with --no-deps: its declared
# dependencies pull in jupyterlab; what hta.trace_analysis imports is listed here instead.
TEST_DEPS := 'pytest:pytest>=7' 'hypothesis:hypothesis>=6' 'psutil:psutil' 'pandas:pandas' 'plotly:plotly' \
             'networkx:networkx' 'yaml:pyyaml'
HTA := HolisticTraceAnalysis>=0.5,<0.6

CORE_STAMP  := $(STAMPS)/.stamp-core
TORCH_STAMP := $(STAMPS)/.stamp-torch
GPU_STAMP   := $(STAMPS)/.stamp-gpu
TEST_STAMP  := $(STAMPS)/.stamp-test

# Prints the requirement of each module:requirement argument whose module does not import.
define _PPSCOPE_MISSING
import importlib, sys
for arg in sys.argv[1:]:
    mod, req = arg.split(":", 1)
    try:
        importlib.import_module(mod)
    except Exception:
        print(req)
endef
# pip constraints that keep installed versions: of torch alone (.venv), or of every installed
# distribution (your own environment: make only adds what is missing there).
define _PPSCOPE_PINS
import importlib.metadata as md, sys
try:
    from packaging.version import Version
except ImportError:
    from pip._vendor.packaging.version import Version
pins = {}
for d in md.distributions():
    name, version = d.metadata["Name"], d.version
    if not name or (sys.argv[1] != "all" and name.lower() != "torch"):
        continue
    try:
        Version(version)
    except Exception:
        continue
    pins.setdefault(name.lower().replace("_", "-"), version)
for name, version in pins.items():
    print(name + "==" + version)
endef
# The triton that the installed torch asks for, else the newest.
define _PPSCOPE_TRITON
import importlib.metadata as md
req = "triton"
try:
    for r in md.requires("torch") or []:
        r = r.split(";")[0].replace(" ", "")
        if r.lower().startswith("triton"):
            req = r
except md.PackageNotFoundError:
    pass
print(req)
endef
export _PPSCOPE_MISSING _PPSCOPE_PINS _PPSCOPE_TRITON

# `$(PIP) requirements...`: pip install under the constraints above.
PIP = mkdir -p $(STAMPS) && $(VPY) -c "$$_PPSCOPE_PINS" $(PIN_WHAT) > $(STAMPS)/pins.txt && \
      $(VPY) -m pip install -q -c $(STAMPS)/pins.txt
# `$(call MISSING,deps)`: the shell variable $$missing gets the requirements not importable.
MISSING = missing=$$($(VPY) -c "$$_PPSCOPE_MISSING" $(1))


.PHONY: help env report test lint topology stage-cost graphs dispatch sglang sglang-lab sglang-lab-test all clean
help:
	@sed -n '/^#/!q;p' Makefile
	@echo
	@$(MAKE) --no-print-directory env

env:
	@echo "interpreter: $(VPY)"
	@echo "why:         $(WHY)"
	@echo "stamps:      $(STAMPS)"
	@if [ -x "$(VPY)" ]; then \
	  bin=$$($(VPY) -c "import sysconfig; print(sysconfig.get_path('scripts'))"); \
	  if [ -x "$$bin/ppscope" ]; then echo "ppscope:     $$bin/ppscope (or '$(PPSCOPE)' from this folder)"; \
	  elif [ -f $(CORE_STAMP) ]; then echo "ppscope:     could not be installed there ($(STAMPS)/install.log says why); '$(PPSCOPE)' from this folder works"; \
	  else echo "ppscope:     not installed there yet (make report installs it); '$(PPSCOPE)' from this folder works"; fi; \
	else echo "ppscope:     $(VENV) is not made yet: make report makes it, then $(VENV)/bin/ppscope"; fi

$(VENV)/bin/python:
	$(PYTHON) -m venv --system-site-packages $(VENV)

$(CORE_STAMP): pyproject.toml Makefile | $(ENV_READY)
	@mkdir -p $(STAMPS)
	@$(call MISSING,$(CORE_DEPS)); if [ -n "$$missing" ]; then \
	  echo "ppscope: installing into $(VPY):" $$missing; \
	  $(PIP) $$missing || { echo "ppscope: could not install" $$missing "into $(VPY)$(if $(filter own,$(MODE)),; install them there or run with USE_VENV=1)" >&2; exit 1; }; fi
ifeq ($(MODE),venv)
	@$(VPY) -m pip install -q --no-deps --no-build-isolation -e . 2>/dev/null || \
	  $(VPY) -m pip install -q --no-deps -e .
else
	@if $(VPY) -m pip install -q --no-deps --no-build-isolation -e . > $(STAMPS)/install.log 2>&1; then \
	  echo "ppscope: installed (editable) into $(VPY)'s environment: the ppscope command is there"; \
	else echo "ppscope: note: could not install the ppscope command there ($$(tail -n 1 $(STAMPS)/install.log));" \
	  "make runs '$(PPSCOPE)' from this folder, and so can you"; fi
endif
	@touch $@

$(TORCH_STAMP): $(CORE_STAMP)
ifeq ($(MODE),venv)
	@$(VPY) -c "import torch" 2>/dev/null || $(PIP) "$(TORCH_FALLBACK)"
else
	@$(VPY) -c "import torch" || { echo "ppscope: torch does not import with $(VPY); the probes need it" \
	  "(install the build for your CUDA there, or run with USE_VENV=1)" >&2; exit 1; }
endif
	@touch $@

# cupy drives the copy engines in the topology probe and builds stage-cost's INT4 MoE kernel
# (NVRTC); pick the wheel for torch's CUDA major.
$(GPU_STAMP): $(TORCH_STAMP)
	@if command -v nvidia-smi >/dev/null 2>&1 && ! $(VPY) -c "import cupy" 2>/dev/null; then \
	  major=$$($(VPY) -c "import torch; print((torch.version.cuda or '12').split('.')[0])"); \
	  $(PIP) "cupy-cuda$${major}x" || \
	    echo "warning: could not install cupy-cuda$${major}x; P2P copy-engine rows will be waived" \
	      "and the INT4 MoE layer runs its Triton kernel"; \
	fi
	@touch $@

# The tests want torch where .venv can have it; your own environment without torch still runs
# the tests that do not need it.
$(TEST_STAMP): $(if $(filter own,$(MODE)),$(CORE_STAMP),$(TORCH_STAMP))
	@$(call MISSING,$(TEST_DEPS)); if [ -n "$$missing" ]; then \
	  echo "ppscope: installing into $(VPY):" $$missing; \
	  $(PIP) $$missing || echo "warning: could not install" $$missing; fi
	@$(VPY) -c "import pytest" 2>/dev/null || { echo "ppscope: the tests need pytest in $(VPY)" >&2; exit 1; }
	@$(VPY) -c "import hta" 2>/dev/null || $(PIP) --no-deps "$(HTA)" || true
	@$(VPY) -c "import hta.trace_analysis" 2>/dev/null || { \
	  echo "warning: hta.trace_analysis does not import; the HTA cross-check tests will be skipped" >&2; \
	  $(VPY) -c "import hta.trace_analysis" 2>&1 | tail -1 >&2; [ "$(STRICT)" != 1 ]; }
	@$(VPY) -c "import triton" 2>/dev/null || $(PIP) "$$($(VPY) -c "$$_PPSCOPE_TRITON")" || { \
	  echo "warning: triton not installed; the Triton kernel CPU tests will be skipped" >&2; [ "$(STRICT)" != 1 ]; }
	@touch $@

report: $(CORE_STAMP)
	$(PPSCOPE) report $(ARGS)

test: $(TEST_STAMP)
	$(VPY) -m pytest -q tests

topology: $(GPU_STAMP)
	$(PPSCOPE) topology --json $(RESULTS)/topology.json $(ARGS)

stage-cost: $(GPU_STAMP)
	$(PPSCOPE) stage-cost --model $(MODEL) --pp $(PP) --json $(RESULTS)/stage_cost.json $(ARGS)

graphs: $(TORCH_STAMP)
	$(PPSCOPE) graphs --model $(MODEL) --pp $(PP) --json $(RESULTS)/graphs.json $(ARGS)

dispatch: $(TORCH_STAMP)
	$(PPSCOPE) dispatch --json $(RESULTS)/dispatch.json $(ARGS)

# SGLang's own evidence (no GPU needed): make sglang ARGS="--log server.log --traces DIR ..."
sglang: $(CORE_STAMP)
	$(PPSCOPE) sglang --json $(RESULTS)/sglang.json $(ARGS)

# SGLang's own server as the system under test (microbench/sglang_lab/): installs SGLang into
# .lab/venv (never this environment), runs the plan, reads every case.
sglang-lab: $(CORE_STAMP)
	$(PPSCOPE) sglang-lab --out $(RESULTS)/lab $(ARGS)

# The linter: pyflakes' checks through ruff (unused imports and variables, undefined names), on
# every package and the tests; ruff is installed into the test environment when missing.
LINT := ruff>=0.4
lint: $(TEST_STAMP)
	@$(VPY) -m ruff --version >/dev/null 2>&1 || $(PIP) "$(LINT)"
	$(VPY) -m ruff check --select F microbench reports topology tests

sglang-lab-test: $(TEST_STAMP)
	PPSCOPE_LAB=1 $(VPY) -m pytest -q -m sglang_lab tests/test_sglang_lab_live.py

# Every probe this machine can run, then the report. A probe that cannot run here leaves a
# `waived` record and the next one still runs.
all: $(GPU_STAMP)
	@for t in $$($(VPY) -m reports.base.probes make-targets); do \
	  $(MAKE) --no-print-directory $$t || echo "ppscope: make $$t failed; the next probe still runs"; \
	done
	$(MAKE) --no-print-directory report

# .venv, the per-environment stamps (under build/) and build outputs. A ppscope installed into
# your own environment stays there: `pip uninstall ppscope` removes it.
clean:
	rm -rf $(VENV) build *.egg-info .lab
