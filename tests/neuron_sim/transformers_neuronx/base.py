"""Stand-in of ``src/transformers_neuronx/base.py`` (NeuronModelBase) and ``module.py`` (from_pretrained) at
aws-neuron/transformers-neuronx v0.13.0 (commit f4e3818), plus ``decoder.py`` ``check_gqa_fallback``.

What is transcribed (user-visible behaviour):

- ``from_pretrained`` (module.py ``PretrainedModel.from_pretrained``): ``_sanity_check``, the config, the
  class built with every keyword, a checkpoint marked ``is_presharded_checkpoint`` loads presharded weights,
  otherwise "Can not find model.safetensors or pytorch_model.bin in ..." when there are no weights.
- ``save(directory, sharded_weights=False)``: one artifact per graph, named like ``hash_hlo`` (20 hex digits
  of a sha256 + ``.neff``); with ``sharded_weights`` it then asserts ``on_device_embedding``, writes the
  presharded weights and a ``config.json`` (the model config's ``__dict__`` with
  ``is_presharded_checkpoint=True``) so ``from_pretrained(directory)`` loads them.
- ``load(directory)`` only records the folder; ``to_neuron()`` then matches every graph by name and raises
  ``FileNotFoundError('Could not find a matching NEFF for your HLO ...')`` when one is missing (never a silent
  recompile); "Did not find directory: ..." when the folder is absent. ``to_neuron()`` of presharded weights
  asserts ``on_device_embedding``.
- ``enable_speculative_decoder(k, batch_sizes=None)`` registers one speculation graph per (k, batch size).
- ``check_gqa_fallback`` (decoder.py): the GQA strategy a model really gets (and its warnings), written back
  into the caller's NeuronConfig as the source does.

What computes: the repository's reference engine (``helpers.NeuronModel``), one instance per compiled
batch size, always at tp_degree=1 whatever ``tp_degree`` was requested (tensor parallelism changes nothing a
user sees in the tokens; ``tp_degree`` still names the graphs). The numbers are the reference engine's on CPU,
never Neuron's. A stand-in graph file is a small JSON description of the graph, not a NEFF.

Where the pinned release would silently misread a call, the stand-in raises ``ContractError``: an unknown
keyword (swallowed by ``**kwargs``), a ``rope_parameters``-only config (read as rope_theta=10000), a left-padded
batch without ``start_ids``, ``load()`` after ``to_neuron()``; and a KV-cache position past ``n_positions``, where the
release fails without naming the cause (``StopIteration`` from ``find_bucket_id`` on a one-token step).
Features the engine does not compute (continuous batching, on-device generation, KV-cache quantization,
sparse attention, right padding, prefixed_length, ...) raise ``NotImplementedError`` at ``to_neuron()``.
Presharded weights are written in the reference engine's layout
(``weights/tp0_sharded_checkpoint.safetensors``) instead of ``DecoderLMHead.safetensors`` +
``decoder_layer_N.safetensors``; only ``config.json`` is the source's.
"""
import hashlib
import json
import os
import warnings

import torch

import _neuron_contract as contract
from transformers_neuronx import bucket
from transformers_neuronx.constants import GQA

SWALLOWED = "swallows unknown **kwargs silently (llama/model.py, mistral/model.py): a typo runs with the default"

# What AutoConfig fills in for keys a config.json omits (transformers' LlamaConfig / MistralConfig defaults).
HF_DEFAULTS = {
    "llama": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=None, hidden_act="silu", max_position_embeddings=2048,
                  rms_norm_eps=1e-6, pad_token_id=None, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
                  rope_theta=10000.0, rope_scaling=None),
    "mistral": dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=8, hidden_act="silu",
                    max_position_embeddings=4096 * 32, rms_norm_eps=1e-6, pad_token_id=None, bos_token_id=1,
                    eos_token_id=2, tie_word_embeddings=False, rope_theta=10000.0, sliding_window=4096),
}
CHECKPOINT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                    "pytorch_model.bin.index.json")
NOT_COMPUTED = ("continuous_batching", "on_device_generation", "kv_cache_quant", "sparse_attn", "output_all_logits",
                "log_softmax_scores", "is_eagle_target", "is_eagle_draft", "lhs_aligned")


