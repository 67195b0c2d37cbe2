"""The compiled event loop behind :mod:`marssim.sim.fast` (numba).

The same simulation as :mod:`marssim.sim.engine` on SimPy, event for event: the same events
(device streams taking ready tasks, compute ends, flow deliveries, the network process waking
to deliver finished flows and recompute rates, its timer), ordered as SimPy orders them (time,
then the order in which they were scheduled), the same max-min fair rates computed by the same
progressive filling in the same order of floating-point operations, so both engines give the
same floats. Everything is a numpy array held by one named tuple :class:`State`; the loop runs
a budget of events per call (its caller reports progress between calls) and stops only between
events.

Importing this module raises ImportError when numba is missing.
"""

from __future__ import annotations

import numpy as np
from numba import config as numba_config
from numba import njit, types
from numba.core import cgutils
from numba.experimental import structref
from numba.experimental.jitclass.base import imp_dtor
from numba.extending import intrinsic

__all__ = ["State", "FIELDS", "run", "start", "I", "F", "DONE", "BUDGET", "GROW_LINKS"]

INF = np.inf

# event kinds (every queued event is of SimPy's normal priority; the processes' start events,
# the only urgent ones, are run before the loop)
EV_DEV_WAKE = 0  # a device stream's idle event: the stream takes its next task
EV_DEV_DONE = 1  # a compute task's timeout: it ends, its stream takes the next
EV_NET_WAKE = 2  # the network process wakes: deliver finished flows, recompute rates
EV_DELIVER = 3  # a transfer (step) arrives after its latency

# status of a call to run()
DONE = 0
BUDGET = 1
GROW_LINKS = 2  # the link timeline needs room (the caller grows it and calls again)

# integer scalars (State.it)
I_EID, I_SEQ, I_QN, I_NHN, I_WAKE, I_TVALID, I_TEID, I_RECOMP, I_NDIRTY, I_STAMP, I_MTN, I_LTN, I_RECORD, \
    I_IDENTITY, I_ERRPOOL, I_ERRTASK, I_NCHANGED, I_EVENTS, I_NSTREAMS, I_SINGLE, I_FREE, I_NEXT_SLOT, I_PEAK_SLOTS, \
    I_MEMO_USED, I_MEMO_FILL, I_MEMO_HITS = range(26)
N_INT_SCALARS = 26
# float scalars (State.fl)
F_NOW, F_TIMER_AT, F_TIMER_TIME, F_ERRLEVEL = range(4)


class I:  # noqa: E742  (names of the integer scalars, for the caller)
    EID, SEQ, RECOMPUTES, MEMORY_ROWS, LINK_ROWS, ERRPOOL, ERRTASK, EVENTS, NSTREAMS, RECORD, IDENTITY, SINGLE, \
        PEAK_SLOTS, MEMO_HITS = I_EID, I_SEQ, I_RECOMP, I_MTN, I_LTN, I_ERRPOOL, I_ERRTASK, I_EVENTS, I_NSTREAMS, \
        I_RECORD, I_IDENTITY, I_SINGLE, I_PEAK_SLOTS, I_MEMO_HITS


class F:
    NOW, ERRLEVEL, TIMER_AT = F_NOW, F_ERRLEVEL, F_TIMER_AT


FIELDS = (
    # per task: its instance (programs), state, flow slot (+1; 0: none), rank (when priorities are not task order)
    "inst_of", "waiting", "readers_left", "has_succ", "steps_left", "preds_read", "start", "end", "slot_of",
    "rank", "by_rank",
    # per row of a template (a plain TaskGraph: one template, its tasks)
    "r_compute", "r_dev", "r_duration", "r_nbytes", "r_steps", "r_mem", "r_pool", "r_route", "r_flow",
    "r_ipred_ptr", "r_ipred", "r_isucc_ptr", "r_isucc", "r_xref_ptr", "r_xref_group", "r_xref_rel",
    # per template: first row, first and last kernel, first group; per group: kind and reverse indexes
    "t_start", "t_first", "t_last", "t_gstart", "g_lastkernel", "g_rev_base", "g_rel_ptr", "rev_ptr", "rev_rel",
    "g_rel",
    # per instance: template, first task, groups' targets, chain neighbours, references pointing at it
    "i_tpl", "i_base", "i_gstart", "i_target", "i_prev", "i_next", "i_inc_ptr", "i_inc_inst", "i_inc_group",
    # per flow slot (taken when a transfer starts, given back when it ends)
    "slot_task", "f_left", "f_t0", "f_rate", "f_finish", "f_seq", "f_hpos", "f_next", "f_prev", "f_free",
    # routes: latency, their resources as entries (route_ptr[k]..route_ptr[k+1]), weights and bounds per entry
    "rt_lat", "rt_ptr", "rt_res", "rt_w", "rt_bound", "rt_has_w", "entry_route",
    "rt_mult", "rt_head", "rt_tail", "rt_found", "rt_rate",
    # resources
    "cap", "rs_head", "rs_tail", "e_next", "e_prev", "rs_busy", "rs_since", "rs_dirty", "dirty", "changed",
    "rs_seen", "rs_local", "prev_rate", "prev_n", "prev_has", "tot_mark", "touched",
    # scratch of a rate computation
    "found", "stack", "keys", "g_rate", "loc_res", "loc_left", "loc_count", "users_cnt", "users_ptr", "users_g",
    "users_n", "rh_share", "rh_r", "fin_slot", "fin_seq",
    # the rates of components already met, by the routes and flows on them (open addressing)
    "mt_hash", "mt_off", "mt_len", "mp_key", "mp_mult", "mp_rate",
    # the flow heap (slots, by finish time then start sequence)
    "nh",
    # the event queue
    "q_time", "q_eid", "q_kind", "q_a", "q_b",
    # devices: ready-task heaps (ranks) and idle streams
    "dh_base", "dh_size", "dh_rank", "idle_base", "idle_size", "idle_stream", "stream_dev",
    # memory pools
    "pl_level", "pl_peak", "pl_limit",
    # timelines (with record)
    "mt_pool", "mt_time", "mt_level", "lt_time", "lt_res", "lt_rate", "lt_n",
    # the depth-first walk of task completions: frames (task, next successor, end), successor lists
    "st_t", "st_a", "st_b", "sb",
    # scalars
    "it", "fl",
)


