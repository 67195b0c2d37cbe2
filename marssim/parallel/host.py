"""Host launch gaps: where a GPU's kernels are shorter than the time the host takes to launch them,
the GPU waits for the host.

The model. The host (Python, PyTorch's dispatcher, the CUDA launch) spends ``launch`` seconds on
each kernel and issues the kernels of a stream in order; a kernel starts when the previous one has
ended and it has been issued. After a synchronisation the host issues the next kernel when the GPU
is idle. Megatron-LM synchronises at every exchange between pipeline stages
(``p2p_communication.py``, ``_communicate``: ``torch.cuda.synchronize()`` after
``batch_isend_irecv``) and twice in the optimizer step (``.item()`` of the inf/NaN flag and of the
gradient norm), so with pipeline parallelism each unit of the schedule (a model chunk's forward or
backward of one micro-batch) starts synchronised. :func:`launch_gaps` runs the recurrence over the
kernels of one unit from such a start and says by how much each kernel starts late. It is exact
when a synchronisation starts the unit and the GPU never waits for communication inside it (a
GPU waiting for a collective lets the host get ahead, which this ignores, so the gaps are then an
upper bound); without pipeline parallelism the units are not synchronised, and the first kernel of
each unit is charged one launch the host may have issued ahead. The lowering adds a kernel's gap
to its task (:mod:`.lower`): the GPU's stream is idle then, so a wait on the stream and a longer
kernel are the same to everything after it. Switch: ``host_gaps`` of the configuration.

The launch time per kernel: the measured host time of a serving engine's forward pass
(``traces/host-overheads/``: Vidur's profiles of sarathi-serve, ``model_execution_e2e``, median per
model, batch and tensor-parallel degree), over the kernels of that forward, layers x the operators
Vidur times per layer (``vidur/entities/execution_time.py``: norm, Q/K/V projection, rotary
embedding, KV-cache store, attention, output projection, norm, up projection, activation, down
projection, residual add: :data:`VIDUR_KERNELS_PER_LAYER`; two all-reduces more with tensor
parallelism). The median over the table's rows of a device and stack (A100, ``vidur-2024``: 1.35
us); a device and stack without host measurements have no gaps. Their decode forwards are long
next to their host time (GPU-bound), so the host time is the launch time of their kernels, with
nothing waited for; the framework is not Megatron-LM's, whose backward runs through autograd's
engine: an approximation where its kernels are short, nothing where they are long.

Units: seconds.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from functools import lru_cache

__all__ = ["VIDUR_KERNELS_PER_LAYER", "MODEL_LAYERS", "launch_seconds", "launch_gaps"]

VIDUR_KERNELS_PER_LAYER = 12
"""Kernels of one transformer layer in Vidur's time model (``vidur/entities/execution_time.py``,
``_get_block_execution_time``): input norm, Q/K/V projection, rotary embedding, KV-cache store,
attention, output projection, residual add, post-attention norm, up projection, activation, down
projection, residual add; with tensor parallelism the two all-reduces more."""

MODEL_LAYERS = {
    "meta-llama/Llama-2-7b-hf": 32, "meta-llama/Llama-2-70b-hf": 80, "meta-llama/Meta-Llama-3-8B": 32,
    "meta-llama/Meta-Llama-3-70B": 80, "microsoft/phi-2": 32, "internlm/internlm-20b": 60,
    "codellama/CodeLlama-34b-Instruct-hf": 48, "Qwen/Qwen-72B": 80,
}
"""Transformer layers of the models of the host-overhead table (``num_hidden_layers`` of each
model's ``config.json`` on the Hugging Face Hub; Qwen-72B's ``num_hidden_layers`` 80)."""


@lru_cache(maxsize=16)
def launch_seconds(device: str | None, stack: str | None) -> float:
    """Seconds the host takes to launch one kernel on ``device`` under ``stack`` (see the module
    docstring); 0 where the shipped host-overhead tables have no such measurement."""
    if not device:
        return 0.0
    from marssim.cost.engine_host import ENGINE_TABLE
    from marssim.cost.host_overheads import load_host_overheads
    from marssim.data import host_overheads

    per_kernel = []
    for path in sorted(host_overheads().glob("*.csv")):
        if path.name == ENGINE_TABLE:  # the engines' settings, not a per-device table
            continue
        for r in load_host_overheads(path):
            if r.device.lower() != device.lower() or (stack and r.stack != stack):
                continue
            if r.stage != "model_execution_e2e" or r.statistic != "median" or r.model not in MODEL_LAYERS:
                continue
            kernels = MODEL_LAYERS[r.model] * (VIDUR_KERNELS_PER_LAYER + (2 if r.tp > 1 else 0))
            per_kernel.append(r.seconds / kernels)
    return statistics.median(per_kernel) if per_kernel else 0.0


def launch_gaps(durations: Sequence[float], kernels: Sequence[int], launch: float) -> list[float]:
    """Per task of one unit (in stream order, ``durations`` s, each running ``kernels`` kernels,
    ``launch`` s to issue each): the seconds its kernels wait for the host, the unit starting
    synchronised (see the module docstring). A task's kernels share its duration evenly."""
    out = []
    host = gpu = 0.0
    for d, k in zip(durations, kernels):
        waited = 0.0
        each = d / k if k > 0 else 0.0
        for _ in range(max(0, k)):
            host += launch
            if host > gpu:
                waited += host - gpu
                gpu = host
            gpu += each
        if k <= 0:
            gpu += d
        out.append(waited)
    return out
