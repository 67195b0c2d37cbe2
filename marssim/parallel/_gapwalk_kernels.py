"""The compiled walks of :mod:`.gapwalk` (numba). Importing this module raises ImportError when
numba is missing."""

from __future__ import annotations

from numba import njit

__all__ = ["compiled_walk", "latest"]


def compiled_walk(walk):
    """``walk`` (:mod:`.gapwalk`'s loop over the gaps, passed in: this module imports nothing of
    the package) compiled, and kept in numba's cache."""
    return njit(cache=True)(walk)


@njit(cache=True)
def latest(out, tasks, skips, every, inst_of, end, inst_tpl, inst_base, tpl_start, ipred_ptr, ipred, xref_ptr,
           xref_group, xref_rel, grp_start, grp_lastkernel, last_compute, first_compute, inst_gstart, target,
           chain_prev):
    """Per task (``every``: all tasks, else ``tasks[k]``, ``skips[k]`` left out), its predecessor
    that ended last, the lowest index among equal ends; -1: none. Its predecessors as the
    TaskGraph lists them (:meth:`~marssim.taskprogram.TaskProgram.edges`): its unit's, its
    references', the kernel before it on its GPU."""
    for k in range(len(out)):
        if every:
            t = k
            skip = -1
        else:
            t = tasks[k]
            skip = skips[k]
        i = inst_of[t]
        tpl = inst_tpl[i]
        base = inst_base[i]
        rel = t - base
        row = tpl_start[tpl] + rel
        best = -1
        best_end = 0.0
        for e in range(ipred_ptr[row], ipred_ptr[row + 1]):
            p = base + ipred[e]
            if p != skip and (best < 0 or end[p] > best_end or (end[p] == best_end and p < best)):
                best = p
                best_end = end[p]
        for e in range(xref_ptr[row], xref_ptr[row + 1]):
            g = xref_group[e]
            j = target[inst_gstart[i] + g]
            if j < 0:
                continue
            if grp_lastkernel[grp_start[tpl] + g]:
                p = inst_base[j] + last_compute[inst_tpl[j]]
            else:
                p = inst_base[j] + xref_rel[e]
            if p != skip and (best < 0 or end[p] > best_end or (end[p] == best_end and p < best)):
                best = p
                best_end = end[p]
        prev = chain_prev[i]
        if prev >= 0 and rel == first_compute[tpl]:
            p = inst_base[prev] + last_compute[inst_tpl[prev]]
            if p != skip and (best < 0 or end[p] > best_end or (end[p] == best_end and p < best)):
                best = p
                best_end = end[p]
        out[k] = best