class _Namespace:
    def __init__(self, **arrays):
        self.__dict__.update(arrays)


_NO_JIT = bool(numba_config.DISABLE_JIT)


@structref.register
class _StateType(types.StructRef):
    def preprocess_fields(self, fields):
        return tuple((name, types.unliteral(typ)) for name, typ in fields)


class State(structref.StructRefProxy):
    """Every array of one run (see :data:`FIELDS`), passed to the compiled functions by reference."""

    def __new__(cls, **arrays):
        if _NO_JIT:  # numba's interpreter mode (NUMBA_DISABLE_JIT=1): a plain namespace
            return _Namespace(**arrays)
        return _new_state(tuple(arrays[name] for name in FIELDS))


structref.define_proxy(State, _StateType, list(FIELDS))


@intrinsic
def _state_of(typingctx, arrays):
    """A :class:`State` holding the tuple ``arrays`` (in :data:`FIELDS` order), written in one
    piece of generated code: the proxy's constructor assigns the fields one by one, about 150
    statements numba would type and lower (seconds of the first compilation)."""
    if not isinstance(arrays, types.BaseTuple) or len(arrays) != len(FIELDS):
        return None
    state_type = _StateType(list(zip(FIELDS, arrays.types)))

    def codegen(context, builder, signature, args):
        data_type = state_type.get_data_type()
        alloc_type = context.data_model_manager[data_type].get_value_type()
        meminfo = context.nrt.meminfo_alloc_dtor(
            builder, context.get_constant(types.uintp, context.get_abi_sizeof(alloc_type)),
            imp_dtor(context, builder.module, state_type))
        pointer = builder.bitcast(context.nrt.meminfo_data(builder, meminfo), alloc_type.as_pointer())
        builder.store(cgutils.get_null_value(alloc_type), pointer)
        data = cgutils.create_struct_proxy(data_type)(context, builder, ref=pointer)
        for i, (name, typ) in enumerate(zip(FIELDS, arrays.types)):
            value = builder.extract_value(args[0], i)
            context.nrt.incref(builder, typ, value)  # the state holds a reference (its destructor drops it)
            setattr(data, name, value)
        state = context.make_helper(builder, state_type)
        state.meminfo = meminfo
        return state._getvalue()

    return state_type(arrays), codegen


@njit(cache=True)
def _new_state(arrays):
    """A :class:`State` holding ``arrays`` (built in compiled code, cached: the proxy's own
    constructor is compiled anew in every process)."""
    return _state_of(arrays)


# ---------------------------------------------------------------------- sorting
@njit(cache=True)
def _sort(a, b, lo, hi, pairs):
    """Sort ``a[lo:hi]`` (int64) ascending in place, moving ``b[lo:hi]`` along when ``pairs``:
    insertion sort for a few values, else heapsort. One small function for every sort of the loop
    (numba's own sorts compile several functions per array type); its keys are distinct where
    ``pairs`` (flow start sequences), so the order is the only one."""
    n = hi - lo
    if n <= 16:
        for i in range(lo + 1, hi):
            x = a[i]
            y = b[i] if pairs else 0
            j = i - 1
            while j >= lo and a[j] > x:
                a[j + 1] = a[j]
                if pairs:
                    b[j + 1] = b[j]
                j -= 1
            a[j + 1] = x
            if pairs:
                b[j + 1] = y
        return
    first = n // 2  # heapify from here down, then take the largest out to the end
    end = n
    while end > 1:
        if first > 0:
            first -= 1
        else:
            end -= 1
            a[lo], a[lo + end] = a[lo + end], a[lo]
            if pairs:
                b[lo], b[lo + end] = b[lo + end], b[lo]
        root = first
        while True:
            child = 2 * root + 1
            if child >= end:
                break
            if child + 1 < end and a[lo + child] < a[lo + child + 1]:
                child += 1
            if a[lo + root] < a[lo + child]:
                a[lo + root], a[lo + child] = a[lo + child], a[lo + root]
                if pairs:
                    b[lo + root], b[lo + child] = b[lo + child], b[lo + root]
                root = child
            else:
                break


# ---------------------------------------------------------------------- event queue
@njit(cache=True)
def _q_less(S, i, j):
    if S.q_time[i] != S.q_time[j]:
        return S.q_time[i] < S.q_time[j]
    return S.q_eid[i] < S.q_eid[j]


