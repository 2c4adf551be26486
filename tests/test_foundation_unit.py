"""Fast unit tests of the foundation: backend switch, config refusal, model store, streaming and
stopping helpers, engine validation (bad configs refused before any build)."""
import pickle

import pytest
import torch
from transformers import StoppingCriteriaList, StopStringCriteria

import helpers
from helpers import model_store
from helpers.notebook.backend import Backend, resolve_backend, run_reference_cell
from helpers.engine.config import NeuronConfig
from helpers.planning.dtypes import amp_dtype
from helpers.prompts import encode_prompts
from helpers.notebook.stopping import RepeatedNgramCriteria
from helpers.neuron.tracking import TokenRecorder, TrackedCriteria
from helpers.notebook.stopping import PromptOnlyCall, fires_at
from helpers.notebook.streaming import TimingStreamer, latency_stats, streaming_overhead
from tiny_models import write_tiny


# -- backend ------------------------------------------------------------------------------------
def test_auto_backend_is_reference_without_neuron_sdk():
    assert resolve_backend("auto") == Backend("reference", None, "cpu")


@pytest.mark.parametrize("kwargs,msg", [
    ({"backend": "nueron"}, "backend='nueron'"),
    ({"backend": "neuron"}, "no Neuron stack imports"),
    ({"backend": "neuron", "neuron_stack": "tnx"}, "does not import here"),
    ({"backend": "reference", "neuron_stack": "nxd"}, "neuron_stack='nxd'"),
    ({"backend": "reference", "device": "gpu"}, "device='gpu'"),
])
def test_bad_backend_settings_are_refused(kwargs, msg):
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        resolve_backend(**kwargs)


def test_reference_cells_say_why_they_are_skipped(capsys):
    assert run_reference_cell(Backend("neuron", "nxdi")) is False
    assert "Skipped" in capsys.readouterr().out
    assert run_reference_cell(Backend("reference")) is True


# -- configuration ------------------------------------------------------------------------------
def test_neuron_config_refuses_typos_with_a_hint():
    with pytest.raises(TypeError, match="Did you mean 'group_query_attention'"):
        NeuronConfig(group_query_atention="shard-over-heads")
    with pytest.raises(ValueError, match="SHARD_OVER_HEADS"):
        NeuronConfig(group_query_attention="shard-heads")
    assert NeuronConfig(group_query_attention="replicated-heads").group_query_attention == helpers.GQA.REPLICATED_HEADS


def test_amp_names():
    assert amp_dtype("bf16") == torch.bfloat16
    with pytest.raises(ValueError, match="'f32', 'bf16', 'f16'"):
        amp_dtype("fp32")


@pytest.mark.parametrize("kwargs,exc,msg", [
    ({"batch_sizes": 2}, TypeError, "Did you mean 'batch_size'"),
    ({"amp": "float32"}, ValueError, "amp='float32'"),
    ({"n_positions": 4096}, ValueError, "max_position_embeddings"),
    ({"batch_size": 0}, ValueError, "batch_size=0"),
])
def test_bad_engine_settings_fail_before_build(tmp_path, kwargs, exc, msg):
    write_tiny(tmp_path, "llama", max_position_embeddings=512)
    with pytest.raises(exc, match=msg):
        helpers.NeuronModel.from_pretrained(tmp_path, **kwargs)


@pytest.mark.parametrize("overrides,msg", [
    ({"hidden_act": "gelu"}, "hidden_act='gelu': the engine implements SiLU-gated MLPs only"),
    ({"mlp_bias": True}, "mlp_bias=True: the engine implements MLPs without biases only; run this checkpoint with "
                         "transformers, or use one whose config.json has mlp_bias=false"),
], ids=["hidden_act", "mlp_bias"])
def test_unimplemented_architecture_features_are_refused_before_build(tmp_path, overrides, msg):
    write_tiny(tmp_path, "llama", **overrides)
    with pytest.raises(ValueError, match=f"^{msg}$"):
        helpers.NeuronModel.from_pretrained(tmp_path)


def test_engine_call_errors_name_the_fix(tmp_path):
    write_tiny(tmp_path)
    model = helpers.NeuronModel.from_pretrained(tmp_path, batch_size=2, n_positions=64)
    ids = torch.randint(3, 200, (2, 8))
    with pytest.raises(RuntimeError, match="to_neuron"):
        model.sample(ids, 16)
    model.to_neuron()
    with pytest.raises(ValueError, match="batch_size=2 but got 1 rows"):
        model.sample(ids[:1], 16)
    with pytest.raises(ValueError, match="exceeds n_positions=64"):
        model.sample(ids, 65)
    with pytest.raises(ValueError, match="leaves no room"):
        model.sample(ids, 8)
    with pytest.raises(ValueError, match="top_k"):
        model.sample(ids, 16, top_k=0)
    bad_mask = torch.ones(2, 8, dtype=torch.long)
    bad_mask[0, -1] = 0
    with pytest.raises(ValueError, match="pad on the left"):
        model.sample(ids, 16, attention_mask=bad_mask)
    # inputs that used to fail deep inside torch (IndexError, AttributeError, RuntimeError)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.sample(torch.full((2, 8), 256), 16)
    with pytest.raises(ValueError, match="prompt is empty"):
        model.sample(torch.zeros(2, 0, dtype=torch.long), 16)
    with pytest.raises(ValueError, match="dtype torch.float32"):
        model.sample(ids.float(), 16)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.forward(torch.full((2, 8), 300))


