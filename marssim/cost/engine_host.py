"""What a serving engine's host does in an iteration, and how long it takes: the engines' settings
and published host-time figures (``traces/host-overheads/engines.csv``) and the per-stage CPU
times of the measured host-overhead tables (:mod:`.host_overheads`).

The engine table holds one value per row, each with its source (``source``, ``version``,
``file``, ``license``, ``date``, ``note``):

===========================  ===================================================================
quantity                     meaning
===========================  ===================================================================
``overlap``                  ``true``: the host prepares step ``n + 1`` while the GPU runs step
                             ``n`` (vLLM's async scheduling, SGLang's overlap scheduler,
                             TensorRT-LLM's overlap scheduler), ``false``: one after the other
``graph_max_batch``          the largest decode batch (sequences) with a captured CUDA graph
``graph_padding``            ``true``: a smaller batch is padded up to the next captured size
                             (every batch up to ``graph_max_batch`` replays a graph);
                             ``false``: only the sizes of ``graph_sizes`` do
``graph_sizes``              the captured sizes, ``1-32 64 128`` (ranges and single sizes)
``graph_launch_per_kernel``  host seconds of the graph's launch per kernel (node) it replays
``host_stack``               ``DEVICE/stack`` of the host-overhead table whose per-stage CPU times
                             the engine's iteration takes (``A100/vidur-2024``)
===========================  ===================================================================

The per-stage CPU times: for each stage of :data:`CPU_STAGES` (scheduling, enqueuing the inputs,
enqueuing the sampler, processing the outputs: the host's own work, the ``*_launch`` stages
rather than ``*_e2e``, which add the GPU's time the cost model already counts) a line
``per_step + per_seq x sequences`` fitted by least squares to the table's median rows of the
device and stack, separately for one GPU (``tp = 1``) and several (``tp > 1``: the inputs are
broadcast to the workers). The eager launch of one kernel: the forward pass's host time per
kernel of the same table (:func:`marssim.parallel.host.launch_seconds`).

NVIDIA's AIConfigurator (``aiconfigurator_core`` 0.12.0, Apache-2.0) carries no decode-step host
time (its generation kernels are timed under CUDA-graph replay); its one host constant is vLLM's
per-request prefill dispatch, ``0.8 ms`` per layer added to the time to first token, fitted to its
silicon corpus (``sdk/backends/vllm_backend.py``, ``_prefill_dispatch_overhead_ms``), which this
module does not take: it is a correction of whole requests, not a measured stage of an iteration.

Units: seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from marssim.csvio import read_commented_table
from marssim.errors import InputError

__all__ = [
    "CPU_STAGES",
    "ENGINES",
    "ENGINE_COLUMNS",
    "ENGINE_TABLE",
    "QUANTITIES",
    "EngineRow",
    "EngineSpec",
    "StageFit",
    "cpu_fits",
    "engine_spec",
    "engine_specs",
    "load_engine_table",
    "parse_sizes",
]

ENGINE_TABLE = "engines.csv"
"""File name of the engine table in ``traces/host-overheads/`` (not a per-device host-overhead table)."""
ENGINES = ("vllm", "sglang", "trtllm")
ENGINE_COLUMNS = ("engine", "quantity", "value", "unit", "source", "version", "file", "license", "date", "note")
QUANTITIES = ("overlap", "graph_max_batch", "graph_padding", "graph_sizes", "graph_launch_per_kernel", "host_stack")
REQUIRED = ("overlap", "graph_max_batch", "graph_padding", "graph_launch_per_kernel", "host_stack")
CPU_STAGES = ("schedule", "prepare_inputs_launch", "sampler_launch", "process_model_outputs")
"""The host-overhead stages an iteration's CPU time sums (see the module docstring)."""


@dataclass(frozen=True)
class EngineRow:
    """One row of the engine table (see the module docstring); ``value`` as written."""

    engine: str
    quantity: str
    value: str
    unit: str
    source: str
    version: str
    file: str
    license: str
    date: str
    note: str


@dataclass(frozen=True)
class EngineSpec:
    """An engine's host settings and figures: ``graph_launch_per_kernel`` in s; ``graph_sizes``
    the captured decode batch sizes (empty: every size up to ``graph_max_batch`` with padding)."""

    engine: str
    overlap: bool
    graph_max_batch: int
    graph_padding: bool
    graph_sizes: tuple[int, ...]
    graph_launch_per_kernel: float
    host_device: str
    host_stack: str

    def graph_fits(self, seqs: int) -> bool:
        """Whether a decode batch of ``seqs`` sequences replays a captured graph."""
        if seqs < 1 or seqs > self.graph_max_batch:
            return False
        return self.graph_padding or not self.graph_sizes or seqs in self.graph_sizes


@dataclass(frozen=True)
class StageFit:
    """Host seconds of one stage of an iteration: ``per_step + per_seq x sequences``."""

    stage: str
    per_step: float
    per_seq: float

    def seconds(self, seqs: int) -> float:
        """Seconds for an iteration of ``seqs`` sequences (never below 0)."""
        return max(0.0, self.per_step + self.per_seq * seqs)


