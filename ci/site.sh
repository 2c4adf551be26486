#!/usr/bin/env bash
# Build the book: a static site of the executed notebooks in out/site (or $OUT_DIR/site), with every Neuron recipe
# and its verification stamp (ci/build_site.py; Sphinx + MyST-NB + sphinx-book-theme, pinned in requirements-site.txt).
#
#   bash ci/site.sh            # set up .venv-site, run the notebooks first when out/ has no executed copies, build
#   bash ci/site.sh --setup    # only build .venv-site
#   bash ci/site.sh --no-run   # never run the notebooks (CI: they ran in ci/test.sh); fail when there are none
#   bash ci/site.sh --run out-alt/notebooks/cpu-alt --out out/site-alt   # other arguments go to ci/build_site.py
#
# It reads the runs' own records: out/notebooks/cpu (ci/test.sh) or out/ (ci/notebooks.sh) for the executed
# notebooks, report.json and metrics; out/neuron-sim-<stack>/cells/results.json for the lanes' standalone runs of the
# recipes; out/inf2-<stack> for an inf2 run (the inf2 workflow's artifact, where one was downloaded). It checks every
# internal link and anchor of the result offline (ci/site_check.py) and exits non-zero on a broken one.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv-site
OUT=${OUT_DIR:-out}
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
# installed once per version of requirements-site.txt (a copy in the venv records which)
if ! cmp -s requirements-site.txt "$VENV/requirements-site.txt"; then
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -r requirements-site.txt
  cp requirements-site.txt "$VENV/requirements-site.txt"
fi
if [ "${1:-}" = "--setup" ]; then
  "$VENV/bin/python" -m sphinx --version
  exit 0
fi
RUN_NOTEBOOKS=1
if [ "${1:-}" = "--no-run" ]; then RUN_NOTEBOOKS=0; shift; fi
has_run() { compgen -G "$OUT/notebooks/cpu/executed/[0-9][0-9]_*.ipynb" > /dev/null \
  || compgen -G "$OUT/executed/[0-9][0-9]_*.ipynb" > /dev/null; }
if ! has_run && [[ " $* " != *" --run "* ]]; then
  if [ "$RUN_NOTEBOOKS" = 0 ]; then
    echo "no executed notebooks in $OUT/notebooks/cpu or $OUT (run bash ci/test.sh or bash ci/notebooks.sh)" >&2
    exit 2
  fi
  echo "no executed notebooks in $OUT: running them first (bash ci/notebooks.sh)"
  bash ci/notebooks.sh
fi
exec "$VENV/bin/python" ci/build_site.py "$@"
