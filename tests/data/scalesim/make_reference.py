"""Run SCALE-Sim 3.0.0 on the reference grid and write ``reference.csv`` beside this file
(with ``--repaired``, ``reference_repaired.csv``: see README.md here).

Not part of marssim and never run by its tests: it needs SCALE-Sim, which lives in its own
virtual environment (see README.md here). The tests read only the committed tables.

    /path/to/scalesim-venv/bin/python tests/data/scalesim/make_reference.py [--jobs 1] [--repaired]

The grid: the layers in ``layers.csv`` (ResNet-18/50 convolutions at batch 1, BERT-base GEMMs at
sequence 128) x the three dataflows (os, ws, is) x three per-operand SRAM sizes x three DRAM
bandwidths, on a 32 x 32 array, int8 (SCALE-Sim's word is one byte), in SCALE-Sim's user
bandwidth mode. Each run's configuration is written to ``configs/`` (one file per dataflow, SRAM
size and bandwidth) before it runs.

SCALE-Sim 3.0.0 in user-bandwidth mode takes the ifmap and filter DRAM bandwidths from the
``[layout]`` keys ``IfmapSRAMBankBandwidth`` / ``FilterSRAMBankBandwidth`` and only the ofmap's
from ``Bandwidth``; all three are set to the same value here, so each of the three buffers has
its own DRAM channel of that many bytes per cycle.

Besides SCALE-Sim's own report values, each row carries observations of its read buffers made
without changing what they report (the methods are wrapped, not replaced): how many times each
buffer's active window slid to a new prefetch (``*_slides``), how many of those slides happened
while the demanded address was not in the next window, so that the circular buffer went round
past data it had to fetch again (``*_wrap_slides``), and the words one slide fetches
(``*_slide_words``) and the words by which a slide advances the window (``*_advance_words``:
fewer than it fetches when the operand is only a little larger than the window).
``docs/memory-model.md`` explains why those wrap-arounds matter. Other wrappers only make
SCALE-Sim faster, with the same results: ``_speed_up`` and ``_compact_trace``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import itertools
import math
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ARRAY = 32
DATAFLOWS = ("os", "ws", "is")
SRAM_KB = (64, 256, 1024)
BANDWIDTHS = (4, 16, 64)  # bytes (words) per cycle, per buffer
TAIL_LINES = 8
"""Repaired buffers: lines at the end of the half just left that still hit (of 100 per buffer)."""

COLUMNS = [
    "layer", "network", "kind", "ifmap_h", "ifmap_w", "filter_h", "filter_w", "channels", "num_filter",
    "stride", "m", "n", "k", "dataflow", "array", "sram_kb", "bandwidth",
    "cycles_incl_prefetch", "total_cycles", "stall_cycles", "overall_util_pct", "compute_util_pct",
    "ifmap_sram_reads", "filter_sram_reads", "ofmap_sram_writes",
    "ifmap_dram_reads", "filter_dram_reads", "ofmap_dram_writes",
    "ifmap_slides", "ifmap_wrap_slides", "ifmap_slide_words", "ifmap_advance_words",
    "filter_slides", "filter_wrap_slides", "filter_slide_words", "filter_advance_words", "wall_s",
]

CONFIG = """[general]
run_name = ref

[run_presets]
InterfaceBandwidth = USER
UseRamulatorTrace = False

[architecture_presets]
ArrayHeight = {array}
ArrayWidth = {array}
ifmapsramszkB = {sram}
filtersramszkB = {sram}
ofmapsramszkB = {sram}
IfmapOffset = 0
FilterOffset = 10000000
OfmapOffset = 20000000
Bandwidth = {bw}
Dataflow = {df}
ReadRequestBuffer = 32
WriteRequestBuffer = 32

[layout]
IfmapCustomLayout = False
IfmapSRAMBankBandwidth = {bw}
IfmapSRAMBankNum = 1
IfmapSRAMBankPort = 2
FilterCustomLayout = False
FilterSRAMBankBandwidth = {bw}
FilterSRAMBankNum = 1
FilterSRAMBankPort = 2

