"""neuronx_distributed_inference/modules/generation/sampling.py at aws-neuron/neuronx-distributed-inference
cd3abf3 (SDK 2.28.0): the host-side (``on_cpu``) path of ``Sampler`` that ``HuggingFaceGenerationAdapter._sample``
builds when no on-device sampling is configured, plus prepare_sampling_params / validate_sampling_params /
infer_sampling_params. The device paths (nxd_topk, nki cumsum, XLA rand) are not transcribed: a Sampler with
``on_cpu`` False raises.

Note what the release does with it: the adapter builds one Sampler on its first ``generate`` call and keeps it
(``self.sampler``), so the ``do_sample`` and ``top_k`` of that first call stick for the adapter's lifetime.
"""
import logging
from typing import Any, Dict, Union

import torch

from neuronx_distributed_inference.models.config import NeuronConfig, OnDeviceSamplingConfig

logger = logging.getLogger("Neuron")


def cumsum(tensor_in, dim, on_cpu: False):
    if on_cpu:
        logger.debug("On CPU, using torch cumsum")
        return torch.cumsum(tensor_in, dim=dim)
    raise NotImplementedError("stand-in: the on-device (NKI / matmul) cumsum is not transcribed")


def validate_sampling_params(
    params: torch.Tensor, on_device_sampling_config: Union[Dict[str, Any], OnDeviceSamplingConfig]
) -> None:
    if params.shape[1] != 3:
        raise ValueError(f"Expected tensor of shape (batch_size, 3), but got {params.shape}")

    params = params.to(torch.float32)
    top_k, top_p, temperature = params[:, 0], params[:, 1], params[:, 2]

    if isinstance(on_device_sampling_config, OnDeviceSamplingConfig):
        global_top_k = on_device_sampling_config.global_topk
    else:
        global_top_k = on_device_sampling_config["global_topk"]

    valid_top_k = (top_k == -1) | ((top_k >= 0) & (top_k <= global_top_k))
    if not torch.all(valid_top_k):
        raise ValueError(
            f"Invalid top-k values found. top-k must be -1 or greater than 0 but less than or equal to {global_top_k=}. Found {top_k=}."
        )
    if torch.any(top_k == -1) or torch.any(top_k == 0):
        logger.warning("In NxDI, top_k = -1 or top_k = 0 means randomly picking a token from the vocabulary with a uniform distribution.")

    if not torch.equal(top_k, top_k.floor()):
        raise ValueError(
            f"Invalid top-k values found. top-k values should be able to be represented as integer values, but found decimal parts. Found {top_k=}."
        )

    valid_top_p = (top_p > 0.0) & (top_p <= 1.0)
    if not torch.all(valid_top_p):
        raise ValueError(
            f"Invalid top-p values found. top-p must be in the range (0.0, 1.0]. Found {top_p=}."
        )

    valid_temp = temperature >= 0.0
    if not torch.all(valid_temp):
        raise ValueError(
            f"Invalid temperature values found. Temperature must be greater than or equal to 0.0. Found {temperature=}."
        )
    invalid_combination = (temperature == 0.0) & ((top_k == -1) | (top_k == 0))
    if torch.any(invalid_combination):
        raise ValueError(
            "Invalid sampling parameters found. Temperature = 0 enables greedy sampling. Please set top_k to 1"
        )


def infer_sampling_params(params: torch.Tensor) -> None:
    bsz = params.shape[0]
    for i in range(bsz):
        temperature = params[i, 2]
        if temperature == 0:
            logger.warning("Temperature = 0 enables greedy sampling. Resetting top_k and top_p values to 1.")
            params[i, 0] = 1
            params[i, 1] = 1
    return params


def prepare_sampling_params(batch_size, top_k=[1], top_p=[1.0], temperature=[1.0]):
    top_k = prepare_tensor(top_k)
    top_p = prepare_tensor(top_p)
    temperature = prepare_tensor(temperature)

    assert (
        top_k.shape[0] == top_p.shape[0] == temperature.shape[0]
    ), f"sampling params shapes don't match. \
        Got top_k shape: {top_k.shape}, top_p shape: {top_p.shape}, temperature shape: {temperature.shape}"

    if top_k.shape[0] == 1:
        top_k = top_k.broadcast_to(batch_size)
        top_p = top_p.broadcast_to(batch_size)
        temperature = temperature.broadcast_to(batch_size)
    stacked = torch.stack([top_k, top_p, temperature], dim=1)
    return stacked


def prepare_tensor(val: Union[torch.Tensor, list, float]):
    if not torch.is_tensor(val):
        if not isinstance(val, list):
            val = [val]
        val = torch.tensor(val)
    return val


