"""The committed SCALE-Sim reference table and marssim's numbers for the same runs.

Each row of ``tests/data/scalesim/reference*.csv`` is one SCALE-Sim 3.0.0 run: a layer (a
convolution given with its padded input, or a GEMM encoded as a 1 x K convolution over an M x K
image, as SCALE-Sim's own GEMM mode does), a dataflow, a per-operand SRAM size and a DRAM
bandwidth per buffer, on a 32 x 32 array with one-byte words. :func:`marssim_columns` builds the
same op (int8) and the same design (three buffers, a channel per buffer, no SRAM bandwidth
limit) and returns marssim's cycles and DRAM bytes for every row.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from marssim.cost import SystolicCost
from marssim.system import Design
from marssim.workload import GraphBuilder

DATA = Path(__file__).resolve().parent / "data" / "scalesim"
CLOCK = 1e9
"""Any clock: marssim's seconds are turned back into cycles with it."""


def load_reference(path: Path = DATA / "reference.csv") -> pd.DataFrame:
    """The table, with ``dram_bytes`` = ifmap and filter DRAM reads + ofmap DRAM writes."""
    ref = pd.read_csv(path)
    ref["dram_bytes"] = ref["ifmap_dram_reads"] + ref["filter_dram_reads"] + ref["ofmap_dram_writes"]
    return ref


def layer_op(row) -> object:
    """The marssim op of a reference row (int8, batch 1, no padding: the input is given padded)."""
    b = GraphBuilder(row["layer"], batch=1, dtype="int8")
    if row["kind"] == "gemm":  # M x K times K x N: ifmap_h = M, ifmap_w = filter_w = K
        x = b.input("x", c=int(row["ifmap_w"]), h=int(row["ifmap_h"]))
        b.linear("op", x, int(row["num_filter"]), bias=False)
    else:
        x = b.input("x", c=int(row["channels"]), h=int(row["ifmap_h"]), w=int(row["ifmap_w"]))
        b.conv("op", x, int(row["num_filter"]), (int(row["filter_h"]), int(row["filter_w"])),
               stride=int(row["stride"]), pad=0)
    return b.build().op("op")


def run_design(row, convention: str = "scalesim") -> Design:
    """The marssim design of a reference row's configuration."""
    size = int(row["sram_kb"]) * 1024
    return Design(name=f"{row['dataflow']}-{row['sram_kb']}k-{row['bandwidth']}", dataflow=row["dataflow"],
                  pe_rows=int(row["array"]), pe_cols=int(row["array"]), clock=CLOCK, sram_bandwidth=1e18,
                  dram_bandwidth=float(row["bandwidth"]) * CLOCK,
                  buffers={"ifmap": size, "filter": size, "ofmap": size, "convention": convention,
                           "dram_channels": "per_operand"})


def marssim_columns(ref: pd.DataFrame, convention: str = "scalesim") -> pd.DataFrame:
    """marssim's ``cycles`` (time x clock) and ``dram_bytes`` for every row of ``ref``."""
    model = SystolicCost()
    ops = {}
    cycles, dram = [], []
    for _, row in ref.iterrows():
        key = row["layer"]
        if key not in ops:
            ops[key] = layer_op(row)
        cost = model.op_cost(ops[key], run_design(row, convention))
        cycles.append(cost.time * CLOCK)
        dram.append(cost.dram_bytes)
    return pd.DataFrame({"cycles": cycles, "dram_bytes": dram}, index=ref.index)


def order_agreement(ref: pd.DataFrame, ours: pd.DataFrame) -> tuple[int, int]:
    """``(agreeing, total)``: (layer, SRAM, bandwidth) cases where sorting os/ws/is by marssim's
    cycles gives SCALE-Sim's order. Dataflows whose SCALE-Sim cycles are within 1% of each other
    count as tied: either order of a tied pair agrees."""
    both = ref.assign(ours=ours["cycles"])
    agree = total = 0
    for _, group in both.groupby(["layer", "sram_kb", "bandwidth"]):
        if len(group) != 3:
            continue
        total += 1
        theirs = group["cycles_incl_prefetch"].to_numpy(dtype=float)
        mine = group["ours"].to_numpy(dtype=float)
        ok = True
        for i in range(3):
            for j in range(3):
                if theirs[i] < theirs[j] * 0.99 and not mine[i] < mine[j]:
                    ok = False
        agree += ok
    return agree, total


def relative_errors(ref: pd.DataFrame, ours: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """|marssim / SCALE-Sim - 1| of cycles and of DRAM bytes, per row."""
    cyc = np.abs(ours["cycles"].to_numpy() / ref["cycles_incl_prefetch"].to_numpy() - 1)
    dram = np.abs(ours["dram_bytes"].to_numpy() / ref["dram_bytes"].to_numpy() - 1)
    return cyc, dram


KEYS = ["layer", "dataflow", "sram_kb", "bandwidth"]


def untouched(stock: pd.DataFrame, repaired: pd.DataFrame) -> np.ndarray:
    """Per row of ``stock``: whether the repaired run has the same cycles and DRAM bytes."""
    both = stock[KEYS].merge(repaired[KEYS + ["cycles_incl_prefetch", "dram_bytes"]], on=KEYS, how="left")
    same = (both["cycles_incl_prefetch"].to_numpy() == stock["cycles_incl_prefetch"].to_numpy()) & (
        both["dram_bytes"].to_numpy() == stock["dram_bytes"].to_numpy())
    return same
