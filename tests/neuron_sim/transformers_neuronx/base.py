"""transformers_neuronx/base.py + module.py (v0.13.0): NeuronModelBase and from_pretrained.

Call-order rules transcribed from the source:
- ``load(dir)`` only records the folder; the NEFFs are matched at ``to_neuron()`` (base.py), so
  ``load`` must come first, and a folder without matching NEFFs raises FileNotFoundError there.
- ``enable_speculative_decoder(k)`` must come before ``to_neuron()`` (its graphs are built in
  ``init_rest_of_model`` during ``load_weights``).
- ``save(dir)`` needs a compiled model; ``sharded_weights=True`` asserts on_device_embedding.
"""
import hashlib
import json
import os

import torch

import _neuron_contract as contract
from transformers_neuronx import bucket
from transformers_neuronx.config import NeuronConfig

SWALLOWED = "swallows unknown **kwargs silently (llama/model.py, mistral/model.py): a typo runs with the default"


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


class NeuronModelBase:
    _init_kwargs = ()

    @classmethod
    def from_pretrained(cls, pretrained_model_path, *model_args, **kwargs):
        # module.py PretrainedModel.from_pretrained: _sanity_check, AutoConfig, cls(config, ...), weights.
        n_positions = kwargs.get("n_positions", 2048)
        cle = kwargs.get("context_length_estimate", None)
        max_n = max(n_positions) if isinstance(n_positions, list) else n_positions
        max_c = max(cle) if isinstance(cle, list) else cle
        if isinstance(max_n, int) and isinstance(max_c, int):
            assert max_n >= max_c, f"Max context_length_estimate {max_c} cannot be more than max n_positions {max_n}."
        cfg = _read_config(pretrained_model_path)
        model = cls(cfg, *model_args, **kwargs)
        if cfg.get("is_presharded_checkpoint"):
            model._using_presharded_weights = pretrained_model_path
        else:
            names = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                     "pytorch_model.bin.index.json")
            if not any(os.path.exists(os.path.join(pretrained_model_path, n)) for n in names):
                raise FileNotFoundError(f"Can not find model.safetensors or pytorch_model.bin in {pretrained_model_path}")
        contract.record(f"tnx.{cls.__name__}.from_pretrained", path=str(pretrained_model_path), **kwargs)
        return model

    def _setup(self, config, n_positions, batch_size, amp, tp_degree, context_length_estimate, neuron_config):
        if amp not in ('f32', 'f16', 'bf16'):
            raise KeyError(amp)  # dtypes.to_torch_dtype
        if neuron_config is not None and not isinstance(neuron_config, NeuronConfig):
            raise contract.ContractError("neuron_config must be a transformers_neuronx.NeuronConfig, "
                                         f"got {type(neuron_config).__module__}.{type(neuron_config).__name__}")
        self.config = config
        self.neuron_config = neuron_config if neuron_config else NeuronConfig()
        self.amp, self.tp_degree = amp, tp_degree
        self.token_buckets = bucket.token_sizes(n_positions)
        self.context_buckets = bucket.context_sizes(context_length_estimate, self.token_buckets)
        self.batch_sizes = bucket.batch_sizes(batch_size)
        self.vocab_size = config["vocab_size"]
        self.eos_token_id = config.get("eos_token_id")
        self._compiled = False
        self._compiled_artifacts_directory = None
        self.decoder_lm_head_for_speculation = {}

    # --- serialization and build --------------------------------------------------------------
    def _graph_names(self):
        key = json.dumps([self.token_buckets, self.context_buckets, self.batch_sizes, self.amp, self.tp_degree,
                          sorted(self.decoder_lm_head_for_speculation)], default=str)
        return [hashlib.sha256(f"{key}{i}".encode()).hexdigest()[:20] + ".neff"
                for i in range(len(self.token_buckets) + len(self.context_buckets))]

    def save(self, directory, sharded_weights=False):
        assert self._compiled, "cannot save a model which has not been successfully compiled"
        if os.path.isfile(directory):
            raise FileExistsError(directory)
        os.makedirs(directory, exist_ok=True)
        for name in self._graph_names():
            with open(os.path.join(directory, name), "wb") as fh:
                fh.write(b"stand-in NEFF")
        if sharded_weights:
            assert self.neuron_config.on_device_embedding, \
                "on_device_embedding must be True to save and load presharded weights"
            # _save_presharded_weights, then config.json with is_presharded_checkpoint=True: a later
            # from_pretrained(directory) loads these weights (base.py save).
            with open(os.path.join(directory, "config.json"), "w") as fh:
                json.dump({**self.config, "is_presharded_checkpoint": True}, fh)
        contract.record("tnx.save", directory=str(directory), sharded_weights=sharded_weights)

    def load(self, directory):
        if self._compiled:
            raise contract.ContractError("load(directory) after to_neuron() has no effect: call load() first, "
                                         "then to_neuron() (base.py: to_neuron reads _compiled_artifacts_directory)")
        self._compiled_artifacts_directory = directory
        contract.record("tnx.load", directory=str(directory))

    def compile(self, parallel_degree=None):
        pass

    def to_neuron(self):
        if getattr(self, "_using_presharded_weights", None):
            assert self.neuron_config.on_device_embedding, \
                "on_device_embedding must be True to save and load presharded weights"
        d = self._compiled_artifacts_directory
        if d is not None:
            if not os.path.isdir(d):
                raise FileNotFoundError(f'Did not find directory: {d}.')
            missing = [n for n in self._graph_names() if not os.path.exists(os.path.join(d, n))]
            if missing:
                raise FileNotFoundError('Could not find a matching NEFF for your HLO in this directory. Ensure that '
                                        'the model you are trying to load is the same type and has the same parameters '
                                        'as the one you saved or call "save" on this model to reserialize it.')
        self._compiled = True
        contract.record("tnx.to_neuron", loaded=d is not None)

    def enable_speculative_decoder(self, speculation_length, batch_sizes=None, token_tree=None):
        if self._compiled:
            raise contract.ContractError("enable_speculative_decoder() after to_neuron(): the speculation graphs are "
                                         "built inside to_neuron() (init_rest_of_model), call it before")
        ks = [speculation_length] if isinstance(speculation_length, int) else list(speculation_length)
        for k in ks:
            for bs in (bucket.batch_sizes(batch_sizes) if batch_sizes is not None else self.batch_sizes):
                self.decoder_lm_head_for_speculation[k, bs] = True
        contract.record("tnx.enable_speculative_decoder", speculation_length=speculation_length)

    def enable_window_context_decoder(self, window_context_length, unroll=None):
        if self._compiled:
            raise contract.ContractError("enable_window_context_decoder() must precede to_neuron()")

    def is_compiled(self):
        return self._compiled

    def reset(self):
        pass

    def _require_compiled(self, what):
        if not self._compiled:
            raise contract.ContractError(f"{what} before to_neuron(): the model has no compiled graphs yet")

    def _check_padding(self, input_ids, start_ids):
        pad = self.config.get("pad_token_id")
        if start_ids is None and pad is not None and input_ids.shape[0] > 1 and bool((input_ids[:, 0] == pad).any()):
            # sample() only learns where each row starts from start_ids: without them the left padding is
            # attended to and shifts the positions of the real tokens.
            raise contract.ContractError("a left-padded batch (rows start with pad_token_id) without start_ids: pass "
                                         "start_ids=(attention_mask == 0).sum(dim=1)")

    def _logits(self, input_ids):
        return torch.zeros(input_ids.shape[0], self.vocab_size)