@njit(cache=True)
def _q_swap(S, i, j):
    S.q_time[i], S.q_time[j] = S.q_time[j], S.q_time[i]
    S.q_eid[i], S.q_eid[j] = S.q_eid[j], S.q_eid[i]
    S.q_kind[i], S.q_kind[j] = S.q_kind[j], S.q_kind[i]
    S.q_a[i], S.q_a[j] = S.q_a[j], S.q_a[i]
    S.q_b[i], S.q_b[j] = S.q_b[j], S.q_b[i]


@njit(cache=True)
def _q_push(S, time, kind, a, b):
    it = S.it
    i = it[I_QN]
    it[I_QN] = i + 1
    S.q_time[i] = time
    S.q_eid[i] = it[I_EID]
    it[I_EID] += 1
    S.q_kind[i] = kind
    S.q_a[i] = a
    S.q_b[i] = b
    while i > 0:
        parent = (i - 1) >> 1
        if _q_less(S, i, parent):
            _q_swap(S, i, parent)
            i = parent
        else:
            break


@njit(cache=True)
def _q_pop(S):
    """Move the smallest event to slot ``size - 1`` and keep the heap on the rest."""
    it = S.it
    last = it[I_QN] - 1
    it[I_QN] = last
    _q_swap(S, 0, last)
    i = 0
    while True:
        left = 2 * i + 1
        if left >= last:
            break
        child = left
        if left + 1 < last and _q_less(S, left + 1, left):
            child = left + 1
        if _q_less(S, child, i):
            _q_swap(S, child, i)
            i = child
        else:
            break
    return last


# ---------------------------------------------------------------------- flow heap (indexed)
@njit(cache=True)
def _nh_less(S, a, b):
    fa, fb = S.f_finish[a], S.f_finish[b]
    if fa != fb:
        return fa < fb
    return S.f_seq[a] < S.f_seq[b]


@njit(cache=True)
def _nh_up(S, i):
    nh = S.nh
    while i > 0:
        parent = (i - 1) >> 1
        if _nh_less(S, nh[i], nh[parent]):
            a, b = nh[i], nh[parent]
            nh[i], nh[parent] = b, a
            S.f_hpos[b] = i
            S.f_hpos[a] = parent
            i = parent
        else:
            break


@njit(cache=True)
def _nh_down(S, i):
    nh = S.nh
    n = S.it[I_NHN]
    while True:
        left = 2 * i + 1
        if left >= n:
            break
        child = left
        if left + 1 < n and _nh_less(S, nh[left + 1], nh[left]):
            child = left + 1
        if _nh_less(S, nh[child], nh[i]):
            a, b = nh[i], nh[child]
            nh[i], nh[child] = b, a
            S.f_hpos[b] = i
            S.f_hpos[a] = child
            i = child
        else:
            break


@njit(cache=True)
def _nh_set(S, slot):
    """Put ``slot`` (its finish time just changed) in its place in the heap."""
    pos = S.f_hpos[slot]
    if pos < 0:
        n = S.it[I_NHN]
        S.nh[n] = slot
        S.f_hpos[slot] = n
        S.it[I_NHN] = n + 1
        _nh_up(S, n)
    else:
        _nh_up(S, pos)
        _nh_down(S, S.f_hpos[slot])


@njit(cache=True)
def _nh_remove(S, slot):
    pos = S.f_hpos[slot]
    if pos < 0:
        return
    n = S.it[I_NHN] - 1
    S.it[I_NHN] = n
    S.f_hpos[slot] = -1
    if pos == n:
        return
    other = S.nh[n]
    S.nh[pos] = other
    S.f_hpos[other] = pos
    _nh_up(S, pos)
    _nh_down(S, S.f_hpos[other])


# ---------------------------------------------------------------------- memory pools
@njit(cache=True)
def _allocate(S, t, row):
    pool = S.r_pool[row]
    level = S.pl_level[pool] + S.r_mem[row]
    if level > S.pl_limit[pool]:
        S.it[I_ERRPOOL] = pool
        S.it[I_ERRTASK] = t
        S.fl[F_ERRLEVEL] = level
        raise MemoryError("a buffer does not fit its memory")
    S.pl_level[pool] = level
    if level > S.pl_peak[pool]:
        S.pl_peak[pool] = level
    if S.it[I_RECORD]:
        k = S.it[I_MTN]
        S.mt_pool[k] = pool
        S.mt_time[k] = S.fl[F_NOW]
        S.mt_level[k] = level
        S.it[I_MTN] = k + 1


@njit(cache=True)
def _release(S, pool, nbytes):
    level = S.pl_level[pool]
    if nbytes < level:
        S.pl_level[pool] = level - nbytes
    elif level > 0:
        S.pl_level[pool] = 0.0
    if S.it[I_RECORD]:
        k = S.it[I_MTN]
        S.mt_pool[k] = pool
        S.mt_time[k] = S.fl[F_NOW]
        S.mt_level[k] = S.pl_level[pool]
        S.it[I_MTN] = k + 1


# ---------------------------------------------------------------------- network
@njit(cache=True)
def _mark_dirty(S, k):
    for e in range(S.rt_ptr[k], S.rt_ptr[k + 1]):
        r = S.rt_res[e]
        if not S.rs_dirty[r]:
            S.rs_dirty[r] = True
            S.dirty[S.it[I_NDIRTY]] = r
            S.it[I_NDIRTY] += 1


