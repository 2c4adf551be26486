"""ci/busy_core.py: each setting timed in its own process, idle and then beside a busy loop pinned to one core; the
table's ratio is busy / idle of the same setting, and the busy loop does not outlive the run."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tiny_models import write_tiny

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and two usable cores")
def test_every_setting_idle_and_beside_a_busy_core(tmp_path):
    write_tiny(tmp_path, vocab_size=1024)  # the timed steps feed token ids below 1000
    # every kernel forced: no kernel timing in the children (the table is what is tested here, not the kernels)
    env = dict(os.environ, PYTHONPATH=str(ROOT), NEURON_NB_CACHE=str(tmp_path / "cache"), NEURON_NB_GEMV="mkl",
               NEURON_NB_GEMM="mkl", NEURON_NB_PREFILL="mkl")
    out = subprocess.run([sys.executable, str(ROOT / "ci" / "busy_core.py"), "--model-path", str(tmp_path),
                          "--threads", "2", "--repeats", "3"], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = re.findall(r"^  (.+?)\s+([\d.]+) \[[\d.]+-[\d.]+\]\s+([\d.]+) \[[\d.]+-[\d.]+\]\s+([\d.]+)x$",
                      out.stdout, re.M)
    assert [r[0] for r in rows] == ["2 threads, default wait policy", "2 threads, OMP_WAIT_POLICY=PASSIVE", "1 thread"]
    for _, idle, busy, ratio in rows:
        idle, busy = float(idle), float(busy)
        assert idle > 0.05 and busy > 0.05
        # each printed median is within 0.05 ms of its value, and the ratio within 0.005 of their quotient
        assert (busy - 0.05) / (idle + 0.05) - 0.005 <= float(ratio) <= (busy + 0.05) / (idle - 0.05) + 0.005
    loops = subprocess.run(["pgrep", "-f", "while True: pass"], capture_output=True, text=True).stdout.split()
    assert not loops, "the busy loop outlived the run"


def test_refuses_a_single_thread():
    out = subprocess.run([sys.executable, str(ROOT / "ci" / "busy_core.py"), "--threads", "1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "at least two usable cores" in out.stdout
