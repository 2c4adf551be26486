#!/usr/bin/env python
"""What one busy core costs the engine's decode step, by thread count and OpenMP wait policy.

Every parallel matmul waits for all its threads. When another process keeps one of the cores busy, the thread on
that core runs only in its scheduler slices, and with OpenMP's default wait policy the other threads spin while
they wait. Each setting below runs in its own process (the OpenMP runtime reads its wait policy once, as torch
loads it): the model is built at batch 1, then its one-row decode step is timed
(``helpers.notebook.timing.step_seconds``), first with the cores idle, then with a busy loop pinned to the last
core this process may use. It prints ms per step and the busy / idle ratio of each setting; the settings' idle
steps, timed in the same run, say what each costs on an idle machine.

    python ci/busy_core.py                      # the embedded SmolLM2-135M-Instruct, f32, every usable core
    python ci/busy_core.py --model-path DIR --threads 2 --repeats 15

Linux only (it pins the busy loop with ``os.sched_setaffinity``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUSY_LOOP = "while True: pass"


def settings(threads: int) -> dict[str, tuple[int, dict]]:
    """label -> (torch threads, extra environment)."""
    return {f"{threads} threads, default wait policy": (threads, {}),
            f"{threads} threads, OMP_WAIT_POLICY=PASSIVE": (threads, {"OMP_WAIT_POLICY": "PASSIVE"}),
            "1 thread": (1, {})}


def child(a) -> int:
    import torch
    sys.path.insert(0, str(ROOT))
    import helpers
    from helpers.notebook.timing import step_seconds

    torch.set_num_threads(a.threads)
    m = helpers.NeuronModel.from_pretrained(a.model_path, batch_size=1, n_positions=256, amp="f32")
    m.to_neuron()
    s = step_seconds({"decode": (m, 1)}, position=128, repeats=a.repeats)["decode"]
    print(json.dumps({k: v * 1e3 if k != "n" else v for k, v in s.items()}))
    return 0


def run_child(a, threads: int, env: dict) -> dict:
    cmd = [sys.executable, __file__, "--child", "--threads", str(threads), "--repeats", str(a.repeats)]
    if a.model_path:
        cmd += ["--model-path", a.model_path]
    full_env = dict(os.environ, OMP_NUM_THREADS=str(threads), **env)
    out = subprocess.run(cmd, env=full_env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"the {threads}-thread child ({env or 'default environment'}) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-path", default=None)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        return child(a)
    cpus = sorted(os.sched_getaffinity(0))
    if a.threads < 2 or len(cpus) < 2:
        print("needs at least two usable cores and --threads >= 2")
        return 2
    cases = settings(a.threads)
    idle = {label: run_child(a, t, env) for label, (t, env) in cases.items()}  # idle first: a kernel choice not yet
    busy_loop = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])              # made is timed on idle cores
    try:
        os.sched_setaffinity(busy_loop.pid, {cpus[-1]})
        time.sleep(1.0)
        busy = {label: run_child(a, t, env) for label, (t, env) in cases.items()}
    finally:
        busy_loop.kill()
    print(f"decode step, f32, batch 1, ms (median [min-max] of {a.repeats}); busy: a loop pinned to CPU {cpus[-1]} "
          f"of {cpus}")
    print(f"  {'setting':42s}{'idle':>22s}{'one core busy':>22s}{'busy / idle':>13s}")
    fmt = lambda s: f"{s['median']:.1f} [{s['min']:.1f}-{s['max']:.1f}]"  # noqa: E731
    for label in cases:
        print(f"  {label:42s}{fmt(idle[label]):>22s}{fmt(busy[label]):>22s}"
              f"{busy[label]['median'] / idle[label]['median']:12.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
