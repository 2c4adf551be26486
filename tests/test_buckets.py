"""Bucket lists and selection against hand-computed values from the pinned sources:
transformers-neuronx 0.13 ``bucket.py`` / ``utils.power_of_two_bucket_sizes``, NxD Inference 0.8
``modules/autobucketing.py`` / ``models/model_wrapper.py:_get_seq_bucket`` / ``models/config.py``."""
import pytest

from helpers import NeuronModel
from helpers.planning import buckets as bk


@pytest.mark.parametrize("n, expected", [
    (2048, [128, 256, 512, 1024, 2048]),
    (3000, [128, 256, 512, 1024, 2048, 3000]),
    (300, [128, 256, 300]),
    (129, [128, 129]),
    (128, [128]),
    (100, [100]),
    (1000, [128, 256, 512, 1000]),
    ([512, 128, 384], [128, 384, 512]),
])
def test_tnx_token_buckets(n, expected):
    assert bk.tnx_token_buckets(n) == expected


@pytest.mark.parametrize("cle, tokens, expected", [
    (None, [128, 256, 512, 1024, 2048], [64, 128, 256, 512, 1024]),
    (None, [128, 256, 300], [64, 128, 150]),
    (None, [100], [50]),
    (500, [128, 256, 512], [500]),
    (0, [128], []),
    (-3, [128], []),
    ([1536, 1024, 2048], [2048], [1024, 1536, 2048]),
])
def test_tnx_context_buckets(cle, tokens, expected):
    assert bk.tnx_context_buckets(cle, tokens) == expected


def test_tnx_context_buckets_rejects_other_types():
    with pytest.raises(NotImplementedError, match="Prompt bucket config"):
        bk.tnx_context_buckets("512", [128])


@pytest.mark.parametrize("size, expected", [(1, 128), (127, 128), (128, 128), (129, 256), (300, 300), (301, 300)])
def test_tnx_find(size, expected):
    assert bk.tnx_find([128, 256, 300], size) == expected


@pytest.mark.parametrize("lo, hi, expected", [
    (128, 2048, [128, 256, 512, 1024, 2048]),
    (128, 3000, [128, 256, 512, 1024, 2048, 3000]),
    (128, 2500, [128, 256, 512, 1024, 2500]),  # round(log2(2500)) = 11: no 2048 bucket
    (128, 4096, [128, 256, 512, 1024, 2048, 4096]),
    (128, 200, [128, 200]),
    (128, 180, [180]),  # round(log2(180)) = 7
    (128, 128, [128]),
    (128, 100, [100]),
    (256, 1000, [256, 512, 1000]),
])
def test_nxdi_generate_buckets(lo, hi, expected):
    assert bk.nxdi_generate_buckets(lo, hi) == expected


@pytest.mark.parametrize("n, expected", [(1, 128), (127, 128), (128, 256), (255, 256), (256, 256)])
def test_nxdi_first_fit_is_strict(n, expected):
    assert bk.nxdi_select([128, 256], n, "token_generation_model") == expected


def test_nxdi_overflow_message_and_truncation():
    with pytest.raises(bk.BucketOverflowError, match=r"^Input len 300 exceeds largest bucket \(256\) for "
                                                     r"context_encoding_model$"):
        bk.nxdi_select([128, 256], 300, bk.CONTEXT_ENCODING_MODEL_TAG)
    assert bk.nxdi_select([128, 256], 300, "x", allow_input_truncation=True) == 256


@pytest.mark.parametrize("cfg, seq_len, ctx, tkg", [
    (bk.NxDIBucketing(), 2048, [128, 256, 512, 1024, 2048], [128, 256, 512, 1024, 2048]),
    (bk.NxDIBucketing(max_context_length=1024), 2048, [128, 256, 512, 1024], [128, 256, 512, 1024, 2048]),
    (bk.NxDIBucketing(enable_bucketing=False, max_context_length=512), 3000, [512], [3000]),
    (bk.NxDIBucketing(context_encoding_buckets=[1024, 512], token_generation_buckets=[2048]), 2048,
     [512, 1024], [2048]),
    (bk.NxDIBucketing(), 3000, [128, 256, 512, 1024, 2048, 3000], [128, 256, 512, 1024, 2048, 3000]),
])
def test_nxdi_bucketing(cfg, seq_len, ctx, tkg):
    assert cfg.buckets(seq_len) == (ctx, tkg)


@pytest.mark.parametrize("cfg, match", [
    (bk.NxDIBucketing(context_encoding_buckets=[4096]), "Context bucket 4096 should be <= 2048"),
    (bk.NxDIBucketing(token_generation_buckets=[128, 4096]), "Token generation bucket 4096 should be <= 2048"),
    (bk.NxDIBucketing(max_context_length=4096), "max_context_length cannot be more than max_length"),
])
def test_nxdi_bucketing_refuses(cfg, match):
    with pytest.raises(ValueError, match=match):
        cfg.buckets(2048)


