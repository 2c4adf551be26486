"""The CPU speed layer: what makes an f32 step on CPU cost what its weights' bytes cost, behind one seam, the ops
object the model runs with (``ops``: ``use_cpu``, ``CpuOps``, ``FusedOps``).

- ``kernels``: the matmul kernels per shape family (one row, a few rows, prefill) and ``CpuWeight``, a weight that
  runs them
- ``kernel_choice``: which kernel runs each family, timed once per machine kind and kept; a saved model's check
- ``stream_kernel``: the "stream" matmul (``csrc/stream_linear.c``): a few rows at the cost of one
- ``fused_ops``: RMSNorm, RoPE, attention and SwiGLU in C (``csrc/decode_ops.c``)
- ``clib``: the C library, built on first use with the system compiler
- ``hugepages``: one allocation for the weights, on transparent huge pages where Linux offers them
"""