def _read_config(path):
    cfg_file = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_file):
        raise OSError(f"{path} does not appear to have a file named config.json")
    with open(cfg_file) as fh:
        cfg = json.load(fh)
    if "rope_parameters" in cfg and "rope_theta" not in cfg:
        # transformers<4.48 (pinned by transformers-neuronx 0.13) does not know rope_parameters, and
        # llama/config.py reads getattr(config, "rope_theta", 10000): the wrong RoPE base, silently.
        raise contract.ContractError(
            f"{path}/config.json has rope_parameters but no rope_theta (a transformers-5 checkpoint): "
            "transformers-neuronx would silently use rope_theta=10000. Use helpers.neuron.neuron_model_dir().")
    return cfg


class _HFConfig:
    """What ``AutoConfig.from_pretrained`` hands the model classes: config.json as attributes, with the
    transformers defaults for omitted keys (read here without transformers, so it behaves the same under
    the pinned 4.47 and under transformers 5)."""

    def __init__(self, values: dict):
        merged = {**HF_DEFAULTS.get(values.get("model_type"), {}), **values}
        if merged.get("num_key_value_heads") is None and "num_attention_heads" in merged:
            merged["num_key_value_heads"] = merged["num_attention_heads"]
        self.__dict__.update(merged)

    def to_dict(self):
        return dict(self.__dict__)


def _auto_config(path) -> _HFConfig:
    return _HFConfig(_read_config(path))


def _sanity_check(**kwargs):
    """module.py ``PretrainedModel.from_pretrained._sanity_check``."""
    context_length_estimate = kwargs.get("context_length_estimate", None)
    n_positions = kwargs.get("n_positions", 2048)
    max_n_pos = max(n_positions) if isinstance(n_positions, list) else n_positions
    max_cle = max(context_length_estimate) if isinstance(context_length_estimate, list) else context_length_estimate
    if isinstance(max_n_pos, int) and isinstance(max_cle, int):
        assert max_n_pos >= max_cle, \
            f"Max context_length_estimate {max_cle} cannot be more than max n_positions {max_n_pos}."
    neuron_config = kwargs.get("neuron_config", None)
    bsh_cache_layout = False
    if neuron_config is not None:
        bsh_cache_layout = neuron_config.cache_layout == "BSH"
    continuous_batching = neuron_config and neuron_config.continuous_batching
    if continuous_batching:
        batch_size_for_shared_caches = neuron_config.continuous_batching.batch_size_for_shared_caches
        expected_batch_size = kwargs.get("batch_size")
        assert batch_size_for_shared_caches == expected_batch_size, \
            f"invalid batch_size_for_shared_caches ({batch_size_for_shared_caches}), {expected_batch_size} is expected"
        if bsh_cache_layout and not neuron_config.continuous_batching.optimized_paged_attention:
            assert isinstance(n_positions, list) and len(n_positions) == 1
            assert isinstance(context_length_estimate, list) and len(context_length_estimate) == 1, \
                "BSH cache layout does not support multi-bucketing"
    else:
        assert not bsh_cache_layout, "BSH cache layout can only be configured with continuous batching."


