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
DEV_TOOLS := pytest pytest-timeout openai httpx ruff tox tox-uv build

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

# In-process tests get the same OpenBLAS preload the server gives itself (mlxcel.backend);
# MLXCEL_NO_FAST_BLAS=1 runs them on MLX's bundled reference BLAS.
test: install
	$(BIN)/ruff check .
	blas="$$($(BIN)/python -m mlxcel.backend)"; \
	LD_PRELOAD="$$blas$${LD_PRELOAD:+$${blas:+:}$$LD_PRELOAD}" $(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: install
	$(BIN)/python bench/serving.py --checkpoint tiny --modes defaults --concurrency 1 --max-tokens 256 --requests 7 --out bench/results/decode_speed.json

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .tox
