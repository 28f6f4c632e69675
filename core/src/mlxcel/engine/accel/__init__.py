"""Device speed: paths that make one backend faster and leave the results as they were.

Masked decode attention for padded batches (``attention``, with the CUDA kernel in
``varlen_attention`` and the CPU softmax in ``cpu_attention``), fused projections
(``fused_proj``), OpenBLAS threads on MLX's CPU device (``cpu_blas``) and CUDA's start-up
warm-up (``warmup``). Which of them run is the ``EnginePolicy``'s choice
(``mlxcel.engine.policy``); nothing here changes what a model computes, only how fast.
"""
