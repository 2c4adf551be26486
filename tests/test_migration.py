"""helpers.neuron.migration: the transformers-neuronx -> NxD Inference mapping is generated from neuron_settings
(one home), says what the pinned releases take, and the reference oracle runs the NxDI keywords it produces."""
from __future__ import annotations

import pytest
import torch

from helpers.neuron import migration, settings
from helpers.neuron.settings import NXDI_NEURON_CONFIG_KEYS, neuron_settings
from helpers.planning.gqa import GQA


def _row(rows, prefix):
    found = [r for r in rows if r.setting.startswith(prefix)]
    assert len(found) == 1, (prefix, [r.setting for r in rows])
    return found[0]


@pytest.fixture(scope="module")
def rows():
    return migration.mapping_rows()


def test_changing_the_settings_function_changes_the_table(monkeypatch, rows):
    """The table is derived: a changed mapping in settings.neuron_settings shows up in it, nowhere else to edit."""
    original = settings.neuron_settings

    def renamed(stack, **kw):
        ns = original(stack, **kw)
        if stack == "nxdi" and "torch_dtype" in ns.neuron_config:
            ns.neuron_config["overrides_torch_dtype"] = ns.neuron_config.pop("torch_dtype")
        return ns

    monkeypatch.setattr(settings, "neuron_settings", renamed)
    changed = migration.mapping_rows()
    assert _row(rows, "amp='bf16'").nxdi == "torch_dtype='bfloat16'"
    assert _row(changed, "amp='bf16'").nxdi == "overrides_torch_dtype='bfloat16'"
    assert migration.markdown_table(changed) != migration.markdown_table(rows)


def test_a_refusal_becomes_a_none_row(monkeypatch):
    original = settings.neuron_settings

    def refuse_tp(stack, **kw):
        if stack == "nxdi" and kw.get("tp_degree", 1) > 1:
            raise ValueError("no tensor parallelism here")
        return original(stack, **kw)

    monkeypatch.setattr(settings, "neuron_settings", refuse_tp)
    row = _row(migration.mapping_rows(), "tp_degree=2")
    assert row.nxdi == "none: no tensor parallelism here" and row.tnx == "tp_degree=2"


def test_one_row_per_knob_and_every_gqa_value(rows):
    assert len(rows) == len(migration.KNOBS) + 1
    for g in GQA:
        row = _row(rows, f"neuron_config.group_query_attention=GQA.{g.name}")
        assert row.tnx == f"neuron_config.group_query_attention={g.value!r}"
        assert row.nxdi.startswith("(no keyword") and "REPLICATE_TO_TP_DEGREE" in row.notes


def test_renamed_keywords(rows):
    assert _row(rows, "tp_degree=2").nxdi == "tp_degree=2"
    assert _row(rows, "batch_size=4").nxdi == "batch_size=4"
    assert _row(rows, "amp='f16'").nxdi == "torch_dtype='float16'"
    assert _row(rows, "neuron_config.fuse_qkv=True").nxdi == "fused_qkv=True"
    assert _row(rows, "enable_speculative_decoder(5)").nxdi == "speculation_length=5"
    assert _row(rows, "enable_speculative_decoder(5)").tnx == "enable_speculative_decoder=5"
    big = _row(rows, "n_positions=2048")
    assert "seq_len=2048" in big.nxdi and "token_generation_buckets=[128, 256, 512, 1024, 2048]" in big.nxdi
    ctx = _row(rows, "context_length_estimate=[64, 128]")
    assert ctx.nxdi == "max_context_length=128, context_encoding_buckets=[64, 128]"
    default = _row(rows, "context_length_estimate=None")  # NxDI's own default, generate_buckets(128, seq_len)
    assert "context_encoding_buckets=[128, 256]" in default.nxdi


def test_int8_and_its_refusals(rows):
    s8 = _row(rows, "neuron_config.quant: s8")
    assert "quantized=True" in s8.nxdi and "quantization_type='per_channel_symmetric'" in s8.nxdi
    assert "quantization_dtype='int8'" in s8.nxdi and "quant.dequant_dtype='f32'" in s8.tnx
    assert "quantization_dtype='f8e4m3'" in _row(rows, "neuron_config.quant: f8e4m3fn").nxdi
    direct = _row(rows, "neuron_config.quant: quantize_method='direct_cast'")
    assert direct.nxdi.startswith("none: ") and "vector_dynamic" in direct.nxdi
    keep = _row(rows, "neuron_config.quant: no_quantize_list")
    assert keep.nxdi.startswith("none: ") and "modules_to_not_convert" in keep.nxdi


