"""The C ops between a step's matmuls (helpers.engine.cpu.fused_ops): each agrees with torch's ops within f32 rounding,
its bits depend neither on the thread count nor on the other rows of a batch, and a model runs them only where its
build chose them ($NEURON_NB_OPS, recorded with a saved model: tests/test_kernel_choice.py)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import helpers
from helpers.engine.cpu import clib
from helpers.engine.cpu import fused_ops as O
from helpers.engine.model import TorchOps, apply_rope
from tiny_models import write_tiny

needs_c = pytest.mark.skipif(clib.load() is None, reason=f"C library unavailable: {clib.unavailable_reason()}")
TOL = dict(atol=1e-5, rtol=1e-5)


@needs_c
@pytest.mark.parametrize("rows,n", [(1, 64), (3, 576), (20, 256)])
def test_rms_norm_and_swiglu_agree_with_torch(rows, n):
    torch.manual_seed(rows)
    x, w = torch.randn(rows, 1, n) * 3, torch.randn(n)
    assert torch.allclose(O.rms_norm(x, w, 1e-5), TorchOps().rms_norm(x, w, 1e-5), **TOL)
    gu = torch.randn(rows, 2 * n) * 4  # silu over a range where exp under- and overflows matter
    g, u = gu.chunk(2, dim=-1)
    assert torch.allclose(O.swiglu(gu), F.silu(g) * u, **TOL)


@needs_c
def test_rope_in_place_agrees_with_apply_rope():
    B, T, H, G, D = 2, 3, 6, 2, 32
    cos, sin = torch.randn(B, T, 1, D), torch.randn(B, T, 1, D)
    for adjacent in (True, False):  # slices of one QKV output (one call), or two tensors (one call each)
        qkv = torch.randn(B, T, (H + 2 * G) * D)
        q, k = qkv[..., :H * D], qkv[..., H * D:(H + G) * D]
        if not adjacent:
            q, k = q.clone(), k.clone()
        ref_q = apply_rope(q.reshape(B, T, H, D), cos, sin).reshape(B, T, -1)
        ref_k = apply_rope(k.reshape(B, T, G, D), cos, sin).reshape(B, T, -1)
        assert O.rope_qk_(q, k, cos, sin, D)
        assert torch.allclose(q, ref_q, **TOL) and torch.allclose(k, ref_k, **TOL)
    q = torch.randn(T, B, H * D).transpose(0, 1)  # rows not evenly strided: left to torch, untouched
    before = q.clone()
    assert not O.rope_qk_(q, q, cos, sin, D) and torch.equal(q, before)
    assert O.unfit_dims(64, 16, 128) is None and "head_dim 24" in O.unfit_dims(64, 24, 128)
    assert "multiples of 8" in O.unfit_dims(60, 16, 128)


def _sdpa(q, k, v, mask, head_kv, D):
    B, T, _ = q.shape
    qh = q.view(B, T, -1, D).transpose(1, 2)
    o = F.scaled_dot_product_attention(qh, k[:, head_kv.long()], v[:, head_kv.long()], attn_mask=mask)
    return o.transpose(1, 2).reshape(B, T, -1)


@needs_c
@pytest.mark.parametrize("head_kv", [[0, 0, 0, 1, 1, 1], [0, 1, 2, 2, 1, 0]])  # GQA, and an arbitrary mapping
def test_attention_agrees_with_sdpa_over_a_strided_cache(head_kv):
    torch.manual_seed(0)
    B, T, D, S, P = 3, 4, 16, 37, 64
    head_kv = torch.tensor(head_kv, dtype=torch.int32)
    G = int(head_kv.max()) + 1
    q = torch.randn(B, T, len(head_kv) * D)
    cache_k, cache_v = torch.randn(B, G, P, D), torch.randn(B, G, P, D)
    k, v = cache_k[:, :, :S], cache_v[:, :, :S]  # views over the first S of P positions, as the KV cache returns
    mask = torch.rand(B, 1, T, S) > 0.4
    mask[1, 0, 2] = False  # a query that sees nothing: zeros, as torch gives
    assert O.attention_fits(q, k, v, mask) and not O.attention_fits(q, k, v, mask.float())
    assert not O.attention_fits(torch.randn(1, O.ATTN_MAX_QUERIES + 1, 16), k, v, mask)  # prefill: torch's
    assert not O.attention_fits(q, k.transpose(2, 3), v, mask)  # a head dim not contiguous: torch's
    out = O.attention(q, k, v, mask, head_kv, D)
    assert torch.allclose(out, _sdpa(q, k, v, mask, head_kv, D), **TOL)
    assert torch.equal(out[1, 2], torch.zeros(len(head_kv) * D))


@needs_c
def test_bits_depend_on_neither_threads_nor_the_other_rows():
    torch.manual_seed(1)
    B, T, D, S = 4, 1, 64, 300
    head_kv = torch.arange(9, dtype=torch.int32) // 3
    q, k, v = torch.randn(B, T, 9 * D), torch.randn(B, 3, S, D), torch.randn(B, 3, S, D)
    mask = torch.ones(B, 1, T, S, dtype=torch.bool)
    x, gu = torch.randn(B, T, 576), torch.randn(B, T, 3072)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append((O.attention(q, k, v, mask, head_kv, D), O.rms_norm(x, x[0, 0], 1e-5), O.swiglu(gu)))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(*results))
    alone = O.attention(q[2:3], k[2:3], v[2:3], mask[2:3], head_kv, D)
    assert torch.equal(alone[0], results[0][0][2])
    assert torch.equal(O.swiglu(gu[2:3]), results[0][2][2:3]) and torch.equal(O.rms_norm(x[2:3], x[0, 0], 1e-5),
                                                                              results[0][1][2:3])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    write_tiny(d)
    return str(d)


def _run(tiny, monkeypatch, ops):
    monkeypatch.setenv(O.ENV, ops)
    m = helpers.NeuronModel.from_pretrained(tiny, batch_size=2, n_positions=64).to_neuron()
    out = m.sample(torch.tensor([[1, 9, 17, 33], [1, 5, 7, 11]]), 16, top_k=1, eos_token_override=[],
                   output_logits=True)
    return m, out, m.stats["logits"]


@needs_c
def test_a_model_with_the_fused_ops_matches_torch_s_and_reproduces_itself(tiny, monkeypatch):
    mt, out_t, logits_t = _run(tiny, monkeypatch, "torch")
    mf, out_f, logits_f = _run(tiny, monkeypatch, "fused")
    assert mt.model.ops.record["ops"] == "torch" and mf.model.ops.record["ops"] == "fused"
    assert torch.equal(out_f, out_t) and torch.allclose(logits_f, logits_t, atol=1e-4, rtol=0)
    _, out_again, logits_again = _run(tiny, monkeypatch, "fused")  # another build: the same bits
    assert torch.equal(out_again, out_f) and torch.equal(logits_again, logits_f)


def test_the_choice_is_refused_by_name_when_wrong_or_unavailable(tmp_path, monkeypatch):
    monkeypatch.setenv(O.ENV, "fast")
    with pytest.raises(ValueError, match=r"NEURON_NB_OPS='fast': use one of \('fused', 'torch'\)"):
        O.planned()
    monkeypatch.setenv(O.ENV, "torch")
    assert O.planned() == "torch"
    monkeypatch.delenv(O.ENV)
    monkeypatch.setenv("NEURON_NB_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-cc")
    monkeypatch.setattr(clib, "_state", {})
    assert O.planned() == "torch"
    monkeypatch.setenv(O.ENV, "fused")
    with pytest.raises(ValueError, match=r"NEURON_NB_OPS='fused': the C library is unavailable here .*no-such-cc"):
        O.planned()


def test_forcing_the_fused_ops_on_a_model_they_cannot_run_is_refused(tmp_path, monkeypatch):
    write_tiny(tmp_path, hidden_size=48)  # 4 heads of 12
    monkeypatch.setenv(O.ENV, "fused")
    if not O.available():
        pytest.skip("C library unavailable")
    with pytest.raises(ValueError, match=r"NEURON_NB_OPS=fused: this model cannot run the C ops \(head_dim 12"):
        helpers.NeuronModel.from_pretrained(str(tmp_path), n_positions=32).to_neuron()
    monkeypatch.delenv(O.ENV)
    m = helpers.NeuronModel.from_pretrained(str(tmp_path), n_positions=32).to_neuron()  # unforced: torch's ops
    assert m.model.ops.record["ops"] == "torch"
