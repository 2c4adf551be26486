"""The reference engine: a Neuron-compiled causal LM mirrored in plain PyTorch (gpt-fast style).

Layer: above ``helpers.planning`` and ``helpers.model_store``; imports nothing above.

- ``config``: the architecture (``ModelArgs``) and the compile-time settings (``NeuronConfig``)
- ``weights``: one rank's weights: fused, cast, sharded over tp as the GQA layout says
- ``kv_cache``, ``model``: the fixed-shape KV cache; ``Transformer``, one rank's forward, and ``TorchOps``
- ``cpu``: the CPU speed layer (kernels and their choice, C ops, huge pages), the model's ops for f32 on CPU
- ``quant``: int8 / fp8 weight storage
- ``sampling``: token selection and the defaults of ``sample()``
- ``generation``: ``CausalLM``: buckets, one graph per bucket, ``forward``, ``generate``, ``sample``
- ``speculative``: draft + target with k-token verification
"""