[sparsity]
SparsitySupport = false
SparseRep = ellpack_block
OptimizedMapping = false
BlockSize = 8
RandomNumberGeneratorSeed = 40
"""


def read_layers() -> list[dict]:
    with open(HERE / "layers.csv", newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if not r["layer"].startswith("#")]
    for r in rows:
        for key in ("ifmap_h", "ifmap_w", "filter_h", "filter_w", "channels", "num_filter", "stride"):
            r[key] = int(r[key])
    return rows


def gemm_view(layer: dict) -> tuple[int, int, int]:
    """(M, N, K) of a layer as SCALE-Sim lays it out (no padding: the given ifmap is padded).
    SCALE-Sim takes ``ceil((H - R + s) / s)`` output rows (``topology_utils``), one more than a
    convolution has when ``H - R`` is not a multiple of the stride; ``layers.csv`` therefore
    gives strided layers the input their output needs, ``(P - 1) * s + R``, where the two agree."""
    p = -(-(layer["ifmap_h"] - layer["filter_h"] + layer["stride"]) // layer["stride"])
    q = -(-(layer["ifmap_w"] - layer["filter_w"] + layer["stride"]) // layer["stride"])
    assert p == (layer["ifmap_h"] - layer["filter_h"]) // layer["stride"] + 1, layer["layer"]
    assert q == (layer["ifmap_w"] - layer["filter_w"]) // layer["stride"] + 1, layer["layer"]
    return p * q, layer["num_filter"], layer["filter_h"] * layer["filter_w"] * layer["channels"]


def config_path(df: str, sram: int, bw: int) -> Path:
    return HERE / "configs" / f"{df}_sram{sram}k_bw{bw}.cfg"


def write_configs() -> None:
    (HERE / "configs").mkdir(exist_ok=True)
    for df, sram, bw in itertools.product(DATAFLOWS, SRAM_KB, BANDWIDTHS):
        config_path(df, sram, bw).write_text(CONFIG.format(array=ARRAY, sram=sram, bw=bw, df=df))


def _observe_read_buffers(repaired: bool = False):
    """Wrap SCALE-Sim's read buffer so that it counts its slides and wrap-arounds (see module
    docstring); what it does is unchanged unless ``repaired`` (see README: the last
    ``TAIL_LINES`` lines of the half it leaves still hit, it seeks to a line it needs again
    instead of going round the operand, and :func:`_repair_timing`)."""
    from scalesim.memory import read_buffer as rb

    cls = rb.read_buffer
    if getattr(cls, "_observed", None) is not None:
        return
    _speed_up()
    hit, new_prefetch = cls.active_buffer_hit, cls.new_prefetch

    def active_buffer_hit(self, addr):
        found = hit(self, addr)
        if not found and repaired and getattr(self, "_tail", None):
            found = any(addr in self.hashed_buffer[line] for line in self._tail)
        if found:
            self._miss = None
        else:
            self._asked = addr
        return found

    def in_next_window(self, addr) -> bool:
        _, end = self.active_buffer_set_limits
        for i in range(self.num_prefetch_buf_lines):
            if addr in self.hashed_buffer[(end + i) % self.num_lines]:
                return True
        return False

    def observed_new_prefetch(self):
        addr = getattr(self, "_asked", None)
        if getattr(self, "_miss", None) != addr:  # first slide for this demanded address
            self._miss = addr
            self._miss_wraps = not in_next_window(self, addr)
        self.obs_slides = getattr(self, "obs_slides", 0) + 1
        if self._miss_wraps:
            self.obs_wrap_slides = getattr(self, "obs_wrap_slides", 0) + 1
        _compact_trace(self)
        if not repaired:
            return new_prefetch(self)
        _, end = self.active_buffer_set_limits
        # the last lines of the half being left are overwritten last by the prefetch that refills it
        self._tail = [(end - i) % self.num_lines for i in range(1, min(TAIL_LINES, self.num_active_buf_lines) + 1)]
        if self._miss_wraps:
            target = _seek_line(self, addr)
            if target is not None:  # the slide below then starts the active window there
                self.active_buffer_set_limits = [(target - self.num_prefetch_buf_lines) % self.num_lines, end]
                self._tail = None
        return new_prefetch(self)

    cls.active_buffer_hit = active_buffer_hit
    cls.new_prefetch = observed_new_prefetch
    cls._observed = repaired
    if repaired:
        _repair_timing()


def _repair_timing() -> None:
    """The two timing repairs: a read stall is added to the array's clock once (SCALE-Sim adds it
    twice, and adds a negative one too, in ``read_buffer.service_reads``), and the ofmap buffer's
    final flush waits for the drain in flight (``write_buffer.empty_all_buffers`` starts it at
    the array's last cycle, on the same port as that drain)."""
    import numpy as np
    from scalesim.memory import read_buffer as rb
    from scalesim.memory import write_buffer as wb

    def service_reads(self, incoming_requests_arr_np, incoming_cycles_arr):
        assert not self.enable_layout_evaluation and not self.use_ramulator_trace
        if not self.active_buf_full_flag:
            self.prefetch_active_buffer(start_cycle=incoming_cycles_arr[0][0])
        out = []
        offset = self.hit_latency
        for i in range(incoming_requests_arr_np.shape[0]):
            cycle = incoming_cycles_arr[i]
            for addr in incoming_requests_arr_np[i]:
                if addr == -1:
                    continue
                while not self.active_buffer_hit(addr):
                    self.new_prefetch()
                    stall = self.last_prefetch_cycle - (cycle + offset)
                    if stall > 0:
                        offset += stall
            out.append(cycle + offset)
        return np.asarray(out).reshape((len(out), 1))

    flush = wb.write_buffer.empty_all_buffers

    def empty_all_buffers(self, cycle):
        return flush(self, max(cycle, self.drain_end_cycle + 1))

    rb.read_buffer.service_reads = service_reads
    wb.write_buffer.empty_all_buffers = empty_all_buffers


def _elems_per_line(buf) -> int:
    """Words per line of SCALE-Sim's hashed buffer (its ``prepare_hashed_buffer``)."""
    return math.ceil(buf.total_size_elems / 100)


def _speed_up() -> None:
    """Make SCALE-Sim faster without changing what it computes: its read buffer looks an
    address up in the sets of the lines in its active window one line after the other; here a
    table from address to the lines holding it (built once the buffer's lines are fixed) says
    whether one of them is in the window, the same test. Its progress bars (``tqdm`` objects
    made with ``disable=True`` for every demand row) are skipped."""
    from scalesim.memory import read_buffer as rb
    from scalesim.memory import write_buffer as wb

    def no_bar(iterable=None, *args, **kwargs):
        return iterable

    rb.tqdm = wb.tqdm = no_bar
    cls = rb.read_buffer
    prepare = cls.prepare_hashed_buffer

    def prepare_hashed_buffer(self):
        prepare(self)
        lines_of: dict = {}
        for line, members in self.hashed_buffer.items():
            for addr in members:
                lines_of.setdefault(addr, []).append(line)
        self._lines_of = lines_of

    def active_buffer_hit(self, addr):
        assert self.active_buf_full_flag, "Active buffer is not ready yet"
        assert not self.enable_layout_evaluation
        start, end = self.active_buffer_set_limits
        lines = self._lines_of.get(addr, ())
        if start < end:
            return any(start <= line < end for line in lines)
        return any(line >= start or line < end for line in lines)

    cls.prepare_hashed_buffer = prepare_hashed_buffer
    cls.active_buffer_hit = active_buffer_hit


def _needs_repair(row: dict) -> bool:
    """Whether the repairs can change a run of reference.csv: a read buffer slid, the array
    stalled, or the ofmap buffer drained before its final flush (more writes than half of it)."""
    slid = any(int(row[f"{name}_slides"]) > 0 for name in ("ifmap", "filter"))
    drained = int(row["ofmap_dram_writes"]) > int(row["sram_kb"]) * 1024 // 2
    return slid or int(row["stall_cycles"]) > 0 or drained


def _compact_trace(buf) -> None:
    """Keep only the earliest and the latest row of the buffer's DRAM trace. SCALE-Sim appends
    every prefetch to this matrix with ``np.concatenate`` (quadratic in the number of
    prefetches) and, with traces off, reads only its first column's minimum and maximum (the
    DRAM start and stop cycles), which two rows keep: the numbers it reports are unchanged."""
    import numpy as np

    trace = buf.trace_matrix
    if trace.shape[0] > 2:
        cycles = trace[:, 0]
        buf.trace_matrix = trace[[int(np.argmin(cycles)), int(np.argmax(cycles))], :]


def _seek_line(buf, addr):
    """The line holding ``addr`` nearest behind the active window (searching backwards), else
    the nearest ahead: where a buffer that refetches what it needs would restart."""
    start, _ = buf.active_buffer_set_limits
    for i in range(1, buf.num_lines + 1):
        line = (start - i) % buf.num_lines
        if addr in buf.hashed_buffer[line]:
            return line
    return None


def run_one(job: tuple[dict, str, int, int, bool]) -> dict:
    layer, df, sram, bw, repaired = job
    _observe_read_buffers(repaired)
    from scalesim.scale_sim import scalesim

    m, n, k = gemm_view(layer)
    with tempfile.TemporaryDirectory() as tmp:
        topo = Path(tmp) / "topology.csv"
        topo.write_text("Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width, Channels, "
                        "Num Filter, Strides,\n"
                        f"{layer['layer']}, {layer['ifmap_h']}, {layer['ifmap_w']}, {layer['filter_h']}, "
                        f"{layer['filter_w']}, {layer['channels']}, {layer['num_filter']}, {layer['stride']},\n")
        layout = Path(tmp) / "layout.csv"
        layout.write_text("Layer name, a, b, c, d, e, f, g,\n" f"{layer['layer']}, 1, 1, 1, 1, 1, 1, 1,\n")
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            sim = scalesim(save_disk_space=True, verbose=False, config=str(config_path(df, sram, bw)),
                           topology=str(topo), layout=str(layout), input_type_gemm=False)
            sim.run_scale(top_path=str(Path(tmp) / "out"))
        wall = time.perf_counter() - t0
    layer_sim = sim.runner.single_layer_sim_object_list[0]
    compute = layer_sim.get_compute_report_items()
    detail = layer_sim.get_detail_report_items()
    mem = layer_sim.memory_system
    row = {key: layer[key] for key in ("layer", "network", "kind", "ifmap_h", "ifmap_w", "filter_h", "filter_w",
                                       "channels", "num_filter", "stride")}
    row.update(m=m, n=n, k=k, dataflow=df, array=ARRAY, sram_kb=sram, bandwidth=bw,
               cycles_incl_prefetch=int(compute[0]), total_cycles=int(compute[1]), stall_cycles=int(compute[2]),
               overall_util_pct=round(float(compute[3]), 4), compute_util_pct=round(float(compute[5]), 4),
               ifmap_sram_reads=int(detail[2]), filter_sram_reads=int(detail[5]), ofmap_sram_writes=int(detail[8]),
               ifmap_dram_reads=int(detail[11]), filter_dram_reads=int(detail[14]), ofmap_dram_writes=int(detail[17]),
               wall_s=round(wall, 2))
    for name, buf in (("ifmap", mem.ifmap_buf), ("filter", mem.filter_buf)):
        row[f"{name}_slides"] = int(getattr(buf, "obs_slides", 0))
        row[f"{name}_wrap_slides"] = int(getattr(buf, "obs_wrap_slides", 0))
        row[f"{name}_slide_words"] = int(math.ceil(buf.prefetch_buf_size / buf.req_gen_bandwidth)
                                         * buf.req_gen_bandwidth)
        row[f"{name}_advance_words"] = int(buf.num_prefetch_buf_lines * _elems_per_line(buf))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1, help="parallel SCALE-Sim processes")
    parser.add_argument("--only", help="run only the layer of this name (appends to a scratch file)")
    parser.add_argument("--repaired", action="store_true",
                        help="SCALE-Sim with its read buffers repaired (see README)")
    parser.add_argument("--out", help="output CSV (default reference.csv, or reference_repaired.csv with --repaired)")
    args = parser.parse_args()
    write_configs()
    layers = [r for r in read_layers() if args.only in (None, r["layer"])]
    jobs = [(layer, df, sram, bw, args.repaired)
            for layer in layers for df in DATAFLOWS for sram in SRAM_KB for bw in BANDWIDTHS]
    out = Path(args.out or HERE / ("reference_repaired.csv" if args.repaired else "reference.csv"))
    columns = COLUMNS + (["rerun"] if args.repaired else [])
    copied: list[dict] = []
    if args.repaired:  # runs without a stall, a slide or an ofmap drain cannot change
        with open(HERE / "reference.csv", newline="") as fh:
            stock = {(r["layer"], r["dataflow"], int(r["sram_kb"]), int(r["bandwidth"])): r for r in csv.DictReader(fh)}
        keep = []
        for job in jobs:
            row = stock.get((job[0]["layer"], job[1], job[2], job[3]))
            if row is not None and not _needs_repair(row):
                copied.append({**row, "rerun": 0})
            else:
                keep.append(job)
        jobs = keep
    done: set[tuple] = set()
    if out.exists():  # resume: keep finished rows
        with open(out, newline="") as fh:
            done = {(r["layer"], r["dataflow"], int(r["sram_kb"]), int(r["bandwidth"])) for r in csv.DictReader(fh)}
    todo = [j for j in jobs if (j[0]["layer"], j[1], j[2], j[3]) not in done]
    print(f"{len(jobs)} runs, {len(todo)} to do", file=sys.stderr)
    new = not out.exists()
    with open(out, "a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=columns, lineterminator="\n")
        if new:
            w.writeheader()
        for row in copied:
            if (row["layer"], row["dataflow"], int(row["sram_kb"]), int(row["bandwidth"])) not in done:
                w.writerow(row)
        t0 = time.perf_counter()
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            for i, row in enumerate(pool.map(run_one, todo), 1):
                if args.repaired:
                    row["rerun"] = 1
                w.writerow(row)
                fh.flush()
                print(f"[{i}/{len(todo)} {time.perf_counter() - t0:.0f} s] {row['layer']} {row['dataflow']} "
                      f"{row['sram_kb']} KB {row['bandwidth']} B/c: {row['cycles_incl_prefetch']} cycles "
                      f"({row['wall_s']} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
