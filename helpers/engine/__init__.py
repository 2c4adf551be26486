"""The reference engine: a Neuron-compiled causal LM mirrored in plain PyTorch (gpt-fast style).

Layer: above ``helpers.planning`` and ``helpers.model_store``; imports nothing above.

- ``config``: the architecture (``ModelArgs``) and the compile-time settings (``NeuronConfig``)
- ``weights``: one rank's weights: fused, cast, sharded over tp as the GQA layout says
- ``model``: ``Transformer``, one rank's forward over a fixed-shape KV cache, and ``TorchOps``, the ops it runs
  between its matmuls
- ``cpu``: the CPU speed layer (matmul kernels and their choice, ops in C, huge pages), handed to the model as its
  ops object for f32 steps on CPU
- ``quant``: int8 / fp8 weight storage
- ``sampling``, ``streaming``, ``stopping``: token selection and the defaults of ``sample()``; the streamer and
  stopping-criteria contracts (one token recorder, the transformers-neuronx #75 workaround)
- ``generation``: ``CausalLM``: buckets, one graph per bucket, ``forward``, ``sample``
- ``speculative``: draft + target with k-token verification, and its analytic model

What the notebooks measure with it (step times, streaming latency, criteria runs, speculation sweeps and
distribution checks) is on the notebook floor, ``helpers.notebook``.
"""
