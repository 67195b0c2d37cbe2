"""The compiled walks of :mod:`.gapwalk` (numba). Importing this module raises ImportError when
numba is missing."""

from __future__ import annotations

from numba import njit

__all__ = ["compiled_walk", "latest", "walk_in_program"]


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


@njit(cache=True)
def walk_in_program(gap_lo, gap_hi, first, start, end, is_compute_row, code_row, sums, bubble, inst_of, inst_tpl,
                    inst_base, tpl_start, ipred_ptr, ipred, xref_ptr, xref_group, xref_rel, grp_start, grp_lastkernel,
                    last_compute, first_compute, inst_gstart, target, chain_prev):
    """:mod:`.gapwalk`'s walk over a lowering's program: each task's kind and category read from
    its row (``is_compute_row``, ``code_row``), the predecessor a transfer waited for last found
    as :func:`latest` finds it, when the walk reaches it (no per-task arrays)."""
    eps = 1e-15
    for k in range(len(gap_lo)):
        lo = gap_lo[k]
        cursor = gap_hi[k]
        p = first[k]
        guard = 0
        while cursor > lo + eps and guard < 10_000:
            guard += 1
            if p < 0:
                sums[bubble] += cursor - lo
                break
            e = end[p]
            if e < cursor - eps:  # the last predecessor ended before: nothing to wait for in between
                edge = max(lo, e)
                sums[bubble] += cursor - edge
                cursor = edge
                if cursor <= lo + eps:
                    break
            i = inst_of[p]
            tpl = inst_tpl[i]
            base = inst_base[i]
            rel = p - base
            row = tpl_start[tpl] + rel
            if is_compute_row[row]:  # another GPU's kernel: from here back, the wait is the pipeline's
                sums[bubble] += cursor - lo
                break
            s = start[p]
            seg_start = max(lo, s)
            sums[code_row[row]] += cursor - seg_start
            cursor = seg_start
            # the predecessor of p that ended last (latest's loop, nothing left out)
            best = -1
            best_end = 0.0
            for x in range(ipred_ptr[row], ipred_ptr[row + 1]):
                q = base + ipred[x]
                if best < 0 or end[q] > best_end or (end[q] == best_end and q < best):
                    best = q
                    best_end = end[q]
            for x in range(xref_ptr[row], xref_ptr[row + 1]):
                g = xref_group[x]
                j = target[inst_gstart[i] + g]
                if j < 0:
                    continue
                if grp_lastkernel[grp_start[tpl] + g]:
                    q = inst_base[j] + last_compute[inst_tpl[j]]
                else:
                    q = inst_base[j] + xref_rel[x]
                if best < 0 or end[q] > best_end or (end[q] == best_end and q < best):
                    best = q
                    best_end = end[q]
            prev = chain_prev[i]
            if prev >= 0 and rel == first_compute[tpl]:
                q = inst_base[prev] + last_compute[inst_tpl[prev]]
                if best < 0 or end[q] > best_end or (end[q] == best_end and q < best):
                    best = q
                    best_end = end[q]
            p = best
