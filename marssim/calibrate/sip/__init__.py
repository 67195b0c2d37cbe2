"""SIP: stochastic perturbation of GPU kernels' native SASS instruction schedules.

Modules, in data-flow order:

* :mod:`.cubin` — read a cubin (ELF), its kernels' 128-bit instruction words, ``.nv.info``
  attributes and relocations; rewrite a kernel's ``.text`` as a permutation of its words.
* :mod:`.encoding` — control-code fields (stall, yield, scoreboards, wait mask, reuse), guard
  predicate, opcode and register fields of Volta-to-Hopper encodings.
* :mod:`.sass` — ``nvdisasm`` listings as instructions (operands, registers read and written,
  memory access, latency class) and basic blocks.
* :mod:`.deps` — whether two adjacent instructions may swap.
* :mod:`.perturb` — SIP's memory-instruction move and the general swap; patching and the
  ``nvdisasm`` round trip.
* :mod:`.anneal` — simulated annealing with an injected timer and checker.
* :mod:`.schedule_file` — tuned schedules that re-apply to the same cubin, with provenance.
* :mod:`.kernels` / :mod:`.triton_kernels` — the Triton kernels tuned (GEMM + LeakyReLU, fused
  attention forward) with launch plans; :mod:`.gpu` — cuda-python loading, launching and timing;
  :mod:`.tune` — the GPU tuning run; :mod:`.calibration` — timings as calibration-table rows.

Only :mod:`.gpu`, :mod:`.tune` (at run time) and :mod:`.triton_kernels` need the ``[gpu]`` extra.
"""
