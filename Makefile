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
# and every notebook executed top to bottom by nbval.
test: $(STAMP)
	$(BIN)/python -m pytest tests chapters --nbval-lax -p no:cacheprovider

test-fast: $(STAMP)
	$(BIN)/python -m pytest tests -x -q

# On a GPU machine: GPU tests, verification, benchmark sweep, figures.
gpu-run: $(STAMP)
	bash scripts/gpu_run.sh

clean:
	rm -rf _build .pytest_cache
