"""Chrome Trace Event JSON (opens in ui.perfetto.dev and chrome://tracing), written streaming.

The file is the JSON Object Format: ``{"traceEvents": [...], "otherData": {...}}``. Events:

* ``M`` metadata: ``process_name``, ``process_labels``, ``process_sort_index``, ``thread_name``,
  ``thread_sort_index`` for every process and track of the :mod:`~marssim.trace.layout`;
  process-wide events (process metadata, counters) name the process's main thread (tid = pid;
  Perfetto reads tid 0 as the idle thread of process 0);
* ``X`` complete slices, ``ts``/``dur`` in microseconds on a nanosecond grid: one per interval
  of the log (category ``compute``, ``transfer``, ``spill_out`` or ``spill_in``; ``args.interval``
  is its row in ``result.intervals``), plus one per link or switch backplane a transfer crosses
  (category ``link``, on the link's process);
* ``s``/``f`` flow arrows, one per dependency of ``result.edges`` (producer compute -> transfer
  -> consumer compute, and transfer -> transfer inside collectives); each end lies inside its
  slice (``bp: "e"``: bound to the enclosing slice);
* ``C`` counters: memory occupancy per node (``memory``, MiB) from ``memory_timeline``;
  bandwidth in use per link (``bandwidth``: GB/s and number of flows) and per memory port
  (``memory port``, GB/s) from ``link_timeline``.

Events are produced one at a time by :func:`chrome_events` and written in chunks, so a trace
of millions of events never sits in memory as a list; the same result always gives the same
bytes (gzip with a zero timestamp and no file name in its header).
"""

from __future__ import annotations

import gzip
import io
import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from marssim.fsutil import atomic_file

from .layout import TraceLayout, build_layout, memory_node, resource_kinds, to_ns

__all__ = ["write_chrome_trace", "chrome_events", "FLOW_CATEGORY", "LINK_CATEGORY"]

FLOW_CATEGORY = "dataflow"
LINK_CATEGORY = "link"
_CHUNK_ROWS = 16384
_NOISE = 1e-9  # counter values above capacity by less than this (relative) are float rounding: clamped


