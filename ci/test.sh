#!/usr/bin/env bash
# The test command. Set up (.venv and both neuron-lane venvs, side by side), then two streams, one per core of a 2-core
# machine, each single-threaded (OMP_NUM_THREADS=1, so they do not oversubscribe the cores):
#   stream 1: every notebook once through papermill on the reference backend, at its own defaults
#             (tests/test_notebooks.py, ci/params/cpu.yaml, metrics against ci/baselines/cpu.json), then the
#             benchmarks' smoke runs (tests/test_benchmark.py);
#   stream 2: the unit tests of helpers (engine parity with transformers, the runner, ...), then the two
#             neuron lanes (ci/neuron_sim.sh tnx, then nxdi): the contract and
#             stand-in tests of each pinned stack and every notebook with backend="neuron", under the
#             transformers version the stack pins.
# Stream 1's log is printed when both have finished (also kept in $OUT_DIR/test-logs, default out/).
# Everything runs even when a part fails; the exit status is non-zero if any failed. Extra arguments go to
# both pytest runs. The figures the notebooks print here are single-threaded and measured beside another
# stream: ratios within one run hold, absolute speeds are lower than on an idle machine.
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS="${OUT_DIR:-out}/test-logs"
mkdir -p "$LOGS"
# The three environments are independent: build them side by side.
bash ci/setup.sh > "$LOGS/setup.log" 2>&1 & setups="$!"
for stack in tnx nxdi; do
  bash ci/neuron_sim.sh "$stack" --setup > "$LOGS/setup-$stack.log" 2>&1 & setups="$setups $!"
done
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
status=0

.venv/bin/python -m pytest tests/test_notebooks.py tests/test_benchmark.py -q -ra "$@" > "$LOGS/notebooks.log" 2>&1 &
notebooks=$!

# tests/contract runs inside each lane (its NxD Inference stand-in needs that stack's transformers)
.venv/bin/python -m pytest tests -q -ra --durations=15 --ignore=tests/contract --ignore=tests/test_notebooks.py \
  --ignore=tests/test_benchmark.py "$@" \
  || status=1
for stack in tnx nxdi; do
  echo "== neuron lane: $stack"
  bash ci/neuron_sim.sh "$stack" || status=1
done

wait "$notebooks" || status=1
echo "== every notebook on the reference backend, then the benchmark smoke runs (stream 1)"
cat "$LOGS/notebooks.log"
exit $status
