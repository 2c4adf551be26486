"""Serving: many requests through one compiled model (continuous batching over KV-cache slots, the schedulers
that replay traffic through it; prefix caching over a block KV cache).

Layer: above ``helpers.engine`` and ``helpers.planning``, below ``helpers.notebook``; imports nothing above.

- ``slots``: ``SlotModel``: the engine with n KV-cache slots, context encoding per slot, decode over all slots
- ``traffic``: sampled requests (Poisson arrivals, mixed prompt and output lengths)
- ``scheduler``: static vs continuous batching on the serving clock; the run-alone oracle
- ``blocks``: the block pool (fixed-size KV blocks, block tables, prefix reuse by chained block hash)
- ``prefix``: the engine over the block pool (prefill computes only the uncached suffix), prefix traffic
"""
from .scheduler import RunResult, run_alone, run_continuous, run_static
from .slots import SlotModel, build_slot_model
from .traffic import Request, sample_traffic

__all__ = ["SlotModel", "build_slot_model", "Request", "sample_traffic", "RunResult", "run_continuous",
           "run_static", "run_alone"]
