"""The host's time in a serving iteration, as an engine runs it (``engine`` and ``cuda_graphs`` of a
pool; :mod:`marssim.cost.engine_host` for the figures and their sources).

Per iteration of ``b`` sequences, the engine's host

* does its CPU work ``C(b)``: scheduling, enqueuing the inputs, enqueuing the sampler, processing
  the outputs, each stage ``per_step + per_seq x b`` (the measured host-overhead table the
  engine's ``host_stack`` names; one GPU or several);
* launches the forward pass's ``K`` kernels: one CUDA graph when ``cuda_graphs`` is on, the
  iteration decodes only and ``b`` fits a captured size (``graph_launch_per_kernel x K``), else
  one launch per kernel (the host table's launch per kernel ``x K``). The GPU runs a kernel as
  soon as it is launched, so the forward takes ``F = max(G, L)`` for the GPU's time ``G`` and
  the launches' ``L``.

Without overlap the iteration takes ``C(b) + F``; with it (vLLM's async scheduling, SGLang's and
TensorRT-LLM's overlap schedulers) the CPU work of the next iteration runs while the GPU runs
this one, so an iteration takes ``max(G, C(b) + L)``: the host is hidden under a longer GPU
step. ``K`` counts the kernels of the first pipeline stage (every op of its blocks, the KV-cache
write with prefill tokens, the embedding, the head on the last, and two all-reduces per block
with tensor parallelism); the host time falls on the first stage, the later stages' hosts are
taken to keep up. ``engine=none`` (the default) models no host: the iteration is the GPU's time,
exactly.

Units: seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from marssim.cost.engine_host import EngineSpec, StageFit, cpu_fits, engine_spec

__all__ = ["HostParts", "HostTime", "host_time", "shape_sequences"]


@dataclass(frozen=True)
class HostParts:
    """The host's work in one iteration: ``cpu`` and ``launch`` in s; ``graph``: whether the
    forward is one CUDA-graph replay."""

    cpu: float
    launch: float
    graph: bool


class HostTime:
    """An engine's host time per iteration of a replica (see the module docstring)."""

    def __init__(self, spec: EngineSpec, cuda_graphs: bool, fits: tuple[StageFit, ...], eager_launch: float,
                 kernels: tuple[int, int]) -> None:
        """``fits``: the CPU stages; ``eager_launch``: s per kernel launched one by one;
        ``kernels``: the first stage's kernels of a decode-only iteration and of one with prefill
        tokens."""
        self.spec = spec
        self.cuda_graphs = cuda_graphs
        self.fits = fits
        self.eager_launch = eager_launch
        self.kernels = kernels
        self._memo: dict[tuple[int, bool], HostParts] = {}

    def parts(self, seqs: int, decode_only: bool) -> HostParts:
        """The host's CPU and launch seconds for an iteration of ``seqs`` sequences."""
        key = (seqs, decode_only)
        hit = self._memo.get(key)
        if hit is None:
            cpu = sum(f.seconds(seqs) for f in self.fits)
            graph = self.cuda_graphs and decode_only and self.spec.graph_fits(seqs)
            k = self.kernels[0] if decode_only else self.kernels[1]
            launch = k * (self.spec.graph_launch_per_kernel if graph else self.eager_launch)
            hit = self._memo[key] = HostParts(cpu, launch, graph)
        return hit

    def step(self, gpu: float, seqs: int, decode_only: bool) -> float:
        """Seconds of an iteration whose GPU work takes ``gpu`` s on the first stage."""
        p = self.parts(seqs, decode_only)
        if self.spec.overlap:
            return max(gpu, p.cpu + p.launch)
        return p.cpu + max(gpu, p.launch)


def host_time(engine: str, cuda_graphs: bool, im, overlap: bool | None = None) -> HostTime | None:
    """The :class:`HostTime` of a replica timed by ``im`` (an
    :class:`~.itermodel.IterationModel`) under ``engine``, overlapping its host work with the GPU
    as the engine does or as ``overlap`` says; None for ``none``."""
    if engine == "none":
        return None
    from dataclasses import replace

    from marssim.parallel.host import launch_seconds

    spec = engine_spec(engine)
    if overlap is not None:
        spec = replace(spec, overlap=overlap)
    fits = cpu_fits(spec.host_device, spec.host_stack, im.tp > 1)
    eager = launch_seconds(spec.host_device, spec.host_stack)
    return HostTime(spec, cuda_graphs, fits, eager, (im.kernels(0, False), im.kernels(0, True)))


def shape_sequences(shape: tuple) -> tuple[int, bool]:
    """``(sequences, decodes only)`` of an iteration of ``shape`` (the arguments of
    :meth:`~.itermodel.IterationModel.stage_times`)."""
    _, _, groups, decodes, _, _ = shape
    prefills = sum(count for count, _, _ in groups)
    return decodes + prefills, prefills == 0