def write_chrome_trace(result, path: str | Path, *, flows: bool = True, link_slices: bool = True,
                       counters: bool = True, compresslevel: int = 6) -> int:
    """Write ``result`` as a Chrome/Perfetto trace to ``path`` (gzip when it ends in ``.gz``)
    atomically; return the file's size in bytes.

    ``flows``: dependency arrows; ``link_slices``: a slice on every link a transfer crosses;
    ``counters``: memory occupancy and bandwidth counters."""
    path = Path(path)
    layout = build_layout(result)
    if path.name.endswith(".gz"):
        with atomic_file(path, "wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=compresslevel) as gz:
                with io.TextIOWrapper(gz, encoding="utf-8", newline="\n") as text:
                    _write(text, result, layout, flows, link_slices, counters)
    else:
        with atomic_file(path, "w", encoding="utf-8", newline="\n") as text:
            _write(text, result, layout, flows, link_slices, counters)
    return path.stat().st_size


def _write(out, result, layout: TraceLayout, flows: bool, link_slices: bool, counters: bool) -> None:
    out.write('{"traceEvents":[\n')
    chunk: list[str] = []
    first = True
    for event in chrome_events(result, layout, flows=flows, link_slices=link_slices, counters=counters):
        chunk.append(event)
        if len(chunk) >= 4096:
            out.write(("" if first else ",\n") + ",\n".join(chunk))
            first = False
            chunk.clear()
    if chunk:
        out.write(("" if first else ",\n") + ",\n".join(chunk))
    out.write('\n],\n"otherData":' + json.dumps(_other_data(result), sort_keys=True, ensure_ascii=False) + "}\n")


def _other_data(result) -> dict:
    from marssim import __version__

    meta = {k: v for k, v in result.meta.items() if isinstance(v, (str, int)) and not isinstance(v, bool)}
    data = {"generator": f"marssim {__version__}", "time_unit": "ts and dur in microseconds on a nanosecond grid",
            "makespan_s": _finite(result.makespan)}
    data.update({str(k): v for k, v in meta.items()})
    return data


def _finite(x: float) -> float | None:
    return float(x) if x == x and not math.isinf(x) else None


# ---------------------------------------------------------------------- events
def chrome_events(result, layout: TraceLayout | None = None, *, flows: bool = True, link_slices: bool = True,
                  counters: bool = True) -> Iterator[str]:
    """The trace events of ``result``, each a JSON object text, in file order: metadata, slices
    (each interval followed by its link slices), flow arrows, counters."""
    layout = layout or build_layout(result)
    yield from _metadata(layout)
    yield from _slices(result, layout, link_slices)
    if flows:
        yield from _flows(result, layout)
    if counters:
        yield from _counters(result, layout)


def _metadata(layout: TraceLayout) -> Iterator[str]:
    for order, proc in enumerate(layout.processes):
        where = f'"pid":{proc.pid},"tid":{proc.pid},"ts":0'
        yield f'{{"ph":"M","name":"process_name",{where},"args":{{"name":{_s(proc.name)}}}}}'
        yield f'{{"ph":"M","name":"process_sort_index",{where},"args":{{"sort_index":{order}}}}}'
        if proc.label:
            yield f'{{"ph":"M","name":"process_labels",{where},"args":{{"labels":{_s(proc.label)}}}}}'
    order_in_process: dict[int, int] = {}
    for th in layout.threads:
        k = order_in_process.get(th.pid, 0)
        order_in_process[th.pid] = k + 1
        yield (f'{{"ph":"M","name":"thread_name","pid":{th.pid},"tid":{th.tid},"ts":0,'
               f'"args":{{"name":{_s(th.name)}}}}}')
        yield (f'{{"ph":"M","name":"thread_sort_index","pid":{th.pid},"tid":{th.tid},"ts":0,'
               f'"args":{{"sort_index":{k}}}}}')


def _slices(result, layout: TraceLayout, link_slices: bool) -> Iterator[str]:
    iv = result.intervals
    n = len(iv)
    ops = _op_fragments(result)
    strings: dict[str, str] = {}

    def s(x) -> str:
        v = strings.get(x)
        if v is None:
            v = strings[x] = _s(str(x))
        return v

    hop_row = layout.hop_row if link_slices else np.zeros(0, dtype=np.int64)
    hop_pid, hop_tid = layout.hop_pid, layout.hop_tid
    h = 0  # next link slice
    n_hops = hop_row.shape[0]
    for lo in range(0, n, _CHUNK_ROWS):
        hi = min(n, lo + _CHUNK_ROWS)
        part = iv.iloc[lo:hi]
        cols = {c: part[c].tolist() for c in ("kind", "task", "op", "model", "micro_batch", "bytes", "flops",
                                              "energy", "src", "dst", "collective", "collective_id", "links")}
        ts_l = layout.start_ns[lo:hi].tolist()
        end_l = layout.end_ns[lo:hi].tolist()
        pid_l = layout.pid[lo:hi].tolist()
        tid_l = layout.tid[lo:hi].tolist()
        for j in range(hi - lo):
            row = lo + j
            kind = cols["kind"][j]
            ts = ts_l[j]
            dur = end_l[j] - ts
            op = cols["op"][j]
            head = f'"pid":{pid_l[j]},"tid":{tid_l[j]},"ts":{_us(ts)},"dur":{_us(dur)}'
            if kind == "compute":
                energy = cols["energy"][j]
                extra = f',"energy_j":{_num(energy)}' if energy == energy else ""
                yield (f'{{"ph":"X","cat":"compute","name":{s(op or "compute")},{head},"args":{{"interval":{row},'
                       f'"task":{cols["task"][j]},"op":{s(op)},{ops.get(op, "")}'
                       f'"micro_batch":{cols["micro_batch"][j]},"flops":{_num(cols["flops"][j])}{extra}}}}}')
                continue
            coll = cols["collective"][j]
            name = f"{op} {coll or kind}" if op else (coll or kind)
            nbytes = cols["bytes"][j]
            rate = f',"avg_GB/s":{_num(nbytes / dur)}' if dur > 0 else ""  # bytes per ns = GB/s
            common = (f'"op":{s(op)},"micro_batch":{cols["micro_batch"][j]},"bytes":{_num(nbytes)},'
                      f'"src":{s(cols["src"][j])},"dst":{s(cols["dst"][j])}')
            yield (f'{{"ph":"X","cat":{s(kind)},"name":{s(name)},{head},"args":{{"interval":{row},'
                   f'"task":{cols["task"][j]},{common},"collective":{s(coll)},'
                   f'"collective_id":{cols["collective_id"][j]},"route":{s(cols["links"][j])}{rate}}}}}')
            while h < n_hops and hop_row[h] == row:
                yield (f'{{"ph":"X","cat":"{LINK_CATEGORY}","name":{s(name)},"pid":{hop_pid[h]},'
                       f'"tid":{hop_tid[h]},"ts":{_us(ts)},"dur":{_us(dur)},'
                       f'"args":{{"interval":{row},"task":{cols["task"][j]},{common}}}}}')
                h += 1


_OP_ARGS = {"kind": "op_kind", "model": "model", "sharding": "sharding", "set": "set", "loops": "op_loops"}


def _op_fragments(result) -> dict[str, str]:
    """Per op name, its args fragment (op kind, model, sharding, set, op loop bounds), each
    item followed by a comma."""
    ops = result.ops
    out: dict[str, str] = {}
    if ops is None or not len(ops):
        return out
    cols = [c for c in _OP_ARGS if c in ops.columns]
    for name, values in zip(ops.index, ops[cols].itertuples(index=False, name=None)):
        parts = []
        for c, v in zip(cols, values):
            if isinstance(v, (bool, np.bool_)) or v is None:
                continue
            if isinstance(v, (int, np.integer, float, np.floating)):
                if v == v:
                    parts.append(f'"{_OP_ARGS[c]}":{_num(float(v))},')
            elif str(v):
                parts.append(f'"{_OP_ARGS[c]}":{_s(str(v))},')
        out[str(name)] = "".join(parts)
    return out


def _flows(result, layout: TraceLayout) -> Iterator[str]:
    edges = result.edges
    if edges is None or not len(edges) or not len(result.intervals):
        return
    task = result.intervals["task"].to_numpy(dtype=np.int64)
    known = task >= 0
    row_of = np.full(int(task.max()) + 1 if known.any() else 1, -1, dtype=np.int64)
    row_of[task[known]] = np.flatnonzero(known)
    src = edges["src_task"].to_numpy(dtype=np.int64)
    dst = edges["dst_task"].to_numpy(dtype=np.int64)
    ok = (src >= 0) & (dst >= 0) & (src < row_of.shape[0]) & (dst < row_of.shape[0])
    a = np.where(ok, row_of[np.where(ok, src, 0)], -1)
    b = np.where(ok, row_of[np.where(ok, dst, 0)], -1)
    keep = (a >= 0) & (b >= 0)
    a, b = a[keep], b[keep]
    anchor = _anchor(layout.start_ns, layout.end_ns)
    pid, tid = layout.pid, layout.tid
    for k, (ra, rb) in enumerate(zip(a.tolist(), b.tolist()), start=1):
        yield (f'{{"ph":"s","cat":"{FLOW_CATEGORY}","name":"{FLOW_CATEGORY}","id":{k},"pid":{pid[ra]},'
               f'"tid":{tid[ra]},"ts":{_us(int(anchor[ra]))}}}')
        yield (f'{{"ph":"f","bp":"e","cat":"{FLOW_CATEGORY}","name":"{FLOW_CATEGORY}","id":{k},"pid":{pid[rb]},'
               f'"tid":{tid[rb]},"ts":{_us(int(anchor[rb]))}}}')


def _anchor(start_ns: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
    """Where a flow end binds to a slice: its middle nanosecond, strictly inside it when it lasts
    2 ns or more (so the viewer finds that slice open there and no other); else its start."""
    dur = end_ns - start_ns
    return np.where(dur >= 2, start_ns + dur // 2, start_ns)


def _counters(result, layout: TraceLayout) -> Iterator[str]:
    # memory occupancy per node, MiB (bytes / 2**20 is exact, so comparisons with the capacity are)
    mem = result.memory_timeline
    caps = result.memories["capacity_bytes"] if "capacity_bytes" in getattr(result.memories, "columns", ()) else None
    if mem is not None and len(mem):
        for node, grp in _by_key(mem, "node", layout.node_pid):
            values = grp["bytes"].to_numpy(dtype=float)
            if caps is not None and node in caps.index:
                values = _clamp_noise(values, float(caps[node]))
            ts, values = _collapse(to_ns(grp["time"].to_numpy()), values)
            pid = layout.node_pid[node]
            for t, v in zip(ts.tolist(), (values / 2**20).tolist()):
                yield f'{{"ph":"C","name":"memory","pid":{pid},"tid":{pid},"ts":{_us(t)},"args":{{"MiB":{_num(v)}}}}}'
    # bandwidth in use per link / backplane, and per memory port
    lt = result.link_timeline
    if lt is None or not len(lt):
        return
    kinds = resource_kinds(result)
    capacity = result.links["capacity"] if "capacity" in getattr(result.links, "columns", ()) else None
    targets: dict[str, tuple[int, bool]] = {}
    for res in pd.unique(lt["resource"]):
        res = str(res)
        if res in layout.resource_pid:
            targets[res] = (layout.resource_pid[res], True)
        elif kinds.get(res, "memory") == "memory" and memory_node(res) in layout.node_pid:
            targets[res] = (layout.node_pid[memory_node(res)], False)
    ordered = sorted(targets, key=lambda r: (targets[r][0], r))
    groups = dict(iter(lt.groupby("resource", sort=False)))
    for res in ordered:
        grp = groups[res]
        pid, is_link = targets[res]
        rate = grp["rate"].to_numpy(dtype=float)
        if capacity is not None and res in capacity.index:
            rate = _clamp_noise(rate, float(capacity[res]))
        flows = grp["flows"].to_numpy(dtype=np.int64)
        ts = to_ns(grp["time"].to_numpy())
        keep = np.r_[ts[1:] != ts[:-1], True]  # last change at each nanosecond
        ts, rate, flows = ts[keep], rate[keep], flows[keep]
        if ts.shape[0] == 0 or ts[0] > 0:
            ts, rate, flows = np.r_[0, ts], np.r_[0.0, rate], np.r_[0, flows]
        gbps = (rate / 1e9).tolist()
        if is_link:
            for t, v, k in zip(ts.tolist(), gbps, flows.tolist()):
                yield (f'{{"ph":"C","name":"bandwidth","pid":{pid},"tid":{pid},"ts":{_us(t)},'
                       f'"args":{{"GB/s":{_num(v)},"flows":{k}}}}}')
        else:
            for t, v in zip(ts.tolist(), gbps):
                yield (f'{{"ph":"C","name":"memory port","pid":{pid},"tid":{pid},"ts":{_us(t)},'
                       f'"args":{{"GB/s":{_num(v)}}}}}')


def _by_key(frame: pd.DataFrame, column: str, order: dict[str, int]):
    """Groups of ``frame`` by ``column`` for keys in ``order``, sorted by their order value."""
    groups = {str(k): g for k, g in frame.groupby(column, sort=False)}
    for key in sorted((k for k in groups if k in order), key=order.__getitem__):
        yield key, groups[key]


def _collapse(ts: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keep the last value at each nanosecond, then drop values equal to the one before."""
    keep = np.r_[ts[1:] != ts[:-1], True]
    ts, values = ts[keep], values[keep]
    keep = np.r_[True, values[1:] != values[:-1]]
    return ts[keep], values[keep]


def _clamp_noise(values: np.ndarray, cap: float) -> np.ndarray:
    """Values above ``cap`` by float rounding only (< 1e-9 relative) become ``cap``; larger
    excesses are left as they are (they would be a simulator bug, and must stay visible)."""
    over = (values > cap) & (values <= cap * (1 + _NOISE))
    return np.where(over, cap, values) if over.any() else values


# ---------------------------------------------------------------------- formatting
def _s(text: str) -> str:
    """A JSON string literal (UTF-8, no ``\\u`` escapes for printable characters)."""
    return json.dumps(text, ensure_ascii=False)


def _num(x: float) -> str:
    """A JSON number: integers without a fraction, else the shortest repr that round-trips."""
    x = float(x)
    if x != x or math.isinf(x):
        return "null"
    if x.is_integer() and abs(x) < 2**53:
        return str(int(x))
    return repr(x)


def _us(ns: int) -> str:
    """Integer nanoseconds as exact decimal microseconds: 1234567 -> ``1234.567``."""
    q, r = divmod(int(ns), 1000)
    if r == 0:
        return str(q)
    return f"{q}.{r:03d}".rstrip("0")
