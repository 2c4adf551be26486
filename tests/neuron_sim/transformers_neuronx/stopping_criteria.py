"""Stand-in of ``src/transformers_neuronx/stopping_criteria.py`` at aws-neuron/transformers-neuronx v0.13.0
(commit f4e3818), as is. ``sample()`` calls a StoppingCriteriaList with the *prompt* ids and the step's top-k
probabilities (sampling.py ``sample_loop_llama``; aws-neuron/transformers-neuronx#75)."""
import time
from abc import ABC
from typing import Optional

import torch


class StoppingCriteria(ABC):
    """Abstract base class for all stopping criteria that can be applied during generation."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> bool:

        raise NotImplementedError("StoppingCriteria needs to be subclassed")


class MaxTimeCriteria(StoppingCriteria):

    def __init__(self, max_time: float, initial_timestamp: Optional[float] = None):
        self.max_time = max_time
        self.initial_timestamp = time.time() if initial_timestamp is None else initial_timestamp

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> bool:
        return time.time() - self.initial_timestamp > self.max_time


class StoppingCriteriaList(list):
    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> bool:
        return any(criteria(input_ids, scores) for criteria in self)
