"""Measured host (CPU) overheads of an inference engine's iteration, kept beside the kernel tables.

Vidur (``github.com/microsoft/vidur``, MIT license) published, until May 2024
(``data/profiling/<gpu>/cpu_overheads.csv``, removed from the repository at commit ``bee57da``),
the host time of the stages of one iteration of its serving engine (``sarathi-serve``, on vLLM's
design) per model, batch size and tensor-parallel degree: scheduling, preparing the inputs,
launching the model's kernels, sampling, processing the outputs, and the Ray call to the
workers; mean and median over the profiled iterations, in milliseconds. They are what a GPU
waits for between kernels where kernels are short (decode steps): the parallel lowering's host
launch gaps take the launch time per kernel from them (:mod:`marssim.parallel.host`); this
module keeps them, with their provenance.

Table schema (``traces/host-overheads/<GPU>.csv``; ``#`` lines are comments), one row per
(model, batch, ``tp``, stage, statistic):

==============  ============================================================================
column          meaning
==============  ============================================================================
device          GPU the host drove (``A100``)
stack           software stack (``vidur-2024``: ``sarathi-serve``, Ray workers)
model           the model served (Hugging Face name)
batch_size      requests in the iteration, integer >= 1
tp              tensor-parallel degree, integer >= 1
stage           ``schedule``, ``prepare_inputs_launch``, ``prepare_inputs_e2e``,
                ``model_execution_launch``, ``model_execution_e2e``, ``sampler_launch``,
                ``sampler_e2e``, ``process_model_outputs``, ``ray_comm_time``
statistic       ``mean`` or ``median`` over the profiled iterations
seconds         the value, s (> 0)
source, commit, file, license, date
                where it comes from (``date``: of the commit that last changed the file)
==============  ============================================================================

``*_launch`` stages are the host time to enqueue work, ``*_e2e`` the host time until it
completed. :func:`vidur_host_rows` converts Vidur's file, :func:`load_host_overheads` reads and
checks a table (an :class:`~marssim.errors.InputError` naming file, line and column).
"""

from __future__ import annotations

import csv
import datetime as _dt
import io
import math
from dataclasses import dataclass
from pathlib import Path

from marssim.csvio import read_commented_table, write_commented_table
from marssim.errors import InputError

__all__ = ["COLUMNS", "STAGES", "HostOverhead", "vidur_host_rows", "load_host_overheads", "write_host_overheads"]

COLUMNS = ("device", "stack", "model", "batch_size", "tp", "stage", "statistic", "seconds", "source", "commit", "file",
           "license", "date")
STAGES = ("schedule", "prepare_inputs_launch", "prepare_inputs_e2e", "model_execution_launch", "model_execution_e2e",
          "sampler_launch", "sampler_e2e", "process_model_outputs", "ray_comm_time")


@dataclass(frozen=True)
class HostOverhead:
    """One measured host overhead (see the module docstring); ``seconds`` in s."""

    device: str
    stack: str
    model: str
    batch_size: int
    tp: int
    stage: str
    statistic: str
    seconds: float
    source: str
    commit: str
    file: str
    license: str
    date: str


def vidur_host_rows(text: str, device: str, stack: str, source: str, commit: str, file: str, license_: str,
                    date: str) -> list[HostOverhead]:
    """The rows of one Vidur ``cpu_overheads.csv`` (milliseconds there, seconds here), in file
    order, stages in :data:`STAGES` order; InputError on a file that is not Vidur's."""
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    for col in ("model_name", "batch_size", "tensor_parallel_degree"):
        if col not in header:
            raise InputError(file, "header", f"expected Vidur's cpu_overheads.csv columns; missing {col}")
    out = []
    for line, row in enumerate(reader, start=2):
        try:
            batch, tp = int(row["batch_size"]), int(row["tensor_parallel_degree"])
        except ValueError:
            raise InputError(file, f"line {line}", "expected integer batch_size and tensor_parallel_degree") from None
        for stage in STAGES:
            for stat in ("mean", "median"):
                text_ = (row.get(f"{stage}_{stat}") or "").strip()
                if not text_:
                    continue
                ms = float(text_)
                if not (math.isfinite(ms) and ms > 0):
                    continue
                out.append(HostOverhead(device, stack, row["model_name"], batch, tp, stage, stat, ms * 1e-3, source,
                                        commit, file, license_, date))
    return out


def write_host_overheads(path: str | Path, rows: list[HostOverhead], comments: list[str]) -> None:
    """Write a table (atomically), ``comments`` first (``# `` prepended where missing)."""
    write_commented_table(path, COLUMNS, ([r.device, r.stack, r.model, r.batch_size, r.tp, r.stage, r.statistic,
                                           f"{r.seconds:.6e}", r.source, r.commit, r.file, r.license, r.date]
                                          for r in rows), comments)


def load_host_overheads(path: str | Path) -> list[HostOverhead]:
    """Read and check a host-overhead table (InputError naming the file, line and column)."""
    name = str(path)
    out = []
    for lineno, cells in read_commented_table(path, COLUMNS, "host-overhead table"):
        try:
            batch, tp = int(cells["batch_size"]), int(cells["tp"])
            if batch < 1 or tp < 1:
                raise ValueError
        except ValueError:
            raise InputError(name, f"line {lineno}: batch_size", "expected integers >= 1 for batch_size and tp") from None
        if cells["stage"] not in STAGES:
            raise InputError(name, f"line {lineno}: stage", f"expected one of {', '.join(STAGES)}, got {cells['stage']!r}")
        if cells["statistic"] not in ("mean", "median"):
            raise InputError(name, f"line {lineno}: statistic", f"expected mean or median, got {cells['statistic']!r}")
        try:
            seconds = float(cells["seconds"])
            if not (math.isfinite(seconds) and seconds > 0):
                raise ValueError
        except ValueError:
            raise InputError(name, f"line {lineno}: seconds", f"expected a time in s > 0, got {cells['seconds']!r}") \
                from None
        try:
            _dt.date.fromisoformat(cells["date"])
        except ValueError:
            raise InputError(name, f"line {lineno}: date", f"expected an ISO date, got {cells['date']!r}") from None
        out.append(HostOverhead(cells["device"], cells["stack"], cells["model"], batch, tp, cells["stage"],
                                cells["statistic"], seconds, cells["source"], cells["commit"], cells["file"],
                                cells["license"], cells["date"]))
    return out
