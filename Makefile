# The two commands a fresh machine needs (see README):
#   make        the main job: verify every kernel (on the GPU, or in numba's
#               simulator when there is none) and build the book
#   make test   the whole test suite
# Both create .venv themselves; nothing installed by hand is assumed.

PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
# Re-install when pyproject.toml changes.
STAMP   := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
# Without a GPU every kernel runs in numba's CUDA simulator.
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1 || echo 0)
ifeq ($(HAS_GPU),1)
  SIM   ?= 0
  EXTRAS ?= cu13,gpu,test,book
else
  SIM   ?= 1
  # torch-cpu: the CPU tests of torch calls and of gemmlib.distributed (gloo)
  EXTRAS ?= cu13,test,book,torch-cpu
endif
export NUMBA_ENABLE_CUDASIM := $(SIM)
# Test workers (pytest-xdist): in the simulator one more than the cores, at most 8
# (a 2-core CI machine runs 3: simulated blocks wait on barriers and compile-gate
# subprocesses, and a third worker fills that idle time -- measured 7m22 against
# 9m30 with 2, 7m52 with 4); with a GPU, none (JOBS=0: one process), as GPU tests time
# kernels and size their problems by the GPU memory left free. `make test JOBS=4`.
ifeq ($(SIM),1)
  JOBS  ?= $(shell n=$$(( $$(nproc 2>/dev/null || echo 2) + 1 )); [ $$n -gt 8 ] && n=8; echo $$n)
else
  JOBS  ?= 0
endif

.PHONY: all run verify book test test-fast gpu-run clean

all: run

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	rm -f $(VENV)/.installed-*
	touch $@

run: verify book

verify: $(STAMP)
	$(BIN)/python -m gemmlib verify

book: $(STAMP)
	$(BIN)/jupyter-book build . --warningiserror --keep-going
	@echo "book: open _build/html/index.html"

# Library tests (simulator unless a GPU is present), the offline compile gate,
# and every notebook executed top to bottom by nbval, spread over $(JOBS) workers.
# --dist loadgroup: tests/conftest.py keeps each notebook (its cells run in order in
# one kernel) and each set of tests sharing a module fixture on one worker, largest
# first (the compile gate), and deals every other test out one by one, so the
# workers finish together instead of waiting on the last long file.
# Bytecode: every worker, notebook kernel and compile subprocess imports gemmlib and
# the tests; with PYTHONDONTWRITEBYTECODE set (as on CI machines) each would compile
# them again. compileall writes them once, and pytest may cache its rewritten tests.
test: $(STAMP)
	$(BIN)/python -m compileall -q gemmlib gemmcourse tests scripts >/dev/null
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest tests chapters --nbval-lax \
		-p no:cacheprovider -n $(JOBS) --dist loadgroup --durations=40

test-fast: $(STAMP)
	$(BIN)/python -m pytest tests -x -q

# On a GPU machine: GPU tests, verification, benchmark sweep, figures.
gpu-run: $(STAMP)
	bash scripts/gpu_run.sh

clean:
	rm -rf _build .pytest_cache