def test_engine_uses_the_library_rules():
    m = NeuronModel.from_pretrained(None, n_positions=1000)
    assert (m.token_buckets, m.context_buckets) == ([128, 256, 512, 1000], [64, 128, 256, 500])
    m = NeuronModel.from_pretrained(None, n_positions=[256, 128, 384], context_length_estimate=[200, 100])
    assert (m.token_buckets, m.context_buckets, m.n_positions) == ([128, 256, 384], [100, 200], 384)
    m = NeuronModel.from_pretrained(None, n_positions=1000, nxdi_bucketing=bk.NxDIBucketing())
    assert (m.token_buckets, m.context_buckets) == ([128, 256, 512, 1000], [128, 256, 512, 1000])


def test_engine_refuses_bad_bucket_settings():
    with pytest.raises(ValueError, match="Max context_length_estimate 512 cannot be more than max n_positions 256"):
        NeuronModel.from_pretrained(None, n_positions=256, context_length_estimate=512)
    with pytest.raises(ValueError, match="drop context_length_estimate"):
        NeuronModel.from_pretrained(None, n_positions=256, context_length_estimate=128,
                                    nxdi_bucketing=bk.NxDIBucketing())


# ------------------------------------------------------------------ context buckets that hold a prompt on NxDI
@pytest.mark.parametrize("cle, tokens, longest, expected", [
    (None, [128, 256, 512, 1024, 2048], 1300, [128, 256, 512, 1024, 2048]),  # tnx default stops at 1024
    (None, [128, 256, 384], 250, [128, 256, 384]),
    (None, [100], 50, [100]),
    ([64, 512, 2048], [128, 256, 512, 1024, 2048], 1300, [64, 512, 2048]),  # an explicit list that holds it
    ([64, 1300], [2048], 1300, [64, 1300]),  # equal to the largest: runs there
    (1500, [2048], 1300, [1500]),
])
def test_nxdi_context_buckets_hold_the_longest_prompt(cle, tokens, longest, expected):
    buckets = bk.nxdi_context_buckets(cle, tokens, longest)
    assert buckets == expected
    assert bk.nxdi_select(buckets, longest, "context_encoding_model") >= longest


@pytest.mark.parametrize("cle, longest", [([64, 128, 1024], 1300), (1024, 1300), ([64, 1300], 1301)])
def test_nxdi_context_buckets_refuse_a_list_too_short(cle, longest):
    with pytest.raises(ValueError, match=rf"Input len {longest} exceeds largest bucket.*>= {longest}.*None"):
        bk.nxdi_context_buckets(cle, [128, 256, 512, 1024, 2048], longest)


@pytest.mark.parametrize("cle, longest, match", [(0, 10, "no context bucket"), (None, 2048, "no room")])
def test_nxdi_context_buckets_refuse_impossible_settings(cle, longest, match):
    with pytest.raises(ValueError, match=match):
        bk.nxdi_context_buckets(cle, [128, 256, 512, 1024, 2048], longest)


# NxD Inference feature guide, "Bucketing with Prefix Caching", Examples
# (https://awsdocs-neuron.readthedocs-hosted.com/en/v2.28.1/libraries/nxd-inference/developer_guides/feature-guide.html):
# context_encoding_buckets=[512, 1024, 2048], prefix_buckets=[512, 1024].
@pytest.mark.parametrize("prompt,prefix,expected", [
    (1000, 0, (1024, 0)),     # no prefix: prefill 1024, prefix 0
    (800, 128, (1024, 0)),    # the whole prefix moves into the 1024 prefill bucket
    (900, 640, (512, 512)),   # 252 prefix tokens move into the 512 prefill bucket: 388 left -> 512
    (400, 100, (512, 0)),     # 257..512 tokens in total: NxDI's corner case (512, 0)
])
def test_nxdi_prefix_caching_selection_follows_the_guides_examples(prompt, prefix, expected):
    grid = bk.nxdi_prefix_caching_buckets([512, 1024, 2048], [512, 1024])
    assert bk.nxdi_prefix_caching_select(grid, prompt, prefix) == expected


def test_nxdi_prefix_caching_overflow_and_grid():
    grid = bk.nxdi_prefix_caching_buckets([512, 1024, 2048], [512, 1024])
    assert len(grid) == 3 * 3 and (2048, 0) in grid  # a prefix bucket 0 is added for requests with no cache hit
    # the guide's last example: 1600 tokens with a 1280 prefix leaves 1088 > 1024 -> an error in NxDI
    with pytest.raises(bk.BucketOverflowError, match="Prefix len 1088 exceeds largest bucket 1024"):
        bk.nxdi_prefix_caching_select(grid, 1600, 1280)
    with pytest.raises(bk.BucketOverflowError, match="Prefill len 3000 exceeds largest bucket"):
        bk.nxdi_prefix_caching_select(grid, 3100, 100)
    # NxDI's own grid (no lists): generate_buckets(512, max) in both dimensions, plus the prefix 0
    assert bk.nxdi_prefix_caching_buckets(max_context_length=2048) == [
        (v, h) for v in (512, 1024, 2048) for h in (0, 512, 1024, 2048)]
