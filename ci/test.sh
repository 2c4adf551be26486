#!/usr/bin/env bash
# The test command. Set up (.venv and both neuron-lane venvs, side by side), then two streams, one per core of a 2-core
# machine, each single-threaded (OMP_NUM_THREADS=1, so they do not oversubscribe the cores):
#   stream 1: every notebook once through papermill on the reference backend, at its own defaults
#             (tests/test_notebooks.py, ci/params/cpu.yaml, metrics against ci/baselines/cpu.json; the executed
#             notebooks, their HTML, logs, metrics and report.json kept in $OUT_DIR/notebooks/cpu), then the
#             benchmarks' smoke runs (tests/test_benchmark.py), then the lanes' third part: every notebook's
#             recipe of each stack (its Neuron cells joined) as a script against its stand-in, on the embedded model and on a production-shaped
#             one (ci/neuron_sim.sh with NEURON_LANE_PARTS=cells; ci/production_model.py);
#   stream 2: the unit tests of helpers (engine parity with transformers, the runner, ...), then the two
#             neuron lanes (ci/neuron_sim.sh tnx, then nxdi) without their cells: the contract and
#             stand-in tests of each pinned stack and every notebook with backend="neuron", under the
#             transformers version the stack pins.
# Stream 1's logs (cells, then notebooks) are printed when both have finished (also kept in $OUT_DIR/test-logs, default out/).
# Everything runs even when a part fails; the exit status is non-zero if any failed. Extra arguments go to
# both pytest runs. The figures the notebooks print here are single-threaded and measured beside another
# stream: ratios within one run hold, absolute speeds are lower than on an idle machine.
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS="${OUT_DIR:-out}/test-logs"
mkdir -p "$LOGS"
# The four environments are independent: build them side by side.
bash ci/setup.sh > "$LOGS/setup.log" 2>&1 & setups="$!"
for stack in tnx nxdi; do
  bash ci/neuron_sim.sh "$stack" --setup > "$LOGS/setup-$stack.log" 2>&1 & setups="$setups $!"
done
# the book's Sphinx (.venv-site): tests/test_site.py builds a small book with it; ci/site.sh builds the real one after
bash ci/site.sh --setup > "$LOGS/setup-site.log" 2>&1 & setups="$setups $!"
for pid in $setups; do
  if ! wait "$pid"; then
    tail -n 40 "$LOGS"/setup*.log
    echo "set-up failed (logs in $LOGS)" >&2
    exit 1
  fi
done
tail -n 1 "$LOGS"/setup*.log
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=1
NOTEBOOKS_OUT="$(cd "${OUT_DIR:-out}" && pwd)/notebooks"  # tests/test_notebooks.py's outputs, per parameter set
export NOTEBOOKS_OUT
status=0

# stream 1: the notebooks, the benchmark smoke runs, then every recipe of both stacks as a standalone script
(
  s=0
  .venv/bin/python -m pytest tests/test_notebooks.py tests/test_benchmark.py -q -ra "$@" > "$LOGS/notebooks.log" 2>&1 || s=1
  for stack in tnx nxdi; do
    echo "== neuron lane, every recipe as a standalone script: $stack"
    NEURON_LANE_PARTS=cells bash ci/neuron_sim.sh "$stack" || s=1
  done > "$LOGS/cells.log" 2>&1
  exit $s
) &
stream1=$!

# tests/contract runs inside each lane (its NxD Inference stand-in needs that stack's transformers)
.venv/bin/python -m pytest tests -q -ra --durations=15 --ignore=tests/contract --ignore=tests/test_notebooks.py \
  --ignore=tests/test_benchmark.py "$@" \
  || status=1
for stack in tnx nxdi; do
  echo "== neuron lane: $stack (contract tests, then every notebook on backend=neuron)"
  NEURON_LANE_PARTS="contract notebooks" bash ci/neuron_sim.sh "$stack" || status=1
done

wait "$stream1" || status=1
echo "== every recipe as a standalone script, both stacks (stream 1, after the notebooks)"
cat "$LOGS/cells.log"
echo "== every notebook on the reference backend, then the benchmark smoke runs (stream 1)"
cat "$LOGS/notebooks.log"
exit $status
