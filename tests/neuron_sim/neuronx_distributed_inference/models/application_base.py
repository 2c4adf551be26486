"""neuronx_distributed_inference/models/application_base.py at aws-neuron/neuronx-distributed-inference cd3abf3
(Neuron SDK 2.28.0, NxD Inference 0.8): NeuronApplicationBase.

Transcribed, with what a user sees of each:

- ``compile(compiled_model_path, debug=False, pre_shard_weights_hook=None, dry_run=False)``: writes
  ``neuron_config.json`` (``config.save``), then, unless ``dry_run``, ``model.pt`` (``torch.jit.save``) and,
  with ``save_sharded_checkpoint=True`` (and not ``skip_sharding``), ``weights/tp{rank}_sharded_checkpoint
  .safetensors`` for every rank of ``world_size``. The stand-in's ``model.pt`` is a TorchScript module that
  records the compiled settings (no Neuron graph); its shard files hold each rank's slice (``tensor_split``
  along dim 0) of the state dict ``checkpoint_loader_fn`` produces, not NxD's parallel-layer layout.
- ``load(compiled_model_path, start_rank_id=None, local_ranks_size=None, skip_warmup=False)``:
  ``torch.jit.load(path + "model.pt")`` (so a missing file raises torch's ``ValueError: The provided
  filename ... does not exist``), then ``load_weights``: the presharded files when
  ``neuron_config.save_sharded_checkpoint`` (safetensors' error when one is missing), else the checkpoint
  (or ``quantized_checkpoints_path`` with ``quantized=True``: ``FileNotFoundError: Quantized checkpoint file
  not found: ...``). **load() never reads neuron_config.json and never compares it with the current
  config** (the release does not): a compiled directory built with other settings loads silently, and on
  Neuron the mismatch shows only at run time. The stand-in computes with the *current* config.
- ``save_quantized_state_dict(model_path, config)`` (classmethod): quantizes the decoder projections per
  ``quantization_type`` (``per_tensor_symmetric``, the default, or ``per_channel_symmetric``) to int8 and
  writes the state dict with ``torch.save`` to ``quantized_checkpoints_path``, or as safetensors into it when
  that path is an existing directory.

Compute: the numbers come from the repository's reference engine (helpers.NeuronModel, see
``neuronx_distributed_inference/_reference.py``), always at tp_degree=1 whatever tp_degree is configured;
they are never Neuron measurements.
"""
import json
import logging
import os
import time
from typing import Dict, List, Tuple, Type

import torch

import _neuron_contract as contract
from neuronx_distributed_inference._continuous_batching import check_continuous_batching
from neuronx_distributed_inference.models.config import InferenceConfig, NeuronConfig, to_dict
from neuronx_distributed_inference.modules.checkpoint import (
    load_state_dict,
    prune_state_dict,
    save_state_dict_safetensors,
)

COMPILED_MODEL_FILE_NAME = "model.pt"
logger = logging.getLogger("Neuron")


def normalize_path(path):
    """Normalize path separators and ensure path ends with a trailing slash"""
    normalized = os.path.normpath(path)
    return os.path.join(normalized, "")


def is_compiled(model_path):
    return os.path.isfile(model_path + COMPILED_MODEL_FILE_NAME)


class _TracedModel(torch.nn.Module):
    """What the stand-in saves as model.pt: the settings the graphs were compiled for (JSON), no graph, and the
    shapes each bucket of each graph was traced with (``input_shape_map``, built as neuronx-distributed v2.28.0
    trace/model_builder.py builds it). ``router`` is neuronx-distributed's ``NxDModel.router`` (trace/spmd.py),
    copied: it runs in TorchScript as there, so inputs of shapes no bucket was traced with fail with the release's
    ``torch.jit.Error`` (``builtins.ValueError: Input shape ... not found in input_shape_map: ...``)."""

    input_shape_map: Dict[str, Tuple[str, int]]

    def __init__(self, settings: str, input_shape_map: Dict[str, Tuple[str, int]]):
        super().__init__()
        self.settings = settings
        self.input_shape_map = input_shape_map

    def router(self, inputs: List[torch.Tensor]) -> Tuple[str, int]:
        actual_shape = str([tensor.shape for tensor in inputs])
        if actual_shape not in self.input_shape_map:
            raise ValueError(f"Input shape {actual_shape} not found in input_shape_map: {self.input_shape_map.keys()}")
        return self.input_shape_map[actual_shape]

    def forward(self, inputs: List[torch.Tensor]) -> Tuple[str, int]:
        model_name, bucket_idx = self.router(inputs)
        return model_name, bucket_idx


