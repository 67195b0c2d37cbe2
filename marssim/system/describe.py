"""A readable text summary of a :class:`~marssim.system.model.System`.

Used by ``marssim show``. Values are printed in the units a person reads (GB/s, GiB, us), from
the SI values the system holds (bytes/s, bytes, seconds).
"""

from __future__ import annotations

import os
import re
import textwrap
from collections.abc import Sequence

from marssim.tables import format_table
from marssim.units import fmt_bytes, fmt_rate, fmt_time

from .design import Design
from .model import Link, System

__all__ = ["describe_system", "compress_ids", "example_routes", "format_table"]


def _fmt_si(value: float, unit: str) -> str:
    """``value`` with a decimal prefix: ``_fmt_si(1.83e9, "Hz") == '1.83 GHz'``."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.4g} {prefix}{unit}"
    return f"{value:.4g} {unit}"


_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def compress_ids(ids: Sequence[str]) -> str:
    """Join ids, folding runs of consecutive numbers: ``["acc0", "acc1", "acc2", "host"]`` gives
    ``"acc[0-2], host"`` (the range form the system files use)."""
    parts: list[str] = []
    i = 0
    while i < len(ids):
        m = _NUMBERED.match(ids[i])
        j = i
        if m:
            prefix, start = m.group(1), int(m.group(2))
            width = len(m.group(2)) if m.group(2).startswith("0") and len(m.group(2)) > 1 else 0
            while j + 1 < len(ids):
                n = _NUMBERED.match(ids[j + 1])
                if not n or n.group(1) != prefix or int(n.group(2)) != start + (j + 1 - i):
                    break
                j += 1
            if j - i >= 2:
                parts.append(f"{prefix}[{start:0{width}d}-{start + j - i:0{width}d}]")
                i = j + 1
                continue
        parts.append(ids[i])
        i += 1
    return ", ".join(parts)


def _array(design: Design) -> str:
    if design.gpu is not None:
        return f"{design.gpu.sms} SMs"
    return f"{design.pe_rows}x{design.pe_cols} = {design.pes}"


def _gpu_dtype(design: Design) -> str:
    """The dtype whose peak a GPU design is summarised by: fp16 (the workloads' default) if given."""
    flops = design.gpu.peak_flops  # type: ignore[union-attr]
    return "fp16" if "fp16" in flops else max(flops, key=flops.__getitem__)


def _macs_per_s(design: Design) -> float:
    """Peak MAC/s shown for a design: the array's, or a GPU's dense peak at :func:`_gpu_dtype` / 2."""
    if design.gpu is not None:
        return design.gpu.peak_flops[_gpu_dtype(design)] / 2.0
    return design.peak_macs_per_s


def _peak(design: Design) -> str:
    text = _fmt_si(_macs_per_s(design), "MAC/s")
    return f"{text} {_gpu_dtype(design)}" if design.gpu is not None else text


def _buffers(d) -> str:
    """One line on a design's buffers section."""
    b = d.buffers
    if b.sizes is not None:
        split = "buffers " + " / ".join(f"{op} {fmt_bytes(v)}" for op, v in zip(("ifmap", "filter", "ofmap"), b.sizes))
    elif isinstance(b.split, dict):
        split = "SRAM split " + " / ".join(f"{op} {b.split[op]:g}" for op in ("ifmap", "filter", "ofmap"))
    else:
        split = "one shared SRAM"
    buffering = "double-buffered" if b.double_buffered else "single-buffered"
    latency = f", DRAM latency {fmt_time(b.dram_latency)}" if b.dram_latency else ""
    return f"{split}, {buffering}, DRAM {b.channels.replace('_', ' ')}{latency}, {b.convention} convention"


def _plural(n: int, word: str, plural: str = "") -> str:
    return f"{n} {word}" if n == 1 else f"{n} {plural or word + 's'}"


def _energy(design: Design) -> str:
    e = design.energy
    if e is None:
        return "-"
    parts = [f"{e.mac * 1e12:.4g} pJ/MAC"]
    sram_rd, sram_wr, dram_rd, dram_wr = e.per_byte
    for name, rd, wr in (("sram", sram_rd, sram_wr), ("dram", dram_rd, dram_wr)):
        if rd == wr and rd:
            parts.append(f"{rd * 1e12:.4g} pJ/B {name}")
        elif rd or wr:
            parts.append(f"{rd * 1e12:.4g}/{wr * 1e12:.4g} pJ/B {name} read/write")
    if e.static_power:
        parts.append(f"{_fmt_si(e.static_power, 'W')} static")
    return ", ".join(parts)


def _link_groups(links: Sequence[Link]) -> list[tuple[tuple[float, float, str], list[Link]]]:
    groups: dict[tuple[float, float, str], list[Link]] = {}
    for link in links:
        groups.setdefault((link.bandwidth, link.latency, link.duplex), []).append(link)
    return list(groups.items())


def _endpoints(links: Sequence[Link], order: dict[str, int], limit: int = 72) -> str:
    """``"nvswitch - gpu[0-7]"``: each link listed under its busier endpoint, cut at ``limit`` chars;
    ``"among tpu[0-7]"`` for rings, meshes and cliques (many hubs with few links each)."""
    degree: dict[str, int] = {}
    for link in links:
        degree[link.a] = degree.get(link.a, 0) + 1
        degree[link.b] = degree.get(link.b, 0) + 1
    spokes: dict[str, list[str]] = {}
    for link in links:
        hub, other = (link.b, link.a) if degree[link.b] > degree[link.a] else (link.a, link.b)
        spokes.setdefault(hub, []).append(other)
    if len(spokes) > 3 and len(links) / len(spokes) < 2.5:
        return "among " + compress_ids(sorted(degree, key=order.__getitem__))
    text = "; ".join(f"{hub} - {compress_ids(others)}" for hub, others in spokes.items())
    return text if len(text) <= limit else text[: limit - 4].rstrip(" ;,") + " ..."


def example_routes(system: System, limit: int = 5) -> list[tuple[str, str]]:
    """A few (src, dst) pairs worth showing: host to the first accelerator, first to second
    accelerator, first to last, and the first accelerator to the one most hops away."""
    accs = system.accelerator_ids
    host = system.hosts[0].id
    pairs = [(host, accs[0])]
    if len(accs) > 1:
        pairs += [(accs[0], accs[1]), (accs[0], accs[-1])]
        far = max(accs[1:], key=lambda a: (len(system.route(accs[0], a).nodes), system.route(accs[0], a).latency))
        pairs.append((accs[0], far))
        pairs.append((host, accs[-1]))
    seen: list[tuple[str, str]] = []
    for p in pairs:
        if p not in seen:
            seen.append(p)
    return seen[:limit]


def describe_system(system: System, *, width: int = 100) -> str:
    """Multi-line summary: designs, accelerators, hosts, switches, links and example routes.

    Bandwidths are per direction (bytes/s shown as GB/s), latencies in s/us/ns, capacities in
    binary units (GiB)."""
    lines: list[str] = []
    title = f"System {system.name}"
    if system.path:
        try:
            rel = os.path.relpath(system.path)
        except ValueError:  # another drive
            rel = system.path
        title += f"  ({system.path if rel.startswith('..') else rel})"
    lines.append(title)
    if system.description:
        lines.extend(textwrap.wrap(system.description, width=width, initial_indent="  ", subsequent_indent="  "))

    accs = system.accelerators
    adaptive = [a for a in accs if not a.fixed]
    peaks_lo = sum(min(_macs_per_s(system.designs[d]) for d in a.designs) for a in accs)
    peaks_hi = sum(max(_macs_per_s(system.designs[d]) for d in a.designs) for a in accs)
    peak = _fmt_si(peaks_hi, "MAC/s") if peaks_lo == peaks_hi else \
        f"{_fmt_si(peaks_lo, 'MAC/s')} to {_fmt_si(peaks_hi, 'MAC/s')} (depends on the designs chosen)"
    gpu_dtypes = sorted({_gpu_dtype(system.designs[d]) for a in accs for d in a.designs
                         if system.designs[d].gpu is not None})
    if gpu_dtypes:
        peak += f" (GPUs at their dense {'/'.join(gpu_dtypes)} peak)"
    lines.append("")
    lines.append(f"  {_plural(len(accs), 'accelerator')} ({len(adaptive)} adaptive), "
                 f"{_plural(len(system.hosts), 'host')}, {_plural(len(system.switches), 'switch', 'switches')}, "
                 f"{_plural(len(system.links), 'link')}, {_plural(len(system.designs), 'design')}")
    lines.append(f"  peak compute {peak}; accelerator memory "
                 f"{fmt_bytes(sum(a.memory.capacity for a in accs))} in total")

    # designs
    users = {name: sum(1 for a in accs if name in a.designs) for name in system.designs}
    lines.append("")
    lines.append("Designs")
    rows = []
    for name, d in system.designs.items():
        rows.append([name, d.dataflow, _array(d), _fmt_si(d.clock, "Hz") if d.clock else "-", _peak(d), fmt_bytes(d.sram),
                     fmt_rate(d.sram_bandwidth) if d.sram_bandwidth else "-", _energy(d), str(users[name])])
    lines += format_table(["name", "dataflow", "PEs", "clock", "peak", "SRAM", "SRAM BW", "energy", "accs"], rows)
    for name, d in system.designs.items():
        if d.gpu is not None:
            rates = ", ".join(f"{k} {_fmt_si(v, 'FLOP/s')}" for k, v in d.gpu.peak_flops.items())
            extra = f"; calibration table {d.gpu.calibration!r}" if d.gpu.calibration else ""
            lines.append(f"  {name}: dense peak {rates}{extra}")
        if d.buffers is not None:
            lines.append(f"  {name}: {_buffers(d)}")
        if d.energy is not None and d.energy.source:
            lines.append(f"  {name}: energy from {d.energy.source}")
        if d.description:
            lines.append(f"  {name}: {d.description}")

    # accelerators, grouped by what they allow and their memory
    lines.append("")
    lines.append("Accelerators")
    groups: dict[tuple, list[str]] = {}
    for a in accs:
        groups.setdefault((a.designs, a.memory.capacity, a.memory.bandwidth), []).append(a.id)
    rows = []
    for (designs, cap, bw), ids in groups.items():
        allowed = designs[0] + " (fixed)" if len(designs) == 1 else "one of " + ", ".join(designs)
        rows.append([compress_ids(ids), str(len(ids)), allowed, fmt_bytes(cap), fmt_rate(bw)])
    lines += format_table(["ids", "count", "designs", "memory", "memory BW"], rows)

    lines.append("")
    lines.append("Hosts")
    lines += format_table(["id", "DRAM", "DRAM BW"],
                    [[h.id, fmt_bytes(h.dram.capacity), fmt_rate(h.dram.bandwidth)] for h in system.hosts])

    if system.switches:
        lines.append("")
        lines.append("Switches")
        by_kind: dict[tuple[float, float | None], list[str]] = {}
        for sw in system.switches:
            by_kind.setdefault((sw.latency, sw.bandwidth), []).append(sw.id)
        lines += format_table(["ids", "latency", "backplane"],
                        [[compress_ids(ids), fmt_time(lat), fmt_rate(bw) if bw else "unlimited"]
                         for (lat, bw), ids in by_kind.items()])

    lines.append("")
    lines.append("Links (bandwidth per direction; half duplex: both directions share it)")
    rows = []
    for (bw, lat, duplex), links in _link_groups(system.links):
        rows.append([fmt_rate(bw), fmt_time(lat), duplex, str(len(links)), _endpoints(links, system.node_index)])
    lines += format_table(["bandwidth", "latency", "duplex", "count", "endpoints"], rows)

    lines.append("")
    lines.append("Example routes (latency: links and switches; bottleneck: tightest link, switch or memory)")
    rows = []
    for src, dst in example_routes(system):
        route = system.route(src, dst)
        caps = [float(system.resource_capacity[r]) for r in route.resources]
        tight = min(range(len(caps)), key=caps.__getitem__) if caps else None
        bottleneck = "-" if tight is None else \
            f"{fmt_rate(caps[tight])} ({system.resource_names[route.resources[tight]]})"
        rows.append([f"{src} -> {dst}", str(len(route.nodes) - 1), fmt_time(route.latency), bottleneck,
                     " > ".join(route.nodes)])
    lines += format_table(["route", "hops", "latency", "bottleneck", "path"], rows)
    return "\n".join(lines)