def parse_sizes(text: str, where: str = "", key: str = "graph_sizes") -> tuple[int, ...]:
    """Batch sizes from ``1-32 64 128`` (ranges inclusive), sorted; InputError on anything else."""
    out: set[int] = set()
    for part in text.split():
        lo, dash, hi = part.partition("-")
        try:
            a, b = (int(lo), int(hi)) if dash else (int(lo), int(lo))
        except ValueError:
            raise InputError(where, key, f"expected sizes like '1-32 64 128', got {text!r}") from None
        if a < 1 or b < a:
            raise InputError(where, key, f"expected sizes >= 1 and ranges low-high, got {part!r}")
        out.update(range(a, b + 1))
    if not out:
        raise InputError(where, key, "expected at least one size")
    return tuple(sorted(out))


def load_engine_table(path: str | Path) -> list[EngineRow]:
    """Read and check an engine table (InputError naming the file, line and column)."""
    name = str(path)
    out = []
    for lineno, cells in read_commented_table(path, ENGINE_COLUMNS, "engine host table"):
        if cells["engine"] not in ENGINES:
            raise InputError(name, f"line {lineno}: engine", f"expected one of {', '.join(ENGINES)}, "
                                                             f"got {cells['engine']!r}")
        if cells["quantity"] not in QUANTITIES:
            raise InputError(name, f"line {lineno}: quantity", f"expected one of {', '.join(QUANTITIES)}, "
                                                               f"got {cells['quantity']!r}")
        if not cells["source"].strip():
            raise InputError(name, f"line {lineno}: source", "expected where the value comes from")
        out.append(EngineRow(*(cells[c].strip() for c in ENGINE_COLUMNS)))
    return out


def _flag(row: EngineRow, where: str) -> bool:
    if row.value in ("true", "false"):
        return row.value == "true"
    raise InputError(where, f"{row.engine}.{row.quantity}", f"expected true or false, got {row.value!r}")


def engine_specs(path: str | Path) -> dict[str, EngineSpec]:
    """Every engine of the table at ``path`` as an :class:`EngineSpec`; InputError where an
    engine lacks a required quantity, has one twice, or a value does not read."""
    where = str(path)
    by: dict[str, dict[str, EngineRow]] = {}
    for row in load_engine_table(path):
        got = by.setdefault(row.engine, {})
        if row.quantity in got:
            raise InputError(where, f"{row.engine}.{row.quantity}", "given twice")
        got[row.quantity] = row
    out = {}
    for engine, rows in by.items():
        missing = [q for q in REQUIRED if q not in rows]
        if missing:
            raise InputError(where, engine, f"missing {', '.join(missing)}")
        try:
            biggest = int(rows["graph_max_batch"].value)
            launch = float(rows["graph_launch_per_kernel"].value)
        except ValueError:
            raise InputError(where, engine, "expected an integer graph_max_batch and a number "
                                            "graph_launch_per_kernel (s)") from None
        if biggest < 0 or not (math.isfinite(launch) and launch >= 0):
            raise InputError(where, engine, "expected graph_max_batch >= 0 and graph_launch_per_kernel >= 0 s")
        device, slash, stack = rows["host_stack"].value.partition("/")
        if not slash or not device or not stack:
            raise InputError(where, f"{engine}.host_stack", f"expected DEVICE/stack, got {rows['host_stack'].value!r}")
        sizes = parse_sizes(rows["graph_sizes"].value, where, f"{engine}.graph_sizes") if "graph_sizes" in rows else ()
        out[engine] = EngineSpec(engine, _flag(rows["overlap"], where), biggest, _flag(rows["graph_padding"], where),
                                 sizes, launch, device, stack)
    return out


@lru_cache(maxsize=4)
def _shipped() -> dict[str, EngineSpec]:
    from marssim.data import host_overheads

    return engine_specs(host_overheads() / ENGINE_TABLE)


def engine_spec(engine: str) -> EngineSpec:
    """The shipped table's :class:`EngineSpec` of ``engine`` (one of :data:`ENGINES`)."""
    specs = _shipped()
    if engine not in specs:
        raise InputError(None, "engine", f"expected one of {', '.join(sorted(specs))}, got {engine!r}")
    return specs[engine]


@lru_cache(maxsize=16)
def cpu_fits(device: str, stack: str, several_gpus: bool) -> tuple[StageFit, ...]:
    """Per stage of :data:`CPU_STAGES`: the least-squares line over the shipped host-overhead
    tables' median rows of ``device`` and ``stack`` with ``tp > 1`` (``several_gpus``) or
    ``tp = 1``; InputError where a stage has fewer than two batch sizes."""
    from marssim.cost.host_overheads import load_host_overheads
    from marssim.data import host_overheads

    points: dict[str, list[tuple[int, float]]] = {s: [] for s in CPU_STAGES}
    for path in sorted(host_overheads().glob("*.csv")):
        if path.name == ENGINE_TABLE:
            continue
        for r in load_host_overheads(path):
            if r.device != device or r.stack != stack or r.statistic != "median" or r.stage not in points:
                continue
            if (r.tp > 1) == several_gpus:
                points[r.stage].append((r.batch_size, r.seconds))
    out = []
    for stage in CPU_STAGES:
        pts = points[stage]
        if len({b for b, _ in pts}) < 2:
            raise InputError(None, "host_stack", f"no host-overhead rows of {device}/{stack} with "
                                                 f"{'tp > 1' if several_gpus else 'tp = 1'} for {stage}")
        n = len(pts)
        mx = sum(b for b, _ in pts) / n
        my = sum(t for _, t in pts) / n
        sxx = sum((b - mx) ** 2 for b, _ in pts)
        slope = sum((b - mx) * (t - my) for b, t in pts) / sxx
        out.append(StageFit(stage, my - slope * mx, slope))
    return tuple(out)