def test_tnx_only_knobs_have_notes(rows):
    assert "NxD Inference embeds on device" in _row(rows, "neuron_config.on_device_embedding").notes


def test_serving_rows_are_marked_and_use_keywords_nxdi_takes(rows):
    for prefix in ("neuron_config.continuous_batching", "neuron_config.on_device_generation"):
        row = _row(rows, prefix)
        assert row.derived.startswith("nxdi_overrides") and "not built by helpers.neuron" in row.tnx
    assert "is_continuous_batching=True" in _row(rows, "neuron_config.continuous_batching").nxdi
    for k in migration.KNOBS:
        assert set(k.nxdi_kwargs.get("nxdi_overrides", {})) <= NXDI_NEURON_CONFIG_KEYS


def test_base_row_is_a_whole_model(rows):
    base = rows[0]
    assert base.tnx.startswith("batch_size=1, n_positions=256, tp_degree=1, amp='f32'")
    assert "padding_side='right'" in base.nxdi and "neuron_config.padding_side='left'" in base.tnx


def test_markdown_table_has_a_line_per_row(rows):
    table = migration.markdown_table(rows)
    assert len(table.splitlines()) == len(rows) + 2


def test_bucket_plan_and_choice():
    p = migration.bucket_plan(2048)
    assert p["tnx"]["token_buckets"] == [128, 256, 512, 1024, 2048]
    assert p["tnx"]["context_buckets"] == [64, 128, 256, 512, 1024]
    assert p["nxdi migrated"]["token_buckets"] == p["tnx"]["token_buckets"]
    assert p["nxdi migrated"]["context_buckets"] == [128, 256, 512, 1024, 2048]
    assert migration.bucket_plan(300)["nxdi naive"]["token_buckets"] == [128, 300]  # tnx: 128, 256, 300
    choice = {r["prompt_len"]: r for r in migration.bucket_choice([64, 128], [64, 129])}
    assert choice[64]["tnx"] == 64 and choice[64]["nxdi"] == 128  # NxDI's strict first fit
    assert choice[129]["tnx"] == 128 and str(choice[129]["nxdi"]).startswith("refused: Input len 129")


def test_memory_plan_names_each_library():
    rows = migration.memory_plan("Llama-3.1-8B", [1, 8], n_positions=4096)
    assert [(r["tp"], r["library"]) for r in rows] == [(1, "tnx"), (1, "nxdi"), (8, "tnx"), (8, "nxdi")]
    tnx1, nxdi1 = rows[0], rows[1]
    assert tnx1["embedding_bytes"] == 0 and nxdi1["embedding_bytes"] > 0  # NxDI embeds on device
    assert not tnx1["fits"] and rows[2]["fits"]


def test_reference_nxdi_settings_runs_the_mapped_keywords():
    nc = neuron_settings("nxdi", batch_size=2, n_positions=256, context_length_estimate=[64, 128], amp="bf16").neuron_config
    kw = migration.reference_nxdi_settings(nc)
    assert kw["n_positions"] == 256 and kw["amp"] == "bf16" and kw["batch_size"] == 2
    assert kw["nxdi_bucketing"].buckets(256) == ([64, 128], [128, 256])
    with pytest.raises(ValueError, match="quantized"):
        migration.reference_nxdi_settings({**nc, "quantized": True})


def test_greedy_agreement_stops_at_eos():
    ref = [torch.tensor([5, 6, 2, 9]), torch.tensor([7, 8, 9, 10])]
    got = torch.tensor([[5, 6, 2, 4], [7, 8, 0, 10]])
    a = migration.greedy_agreement(got, ref, eos_ids=[2])
    assert a == {"agree": [3, 2], "compared": [3, 4], "identical": False}
    assert migration.greedy_agreement(got[:1], ref[:1], eos_ids=[2])["identical"]