class Sampler(torch.nn.Module):
    """Use this to implement sampling techniques (host path: ``neuron_config.on_cpu``)."""

    def __init__(self, neuron_config: NeuronConfig, do_sample=None):
        super().__init__()
        self.on_device_sampling = neuron_config.on_device_sampling_config is not None

        assert self.on_device_sampling, "on device configs is not initialized"

        if hasattr(neuron_config, "is_medusa"):
            self.is_medusa = neuron_config.is_medusa
        else:
            self.is_medusa = False

        self.neuron_config = neuron_config
        self.do_sample = (
            do_sample
            if do_sample is not None
            else neuron_config.on_device_sampling_config.do_sample
        )
        self.dynamic = neuron_config.on_device_sampling_config.dynamic
        self.deterministic = neuron_config.on_device_sampling_config.deterministic
        self.global_topk = neuron_config.on_device_sampling_config.global_topk
        self.top_k_kernel_enabled = neuron_config.on_device_sampling_config.top_k_kernel_enabled
        self.IGNORED_LOGITS_VALUE = -3000
        self.process_group = None

    def _soft_max(self, logits, dim):
        return torch.nn.functional.softmax(input=logits, dim=dim)

    def _require_cpu(self):
        if not self.neuron_config.on_cpu:
            raise NotImplementedError("stand-in: only the host (on_cpu) sampler is transcribed")

    def _top_k_masked(self, logits, top_k, dim, rank_id):
        self._require_cpu()
        if self.global_topk > 0:
            sorted_logits, indices = torch.topk(input=logits, k=self.global_topk, dim=dim)
        else:
            sorted_logits, indices = torch.sort(input=logits, dim=dim, descending=True)
        vocab_size = sorted_logits.shape[-1]
        mask = torch.arange(vocab_size, device=logits.device)
        mask = mask.broadcast_to(*sorted_logits.shape)
        mask = torch.greater_equal(mask, top_k)
        sorted_logits = sorted_logits.masked_fill_(mask, self.IGNORED_LOGITS_VALUE)
        return sorted_logits, indices

    def _rand_selector(self, probs_cumsum, num_samples=1):
        if probs_cumsum.dim() == 3:
            shape = (probs_cumsum.shape[0], 1, num_samples)
        else:
            shape = (probs_cumsum.shape[0], num_samples)

        if self.deterministic:
            rand_selector = torch.full(shape, 0.5, device=probs_cumsum.device)
        else:
            self._require_cpu()
            zeros = torch.zeros(shape, device=probs_cumsum.device, dtype=probs_cumsum.dtype)
            rand_selector = torch.rand_like(zeros)
        return rand_selector

    def _multinomial(self, probs, dim, num_samples=1):
        probs_cumsum = cumsum(tensor_in=probs, dim=dim, on_cpu=self.neuron_config.on_cpu)
        probs_cumsum = probs_cumsum / probs_cumsum[..., -1:]
        probs_cumsum[..., -1:] = 1
        rand_selector = self._rand_selector(probs_cumsum, num_samples)
        greater_than_rand = torch.greater(rand_selector, probs_cumsum)
        counts = torch.sum(greater_than_rand, dim=dim).unsqueeze(dim)
        return counts

    def _argmax_sample(self, token_logits, return_values, dim):
        self._require_cpu()
        return torch.argmax(token_logits, dim=dim)

    def _multinomial_sample(self, token_logits, sampling_params, return_values, dim, rank_id):
        batch_size = token_logits.shape[0]
        top_k = sampling_params[:, 0]
        top_p = sampling_params[:, 1]
        temperature = sampling_params[:, 2]

        if token_logits.dim() == 3:
            sampling_param_shape = (batch_size, 1, 1)
        else:
            sampling_param_shape = (batch_size, 1)
        top_k = top_k.reshape(*sampling_param_shape)
        top_p = top_p.reshape(*sampling_param_shape)
        temperature = temperature.reshape(*sampling_param_shape)
        top_k_logits_values, top_k_logits_indices = self._top_k_masked(token_logits, top_k, dim, rank_id)
        top_k = top_k[:top_k_logits_values.shape[0], ...]
        top_p = top_p[:top_k_logits_values.shape[0], ...]
        temperature = temperature[:top_k_logits_values.shape[0], ...]
        if self.is_medusa:
            return top_k_logits_indices
        if self.dynamic or torch.any(temperature != 1.0):
            top_k_logits_values = torch.divide(top_k_logits_values, temperature)

        if self.dynamic or torch.any(top_p < 1.0):
            probs_soft_max = self._soft_max(top_k_logits_values, dim)
            probs_cumsum = cumsum(tensor_in=probs_soft_max, dim=dim, on_cpu=self.neuron_config.on_cpu)
            top_p = torch.max(torch.min(probs_cumsum), top_p)
            top_p_mask = torch.greater(probs_cumsum, top_p).index_fill_(
                dim, torch.tensor([0], device=top_p.device), False
            )
            top_k_logits_values = top_k_logits_values.masked_fill_(top_p_mask, self.IGNORED_LOGITS_VALUE)

        probs_soft_max = self._soft_max(top_k_logits_values, dim)
        if return_values:
            return top_k_logits_indices, probs_soft_max

        counts = self._multinomial(probs_soft_max, dim)
        return torch.gather(input=top_k_logits_indices, dim=dim, index=counts).flatten()

    def forward(self, token_logits, sampling_params, return_values=False, rank_id=None):
        dim = len(token_logits.shape) - 1  # vocab_size dimension

        if self.do_sample or self.dynamic or self.is_medusa:
            return self._multinomial_sample(token_logits, sampling_params, return_values, dim, rank_id)
        else:
            return self._argmax_sample(token_logits, return_values, dim)
