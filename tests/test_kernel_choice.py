"""The CPU matmul kernels are chosen once per machine kind and kept (helpers.engine.cpu.kernel_choice): builds in one
process and in later processes run the same kernels and give bitwise the same f32 logits; a saved model records
its kernels and loads with them, or refuses naming the one that cannot run here."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import helpers
from helpers.engine.cpu import fused_ops
from helpers.engine.cpu import kernel_choice as KC
from helpers.engine.cpu import kernels as K
from helpers.engine.config import NeuronConfig
from tiny_models import write_tiny

ROOT = Path(__file__).resolve().parent.parent
A = {"one_row": "mkl", "rows": "onednn", "prefill": "mkl"}
B = {"one_row": "packed", "rows": "mkl", "prefill": "onednn"}


def _timed(choice):
    return lambda repeats=3: {case: {"kernel": k, "ms": {k: 1.0}} for case, k in choice.items()}


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty cache home, nothing chosen in this process yet, no kernel forced."""
    monkeypatch.setenv("NEURON_NB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(KC, "_chosen", {})
    for env in K.MATMUL_ENV.values():
        monkeypatch.delenv(env, raising=False)
    if not all(K.kernel_available(k) for k in {*A.values(), *B.values()}):
        pytest.skip("needs oneDNN")
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    write_tiny(d)
    return str(d)


def test_timed_once_per_machine_then_read_back(fresh_cache, monkeypatch):
    """The first build times and writes the choice under the one cache home; a later process (memory cleared)
    reads it and never times again, even where timing would now pick otherwise; another thread count is another
    machine kind; a file that names an unknown kernel is timed again."""
    monkeypatch.setattr(KC, "time_here", _timed(A))
    rec = KC.machine_choice()
    assert rec["kernels"] == A and rec["source"] == "timed here"
    path = Path(rec["path"])
    assert path.parent == fresh_cache / "kernels" and json.loads(path.read_text())["kernels"] == A
    monkeypatch.setattr(KC, "_chosen", {})
    monkeypatch.setattr(KC, "time_here", lambda repeats=3: pytest.fail("timed again on the same machine"))
    rec = KC.machine_choice()
    assert rec["kernels"] == A and rec["source"] == "cache file" and KC.planned_kernels() == A
    monkeypatch.setenv("NEURON_NB_GEMV", "split-k")  # forcing still wins over the kept choice
    assert KC.planned_kernels()["one_row"] == "split-k" and KC.planned_kernels()["rows"] == A["rows"]
    monkeypatch.delenv("NEURON_NB_GEMV")
    monkeypatch.setattr(KC, "time_here", _timed(B))
    other = KC.machine_choice(threads=torch.get_num_threads() + 1)
    assert other["kernels"] == B and other["path"] != rec["path"]
    saved = json.loads(path.read_text())
    path.write_text(json.dumps(dict(saved, kernels=dict(A, rows="fast"))))
    monkeypatch.setattr(KC, "_chosen", {})
    assert KC.machine_choice()["kernels"] == B and json.loads(path.read_text())["kernels"] == B


def test_a_timing_beside_other_work_is_repeated_and_kept_with_its_best_times(fresh_cache, monkeypatch):
    """Other processes holding the cores make every kernel look slower, and the choice is kept for good: the timing is
    repeated (up to ATTEMPTS) while they do, each kernel keeps its best time, the record says how busy the cores were,
    and a choice still made beside other work warns, naming the file to delete."""
    rounds = iter([({"one_row": {"kernel": "mkl", "ms": {"mkl": 9.0, "stream": 30.0}}}, 1.0),   # a busy core
                   ({"one_row": {"kernel": "stream", "ms": {"mkl": 12.0, "stream": 6.0}}}, 0.0)])  # then idle
    monkeypatch.setattr(KC, "usable_cpus", lambda: [0, 1])
    monkeypatch.setattr(KC, "others_cores", lambda fn: next(rounds))
    best, loads = KC.time_when_free(threads=2)
    assert best == {"one_row": {"kernel": "stream", "ms": {"mkl": 9.0, "stream": 6.0}}} and loads == [1.0, 0.0]
    monkeypatch.setattr(KC, "others_cores", lambda fn: pytest.fail("timed again with the cores free"))
    assert KC.time_when_free.__defaults__ is None  # (threads is required: the count the model runs with)
    monkeypatch.setattr(KC, "others_cores", lambda fn: (fn(), 0.2))
    monkeypatch.setattr(KC, "time_here", _timed(A))
    assert KC.time_when_free(threads=1)[1] == [0.2]  # one thread, one core free: timed once
    calls = []
    monkeypatch.setattr(KC, "others_cores", lambda fn: (calls.append(1) or fn(), 1.5))
    with pytest.warns(UserWarning, match=r"timed 3 times while other processes kept 1\.5 .* delete that file"):
        rec = KC.machine_choice(threads=2)
    assert len(calls) == KC.ATTEMPTS and rec["kernels"] == A and rec["others_cores"] == [1.5] * 3
    assert json.loads(Path(rec["path"]).read_text())["others_cores"] == [1.5] * 3


def test_other_processes_load_counts_this_process_cpus_without_its_own_time(tmp_path, monkeypatch):
    """others_cores: the busy ticks of this process's CPUs (idle and iowait excluded) minus its own CPU time, per
    second of wall time."""
    stat = tmp_path / "stat"
    ticks = os.sysconf("SC_CLK_TCK")

    def write(busy0, busy1, busy2):  # user nice system idle iowait irq softirq steal, per CPU
        stat.write_text(f"cpu  0 0 0 0 0 0 0 0\ncpu0 {busy0} 0 0 500 7 0 0 0\ncpu1 {busy1} 0 0 500 0 0 0 0\n"
                        f"cpu2 {busy2} 0 0 0 0 0 0 0\n")

    monkeypatch.setattr(KC, "PROC_STAT", stat)
    monkeypatch.setattr(KC, "usable_cpus", lambda: [0, 1])  # cpu2 is not this process's
    write(100, 100, 0)
    assert KC._busy_seconds([0, 1]) == 200 / ticks

    def other_work():  # while fn runs, other processes add one core-second on cpu1 (and some on cpu2) in ~1 s
        write(100, 100 + ticks, 5 * ticks)
        time.sleep(1.0)

    _, others = KC.others_cores(other_work)
    assert 0.8 < others <= 1.0  # wall a bit over 1 s; the test's own CPU time is nearly nothing
    monkeypatch.setattr(KC, "PROC_STAT", tmp_path / "missing")
    assert KC.others_cores(lambda: 7) == (7, None)


def test_an_unwritable_cache_keeps_the_timing_for_this_process(fresh_cache, monkeypatch):
    def refuse(path, rec):
        raise PermissionError(f"read-only: {path}")

    monkeypatch.setattr(KC, "_write_once", refuse)
    monkeypatch.setattr(KC, "time_here", _timed(B))
    rec = KC.machine_choice()
    assert rec["kernels"] == B and "not cached" in rec["source"] and not Path(rec["path"]).exists()
    monkeypatch.setattr(KC, "time_here", lambda repeats=3: pytest.fail("timed twice in one process"))
    assert KC.machine_choice() is rec


def test_the_first_writer_wins(fresh_cache):
    """Two processes timing at once (the ranks of a tensor-parallel model) keep the first file written."""
    path = fresh_cache / "kernels" / "matmul-x.json"
    KC._write_once(path, {"kernels": A})
    KC._write_once(path, {"kernels": B})
    assert json.loads(path.read_text()) == {"kernels": A}
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind


LOGITS = """
import sys, torch, helpers
from helpers.engine.cpu import fused_ops
from helpers.engine.cpu import kernel_choice as KC
KC.time_here = lambda repeats=3: {c: {"kernel": k, "ms": {k: 1.0}} for c, k in %r.items()}
m = helpers.NeuronModel.from_pretrained(sys.argv[1], n_positions=64).to_neuron()
torch.save((m.model.ops.kernels, m.forward(torch.tensor([[1, 9, 17, 33, 40]]))), sys.argv[2])
"""


def test_builds_give_bitwise_equal_logits_in_one_process_and_across_processes(fresh_cache, tiny, tmp_path):
    """f32 on CPU: two builds of the same settings in this process give the same logits bit for bit, and so do
    two later processes, the second of which would time another winner: it reads the first one's choice."""
    ids = torch.tensor([[1, 9, 17, 33, 40]])
    m1 = helpers.NeuronModel.from_pretrained(tiny, n_positions=64).to_neuron()
    m2 = helpers.NeuronModel.from_pretrained(tiny, n_positions=64).to_neuron()
    assert m1.model.ops.kernels == m2.model.ops.kernels == KC.planned_kernels()
    assert torch.equal(m1.forward(ids), m2.forward(ids))
    env = dict(os.environ, NEURON_NB_CACHE=str(tmp_path / "other-cache"), PYTHONPATH=str(ROOT))
    runs = []
    for i, choice in enumerate((A, B)):
        out = tmp_path / f"run{i}.pt"
        subprocess.run([sys.executable, "-c", LOGITS % (choice,), tiny, str(out)], env=env, check=True, cwd=ROOT)
        runs.append(torch.load(out))
    assert runs[0][0] == runs[1][0] == A  # the second process timed B but reads A, written first
    assert torch.equal(runs[0][1], runs[1][1])


@pytest.fixture
def saved(fresh_cache, tiny, tmp_path, monkeypatch):
    """A tiny model with exported graphs, built with kernels A and saved."""
    monkeypatch.setattr(KC, "time_here", _timed(A))
    m = helpers.NeuronModel.from_pretrained(tiny, n_positions=64, neuron_config=NeuronConfig(compiled="export"))
    m.to_neuron()
    d = tmp_path / "saved"
    m.save(d)
    return d, m


def _sample(m):
    out = m.sample(torch.tensor([[1, 9, 17, 33]]), 12, top_k=1, eos_token_override=[], output_logits=True)
    return out, m.stats["logits"]


def test_a_saved_model_loads_with_its_kernels(saved, tiny, monkeypatch):
    """The manifest records the kernels the model ran; a machine whose own choice differs loads it with the
    recorded ones, and reproduces its tokens and logits bit for bit."""
    d, m = saved
    assert m.model.ops.record == dict(A, ops=fused_ops.planned())
    assert json.loads((d / "graphs-rank0.json").read_text())["matmul_kernels"] == dict(A, ops=fused_ops.planned())
    monkeypatch.setattr(KC, "_chosen", {k: dict(v, kernels=B) for k, v in KC._chosen.items()})  # "another machine"
    assert KC.planned_kernels() == B
    loaded = helpers.NeuronModel.from_pretrained(tiny, n_positions=64).load(d).to_neuron()
    assert loaded.model.ops.kernels == A and all(w.kernels == A for w in loaded.model.w.matrices())
    (o1, l1), (o2, l2) = _sample(m), _sample(loaded)
    assert torch.equal(o1, o2) and torch.equal(l1, l2)


def test_a_saved_model_refuses_a_kernel_it_cannot_run(saved, tiny, monkeypatch):
    """A recorded kernel unavailable here, or overridden by an environment variable, is refused at load(), by name."""
    d, _ = saved
    available = K.kernel_available
    monkeypatch.setattr(K, "kernel_available", lambda k: k != "onednn" and available(k))
    with pytest.raises(KC.KernelMismatchError, match=r"rows: 'onednn' is unavailable here"):
        helpers.NeuronModel.from_pretrained(tiny, n_positions=64).load(d)
    monkeypatch.setattr(K, "kernel_available", available)
    monkeypatch.setenv("NEURON_NB_GEMV", "packed")
    with pytest.raises(KC.KernelMismatchError, match=r"one_row: 'mkl', but \$NEURON_NB_GEMV .* forces 'packed'"):
        helpers.NeuronModel.from_pretrained(tiny, n_positions=64).load(d)
    monkeypatch.delenv("NEURON_NB_GEMV")
    ran = fused_ops.planned()
    other = "torch" if ran == "fused" else "fused"
    if other == "torch" or fused_ops.available():
        monkeypatch.setenv("NEURON_NB_OPS", other)
        with pytest.raises(KC.KernelMismatchError, match=rf"ops: '{ran}', but \$NEURON_NB_OPS forces"):
            helpers.NeuronModel.from_pretrained(tiny, n_positions=64).load(d)


def test_the_ops_a_record_names_and_an_older_record_without_them():
    """The ops between the matmuls are part of the record: a record from before them ran torch's ops."""
    assert KC.check_recorded(dict(A)) == dict(A, ops="torch")
    assert KC.check_recorded(dict(A, ops="torch")) == dict(A, ops="torch")
    with pytest.raises(KC.KernelMismatchError, match=r"ops: 'cuda' is none of"):
        KC.check_recorded(dict(A, ops="cuda"))


def test_the_key_follows_the_matmul_kernel_source_only():
    """The "stream" kernel's C source is part of the key (a new kernel is timed again); the C ops between the matmuls
    (helpers.engine.cpu.fused_ops) are not, so changing them does not time the matmul kernels again."""
    import hashlib

    from helpers.engine.cpu import clib
    stream_c = next(s for s in clib.SOURCES if s.name == "stream_linear.c")
    assert KC.machine_key()["stream_source"] == hashlib.sha256(stream_c.read_bytes()).hexdigest()[:16]
    assert clib.source_digest("stream_linear.c") != clib.source_digest()
