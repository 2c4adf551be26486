"""The "stream" kernel (helpers.engine.cpu.stream_kernel): it computes F.linear for any row count, thread count, bias and
input shape; it is built once into the cache; where it cannot be built, it says why and the engine's kernel
choice leaves it out."""
import os
import platform
import shutil

import pytest
import torch
import torch.nn.functional as F

from helpers.engine.cpu import kernels as E
from helpers.engine.cpu import clib, stream_kernel

needs_stream = pytest.mark.skipif(clib.load() is None, reason=f"stream kernel unavailable: {clib.unavailable_reason()}")


@needs_stream
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9, 16, 33])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_stream_linear_is_f_linear(rows, threads):
    g = torch.Generator().manual_seed(rows * 10 + threads)
    w = torch.randn(80, 96, generator=g)  # 5 blocks of 16 output columns (not a multiple of the threads)
    b = torch.randn(80, generator=g)
    x = torch.randn(rows, 96, generator=g)
    wp = stream_kernel.stream_layout(E.column_major(w))
    assert wp.shape == (5, 96, 16) and wp.is_contiguous()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert torch.allclose(stream_kernel.stream_linear(x, wp), F.linear(x, w), atol=1e-4, rtol=1e-4)
        assert torch.allclose(stream_kernel.stream_linear(x, wp, b), F.linear(x, w, b), atol=1e-4, rtol=1e-4)
        x3 = x.reshape(1, rows, 96).transpose(0, 1)  # [rows, 1, 96], non-contiguous
        assert torch.allclose(stream_kernel.stream_linear(x3, wp), F.linear(x3, w), atol=1e-4, rtol=1e-4)
    finally:
        torch.set_num_threads(before)


@needs_stream
@pytest.mark.skipif(clib.load() is None or not stream_kernel.use_avx512(), reason="no AVX-512 here")
@pytest.mark.parametrize("rows", [1, 5, 6, 7, 8, 13, 16, 17, 40])
def test_the_avx512_path_gives_the_avx2_paths_bits(rows):
    """Up to 16 rows per pass with AVX-512, 6 with AVX2: the same FMAs in the same order, so the same bits (a saved
    model's outputs do not depend on which path a machine takes)."""
    g = torch.Generator().manual_seed(rows)
    w, x = torch.randn(96, 200, generator=g), torch.randn(rows, 200, generator=g)
    wp = stream_kernel.stream_layout(w)
    try:
        assert stream_kernel.use_avx512(False) is False
        narrow = stream_kernel.stream_linear(x, wp)
        assert stream_kernel.use_avx512(True) is True
        wide = stream_kernel.stream_linear(x, wp)
    finally:
        stream_kernel.use_avx512(True)
    assert torch.equal(narrow, wide)
    assert torch.allclose(wide, F.linear(x, w), atol=1e-4, rtol=1e-4)


@needs_stream
def test_stream_layout_needs_whole_blocks_and_refuses_a_mismatch():
    assert stream_kernel.stream_layout(torch.randn(50, 32)) is None
    wp = stream_kernel.stream_layout(torch.randn(32, 24))
    with pytest.raises(ValueError, match="stream_linear: x"):
        stream_kernel.stream_linear(torch.randn(2, 32), wp)
    with pytest.raises(ValueError, match="stream_linear: x"):
        stream_kernel.stream_linear(torch.randn(2, 24, dtype=torch.float64), wp)


@needs_stream
def test_built_once_into_the_cache(tmp_path, monkeypatch):
    """The library lives in the one cache home, helpers.model_store.cache_dir() ($NEURON_NB_CACHE), under kernels/."""
    monkeypatch.setenv("NEURON_NB_CACHE", str(tmp_path))
    monkeypatch.setattr(clib, "_state", {})
    assert clib.load() is not None and clib.unavailable_reason() is None
    (built,) = (tmp_path / "kernels").glob("cpu_kernels-*.so")
    stamp = built.stat().st_mtime_ns
    monkeypatch.setattr(clib, "_state", {})
    assert clib.load() is not None and built.stat().st_mtime_ns == stamp  # reused, not rebuilt


def test_without_a_compiler_it_says_why_and_is_left_out(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_NB_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-cc")
    monkeypatch.setattr(clib, "_state", {})
    for env in E.MATMUL_ENV.values():
        monkeypatch.delenv(env, raising=False)
    assert clib.load() is None and "no-such-cc" in clib.unavailable_reason()
    assert not E.kernel_available("stream") and "stream" not in E.default_kernels().values()
    w = E.CpuWeight.build(torch.randn(32, 16), {}, E.COPIES)
    assert not any("stream" in E.candidates(case, [w], 2) for case in E.MATMUL_KERNELS)
    assert "stream" not in w.copies and E.weight_copy(w.dense, "stream") is None
    monkeypatch.setenv("NEURON_NB_GEMM", "stream")
    with pytest.raises(ValueError, match="NEURON_NB_GEMM='stream': that kernel is unavailable here .*no-such-cc"):
        E.forced_kernel("rows")


def test_a_library_that_does_not_load_is_reported_not_raised(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_NB_CACHE", str(tmp_path))
    monkeypatch.setattr(clib, "_state", {})
    bad = clib.library_path(os.environ.get("CC") or "cc")  # e.g. a cache shared with another machine
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"not a shared library")
    if shutil.which(os.environ.get("CC") or "cc") is None or platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("no compiler or not x86-64: the library is never loaded here")
    assert clib.load() is None and "could not load" in clib.unavailable_reason()
