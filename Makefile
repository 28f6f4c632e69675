# mlxcel developer entry points. `make serve` and `make test` work on a fresh machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
UV := $(BIN)/uv
MODEL ?=
HOST ?= 127.0.0.1
PORT ?= 8080
# Every distribution of the repository, installed editable.
DISTS := core $(wildcard families/*/pyproject.toml) $(wildcard plugins/*/pyproject.toml)
DIST_DIRS := core $(patsubst %/pyproject.toml,%,$(filter %/pyproject.toml,$(DISTS)))
# misaki (Kokoro's G2P) supports Python < 3.13 only: newer Pythons get every other one
ifeq ($(shell $(PY) -c 'import sys; print(sys.version_info >= (3, 13))'),True)
DIST_DIRS := $(filter-out families/kokoro,$(DIST_DIRS))
endif
DEV_TOOLS := pytest pytest-timeout openai anthropic httpx ruff tox tox-uv build jsonschema

.PHONY: install serve test test-fast bench lint sysdeps clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip uv

install: $(BIN)/python sysdeps
	$(UV) pip install --python $(BIN)/python $(addprefix -e ./,$(DIST_DIRS)) $(DEV_TOOLS) mlx-lm
	@echo "installed into $(VENV)"

# System packages the project needs (OpenBLAS for a fast MLX CPU backend; ffmpeg for video).
sysdeps:
	@bash scripts/install-sysdeps.sh

serve: install
	$(BIN)/mlxcel-server $(if $(MODEL),--model $(MODEL),--demo) --host $(HOST) --port $(PORT)

# Every tox env (`tox -l`): each distribution's tests in an env holding core plus that
# distribution only, then lint and the cross-distribution tests. `make test TOX_ARGS="-e
# core"` runs one env. .ci/pytest gives in-process tests the OpenBLAS preload the server
# gives itself (mlxcel.backend); MLXCEL_NO_FAST_BLAS=1 runs them on MLX's reference BLAS.
TOX_ARGS ?=
test: install
	$(BIN)/tox run $(TOX_ARGS)

# The quick loop: core's and the cross-distribution tests in .venv, where every
# distribution is installed together (no per-distribution isolation).
test-fast: install
	$(BIN)/ruff check .
	PYTHON=$(BIN)/python bash .ci/pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: install
	$(BIN)/python bench/serving.py --checkpoint tiny --modes defaults --concurrency 1 --max-tokens 256 --requests 7 --out bench/results/decode_speed.json

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .tox