@njit(cache=True)
def _inst_row(S, t):
    """Task ``t``'s instance and template row."""
    if S.it[I_SINGLE]:
        return 0, t
    i = S.inst_of[t]
    return i, S.t_start[S.i_tpl[i]] + t - S.i_base[i]


@njit(cache=True)
def _add_flow(S, t, row):
    """Task ``t``'s transfer (step) starts as a flow; the network wakes at this instant."""
    now = S.fl[F_NOW]
    slot = S.slot_of[t] - 1
    if slot < 0:  # a free slot: the last one given back, else a new one
        if S.it[I_FREE] > 0:
            S.it[I_FREE] -= 1
            slot = S.f_free[S.it[I_FREE]]
        else:
            slot = S.it[I_NEXT_SLOT]
            S.it[I_NEXT_SLOT] = slot + 1
            if slot + 1 > S.it[I_PEAK_SLOTS]:
                S.it[I_PEAK_SLOTS] = slot + 1
        S.slot_of[t] = slot + 1
        S.slot_task[slot] = t
        S.f_hpos[slot] = -1
    S.it[I_SEQ] += 1
    S.f_left[slot] = S.r_nbytes[row] / max(S.r_steps[row], 1)
    S.f_t0[slot] = now
    S.f_rate[slot] = 0.0
    S.f_finish[slot] = INF
    S.f_seq[slot] = S.it[I_SEQ]
    k = S.r_route[row]
    m = S.rt_mult[k]
    S.rt_mult[k] = m + 1
    S.f_next[slot] = -1
    if m:
        tail = S.rt_tail[k]
        S.f_next[tail] = slot
        S.f_prev[slot] = tail
        S.rt_tail[k] = slot
    else:
        S.rt_head[k] = slot
        S.rt_tail[k] = slot
        S.f_prev[slot] = -1
        for e in range(S.rt_ptr[k], S.rt_ptr[k + 1]):
            r = S.rt_res[e]
            S.e_next[e] = -1
            if S.rs_head[r] < 0:
                S.rs_head[r] = e
                S.rs_tail[r] = e
                S.e_prev[e] = -1
                S.rs_since[r] = now
            else:
                tail = S.rs_tail[r]
                S.e_next[tail] = e
                S.e_prev[e] = tail
                S.rs_tail[r] = e
    _mark_dirty(S, k)
    if S.it[I_WAKE] == 0:
        S.it[I_WAKE] = 1
        _q_push(S, now, EV_NET_WAKE, 0, 0)


@njit(cache=True)
def _remove_flow(S, t, row):
    now = S.fl[F_NOW]
    slot = S.slot_of[t] - 1
    k = S.r_route[row]
    left = S.rt_mult[k] - 1
    _mark_dirty(S, k)
    S.rt_mult[k] = left
    if left:
        prv, nxt = S.f_prev[slot], S.f_next[slot]
        if prv >= 0:
            S.f_next[prv] = nxt
        else:
            S.rt_head[k] = nxt
        if nxt >= 0:
            S.f_prev[nxt] = prv
        else:
            S.rt_tail[k] = prv
    else:
        S.rt_head[k] = -1
        S.rt_tail[k] = -1
        for e in range(S.rt_ptr[k], S.rt_ptr[k + 1]):
            r = S.rt_res[e]
            prv, nxt = S.e_prev[e], S.e_next[e]
            if prv >= 0:
                S.e_next[prv] = nxt
            else:
                S.rs_head[r] = nxt
            if nxt >= 0:
                S.e_prev[nxt] = prv
            else:
                S.rs_tail[r] = prv
            if S.rs_head[r] < 0:
                S.rs_busy[r] += now - S.rs_since[r]


@njit(cache=True)
def _binding(S, q):
    load = 0.0
    cap = S.cap[q]
    e = S.rs_head[q]
    while e >= 0:
        k = S.entry_route[e]
        load += S.rt_mult[k] * S.rt_w[e] * S.rt_bound[e]
        if load > cap:
            return True
        e = S.e_next[e]
    return False


@njit(cache=True)
def _component(S):
    """The active routes whose rates may change (the network module's ``_component``); the
    dirty resources become the changed ones."""
    it = S.it
    it[I_STAMP] += 1
    stamp = it[I_STAMP]
    nd = it[I_NDIRTY]
    for i in range(nd):
        r = S.dirty[i]
        S.changed[i] = r
        S.rs_dirty[r] = False
        S.rs_seen[r] = stamp
    it[I_NCHANGED] = nd
    it[I_NDIRTY] = 0
    nfound = 0
    top = 0
    for i in range(nd):
        e = S.rs_head[S.changed[i]]
        while e >= 0:
            k = S.entry_route[e]
            if S.rt_found[k] != stamp:
                S.rt_found[k] = stamp
                S.found[nfound] = k
                nfound += 1
                S.stack[top] = k
                top += 1
            e = S.e_next[e]
    while top > 0:
        top -= 1
        k = S.stack[top]
        for e in range(S.rt_ptr[k], S.rt_ptr[k + 1]):
            q = S.rt_res[e]
            if S.rs_seen[q] == stamp:
                continue
            S.rs_seen[q] = stamp
            if not _binding(S, q):
                continue
            e2 = S.rs_head[q]
            while e2 >= 0:
                other = S.entry_route[e2]
                if S.rt_found[other] != stamp:
                    S.rt_found[other] = stamp
                    S.found[nfound] = other
                    nfound += 1
                    S.stack[top] = other
                    top += 1
                e2 = S.e_next[e2]
    return nfound


