"""helpers.engine.cpu.hugepages: one 2 MB-aligned allocation for a model's matrices, advised for huge pages where Linux
offers them, that changes where the bytes live and nothing else."""
import pytest
import torch

from helpers.engine.cpu import hugepages, kernel_choice
from helpers.engine.cpu import kernels as K
from helpers.engine.cpu.hugepages import ALIGN, HUGE_PAGE, Arena


def test_views_are_aligned_in_order_and_refused_beyond_the_size():
    shapes = [(3, 5), (7,), (2, 2, 2)]
    arena = Arena(sum(Arena.size_of(s) for s in shapes))
    ts = [arena.empty(s) for s in shapes]
    assert [tuple(t.shape) for t in ts] == shapes and all(t.is_contiguous() for t in ts)
    assert all(t.data_ptr() % ALIGN == 0 for t in ts)
    assert [t.data_ptr() - ts[0].data_ptr() for t in ts] == [0, 64, 128]  # 60 and 28 bytes, each rounded up to 64
    for i, t in enumerate(ts):
        t.fill_(i)
    assert [t.sum().item() for t in ts] == [0, 7, 16]  # no overlap
    with pytest.raises(ValueError, match="is full"):
        arena.empty((1,))


def test_advised_where_linux_offers_huge_pages(monkeypatch):
    arena = Arena(3 * HUGE_PAGE)
    if hugepages.thp_mode() in ("madvise", "always"):
        assert arena.advised and arena.buffer.data_ptr() % HUGE_PAGE == 0 and "huge pages" in arena.describe()
    else:
        assert not arena.advised and "4 KB pages" in arena.describe()
    monkeypatch.setattr(hugepages, "thp_mode", lambda: "never")
    small = Arena(3 * HUGE_PAGE)
    assert not small.advised and "transparent huge pages: never" in small.describe()


def test_a_weight_built_in_the_arena_is_the_same_weight():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 40, generator=g)
    kernels = {"one_row": "stream", "rows": "stream", "prefill": "stream"} if K.kernel_available("stream") else \
        K.default_kernels()
    arena = Arena(K.CpuWeight.arena_bytes(w, kernels))
    inside, outside = K.CpuWeight.build(w, kernels, arena=arena), K.CpuWeight.build(w, kernels)
    assert inside.dense.stride() == outside.dense.stride() == (1, 96) and torch.equal(inside.dense, w)
    assert inside.copies.keys() == outside.copies.keys()
    for kind, c in inside.copies.items():
        assert torch.equal(c, outside.copies[kind]) and c.untyped_storage().data_ptr() == arena.buffer.data_ptr()
    for rows in (1, 4, 64):
        x = torch.randn(rows, 40, generator=g)
        assert torch.equal(inside.linear(x), outside.linear(x))


def test_a_built_model_keeps_its_matrices_in_one_arena(tmp_path):
    import helpers
    from tiny_models import write_tiny
    write_tiny(tmp_path)
    m = helpers.NeuronModel.from_pretrained(str(tmp_path), n_positions=64).to_neuron()
    tr = m.require_built()
    storages = {t.dense.untyped_storage().data_ptr() for t in tr.w.matrices()}
    assert len(storages) == 1
    assert kernel_choice.machine_key()["pages"] == hugepages.thp_mode()
