"""The walk behind the parallel report's exposed-time attribution (:mod:`.report`): from the end
of each idle gap of a GPU's compute stream back along the predecessors that ended last, each
second of the gap charged to what it waited for (a collective's group, a pipeline transfer, or
the pipeline bubble).

One loop of scalar steps per gap (hundreds of thousands of gaps on the largest runs), so it is
compiled with numba where numba is installed (``MARSSIM_NO_NUMBA=1``: plain Python, the same
floats: the same additions in the same order). With numba, the predecessor each task waited for
last is found here too, over a lowering's :class:`~marssim.taskprogram.TaskProgram`
(:func:`latest_in_program`), without the TaskGraph's predecessor lists. Units: seconds.
"""

from __future__ import annotations

import os

import numpy as np

__all__ = ["latest_in_program", "walk_gaps", "walk_gaps_in_program"]

_EPS = 1e-15  # s: a gap or a remainder shorter than this is none


def _walk(gap_lo: np.ndarray, gap_hi: np.ndarray, first: np.ndarray, start: np.ndarray, end: np.ndarray,
          is_compute: np.ndarray, collective: np.ndarray, code: np.ndarray, latest: np.ndarray, sums: np.ndarray,
          bubble: int) -> None:
    for k in range(len(gap_lo)):
        lo = gap_lo[k]
        cursor = gap_hi[k]
        p = first[k]
        guard = 0
        while cursor > lo + _EPS and guard < 10_000:
            guard += 1
            if p < 0:
                sums[bubble] += cursor - lo
                break
            e = end[p]
            if e < cursor - _EPS:  # the last predecessor ended before: nothing to wait for in between
                edge = max(lo, e)
                sums[bubble] += cursor - edge
                cursor = edge
                if cursor <= lo + _EPS:
                    break
            if is_compute[p]:  # another GPU's kernel: from here back, the wait is the pipeline's
                sums[bubble] += cursor - lo
                break
            s = start[p]
            seg_start = max(lo, s)
            sums[code[collective[p]]] += cursor - seg_start  # a collective's group (-1: the last code)
            cursor = seg_start
            p = latest[p]


_COMPILED: dict = {}


def _kernels() -> dict:
    """The compiled functions (``walk``, ``latest``: :mod:`._gapwalk_kernels`), or the
    Python walk alone without numba."""
    if not _COMPILED:
        _COMPILED["walk"] = _walk
        if os.environ.get("MARSSIM_NO_NUMBA", "") in ("", "0"):
            try:
                from . import _gapwalk_kernels as K
            except ImportError:
                pass
            else:
                _COMPILED.update(walk=K.compiled_walk(_walk), latest=K.latest, walk_program=K.walk_in_program)
    return _COMPILED


def compiled() -> bool:
    """Whether the walks run compiled (numba installed, ``MARSSIM_NO_NUMBA`` unset)."""
    return "latest" in _kernels()


def _program_arrays(program) -> tuple:
    return (program.inst_tpl, program.inst_base, program.tpl_start, program.ipred_ptr, program.ipred,
            program.xref_ptr, program.xref_group, program.xref_rel, program.grp_start, program.grp_lastkernel,
            program.last_compute, program.first_compute, program.inst_gstart, program.target, program.chain_prev)


def latest_in_program(program, end: np.ndarray, tasks: np.ndarray | None = None,
                      excluded: np.ndarray | None = None) -> np.ndarray:
    """:func:`marssim.parallel.report.latest_predecessors` of a lowering's TaskGraph read from its
    :class:`~marssim.taskprogram.TaskProgram` (compiled; callers check :func:`compiled`): per task
    (of ``tasks``, default all) its predecessor that ended last, the lowest index among equal
    ends (``excluded[k]``: a predecessor of ``tasks[k]`` left out), -1 where it has none; without
    the TaskGraph's predecessor lists (hundreds of MB on the largest runs)."""
    end = np.ascontiguousarray(end, dtype=np.float64)
    every = tasks is None
    tasks = np.zeros(0, dtype=np.int64) if every else np.ascontiguousarray(tasks, dtype=np.int64)
    skips = np.full(len(tasks), -1, dtype=np.int64) if excluded is None else \
        np.ascontiguousarray(excluded, dtype=np.int64)
    out = np.empty(program.n_tasks if every else len(tasks), dtype=np.int64)
    _kernels()["latest"](out, tasks, skips, every, program.inst_of, end, *_program_arrays(program))
    return out


def walk_gaps(gap_lo: np.ndarray, gap_hi: np.ndarray, first: np.ndarray, start: np.ndarray, end: np.ndarray,
              is_compute: np.ndarray, collective: np.ndarray, code: np.ndarray, latest: np.ndarray,
              sums: np.ndarray, bubble: int) -> None:
    """Charge each gap ``gap_lo[k]..gap_hi[k]`` (s) of one compute stream, gap by gap: from its end
    back along ``first[k]`` (the task it waited for last, -1: none), then each transfer's own
    ``latest`` predecessor, ``cursor - max(lo, start)`` of each transfer ``p`` to
    ``sums[code[collective[p]]]`` (``code``: a category per collective, then one for the
    transfers of none, index -1), the rest (no predecessor, time between predecessors, another
    GPU's kernel) to ``sums[bubble]``. ``start``, ``end``: per task (s); ``is_compute``,
    ``collective``, ``latest``: per task. Adds into ``sums`` in place."""
    _kernels()["walk"](np.ascontiguousarray(gap_lo, dtype=np.float64), np.ascontiguousarray(gap_hi, dtype=np.float64),
              np.ascontiguousarray(first, dtype=np.int64), np.ascontiguousarray(start, dtype=np.float64),
              np.ascontiguousarray(end, dtype=np.float64), np.ascontiguousarray(is_compute, dtype=np.bool_),
              np.ascontiguousarray(collective, dtype=np.int32), np.ascontiguousarray(code, dtype=np.int64),
              np.ascontiguousarray(latest, dtype=np.int64), sums, int(bubble))


def walk_gaps_in_program(program, gap_lo: np.ndarray, gap_hi: np.ndarray, first: np.ndarray, start: np.ndarray,
                         end: np.ndarray, is_compute_row: np.ndarray, code_row: np.ndarray, sums: np.ndarray,
                         bubble: int) -> None:
    """:func:`walk_gaps` of a lowering's TaskGraph over its
    :class:`~marssim.taskprogram.TaskProgram` (compiled; callers check :func:`compiled`): a
    task's kind and category (``is_compute_row``, ``code_row``: per template row; a category
    indexes ``sums``) read from its row, and each transfer's latest predecessor found when the
    walk reaches it (:func:`latest_in_program`'s rule), not read from per-task arrays. The same
    additions in the same order: the same floats."""
    _kernels()["walk_program"](
        np.ascontiguousarray(gap_lo, dtype=np.float64), np.ascontiguousarray(gap_hi, dtype=np.float64),
        np.ascontiguousarray(first, dtype=np.int64), np.ascontiguousarray(start, dtype=np.float64),
        np.ascontiguousarray(end, dtype=np.float64), np.ascontiguousarray(is_compute_row, dtype=np.bool_),
        np.ascontiguousarray(code_row, dtype=np.int64), sums, int(bubble), program.inst_of, *_program_arrays(program))