@njit(cache=True)
def _rh_less(S, i, j):
    if S.rh_share[i] != S.rh_share[j]:
        return S.rh_share[i] < S.rh_share[j]
    return S.rh_r[i] < S.rh_r[j]


@njit(cache=True)
def _rh_push(S, n, share, r):
    S.rh_share[n] = share
    S.rh_r[n] = r
    i = n
    while i > 0:
        parent = (i - 1) >> 1
        if _rh_less(S, i, parent):
            S.rh_share[i], S.rh_share[parent] = S.rh_share[parent], S.rh_share[i]
            S.rh_r[i], S.rh_r[parent] = S.rh_r[parent], S.rh_r[i]
            i = parent
        else:
            break
    return n + 1


@njit(cache=True)
def _rh_pop(S, n):
    last = n - 1
    S.rh_share[0], S.rh_share[last] = S.rh_share[last], S.rh_share[0]
    S.rh_r[0], S.rh_r[last] = S.rh_r[last], S.rh_r[0]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= last:
            break
        child = left
        if left + 1 < last and _rh_less(S, left + 1, left):
            child = left + 1
        if _rh_less(S, child, i):
            S.rh_share[child], S.rh_share[i] = S.rh_share[i], S.rh_share[child]
            S.rh_r[child], S.rh_r[i] = S.rh_r[i], S.rh_r[child]
            i = child
        else:
            break
    return last


@njit(cache=True)
def _rates(S, nkeys):
    """Max-min fair rate of each found route (progressive filling over the flows each puts on
    each resource, exactly the network module's ``progressive_filling``: the
    routes in increasing order, the bottleneck resource by (share, index), its routes fixed in
    that order)."""
    S.it[I_RECOMP] += 1
    keys = S.keys
    for i in range(nkeys):
        keys[i] = S.found[i]
    _sort(keys, keys, 0, nkeys, False)
    # met before? (the same routes with the same flows on each: the same rates)
    h = np.uint64(14695981039346656037)
    for g in range(nkeys):
        h = (h ^ np.uint64(keys[g])) * np.uint64(1099511628211)
        h = (h ^ np.uint64(S.rt_mult[keys[g]])) * np.uint64(1099511628211)
    hs = np.int64(h >> np.uint64(1))
    mask = S.mt_hash.shape[0] - 1
    slot = hs & mask
    while S.mt_off[slot] > 0:
        if S.mt_hash[slot] == hs and S.mt_len[slot] == nkeys:
            off = S.mt_off[slot] - 1
            same = True
            for g in range(nkeys):
                if S.mp_key[off + g] != keys[g] or S.mp_mult[off + g] != S.rt_mult[keys[g]]:
                    same = False
                    break
            if same:
                S.it[I_MEMO_HITS] += 1
                for g in range(nkeys):
                    S.rt_rate[keys[g]] = S.mp_rate[off + g]
                return
        slot = (slot + 1) & mask
    nloc = 0
    for g in range(nkeys):
        k = keys[g]
        mult = S.rt_mult[k]
        for e in range(S.rt_ptr[k], S.rt_ptr[k + 1]):
            r = S.rt_res[e]
            loc = S.rs_local[r]
            if loc < 0:
                loc = nloc
                S.rs_local[r] = loc
                S.loc_res[loc] = r
                S.loc_left[loc] = S.cap[r]
                S.loc_count[loc] = mult * S.rt_w[e]
                S.users_cnt[loc] = 1
                nloc += 1
            else:
                S.loc_count[loc] += mult * S.rt_w[e]
                S.users_cnt[loc] += 1
    at = 0
    for loc in range(nloc):
        S.users_ptr[loc] = at
        at += S.users_cnt[loc]
        S.users_cnt[loc] = 0
    S.users_ptr[nloc] = at
    for g in range(nkeys):
        k = keys[g]
        mult = S.rt_mult[k]
        for e in range(S.rt_ptr[k], S.rt_ptr[k + 1]):
            loc = S.rs_local[S.rt_res[e]]
            u = S.users_ptr[loc] + S.users_cnt[loc]
            S.users_cnt[loc] += 1
            S.users_g[u] = g
            S.users_n[u] = mult * S.rt_w[e]
    nh = 0
    for loc in range(nloc):
        nh = _rh_push(S, nh, S.loc_left[loc] / S.loc_count[loc], S.loc_res[loc])
    for g in range(nkeys):
        S.g_rate[g] = -1.0
    todo = nkeys
    while todo and nh:
        nh = _rh_pop(S, nh)
        share = S.rh_share[nh]
        r = S.rh_r[nh]
        loc = S.rs_local[r]
        c = S.loc_count[loc]
        if c <= 1e-12:
            continue
        current = S.loc_left[loc] / c
        if current != share:
            nh = _rh_push(S, nh, current, r)
            continue
        if share < 0.0:
            share = 0.0
        for u in range(S.users_ptr[loc], S.users_ptr[loc + 1]):
            g = S.users_g[u]
            if S.g_rate[g] >= 0.0:
                continue
            S.g_rate[g] = share
            todo -= 1
            k = keys[g]
            mult = S.rt_mult[k]
            for e in range(S.rt_ptr[k], S.rt_ptr[k + 1]):
                lq = S.rs_local[S.rt_res[e]]
                n = mult * S.rt_w[e]
                S.loc_left[lq] -= share * n
                S.loc_count[lq] -= n
    for loc in range(nloc):
        S.rs_local[S.loc_res[loc]] = -1
    for g in range(nkeys):
        S.rt_rate[keys[g]] = S.g_rate[g]
    # remember them (everything is forgotten when the table is half full or its pool full)
    if 2 * (S.it[I_MEMO_USED] + 1) > S.mt_hash.shape[0] or S.it[I_MEMO_FILL] + nkeys > S.mp_key.shape[0]:
        S.mt_off[:] = 0
        S.it[I_MEMO_USED] = 0
        S.it[I_MEMO_FILL] = 0
        slot = hs & mask
    if nkeys <= S.mp_key.shape[0]:
        off = S.it[I_MEMO_FILL]
        for g in range(nkeys):
            S.mp_key[off + g] = keys[g]
            S.mp_mult[off + g] = S.rt_mult[keys[g]]
            S.mp_rate[off + g] = S.g_rate[g]
        while S.mt_off[slot] > 0:
            slot = (slot + 1) & mask
        S.mt_hash[slot] = hs
        S.mt_len[slot] = nkeys
        S.mt_off[slot] = off + 1
        S.it[I_MEMO_USED] += 1
        S.it[I_MEMO_FILL] = off + nkeys


