"""A validator of Chrome Trace Event Format files, and tests that it rejects what it should.

The format is Google's "Trace Event Format" document (the JSON Object Format read by
chrome://tracing and ui.perfetto.dev), with the rules Perfetto's JSON importer adds. The
validator :func:`check_trace` checks:

File
  * strict JSON (no NaN/Infinity, no duplicate keys), a top-level object whose first key is
    ``traceEvents`` (a list); other top-level keys only from the format's list; ``displayTimeUnit``
    is ``ms`` or ``ns`` when present;
  * no ``\\u`` escapes and no control characters in strings (Perfetto's tokenizer rejects them).

Every event
  * an object with a one-letter ``ph`` from the format's phases; ``name`` a string; ``cat`` a
    string when present; integer ``pid`` and ``tid`` >= 1 (Perfetto maps 0 to the idle process);
    a number ``ts`` >= 0 in microseconds (on a nanosecond grid: at most three decimals);
    ``args`` an object when present; no array values at the top level of an event (Perfetto's
    tokenizer rejects them);
  * ``X``: a number ``dur`` >= 0 on the same grid;
  * ``C``: ``args`` holds at least one value, all finite numbers;
  * ``M``: ``name`` is process_name / process_labels / process_sort_index / thread_name /
    thread_sort_index with the matching ``args`` (``name`` / ``labels`` strings,
    ``sort_index`` integer), at most one of each per process or thread;
  * ``s``/``t``/``f``: an integer ``id``; ``bp`` absent or ``e`` on ``f``.

Across events
  * every process with events has a ``process_name``; every track with slices a ``thread_name``;
  * on each track (pid, tid), ``X`` slices never overlap: each begins at or after the end of the
    one before (an empty slice counts as 1 ns, so no two slices of a track start together);
    ``B``/``E`` events are not produced by marssim and rejected here;
  * every flow (``cat``, ``name``, ``id``) has exactly one ``s`` and one ``f``, the ``s`` no later
    than the ``f``, and each end binds to a slice of its own track: strictly inside it when the
    slice lasts 2 ns or more, at its start otherwise (so a viewer binds it to that slice).

Times are compared exactly: numbers are parsed as decimals.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import pytest

PHASES = set("BEXiICbneSTpFstfPNODMVvRc()")
TOP_LEVEL_KEYS = {"traceEvents", "displayTimeUnit", "otherData", "metadata", "systemTraceEvents", "stackFrames",
                  "samples", "controllerTraceDataKey", "powerTraceAsString"}
METADATA = {"process_name": ("name", str), "process_labels": ("labels", str), "process_sort_index": ("sort_index", int),
            "thread_name": ("name", str), "thread_sort_index": ("sort_index", int)}
NS = Decimal("0.001")


class TraceFormatError(AssertionError):
    """The file breaks a rule of the format; the message lists the first problems."""


@dataclass
class Slice:
    pid: int
    tid: int
    ts: Decimal
    dur: Decimal
    cat: str
    name: str
    args: dict
    index: int  # position in traceEvents

    @property
    def end(self) -> Decimal:
        return self.ts + self.dur


@dataclass
class CheckedTrace:
    """What a valid trace holds, decoded for further checks."""

    events: list
    other: dict
    slices: list[Slice] = field(default_factory=list)
    flows: list[tuple[Slice, Slice]] = field(default_factory=list)  # (source slice, destination slice) per flow
    counters: dict = field(default_factory=dict)  # (pid, name, key) -> [(ts, value)] in file order
    process_names: dict = field(default_factory=dict)
    thread_names: dict = field(default_factory=dict)


def read_text(path: str | Path) -> str:
    path = Path(path)
    raw = path.read_bytes()
    return (gzip.decompress(raw) if path.name.endswith(".gz") else raw).decode("utf-8")


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise TraceFormatError(f"duplicate key in object: {keys}")
    return dict(pairs)


def _reject_constant(name):
    raise TraceFormatError(f"non-JSON number {name}")


def _is_number(x) -> bool:
    return isinstance(x, (int, Decimal)) and not isinstance(x, bool) and (not isinstance(x, Decimal) or x.is_finite())


def _on_grid(x) -> bool:
    return isinstance(x, int) or (x / NS) == (x / NS).to_integral_value()


def check_trace(source: str | Path) -> CheckedTrace:
    """Validate a trace (a path to .json/.json.gz, or the JSON text); raise TraceFormatError."""
    text = read_text(source) if isinstance(source, Path) else source
    problems: list[str] = []

    def bad(msg: str) -> None:
        problems.append(msg)
        if len(problems) >= 20:
            raise TraceFormatError("\n".join(problems))

    if "\\u" in text:
        bad("a \\u escape (Perfetto's JSON tokenizer does not accept them)")
    data = json.loads(text, parse_float=Decimal, parse_constant=_reject_constant, object_pairs_hook=_no_duplicates)
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceFormatError("expected an object with a traceEvents list (JSON Object Format)")
    if next(iter(data)) != "traceEvents":
        bad("traceEvents is not the first key")
    for key in data:
        if key not in TOP_LEVEL_KEYS:
            bad(f"unknown top-level key {key!r}")
    if "displayTimeUnit" in data and data["displayTimeUnit"] not in ("ms", "ns"):
        bad("displayTimeUnit must be 'ms' or 'ns'")
    out = CheckedTrace(events=data["traceEvents"], other=data.get("otherData", {}))
    meta_seen: set = set()
    pids_with_events: set = set()
    tracks_with_slices: set = set()
    flow_ends: dict = defaultdict(lambda: {"s": [], "t": [], "f": []})
    for i, e in enumerate(out.events):
        if not isinstance(e, dict):
            bad(f"event {i} is not an object")
            continue
        ph = e.get("ph")
        if not isinstance(ph, str) or len(ph) != 1 or ph not in PHASES:
            bad(f"event {i}: ph {ph!r} is not a phase of the format")
            continue
        if not isinstance(e.get("name"), str):
            bad(f"event {i}: name must be a string")
        if "cat" in e and not isinstance(e["cat"], str):
            bad(f"event {i}: cat must be a string")
        for key in ("pid", "tid"):
            if not isinstance(e.get(key), int) or isinstance(e.get(key), bool) or e[key] < 1:
                bad(f"event {i}: {key} must be a positive integer (Perfetto reads 0 as the idle process/thread)")
        ts = e.get("ts")
        if not _is_number(ts) or ts < 0:
            bad(f"event {i}: ts must be a number >= 0 (microseconds)")
            continue
        if not _on_grid(ts):
            bad(f"event {i}: ts {ts} has more than three decimals (finer than 1 ns)")
        if "args" in e and not isinstance(e["args"], dict):
            bad(f"event {i}: args must be an object")
        for key, value in e.items():
            if isinstance(value, list):
                bad(f"event {i}: array value for {key!r}")
        pid, tid = e.get("pid"), e.get("tid")
        if ph != "M":
            pids_with_events.add(pid)
        if ph == "X":
            dur = e.get("dur")
            if not _is_number(dur) or dur < 0:
                bad(f"event {i}: X needs a number dur >= 0")
                continue
            if not _on_grid(dur):
                bad(f"event {i}: dur {dur} has more than three decimals")
            out.slices.append(Slice(pid, tid, Decimal(ts), Decimal(dur), e.get("cat", ""), e["name"],
                                    e.get("args", {}), i))
            tracks_with_slices.add((pid, tid))
        elif ph in "BE":
            bad(f"event {i}: B/E slices are not expected (marssim writes X slices)")
        elif ph == "C":
            args = e.get("args")
            if not isinstance(args, dict) or not args:
                bad(f"event {i}: C needs a non-empty args object")
                continue
            for key, value in args.items():
                if not _is_number(value):
                    bad(f"event {i}: counter {key!r} is not a finite number")
                    continue
                out.counters.setdefault((pid, e["name"], key), []).append((Decimal(ts), Decimal(value)))
        elif ph == "M":
            spec = METADATA.get(e.get("name"))
            if spec is None:
                bad(f"event {i}: unknown metadata {e.get('name')!r}")
                continue
            key, kind = spec
            value = e.get("args", {}).get(key)
            if not isinstance(value, kind) or isinstance(value, bool):
                bad(f"event {i}: {e['name']} needs args.{key} of type {kind.__name__}")
            scope = (e["name"], pid) if e["name"].startswith("process") else (e["name"], pid, tid)
            if scope in meta_seen:
                bad(f"event {i}: second {e['name']} for {scope[1:]}")
            meta_seen.add(scope)
            if e["name"] == "process_name":
                out.process_names[pid] = value
            elif e["name"] == "thread_name":
                out.thread_names[(pid, tid)] = value
        elif ph in "stf":
            if not isinstance(e.get("id"), int) or isinstance(e.get("id"), bool):
                bad(f"event {i}: flow event needs an integer id")
                continue
            if ph == "f" and e.get("bp", "e") != "e":
                bad(f"event {i}: flow end binds to the next slice (bp != 'e'); marssim binds to the enclosing one")
            flow_ends[(e.get("cat", ""), e["name"], e["id"])][ph].append(e)
    for pid in sorted(pids_with_events - set(out.process_names), key=str):
        bad(f"process {pid} has events but no process_name")
    for track in sorted(tracks_with_slices - set(out.thread_names), key=str):
        bad(f"track {track} has slices but no thread_name")
    # no overlap on a track
    by_track: dict = defaultdict(list)
    for s in out.slices:
        by_track[(s.pid, s.tid)].append(s)
    for track, slices in by_track.items():
        slices.sort(key=lambda s: (s.ts, s.dur))
        for a, b in zip(slices, slices[1:]):
            if b.ts < a.ts + max(a.dur, NS):
                bad(f"track {track}: slice at {b.ts} us (event {b.index}) overlaps the one at {a.ts} us "
                    f"(event {a.index}, dur {a.dur})")
    # flows: both ends, each bound to a slice of its track
    for key, ends in flow_ends.items():
        if len(ends["s"]) != 1 or len(ends["f"]) != 1:
            bad(f"flow {key}: {len(ends['s'])} start(s) and {len(ends['f'])} end(s), expected one of each")
            continue
        start, finish = ends["s"][0], ends["f"][0]
        if Decimal(start["ts"]) > Decimal(finish["ts"]):
            bad(f"flow {key}: ends before it starts")
        bound = []
        for end in (start, finish):
            slice_ = _enclosing(by_track.get((end["pid"], end["tid"]), []), Decimal(end["ts"]))
            if slice_ is None:
                bad(f"flow {key}: its {end['ph']} at {end['ts']} us on track ({end['pid']}, {end['tid']}) "
                    f"is not inside a slice")
            bound.append(slice_)
        if all(b is not None for b in bound):
            out.flows.append((bound[0], bound[1]))
    if problems:
        raise TraceFormatError("\n".join(problems))
    return out


def _enclosing(slices: list[Slice], ts: Decimal) -> Slice | None:
    """The slice a flow end at ``ts`` binds to: ts strictly inside it, or at its start when it
    is shorter than 2 ns."""
    for s in slices:
        if s.dur >= 2 * NS and s.ts < ts < s.end:
            return s
        if s.dur < 2 * NS and ts == s.ts:
            return s
    return None


# ---------------------------------------------------------------------- the validator's own tests
def _trace(*events, other_first: bool = False, **top) -> str:
    names = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 1, "ts": 0, "args": {"name": "p"}},
             {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "ts": 0, "args": {"name": "t"}}]
    body = {"otherData": {}} if other_first else {}
    body["traceEvents"] = names + list(events)
    body.update(top)
    return json.dumps(body)


def _x(ts, dur, tid=2, **kw):
    return {"ph": "X", "name": "a", "cat": "c", "pid": 1, "tid": tid, "ts": ts, "dur": dur, **kw}


def test_a_well_formed_trace_passes_and_is_decoded():
    text = _trace(_x(0, 1.5), _x(1.5, 2), _x(4, 0),
                  {"ph": "s", "cat": "f", "name": "f", "id": 1, "pid": 1, "tid": 2, "ts": 0.75},
                  {"ph": "f", "bp": "e", "cat": "f", "name": "f", "id": 1, "pid": 1, "tid": 2, "ts": 2.5},
                  {"ph": "C", "name": "mem", "pid": 1, "tid": 1, "ts": 0, "args": {"MiB": 3}},
                  otherData={"x": 1})
    checked = check_trace(text)
    assert len(checked.slices) == 3
    assert [(a.ts, b.ts) for a, b in checked.flows] == [(Decimal(0), Decimal("1.5"))]
    assert checked.counters[(1, "mem", "MiB")] == [(0, 3)]


@pytest.mark.parametrize("events, message", [
    ([_x(0, 2), _x(1, 2)], "overlaps"),
    ([_x(0, 0), _x(0, 1)], "overlaps"),  # two slices starting together, the first empty
    ([{"ph": "X", "name": "a", "pid": 1, "tid": 2, "ts": 0}], "dur"),
    ([_x(-1, 1)], "ts must be"),
    ([_x(0.0001, 1)], "three decimals"),
    ([{"ph": "Q", "name": "a", "pid": 1, "tid": 2, "ts": 0}], "phase"),
    ([_x(0, 1, tid=3)], "no thread_name"),
    ([{**_x(0, 1), "pid": "p"}], "pid"),
    ([{**_x(0, 1), "args": [1]}], "args must be an object"),
    ([_x(0, 1), {"ph": "s", "cat": "f", "name": "f", "id": 1, "pid": 1, "tid": 2, "ts": 0.5}], "end(s)"),
    ([_x(0, 1), {"ph": "s", "cat": "f", "name": "f", "id": 1, "pid": 1, "tid": 2, "ts": 0.5},
      {"ph": "f", "bp": "e", "cat": "f", "name": "f", "id": 1, "pid": 1, "tid": 2, "ts": 3}], "not inside a slice"),
    ([_x(0, 1), _x(2, 1), {"ph": "s", "cat": "f", "name": "f", "id": 1, "pid": 1, "tid": 2, "ts": 0.5},
      {"ph": "f", "cat": "f", "name": "f", "id": 1, "bp": "n", "pid": 1, "tid": 2, "ts": 2.5}], "bp"),
    ([{"ph": "C", "name": "m", "pid": 1, "tid": 1, "ts": 0, "args": {"v": "x"}}], "finite number"),
    ([{"ph": "C", "name": "m", "pid": 1, "tid": 0, "ts": 0, "args": {"v": 1}}], "positive integer"),
    ([{"ph": "M", "name": "process_name", "pid": 1, "tid": 1, "ts": 0, "args": {"name": "again"}}], "second"),
    ([{"ph": "M", "name": "thread_sort_index", "pid": 1, "tid": 2, "ts": 0, "args": {"sort_index": "1"}}],
     "sort_index"),
    ([{"ph": "B", "name": "a", "pid": 1, "tid": 2, "ts": 0}], "B/E"),
])
def test_broken_traces_are_rejected(events, message):
    with pytest.raises(TraceFormatError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_trace(_trace(*events))


def test_file_level_rules():
    with pytest.raises(TraceFormatError, match="first key"):
        check_trace(_trace(_x(0, 1), other_first=True))
    with pytest.raises(TraceFormatError, match="unknown top-level"):
        check_trace(_trace(_x(0, 1), extra=1))
    with pytest.raises(TraceFormatError, match="non-JSON"):
        check_trace(_trace(_x(0, 1)).replace('"dur": 1', '"dur": NaN'))
    with pytest.raises(TraceFormatError, match="escape"):
        check_trace(_trace(_x(0, 1, args={"op": "\u00e9"})))  # json.dumps escapes it as \u00e9
    with pytest.raises(TraceFormatError, match="duplicate key"):
        check_trace(_trace(_x(0, 1)).replace('"cat": "c"', '"cat": "c", "cat": "d"'))