def check_gqa_fallback(neuron_config, n_head, n_kv_head, attention_head_size, tp_degree, batch_sizes):
    """decoder.py ``DecoderLmHeadForSamplingNoEmbedding.check_gqa_fallback``: mutates
    ``neuron_config.group_query_attention`` to the strategy the model really gets, with the source's warnings."""
    gqa = neuron_config.group_query_attention
    if gqa is None:
        if n_head == n_kv_head:
            if neuron_config.shard_over_sequence:
                warnings.warn(f'Cannot enable shard_over_sequence when a n_heads ({n_head}) == n_kv_heads '
                              f'({n_kv_head})disabling shard over sequence')
                neuron_config.shard_over_sequence = False
            return
        neuron_config.group_query_attention = GQA.SHARD_OVER_HEADS
    if gqa == GQA.REPLICATED_HEADS:
        return
    if gqa == GQA.SHARD_OVER_BATCH:
        success = True
        for batch_size in batch_sizes:
            if batch_size % tp_degree != 0:
                warnings.warn(f'Cannot enable "{gqa}" when a batch size ({batch_size} in {batch_sizes}) is not evenly '
                              f'divisible by the tensor parallel degree ({tp_degree})')
                success = False
                neuron_config.group_query_attention = GQA.SHARD_OVER_HEADS
        if success:
            return
    if gqa == GQA.ALL_GATHER_HEADS:
        if (n_kv_head * attention_head_size) % tp_degree != 0:
            warnings.warn(f'Cannot enable "{gqa}" when the hidden size of KV ({n_kv_head} x {attention_head_size}) '
                          f'is not evenly divisible by the tensor parallel degree ({tp_degree})')
            neuron_config.group_query_attention = GQA.SHARD_OVER_HEADS
        if n_head % tp_degree != 0:
            pad_size = ((n_head // tp_degree + 1) * tp_degree - n_head) % tp_degree  # utils.get_pad_size
            if pad_size % n_kv_head == 0:
                return
            else:
                warnings.warn(f'Cannot enable "{gqa}" when the number of padding {pad_size} need for query '
                              f'attention heads ({n_head}) with the tensor parallel degree ({tp_degree}) '
                              f'is not divisible by KV heads ({n_kv_head})')
                neuron_config.group_query_attention = GQA.SHARD_OVER_HEADS
        else:
            return
    if n_kv_head % tp_degree != 0:
        warnings.warn(f'KV head replication will be enabled since the number of KV heads ({n_kv_head}) is not evenly '
                      f'divisible by the tensor parallel degree ({tp_degree})')
        neuron_config.group_query_attention = GQA.REPLICATED_HEADS


# Config keys a graph's HLO depends on (shapes and constants); token ids and sizes of other graphs do not.
ARCH_KEYS = ("model_type", "intermediate_size", "hidden_size", "attention_head_size", "num_attention_heads",
             "num_key_value_heads", "num_hidden_layers", "vocab_size", "hidden_act", "max_position_embeddings",
             "rms_norm_eps", "rotary_percentage", "rope_theta", "position_interpolation_factor", "rope_scaling",
             "sliding_window", "is_eagle", "bias")


class NeuronModelBase(torch.nn.Module):
    is_fid = False

    # --- module.py ---------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, pretrained_model_path, *model_args, **kwargs):
        _sanity_check(**kwargs)
        config = _auto_config(pretrained_model_path)
        model = cls(config, *model_args, **kwargs)
        if getattr(config, 'is_presharded_checkpoint', False):
            model._using_presharded_weights = pretrained_model_path
        else:
            if not any(os.path.exists(os.path.join(pretrained_model_path, n)) for n in CHECKPOINT_FILES):
                raise FileNotFoundError(f"Can not find model.safetensors or pytorch_model.bin in {pretrained_model_path}")
            model._checkpoint_path = pretrained_model_path
        model._hf_config = config
        contract.record(f"tnx.{cls.__name__}.from_pretrained", path=str(pretrained_model_path), **kwargs)
        return model

    def _init_stand_in(self):
        """The stand-in's own state (called at the end of each model's __init__)."""
        self._engines = {}           # batch size -> helpers.NeuronModel
        self._compiled = False
        self._past_cache_ok = False  # set by SpeculativeGenerator.sample (see _check_positions)
        self.nbs_objs = ["registered"]  # serialization_enabled(): the source registers each decoder at init

    # --- base.py top level api ---------------------------------------------------------------------
    def save(self, directory, sharded_weights=False):
        assert self.serialization_enabled(), 'serialization is not enabled for this model'
        self._save_compiled_artifacts(directory)
        if sharded_weights:
            assert self.neuron_config.on_device_embedding, \
                "on_device_embedding must be True to save and load presharded weights"
            self._save_presharded_weights(directory)
            self.config.is_presharded_checkpoint = True
            with open(os.path.join(directory, 'config.json'), 'w') as f:
                f.write(json.dumps(self.config.__dict__))
        contract.record("tnx.save", directory=str(directory), sharded_weights=sharded_weights)

    def load(self, directory):
        if self._compiled:
            raise contract.ContractError("load(directory) after to_neuron() has no effect: call load() first, "
                                         "then to_neuron() (base.py: to_neuron reads _compiled_artifacts_directory)")
        assert self.serialization_enabled(), 'serialization is not enabled for this model'
        self._compiled_artifacts_directory = directory
        contract.record("tnx.load", directory=str(directory))

    def compile(self, parallel_degree=None):
        pass  # the graphs are "compiled" by to_neuron(); nothing runs in a process pool here

    def setup(self):
        pass

    def to_neuron(self):
        self._refuse_not_computed()
        if hasattr(self, "_using_presharded_weights"):
            assert self.neuron_config.on_device_embedding, \
                "on_device_embedding must be True to save and load presharded weights"
        loaded = hasattr(self, "_compiled_artifacts_directory")
        if loaded:
            # (the source loads the weights first; the stand-in matches the graphs first, to fail fast)
            self._load_compiled_artifacts(self._compiled_artifacts_directory)
        self._build_engines()
        self._compiled = True
        contract.record("tnx.to_neuron", loaded=loaded)

    def enable_speculative_decoder(self, speculation_length, batch_sizes=None, token_tree=None):
        if self._compiled:
            raise contract.ContractError("enable_speculative_decoder() after to_neuron(): the speculation graphs are "
                                         "built inside to_neuron() (init_rest_of_model), call it before")
        if token_tree is not None:
            raise NotImplementedError("token-tree speculation is not transcribed in the stand-in")
        if isinstance(speculation_length, int):
            speculation_length = [speculation_length]
        if batch_sizes is None:
            batch_sizes = self.batch_sizes
        if isinstance(batch_sizes, int):
            batch_sizes = [batch_sizes]
        for k in speculation_length:
            for batch_size in batch_sizes:
                self.decoder_lm_head_for_speculation[k, batch_size] = {"n_active_tokens": k, "batch_size": batch_size}
        contract.record("tnx.enable_speculative_decoder", speculation_length=speculation_length)

    def enable_window_context_decoder(self, window_context_length, unroll=None):
        if self._compiled:
            raise contract.ContractError("enable_window_context_decoder() must precede to_neuron()")
        if isinstance(window_context_length, int):
            window_context_length = [window_context_length]
        # The source encodes a prompt's leftover tokens in these windows instead of one by one: the same
        # numbers, so the engine keeps feeding them one by one; the windows only name graphs here.
        self.window_context_buckets = bucket.context_sizes(window_context_length, self.token_buckets)
        for k in self.window_context_buckets:
            self.decoder_lm_head_for_window_context[k] = {"n_active_tokens": k}

    def is_compiled(self):
        return self._compiled

    def reset(self):
        pass

    def serialization_enabled(self):
        return getattr(self, 'nbs_objs', None) is not None

    # --- graphs and their artifacts ---------------------------------------------------------------
    def _graph_specs(self):
        """One entry per graph (per NEFF) the source registers for serialization."""
        common = {"config": {k: getattr(self.config, k) for k in ARCH_KEYS if hasattr(self.config, k)},
                  "amp": self.config.amp, "tp_degree": self.config.tp_degree,
                  "kv_cache_positions": max(self.token_buckets),
                  "neuron_config": {k: v for k, v in self.neuron_config.to_json().items()
                                    if k != "compilation_worker_count"},
                  "unroll": self.unroll, "class": type(self).__name__}
        specs = []
        for bs in self.batch_sizes:
            for b in self.token_buckets:
                specs.append({"tag": "token", "n_positions": b, "n_active_tokens": 1, "batch_size": bs})
        for e in self.context_buckets:
            for bs in self.context_batch_sizes:
                specs.append({"tag": "context", "n_positions": e, "n_active_tokens": e, "batch_size": bs,
                              "unroll": self.context_unroll})
        for (k, bs) in getattr(self, "decoder_lm_head_for_speculation", {}):
            for b in self.token_buckets:
                specs.append({"tag": f"speculation-k{k}", "n_positions": b, "n_active_tokens": k, "batch_size": bs})
        for w in getattr(self, "decoder_lm_head_for_window_context", {}):
            for bs in self.batch_sizes:
                for b in self.token_buckets:
                    specs.append({"tag": f"window-width{w}", "n_positions": b, "n_active_tokens": w,
                                  "batch_size": bs})
        return [{**common, **s} for s in specs]

    @staticmethod
    def _hash_graph(spec):
        """base.py ``hash_hlo``: 20 hex digits of a sha256, + '.neff' (here of the graph's description)."""
        message = json.dumps(spec, sort_keys=True, default=str).encode()
        return hashlib.sha256(message).hexdigest()[:20] + '.neff'

    def _save_compiled_artifacts(self, directory):
        if os.path.isfile(directory):
            raise FileExistsError(
                f'Artifacts should be saved to a directory. '
                f'Found existing file: {directory}'
            )
        os.makedirs(directory, exist_ok=True)
        for spec in self._graph_specs():
            with open(os.path.join(directory, self._hash_graph(spec)), 'wb') as f:
                assert self._compiled, "cannot save a model which has not been successfully compiled"
                f.write(json.dumps({"stand_in": "transformers-neuronx stand-in graph, not a NEFF", **spec},
                                   sort_keys=True, default=str).encode())

    def _load_compiled_artifacts(self, directory):
        if not os.path.isdir(directory):
            raise FileNotFoundError(f'Did not find directory: {directory}.')
        for spec in self._graph_specs():
            if not os.path.isfile(os.path.join(directory, self._hash_graph(spec))):
                raise FileNotFoundError(('Could not find a matching NEFF for your HLO in this directory. '
                                         'Ensure that the model you are trying to load is the same type and '
                                         'has the same parameters as the one you saved or call "save" on '
                                         'this model to reserialize it.'))

    def _save_presharded_weights(self, directory):
        """The reference engine's presharded weights (helpers.artifacts.presharded / .serialization: the same files
        NeuronModel.save(dir, sharded_weights=True) writes), read back by the engine when config.json says
        is_presharded_checkpoint."""
        from helpers.artifacts import presharded as engine_presharded
        from helpers.artifacts import serialization as engine_serialization

        if self.neuron_config.quant is not None:
            raise NotImplementedError("the stand-in's presharded weights come from the reference engine, which "
                                      "stores them unquantized: save without sharded_weights when quant is set")
        engine = self._engines[self.batch_sizes[0]]
        engine_presharded.save_rank_weights(directory, engine.require_built().w,
                                        engine_serialization.weights_meta(engine, 0), 0)

    # --- the reference engine ---------------------------------------------------------------------
    def _refuse_not_computed(self):
        nc = self.neuron_config
        used = [name for name in NOT_COMPUTED if getattr(nc, name, None)]
        if getattr(self, "prefixed_length", 0):
            used.append("prefixed_length")
        if getattr(nc, "pp_stages", 1) > 1:
            used.append("NEURON_PP_STAGES")
        if used:
            raise NotImplementedError(f"{', '.join(used)}: not computed by the transformers-neuronx stand-in (the "
                                      "reference engine has no such path); the real library would run it")

    def _build_engines(self):
        try:
            from helpers.engine.config import NeuronConfig as EngineConfig
            from helpers import NeuronModel
        except ImportError as exc:  # pragma: no cover
            raise ImportError("the transformers-neuronx stand-in computes with the repository's reference engine: "
                              "put the repository root on PYTHONPATH") from exc
        nc = self.neuron_config
        quant = None
        if nc.quant is not None:
            from helpers.engine.quant import QuantizationConfig as EngineQuant

            q = nc.quant
            quant = EngineQuant(quant_dtype=q.quant_dtype, dequant_dtype=q.dequant_dtype,
                                quantize_method=q.quantize_method, quantize_attn=bool(q.quantize_attn),
                                no_quantize_list=list(q.no_quantize_list))
        path = getattr(self, "_using_presharded_weights", None) or getattr(self, "_checkpoint_path", None)
        if path is None:
            raise NotImplementedError("the stand-in reads its weights from the checkpoint given to from_pretrained(): "
                                      f"build the model with {type(self).__name__}.from_pretrained(path, ...)")
        ks = sorted({k for k, _ in getattr(self, "decoder_lm_head_for_speculation", {})})
        self._engines = {}
        for bs in sorted(set(self.batch_sizes) | set(self.context_batch_sizes)):
            engine = NeuronModel.from_pretrained(
                str(path), batch_size=bs, n_positions=list(self.token_buckets), tp_degree=1, amp=self.config.amp,
                context_length_estimate=list(self.context_buckets),
                neuron_config=EngineConfig(on_device_embedding=bool(nc.on_device_embedding), quant=quant))
            if ks and ks[-1] >= 2:
                engine.enable_speculative_decoder(ks[-1] - 1)  # its graph scores k tokens: the last + k - 1 drafts
            engine.to_neuron()
            self._engines[bs] = engine

    def _require_compiled(self, what):
        if not self._compiled:
            raise contract.ContractError(f"{what} before to_neuron(): the model has no compiled graphs yet")

    def _engine(self, batch_size):
        if batch_size not in self._engines:
            raise KeyError((batch_size, f"no graph compiled for batch size {batch_size}; compiled: "
                                        f"{sorted(self._engines)}"))
        return self._engines[batch_size]

    def _check_compiled_batch(self, batch_size, context_length, first_position):
        """The graph ``forward`` reaches for this batch size, and the lookup that fails when none was compiled for
        it. More than one token goes through base.py ``context()`` (after ``_prepare_for_par_ctx_rhs_padding``):
        ``self.decoder_lm_head_for_context[estimate, batch_size]``, a dict of the ``(context bucket, batch size)``
        pairs compiled (``context_batch_sizes``): ``KeyError((estimate, batch_size))``. One token (or a prompt with no
        context bucket, run token by token) goes to the token decoder: decoder.py ``forward_single`` picks the
        ``n_positions`` bucket (``DecoderProgram.find_bucket_id``), then ``DecoderProgramFullyUnrolled.execute`` looks
        up ``self.executors[npos, batch_size]`` (``KeyError((npos, batch_size))``); a decoder not fully unrolled
        (``unroll`` < the number of layers: ``DecoderProgramMultiLayer``) fails first on
        ``self.batch_sizes.index(batch_size)`` (``ValueError: N is not in list``)."""
        if context_length > 1:
            estimate = bucket.find(self.context_buckets, context_length)
            if estimate is not None:
                if batch_size not in self.context_batch_sizes:
                    raise KeyError((estimate, batch_size))
                return
            first_position = 0  # base.py context(): the leftovers run token by token from position 0
        if batch_size in self.batch_sizes:
            return
        npos = next((n for n in self.token_buckets if n >= first_position + 1), None)
        if npos is None:
            return  # find_bucket_id finds no bucket: _check_positions answers
        if self.unroll == len(self.layers_after_partition):
            raise KeyError((npos, batch_size))
        raise ValueError(f"{batch_size} is not in list")

    def _check_positions(self, last_position):
        """True when ``last_position`` fits the KV cache. Past it no token bucket of the source holds the position
        (a one-token step raises StopIteration in ``find_bucket_id``): refused, except inside
        SpeculativeGenerator.sample, whose last blocks may run past sequence_length == n_positions (those tokens
        are cut from its result)."""
        n = max(self.token_buckets)
        if last_position < n:
            return True
        if self._past_cache_ok:
            return False
        raise contract.ContractError(
            f"KV-cache position {last_position} is past n_positions={n}: no graph of transformers-neuronx holds it (its "
            "token step fails with StopIteration in find_bucket_id). Keep prompt + sequence_length <= n_positions.")

    def _check_padding(self, input_ids, start_ids):
        pad = getattr(getattr(self, "_hf_config", None), "pad_token_id", None)
        if start_ids is None and pad is not None and input_ids.shape[0] > 1 and bool((input_ids[:, 0] == pad).any()):
            # sample() only learns where each row starts from start_ids: without them the left padding is
            # attended to and shifts the positions of the real tokens.
            raise contract.ContractError("a left-padded batch (rows start with pad_token_id) without start_ids: pass "
                                         "start_ids=(attention_mask == 0).sum(dim=1)")

    def _cast_logits(self, logits):
        logits_dtype = torch.float32
        if self.neuron_config:
            if self.neuron_config.cast_logits_dtype is not None:
                logits_dtype = getattr(torch, self.neuron_config.cast_logits_dtype)
        return logits.to(logits_dtype)

    @staticmethod
    def _first_position(cache_ids):
        c = torch.as_tensor(cache_ids)
        if c.dim() == 2:
            if not bool((c == c[:1]).all()):
                raise NotImplementedError("per-row cache_ids (2D, rows at different positions) are not computed by "
                                          "the stand-in: the reference engine moves all rows together")
            c = c[0]
        positions = c.flatten().tolist()
        if positions != list(range(positions[0], positions[0] + len(positions))):
            raise NotImplementedError(f"non-contiguous cache_ids {positions} are not computed by the stand-in")
        return positions[0]

    def _forward_logits(self, input_ids, cache_ids, start_ids):
        """base.py ``_forward`` (context encoding through ``context()``, or one token-generation step):
        logits [batch, vocab] of the last position, from the reference engine. With cache_ids None or starting
        at 0 the prompt is context-encoded up to the bucket ``bucket.find(context_buckets, length)``, padded to
        it, and a remainder past the largest context bucket runs token by token (base.py ``context``)."""
        batch, length = input_ids.shape
        first = 0 if cache_ids is None else self._first_position(cache_ids)
        self._check_compiled_batch(batch, length, first)
        engine = self._engine(batch)
        if not self._check_positions(first + length - 1):
            return torch.zeros(batch, self.config.vocab_size, dtype=torch.float32)
        if first == 0 and length > 1:
            estimate = bucket.find(self.context_buckets, length)
            contract.record("tnx.context", context_length=length, estimate=estimate,
                            serial_tokens=length - min(length, estimate or 0))
        logits = engine.forward(torch.as_tensor(input_ids), cache_ids=None if cache_ids is None
                                else torch.tensor([first]), start_ids=start_ids)
        return self._cast_logits(logits.clone())  # a normal tensor: the sampling loop edits it in place

    def _all_logits(self, input_ids, cache_ids, start_ids):
        """Logits [batch, tokens, vocab] of every position of ``input_ids`` written at ``cache_ids``
        (the speculation graph): the engine's speculative graph when it has this width, else token by token."""
        batch, length = input_ids.shape
        engine = self._engine(batch)
        first = self._first_position(cache_ids)
        if first + length <= max(self.token_buckets) and engine.speculation_length + 1 == length:
            return engine.speculative_forward(torch.as_tensor(input_ids), torch.arange(first, first + length),
                                              start_ids=start_ids).clone()
        out = torch.zeros(batch, length, self.config.vocab_size, dtype=torch.float32)
        for j in range(length):
            if not self._check_positions(first + j):
                break
            out[:, j] = engine.forward(torch.as_tensor(input_ids)[:, j:j + 1], cache_ids=torch.tensor([first + j]),
                                       start_ids=start_ids)
        return out