@njit(cache=True)
def _record_links(S, nkeys):
    """The network module's ``_record``: the resources whose total rate or flow count changed."""
    it = S.it
    now = S.fl[F_NOW]
    stamp = it[I_STAMP]
    nt = 0
    for i in range(it[I_NCHANGED]):
        r = S.changed[i]
        if S.tot_mark[r] != stamp:
            S.tot_mark[r] = stamp
            S.touched[nt] = r
            nt += 1
    for i in range(nkeys):
        k = S.found[i]
        for e in range(S.rt_ptr[k], S.rt_ptr[k + 1]):
            r = S.rt_res[e]
            if S.tot_mark[r] != stamp:
                S.tot_mark[r] = stamp
                S.touched[nt] = r
                nt += 1
    _sort(S.touched, S.touched, 0, nt, False)
    for i in range(nt):
        r = S.touched[i]
        total = 0.0
        count = 0.0
        e = S.rs_head[r]
        while e >= 0:
            k = S.entry_route[e]
            m = S.rt_mult[k]
            if S.rt_found[k] == stamp:
                rate = S.rt_rate[k]
            else:
                rate = S.f_rate[S.rt_head[k]]
            n = m * S.rt_w[e] if S.rt_has_w[k] else float(m)
            total += rate * n
            count += n
            e = S.e_next[e]
        if S.prev_has[r]:
            same = S.prev_rate[r] == total and S.prev_n[r] == count
        else:
            same = total == 0.0 and count == 0.0
        if not same:
            k = it[I_LTN]
            S.lt_time[k] = now
            S.lt_res[k] = r
            S.lt_rate[k] = total
            S.lt_n[k] = count
            it[I_LTN] = k + 1
            if count != 0.0:
                S.prev_rate[r] = total
                S.prev_n[r] = count
                S.prev_has[r] = True
            else:
                S.prev_has[r] = False


@njit(cache=True)
def _recompute(S):
    now = S.fl[F_NOW]
    nkeys = _component(S)
    if nkeys:
        _rates(S, nkeys)
        for i in range(nkeys):
            k = S.found[i]
            rate = S.rt_rate[k]
            slot = S.rt_head[k]
            while slot >= 0:
                old = S.f_rate[slot]
                if not (old == rate and S.f_finish[slot] != INF):
                    if old != 0.0:
                        S.f_left[slot] -= old * (now - S.f_t0[slot])
                    S.f_t0[slot] = now
                    S.f_rate[slot] = rate
                    if rate > 0:
                        S.f_finish[slot] = now + S.f_left[slot] / rate
                        _nh_set(S, slot)
                    else:
                        S.f_finish[slot] = INF
                        _nh_remove(S, slot)
                slot = S.f_next[slot]
    if S.it[I_RECORD]:
        _record_links(S, nkeys)


# ---------------------------------------------------------------------- tasks
@njit(cache=True)
def _read_one(S, p):
    left = S.readers_left[p] - 1
    S.readers_left[p] = left
    if left == 0:
        _, row = _inst_row(S, p)
        nb = S.r_mem[row]
        if nb > 0:
            _release(S, S.r_pool[row], nb)


@njit(cache=True)
def _read_inputs(S, t):
    """Task ``t`` has read its inputs (its predecessors: in its unit, its references, the kernel
    before it on its GPU): a buffer whose last reader this was is freed."""
    i, row = _inst_row(S, t)
    base = S.i_base[i]
    for e in range(S.r_ipred_ptr[row], S.r_ipred_ptr[row + 1]):
        _read_one(S, base + S.r_ipred[e])
    tpl = S.i_tpl[i]
    if S.r_xref_ptr[row + 1] > S.r_xref_ptr[row]:
        gs = S.i_gstart[i]
        gbase = S.t_gstart[tpl]
        for e in range(S.r_xref_ptr[row], S.r_xref_ptr[row + 1]):
            g = S.r_xref_group[e]
            j = S.i_target[gs + g]
            if j < 0:
                continue
            if S.g_lastkernel[gbase + g]:
                _read_one(S, S.i_base[j] + S.t_last[S.i_tpl[j]])
            else:
                _read_one(S, S.i_base[j] + S.r_xref_rel[e])
    prev = S.i_prev[i]
    if prev >= 0 and row - S.t_start[tpl] == S.t_first[tpl]:
        _read_one(S, S.i_base[prev] + S.t_last[S.i_tpl[prev]])
    S.preds_read[t] = True


