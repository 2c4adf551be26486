"""transformers_neuronx/stopping_criteria.py (v0.13.0)."""
import time
from abc import ABC


class StoppingCriteria(ABC):
    def __call__(self, input_ids, scores, **kwargs) -> bool:
        raise NotImplementedError


class MaxTimeCriteria(StoppingCriteria):
    def __init__(self, max_time: float, initial_timestamp=None):
        self.max_time = max_time
        self.initial_timestamp = time.time() if initial_timestamp is None else initial_timestamp

    def __call__(self, input_ids, scores, **kwargs) -> bool:
        return time.time() - self.initial_timestamp > self.max_time


class StoppingCriteriaList(list):
    def __call__(self, input_ids, scores, **kwargs) -> bool:
        return any(criteria(input_ids, scores) for criteria in self)