def test_per_row_stopping_pads_finished_rows(tmp_path):
    write_tiny(tmp_path)
    model = helpers.NeuronModel.from_pretrained(tmp_path, batch_size=2, n_positions=64).to_neuron()
    ids = torch.randint(3, 200, (2, 6))
    full = model.sample(ids, 30, top_k=1, eos_token_override=[])

    class StopRow0After3:
        def __call__(self, seq, scores):
            return torch.tensor([seq.shape[1] - 6 >= 3, False])

    out = model.sample(ids, 30, top_k=1, eos_token_override=[], stopping_criteria_list=StopRow0After3(), pad_token_id=0)
    assert model.stats["row_new_tokens"] == [3, 24]
    assert torch.equal(out[0, :9], full[0, :9]) and (out[0, 9:] == 0).all()
    assert torch.equal(out[1], full[1])


# -- model store --------------------------------------------------------------------------------
def test_missing_model_dir_is_a_clear_error(tmp_path):
    with pytest.raises(model_store.ModelNotFoundError, match="Nothing is downloaded"):
        model_store.resolve_model_path(tmp_path / "nope")


def test_unsupported_architecture_is_refused(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ValueError, match="not supported"):
        model_store.load_config(tmp_path)


def test_pickle_checkpoints_load_with_weights_only(tmp_path):
    hf = write_tiny(tmp_path)
    for f in tmp_path.glob("*.safetensors"):
        f.unlink()
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    assert "model.embed_tokens.weight" in model_store.load_state_dict(tmp_path)

    class Evil:
        def __reduce__(self):
            return (print, ("executed",))

    with open(tmp_path / "pytorch_model.bin", "wb") as f:
        pickle.dump({"x": Evil()}, f)
    with pytest.raises(pickle.UnpicklingError):
        model_store.load_state_dict(tmp_path)


def test_embedded_model_is_converted_once():
    path = model_store.resolve_model_path(None)
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    cfg = model_store.load_config(None)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["num_hidden_layers"]) == (9, 3, 30)


def test_prompts_fill_the_fixed_batch(tokenizer):
    enc = encode_prompts(tokenizer, ["a", "a longer prompt"], 3)
    assert enc.input_ids.shape[0] == 3 and enc.attention_mask[0, 0] == 0
    with pytest.raises(ValueError, match="raise batch_size"):
        encode_prompts(tokenizer, ["a", "b"], 1)


# -- streaming ----------------------------------------------------------------------------------
def test_timing_streamer_records_and_forwards():
    inner = TokenRecorder()
    s = TimingStreamer(inner=inner)
    for t in range(3):
        s.put(torch.tensor([[t], [t + 10]]))
    s.end()
    assert s.tokens.tolist() == [[0, 1, 2], [10, 11, 12]] and s.ended == 1
    assert inner.generated(2).tolist() == [[0, 1, 2], [10, 11, 12]]
    with pytest.raises(ValueError, match=r"\(batch, 1\)"):
        s.put(torch.tensor([[1, 2, 3]]))  # a prompt put, as transformers' generate() does


def test_latency_stats():
    st = latency_stats([0.5, 0.6, 0.7, 0.9])
    assert st["ttft_s"] == 0.5 and st["n_tokens"] == 4
    assert st["itl_median_s"] == pytest.approx(0.1)
    assert st["decode_tokens_per_s"] == pytest.approx(3 / 0.4)
    with pytest.raises(ValueError):
        latency_stats([])


def test_streaming_overhead_interleaves_runs():
    calls = []
    res = streaming_overhead(lambda streamer: calls.append(streamer is None), repeats=2)
    assert calls == [False, True, False, True] and res["repeats"] == 2


# -- stopping -----------------------------------------------------------------------------------
def test_repeated_ngram_criteria():
    crit = RepeatedNgramCriteria(prompt_len=2, n=2, max_repeats=2)
    looping = torch.tensor([[9, 9, 1, 2, 1, 2, 1, 2]])
    fresh = torch.tensor([[9, 9, 1, 2, 3, 4, 5, 6]])
    assert crit(torch.cat([looping, fresh])).tolist() == [True, False]
    assert fires_at(crit, looping, 2) == 6


def test_tracked_criteria_see_generated_ids_and_stay_done(tokenizer):
    prompt = tokenizer(["Hello\n", "Hi there"], return_tensors="pt", padding=True).input_ids
    crit = StoppingCriteriaList([StopStringCriteria(tokenizer, ["."])])
    tracker = TokenRecorder()
    tracked = TrackedCriteria(crit, tracker, prompt)
    dot = tokenizer.encode(".")[0]
    word = tokenizer.encode(" ok")[0]
    as_bool = TrackedCriteria(crit, tracker, prompt, as_bool=True)
    tracker.put(torch.tensor([[dot], [word]]))
    assert tracked(prompt, None).tolist() == [True, False]
    assert as_bool(prompt, None) is False  # transformers-neuronx stops the whole batch: wait for all rows
    tracker.put(torch.tensor([[word], [dot]]))
    assert tracked(prompt, None).tolist() == [True, True]  # row 0 stays done
    assert as_bool(prompt, None) is True
    # the transformers-neuronx convention: only the prompt is seen, so nothing fires
    assert PromptOnlyCall(crit, prompt)(prompt, None).tolist() == [False, False]
