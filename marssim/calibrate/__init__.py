"""GPU calibration: measured kernel timings for the calibrated cost models, and ``sip``
(stochastic instruction perturbation of native SASS schedules).

Modules of the measurement harness (``marssim calibrate``), in data-flow order:

* :mod:`.grid` -- the kernel shapes to time: the zoo's layer shapes plus a sweep around them,
  the time estimate and its split into chunks (pure, no GPU);
* :mod:`.llm` -- the LLM grid: the shards the parallel lowering times for GPT-3 and Llama-3
  layers (training, prefill, decode; unfused and fused attention) at tensor-parallel degrees
  1-8 (pure, no GPU);
* :mod:`.kernels` -- the kernel timed for each kind (cuBLAS, the SIP package's Triton GEMM,
  cuDNN, PyTorch's own kernels, fused attention), built with random inputs; the LLM ops' in
  :mod:`.llm_kernels` (gradient GEMMs, grouped-query products, scaled-dot-product attention per
  backend, norm and activation gradients, AdamW);
* :mod:`.harness` -- CUDA-event timing with the L2 flushed before every repetition, device
  and library provenance, progress, resumable runs (needs torch and a GPU);
* :mod:`.fitting` -- the efficiency-curve fit (with its local residual correction) of a table,
  its held-out error and ``.fit.json``;
* :mod:`.coverage` -- what a table covers, per kind and dtype and per workload layer.

Shared with :mod:`.sip`: :mod:`.table` (calibration rows, merging, device names),
:mod:`.stats` (median and IQR of timings), :mod:`.device` (``nvidia-smi``, torch's CUDA
status, library versions). Only :mod:`.harness` (at run time) and the Triton kernels need the
``[gpu]`` extra.
"""
