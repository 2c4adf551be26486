"""Tensor parallelism for the reference engine: one process per rank, real collectives.

Layer: above ``helpers.artifacts`` (and ``helpers.engine``, ``helpers.planning``, ``helpers.model_store``,
``helpers.prompts``); imports nothing above.

As in transformers-neuronx / NxD Inference (Megatron-style): q/k/v and gate/up are column-parallel,
o and down are row-parallel and followed by an all-reduce, the LM head is vocabulary-parallel (its
logits all-gathered); query heads are padded up to a multiple of ``tp_degree`` and KV heads replicated
or split as the chosen GQA strategy says (``helpers.planning.gqa``; the shards: ``helpers.engine.weights``).
Each rank is a separate process that holds only its shard and its own KV cache; collectives go through
``torch.distributed`` (gloo on CPU, nccl on CUDA with one GPU per rank).

``ParallelModel`` has ``NeuronModel``'s API (``from_pretrained``, ``to_neuron``, ``sample``, ``forward``,
``stats``, ``save``/``load``, ``compile``/``from_compiled``); the driver (your process) runs the sampling
loop and sends each fixed-shape step to the ranks. With ``NeuronConfig(compiled="export"|"aoti")`` each
rank builds its own graphs per bucket (``helpers.artifacts``: attention and MLP units cut at the
all-reduces, so a graph holds no collective) and saves / loads them under its rank's file names.
Ranks are started with ``torch.multiprocessing``; from the command line::

    python -m helpers.parallel --tp-degree 2 --max-new-tokens 16 --check

Modules: ``collectives`` (``DistComm``, ``ParallelTransformer``: the attention dataflows that exchange
data between ranks), ``ranks`` (a rank's server and the rank processes),
``model`` (``ParallelModel``, the driver), ``cli`` (the command line).
"""
from .model import ParallelModel

__all__ = ["ParallelModel"]