@njit(cache=True)
def _successors(S, t, at):
    """Write task ``t``'s successors, ascending, into ``sb[at:]``; return where they end."""
    i, row = _inst_row(S, t)
    base = S.i_base[i]
    sb = S.sb
    k = at
    for e in range(S.r_isucc_ptr[row], S.r_isucc_ptr[row + 1]):
        sb[k] = base + S.r_isucc[e]
        k += 1
    tpl = S.i_tpl[i]
    rel = row - S.t_start[tpl]
    for q in range(S.i_inc_ptr[i], S.i_inc_ptr[i + 1]):
        b2 = S.i_base[S.i_inc_inst[q]]
        gg = S.i_inc_group[q]
        if S.g_lastkernel[gg]:
            if rel == S.t_last[tpl]:
                for e in range(S.g_rel_ptr[gg], S.g_rel_ptr[gg + 1]):
                    sb[k] = b2 + S.g_rel[e]
                    k += 1
        else:
            a = S.g_rev_base[gg] + rel
            for e in range(S.rev_ptr[a], S.rev_ptr[a + 1]):
                sb[k] = b2 + S.rev_rel[e]
                k += 1
    nxt = S.i_next[i]
    if nxt >= 0 and rel == S.t_last[tpl]:
        sb[k] = S.i_base[nxt] + S.t_first[S.i_tpl[nxt]]
        k += 1
    for e in range(at + 1, k):  # usually ascending already (sorted only when not)
        if sb[e] < sb[e - 1]:
            _sort(sb, sb, at, k, False)
            break
    return k


@njit(cache=True)
def _finish(S, t):
    """Task ``t`` ends now; True when its successors are to be readied."""
    S.end[t] = S.fl[F_NOW]
    if not S.preds_read[t]:
        _read_inputs(S, t)
    slot = S.slot_of[t] - 1
    if slot >= 0:  # a transfer's flow slot is free again
        S.f_free[S.it[I_FREE]] = slot
        S.it[I_FREE] += 1
        S.slot_of[t] = 0
    if not S.has_succ[t]:  # nobody reads its buffer: freed at once
        _, row = _inst_row(S, t)
        nb = S.r_mem[row]
        if nb > 0:
            _release(S, S.r_pool[row], nb)
        return False
    return True


@njit(cache=True)
def _advance(S, t):
    """A step of transfer ``t`` has arrived: start the next (a flow, or its latency) or finish;
    True when the task has finished and its successors are to be readied."""
    _, row = _inst_row(S, t)
    while True:
        left = S.steps_left[t]
        if left > 0:
            if left == S.r_steps[row] - 1:
                _read_inputs(S, t)
            S.steps_left[t] = left - 1
            if S.r_flow[row]:
                _add_flow(S, t, row)
                return False
            lat = S.rt_lat[S.r_route[row]]
            if lat > 0:
                _q_push(S, S.fl[F_NOW] + lat, EV_DELIVER, t, 0)
                return False
            continue
        return _finish(S, t)


@njit(cache=True)
def _dispatch(S, t):
    """Task ``t``'s predecessors have all ended: queue it on its device, or start its transfer.
    True when it finished at once (a transfer without bytes nor latency)."""
    now = S.fl[F_NOW]
    _, row = _inst_row(S, t)
    if S.r_compute[row]:
        d = S.r_dev[row]
        r = S.rank[t] if not S.it[I_IDENTITY] else t
        base = S.dh_base[d]
        i = S.dh_size[d]
        S.dh_size[d] = i + 1
        S.dh_rank[base + i] = r
        while i > 0:
            parent = (i - 1) >> 1
            if S.dh_rank[base + i] < S.dh_rank[base + parent]:
                S.dh_rank[base + i], S.dh_rank[base + parent] = S.dh_rank[base + parent], S.dh_rank[base + i]
                i = parent
            else:
                break
        n_idle = S.idle_size[d]
        if n_idle:
            S.idle_size[d] = n_idle - 1
            _q_push(S, now, EV_DEV_WAKE, S.idle_stream[S.idle_base[d] + n_idle - 1], 0)
        return False
    S.start[t] = now
    S.steps_left[t] = max(S.r_steps[row] - 1, 0)
    if S.r_mem[row] > 0:
        _allocate(S, t, row)
    if S.r_flow[row]:
        _add_flow(S, t, row)
        return False
    lat = S.rt_lat[S.r_route[row]]
    if lat > 0:
        _q_push(S, now + lat, EV_DELIVER, t, 0)
        return False
    return _advance(S, t)


@njit(cache=True)
def _complete(S, t0):
    """Ready the successors of ``t0`` (and, depth first, of those that finish at once)."""
    top = 0
    S.st_t[0] = t0
    S.st_a[0] = 0
    S.st_b[0] = _successors(S, t0, 0)
    while top >= 0:
        a = S.st_a[top]
        if a == S.st_b[top]:
            top -= 1
            continue
        S.st_a[top] = a + 1
        s = S.sb[a]
        w = S.waiting[s] - 1
        S.waiting[s] = w
        if w == 0 and _dispatch(S, s):
            at = S.st_b[top]
            top += 1
            S.st_t[top] = s
            S.st_a[top] = at
            S.st_b[top] = _successors(S, s, at)