def input_shape_map(models) -> Dict[str, Tuple[str, int]]:
    """neuronx-distributed trace/model_builder.py (ModelBuilder): every example input of every model, by the
    string of its shapes; a later bucket with the same shapes takes the key over."""
    input_shape_map = {}
    for model in models:
        for i, example_input in enumerate(model.input_generator()):
            # torch.Size type is not a concept in a jit model, it's just List[int]
            input_shape_map[str([list(tensor.shape) for tensor in example_input])] = (model.tag, i)
    return input_shape_map


class NeuronApplicationBase(torch.nn.Module):
    _STATE_DICT_MODEL_PREFIX = "model."
    _NEW_STATE_DICT_MODEL_PREFIX = ""
    _FUSED_PREFIX = ""

    def __init__(
        self,
        model_path: str,
        config: InferenceConfig = None,
        neuron_config: NeuronConfig = None,
    ):
        super().__init__()
        model_path = normalize_path(model_path)

        if config is None:
            config = self.get_config_cls().load(model_path)

        if neuron_config is not None:
            config.neuron_config = neuron_config

        if not isinstance(config, self.get_config_cls()):
            # The release accepts any InferenceConfig and fails later, deep in the model: refuse here.
            raise contract.ContractError(f"{type(self).__name__} takes a {self.get_config_cls().__name__}")
        self.validate_config(config)
        self.config = config
        self.neuron_config = config.neuron_config
        self.fused_spec_config = config.fused_spec_config
        self.on_device_sampling = self.neuron_config.on_device_sampling_config is not None
        self.model_path = model_path
        self.models = []
        self.traced_model = None
        self.is_compiled = is_compiled(model_path)
        self.is_loaded_to_neuron = False
        self._builder = None
        self._runtime = None  # stand-in: the reference engine, built by load_weights()

        if self.neuron_config.lora_config is not None:
            raise NotImplementedError("stand-in: LoRA serving (lora_config) is not transcribed")
        contract.record(f"nxdi.{type(self).__name__}", model_path=model_path)

    def forward(self, **kwargs):
        """Forward pass for this model."""
        raise NotImplementedError("forward is not implemented")

    @classmethod
    def validate_config(cls, config: InferenceConfig):
        """Checks whether the config is valid for this model."""
        if not hasattr(config, "neuron_config"):
            raise ValueError("Config must include a NeuronConfig")

        if getattr(config, "fused_spec_config", None) is not None:
            if (
                config.fused_spec_config.draft_config.neuron_config.torch_dtype
                != config.neuron_config.torch_dtype
            ) and (config.neuron_config.cast_type == "config"):
                raise ValueError(
                    "cast-type must be set to 'as-declared' to be able to run different precisions for draft and target model!"
                )

    @classmethod
    def get_config_cls(cls) -> InferenceConfig:
        """Gets the config class for this model."""
        raise NotImplementedError("get_config_cls is not implemented")

    @classmethod
    def get_neuron_config_cls(cls) -> Type[NeuronConfig]:
        return cls.get_config_cls().get_neuron_config_cls()

    def get_compiler_args(self) -> str:
        return None

    # -- compile ------------------------------------------------------------------------------------
    def _trace(self) -> torch.jit.ScriptModule:
        """Stand-in for ModelBuilder.trace: a TorchScript module recording what was compiled."""
        settings = {
            "stand_in": "neuron-stand-ins (no Neuron graph)",
            "models": {m.tag: list(m.config.neuron_config.buckets) for m in self.models},
            "neuron_config": to_dict(self.neuron_config),
        }
        return torch.jit.script(_TracedModel(json.dumps(settings, sort_keys=True, default=str),
                                             input_shape_map(self.models)))

    def shard_weights(self, compiled_model_path, debug=False, pre_shard_weights_hook=None):
        compiled_model_path = normalize_path(compiled_model_path)
        sharded_checkpoint_dir = os.path.join(compiled_model_path, "weights/")
        if pre_shard_weights_hook:
            pre_shard_weights_hook(self)

        if self.neuron_config.skip_sharding:
            logger.info("Pre-sharding the checkpoints is forced to be SKIPPED with skip_sharding.")
        elif not self.neuron_config.save_sharded_checkpoint:
            logger.info(
                "SKIPPING pre-sharding the checkpoints. The checkpoints will be sharded during load time."
            )
        else:
            logger.info("Pre-sharding checkpoints.")
            from safetensors.torch import save_file

            os.makedirs(sharded_checkpoint_dir, exist_ok=True)
            model_sd = self.checkpoint_loader_fn()
            world = self.neuron_config.world_size
            split = sorted(k for k, v in model_sd.items() if v.dim() >= 1 and v.shape[0] >= world)
            for rank in range(world):
                shard = {k: (v.tensor_split(world, dim=0)[rank] if k in split else v).contiguous().clone()
                         for k, v in model_sd.items()}
                save_file(shard, os.path.join(sharded_checkpoint_dir, f"tp{rank}_sharded_checkpoint.safetensors"),
                          metadata={"world_size": str(world), "rank": str(rank), "split": json.dumps(split)})

    def compile(self, compiled_model_path, debug=False, pre_shard_weights_hook=None, dry_run=False):
        """Compiles this model and saves it to the given path."""
        compiled_model_path = normalize_path(compiled_model_path)

        self.config.save(compiled_model_path)
        logger.info(f"Saving the neuron_config to {compiled_model_path}")
        contract.record("nxdi.compile", path=compiled_model_path, dry_run=dry_run)

        check_continuous_batching(self.neuron_config)  # tracing asserts it (stand-in: _continuous_batching.py)
        traced_model = self._trace()

        if dry_run:
            return

        torch.jit.save(traced_model, compiled_model_path + COMPILED_MODEL_FILE_NAME)
        del traced_model

        self.shard_weights(compiled_model_path, debug, pre_shard_weights_hook)
        self.is_compiled = True

    # -- load ---------------------------------------------------------------------------------------
    def load(
        self, compiled_model_path, start_rank_id=None, local_ranks_size=None, skip_warmup=False
    ):
        compiled_model_path = normalize_path(compiled_model_path)

        """Loads the compiled model checkpoint to the Neuron device."""
        self.traced_model = torch.jit.load(compiled_model_path + COMPILED_MODEL_FILE_NAME)

        self.load_weights(
            compiled_model_path, start_rank_id=start_rank_id, local_ranks_size=local_ranks_size
        )

        if self.neuron_config.torch_dtype != torch.float32:
            self.to(self.neuron_config.torch_dtype)

        for model_wrapper in self.models:
            model_wrapper.model = self.traced_model
        self.is_loaded_to_neuron = True
        contract.record("nxdi.load", path=compiled_model_path)

        if not self.neuron_config.skip_warmup and not skip_warmup:
            self.warmup()
        else:
            logger.info("Skipping model warmup")

    def warmup(self):
        """The release runs each graph once on example inputs; nothing a user sees (stand-in: a no-op)."""
        logger.info("Warming up the model.")
        start_time = time.time()
        logger.info(f"Warmup completed in {time.time() - start_time} seconds.")

    def load_weights(self, compiled_model_path, start_rank_id=None, local_ranks_size=None):
        from neuronx_distributed_inference._continuous_batching import SlotRuntime
        from neuronx_distributed_inference._reference import ReferenceRuntime

        # continuous batching computes on KV-cache slots (stand-in: _continuous_batching.py)
        runtime_cls = SlotRuntime if self.neuron_config.is_continuous_batching else ReferenceRuntime

        compiled_model_path = normalize_path(compiled_model_path)

        """Loads the model weights to the Neuron device."""
        if self.traced_model is None:
            raise ValueError("Model is not loaded")

        if start_rank_id is None:
            start_rank_id = self.neuron_config.start_rank_id
        if local_ranks_size is None:
            local_ranks_size = self.neuron_config.local_ranks_size

        start_time = time.monotonic()
        if self.neuron_config.save_sharded_checkpoint:
            from safetensors import safe_open
            from safetensors.torch import load_file

            logger.info(
                f"Loading presharded checkpoints for ranks: {start_rank_id}...{start_rank_id + local_ranks_size - 1}"
            )
            files = {}
            for rank in range(start_rank_id, start_rank_id + local_ranks_size):
                files[rank] = load_file(os.path.join(
                    compiled_model_path, f"weights/tp{rank}_sharded_checkpoint.safetensors"))
            # The stand-in computes every rank in this process: it needs the other ranks' shards too.
            for rank in range(self.neuron_config.world_size):
                if rank not in files:
                    files[rank] = load_file(os.path.join(
                        compiled_model_path, f"weights/tp{rank}_sharded_checkpoint.safetensors"))
            ranks = [files[r] for r in sorted(files)]
            with safe_open(os.path.join(compiled_model_path, "weights/tp0_sharded_checkpoint.safetensors"),
                           framework="pt") as fh:
                split = set(json.loads((fh.metadata() or {}).get("split", "[]")))
            model_sd = {k: (torch.cat([f[k] for f in ranks]) if k in split else ranks[0][k]) for k in ranks[0]}
            self._runtime = runtime_cls(self, state_dict=model_sd)
        else:
            logger.info("Sharding weights on load...")
            self._runtime = runtime_cls(self, quantized_state_dict=self._checkpoint_for_load())

        logger.info(f"Finished weights loading in {time.monotonic() - start_time} seconds")

    def _checkpoint_for_load(self):
        """checkpoint_loader_fn's result when it is the quantized checkpoint, else None (the reference engine
        then reads the checkpoint at model_path itself)."""
        if self.config.neuron_config.quantized or self.config.neuron_config.enable_fused_speculation:
            return self.checkpoint_loader_fn()
        model_path = getattr(self.config, "_name_or_path", None)
        if model_path is None or not os.path.exists(model_path):
            model_path = self.model_path
        # The release reads the checkpoint here (modules/checkpoint.py load_state_dict); the engine reads it later.
        if not any(f.endswith((".safetensors", ".bin")) for f in os.listdir(model_path)):
            raise FileNotFoundError(f"Can not find model.safetensors or pytorch_model.bin in {model_path}")
        return None

    def checkpoint_loader_fn(self, mmap: bool = False):
        """This function loads the model's state dictionary and weights from the hf model"""

        model_path = getattr(self.config, "_name_or_path", None)
        if model_path is None or not os.path.exists(model_path):
            model_path = self.model_path

        if self.config.neuron_config.quantized:
            existing_checkpoint_path = self.config.neuron_config.quantized_checkpoints_path
            if not os.path.exists(existing_checkpoint_path):
                raise FileNotFoundError(
                    f"Quantized checkpoint file not found: {existing_checkpoint_path}"
                )
            model_path = existing_checkpoint_path

        if self.config.neuron_config.enable_fused_speculation:
            raise NotImplementedError("stand-in: fused speculation (enable_fused_speculation) is not transcribed")
        model_sd = self.get_state_dict(model_path, self.config)

        if (
            self.neuron_config.torch_dtype != torch.float32
            and self.neuron_config.cast_type == "config"
        ):
            for name, param in model_sd.items():
                if torch.is_floating_point(param) and param.dtype not in [torch.float8_e4m3fn]:
                    current_dtype = self.neuron_config.torch_dtype
                    if name.endswith("scale"):
                        pass  # the release warns "Found {dtype} scales, skip converting to {dtype}"
                    elif param.dtype != current_dtype:
                        model_sd[name] = param.to(current_dtype)

        return model_sd

    @classmethod
    def get_state_dict(cls, model_name_or_path: str, config: InferenceConfig) -> dict:
        """Gets the state dict for this model."""
        if os.path.isdir(model_name_or_path):
            model_sd = load_state_dict(model_name_or_path)
        elif os.path.isfile(model_name_or_path):
            model_sd = torch.load(model_name_or_path)
        else:
            raise NotImplementedError("stand-in: model names are not resolved (nothing is downloaded)")

        param_name_list = list(model_sd.keys())
        for param_name in param_name_list:
            updated_param_name = param_name
            if param_name.startswith(cls._STATE_DICT_MODEL_PREFIX):
                updated_param_name = param_name.replace(
                    cls._STATE_DICT_MODEL_PREFIX, cls._NEW_STATE_DICT_MODEL_PREFIX, 1
                )
            if param_name.endswith(".weight_scale"):
                updated_param_name = updated_param_name.replace(".weight_scale", ".scale")
            if updated_param_name != param_name:
                model_sd[updated_param_name] = model_sd[param_name]
                del model_sd[param_name]

        if config.neuron_config.is_medusa:
            raise NotImplementedError("stand-in: Medusa heads are not transcribed")

        model_sd = cls.convert_hf_to_neuron_state_dict(model_sd, config)
        if getattr(config, "tie_word_embeddings", False):
            cls.update_state_dict_for_tied_weights(model_sd)

        return model_sd

    @staticmethod
    def convert_hf_to_neuron_state_dict(state_dict: dict, config: InferenceConfig) -> dict:
        """This function should be over-ridden in child classes as needed"""
        return state_dict

    # -- quantization -------------------------------------------------------------------------------
    @classmethod
    def save_quantized_state_dict(cls, model_path: str, config: InferenceConfig):
        """
        Quantize the model and save the quantized checkpoint to `config.neuron_config.quantized_checkpoints_path`.
        """
        model_path = normalize_path(model_path)
        if config.neuron_config.quantized_checkpoints_path is None:
            # The release fails inside torch.save / os.path.isdir with a TypeError on None.
            raise contract.ContractError("save_quantized_state_dict needs neuron_config.quantized_checkpoints_path")
        quantized_state_dict = cls.generate_quantized_state_dict(model_path, config)

        quantized_state_dict = prune_state_dict(quantized_state_dict)
        if os.path.isdir(config.neuron_config.quantized_checkpoints_path):
            logger.info(
                "Saving quantized state dict as safetensors to: %s",
                config.neuron_config.quantized_checkpoints_path,
            )
            save_state_dict_safetensors(
                state_dict=quantized_state_dict,
                state_dict_dir=config.neuron_config.quantized_checkpoints_path,
            )
        else:
            logger.info(
                "Saving quantized state dict as torch pt file to: %s",
                config.neuron_config.quantized_checkpoints_path,
            )
            torch.save(quantized_state_dict, config.neuron_config.quantized_checkpoints_path)
        contract.record("nxdi.save_quantized_state_dict", model_path=str(model_path),
                        target=str(config.neuron_config.quantized_checkpoints_path))

    @classmethod
    def generate_quantized_state_dict(cls, model_path: str, config: InferenceConfig) -> dict:
        """Generates the quantized state dict for this model.

        The release loads the HF model and runs neuronx-distributed's quantize_pytorch_model_per_tensor_symmetric
        / _per_channel_symmetric on every nn.Linear (``modules_to_not_convert`` honoured for per-channel). The
        stand-in quantizes the decoder projections (q/k/v/o, gate/up/down) with helpers.engine.quant's transcription of
        those observers (per-tensor absmax/127.5, per-channel absmax/127, int8) and keeps the rest in float;
        ``lm_head`` stays float (on a tied-embedding model the release's loader replaces it with the embedding
        anyway).
        """
        from neuronx_distributed_inference._reference import quantize_state_dict

        quantization_types = ("per_tensor_symmetric", "per_channel_symmetric", "blockwise_symmetric",
                              "expert_wise_per_channel_symmetric")
        if config.neuron_config.quantization_type not in quantization_types:  # QuantizationType(...)
            raise ValueError(f"'{config.neuron_config.quantization_type}' is not a valid QuantizationType")
        if config.neuron_config.quantization_type not in ("per_tensor_symmetric", "per_channel_symmetric"):
            raise RuntimeError(f"{config.neuron_config.quantization_type} not supported")
        return quantize_state_dict(model_path, config)

    @staticmethod
    def load_hf_model(model_path):
        raise NotImplementedError("load_hf_model is not implemented")

    @staticmethod
    def update_state_dict_for_tied_weights(state_dict):
        raise NotImplementedError("State-dict update not implemented")

    @property
    def device(self) -> torch.device:
        # We don't want HF to move parameters to device
        return torch.device("cpu")

    def reset(self):
        """Resets the model state. Can be implemented by subclasses."""
        pass