@njit(cache=True)
def _stream(S, s):
    """Device stream ``s`` takes its device's lowest-ranked ready task, or waits idle."""
    d = S.stream_dev[s]
    base = S.dh_base[d]
    size = S.dh_size[d]
    if size == 0:
        S.idle_stream[S.idle_base[d] + S.idle_size[d]] = s
        S.idle_size[d] += 1
        return
    r = S.dh_rank[base]
    last = size - 1
    S.dh_size[d] = last
    S.dh_rank[base] = S.dh_rank[base + last]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= last:
            break
        child = left
        if left + 1 < last and S.dh_rank[base + left + 1] < S.dh_rank[base + left]:
            child = left + 1
        if S.dh_rank[base + child] < S.dh_rank[base + i]:
            S.dh_rank[base + child], S.dh_rank[base + i] = S.dh_rank[base + i], S.dh_rank[base + child]
            i = child
        else:
            break
    t = S.by_rank[r] if not S.it[I_IDENTITY] else r
    _, row = _inst_row(S, t)
    now = S.fl[F_NOW]
    S.start[t] = now
    if S.r_mem[row] > 0:
        _allocate(S, t, row)
    _q_push(S, now + S.r_duration[row], EV_DEV_DONE, s, t)


@njit(cache=True)
def _network(S):
    """The network process wakes: deliver the flows that have finished serialising (in start
    order), recompute the rates that changed, set its timer to the next finish."""
    it = S.it
    it[I_WAKE] = 0
    now = S.fl[F_NOW]
    limit = now + abs(now) * 1e-12 + 1e-18
    nf = 0
    while it[I_NHN] > 0:
        top = S.nh[0]
        if S.f_finish[top] > limit:
            break
        _nh_remove(S, top)
        S.fin_slot[nf] = top
        S.fin_seq[nf] = S.f_seq[top]
        nf += 1
    if nf:
        _sort(S.fin_seq, S.fin_slot, 0, nf, True)  # in start order
        for j in range(nf):
            t = S.slot_task[S.fin_slot[j]]
            _, row = _inst_row(S, t)
            _remove_flow(S, t, row)
            lat = S.rt_lat[S.r_route[row]]
            if lat <= 0:
                if _advance(S, t):
                    _complete(S, t)
            else:
                _q_push(S, now + lat, EV_DELIVER, t, 0)
    if it[I_NDIRTY]:
        _recompute(S)
    if it[I_NHN] > 0:
        nxt = S.f_finish[S.nh[0]]
        if nxt < INF and nxt != S.fl[F_TIMER_AT]:
            S.fl[F_TIMER_AT] = nxt
            S.fl[F_TIMER_TIME] = now + max(0.0, nxt - now)
            it[I_TVALID] = 1
            it[I_TEID] = it[I_EID]
            it[I_EID] += 1


# ---------------------------------------------------------------------- the loop
@njit(cache=True)
def start(S, first):
    """What the SimPy engine does before its loop: ready every task without predecessors (in
    task order: ``first``, listed by the caller before any runs, since those a task ending at once
    readies come later), then start the device streams (their processes' start events)."""
    for t in first:
        if _dispatch(S, t):
            _complete(S, t)
    for s in range(S.it[I_NSTREAMS]):
        _stream(S, s)


@njit(cache=True)
def run(S, budget, link_room):
    """Process up to ``budget`` events; DONE when none is left, BUDGET when the budget is spent,
    GROW_LINKS when (with record) the link timeline has less than ``link_room`` rows free."""
    it = S.it
    fl = S.fl
    done = 0
    while True:
        has_q = it[I_QN] > 0
        has_t = it[I_TVALID] != 0
        if not has_q and not has_t:
            return DONE
        if done >= budget:
            return BUDGET
        if it[I_RECORD] and S.lt_time.shape[0] - it[I_LTN] < link_room:
            return GROW_LINKS
        done += 1
        it[I_EVENTS] += 1
        use_timer = False
        if has_t:
            if not has_q:
                use_timer = True
            else:
                tt = fl[F_TIMER_TIME]
                qt = S.q_time[0]
                use_timer = tt < qt or (tt == qt and it[I_TEID] < S.q_eid[0])
        if use_timer:
            fl[F_NOW] = fl[F_TIMER_TIME]
            it[I_TVALID] = 0
            fl[F_TIMER_AT] = INF
            if it[I_WAKE] == 0:
                it[I_WAKE] = 1
                _q_push(S, fl[F_NOW], EV_NET_WAKE, 0, 0)
            continue
        i = _q_pop(S)
        fl[F_NOW] = S.q_time[i]
        kind = S.q_kind[i]
        a = S.q_a[i]
        if kind == EV_DEV_DONE:
            t = S.q_b[i]
            if _finish(S, t):
                _complete(S, t)
            _stream(S, a)
        elif kind == EV_DELIVER:
            if _advance(S, a):
                _complete(S, a)
        elif kind == EV_NET_WAKE:
            _network(S)
        else:  # EV_DEV_WAKE
            _stream(S, a)
