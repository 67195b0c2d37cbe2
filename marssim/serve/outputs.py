"""What a serving run writes: the report a person reads, tables, figures and a Perfetto trace.

* :func:`report_lines`: the run in a screen of text (deployment, KV cache per replica, latency
  percentiles, throughput, goodput, occupancy, Little's law);
* :func:`write_tables`: ``summary.json``, ``requests.csv`` (one row per request),
  ``iterations.csv`` (one per engine iteration), ``replicas.csv``, ``transfers.csv``;
* :func:`plot_run`: latency CDFs (TTFT, TPOT, TBT, E2E) and, beside them (``-timeline``),
  KV-cache occupancy, queue length and batch size over time (a line per replica, or for many replicas
  per pool the median and percentile bands); :func:`plot_sweep`:
  throughput, goodput and latency percentiles against the arrival rate;
* :func:`write_trace`: Chrome Trace Event JSON for ui.perfetto.dev: a process per replica, a
  track per engine with its iterations (their requests and tokens in the args), counters of
  KV-cache blocks and waiting requests, the KV transfers of disaggregated pools as slices on a
  network track with flow arrows from the prefill iteration to the transfer to the first decode
  iteration.

Every file is written atomically; the same result gives the same bytes.
"""

from __future__ import annotations

import gzip
import io
import json
import math
from pathlib import Path

import numpy as np

from marssim.fsutil import atomic_file

from .fabric import TRANSFER_KINDS
from .metrics import PERCENTILES

__all__ = ["report_lines", "write_tables", "plot_run", "plot_sweep", "write_trace", "sweep_lines", "json_clean"]


def _ms(x: float) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x * 1e3:,.1f}"


def report_lines(result) -> list[str]:
    """The run as lines of text."""
    s = result.summary
    dep = result.deployment
    out = [f"{result.model.name or result.model.family} on {result.system}: {dep.text()}",
           f"requests: {result.requests.source or len(result.requests)}", f"benchmark: {benchmark_mode(result)}"]
    seen = set()
    for info in result.replicas:
        key = (info.pool, info.memory)
        if key in seen:
            continue
        seen.add(key)
        pool = dep.pools[info.pool]
        n = sum(1 for r in result.replicas if r.pool == info.pool)
        out.append(f"pool {info.pool} ({pool.role}, {n} x tp {pool.tp} pp {pool.pp} on {info.design}, "
                   f"{pool.scheduler.kind}): " + info.memory.lines()[0])
        if info.kernels:
            out.append(f"pool {info.pool} kernels: {info.kernels}")
        if info.experts:
            out.append(f"pool {info.pool} experts: {info.experts}")
    if dep.disaggregated:
        p = sum(x.replicas for x in dep.pools if x.role == "prefill")
        d = sum(x.replicas for x in dep.pools if x.role == "decode")
        pg = sum(x.gpus for x in dep.pools if x.role == "prefill")
        dg = sum(x.gpus for x in dep.pools if x.role == "decode")
        out.append(f"prefill:decode {p}:{d} replicas ({pg}:{dg} GPUs)")
    out.append("")
    out.append(f"{'latency (ms)':<14}{'mean':>10}" + "".join(f"{'P' + str(p):>10}" for p in PERCENTILES) + f"{'max':>10}")
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("tbt_s", "TBT (ITL)"), ("e2e_s", "E2E"),
                       ("queue_s", "queueing")):
        st = s[key]
        out.append(f"{label:<14}{_ms(st['mean']):>10}" + "".join(f"{_ms(st[f'p{p}']):>10}" for p in PERCENTILES)
                   + f"{_ms(st['max']):>10}")
    out.append("")
    out.append(f"completed {s['completed']:,} of {s['requests']:,} requests ({s['rejected']:,} rejected) in "
               f"{s['duration_s']:.2f} s; {s['iterations']:,} engine iterations; {s['preemptions']:,} preemptions")
    out.append(f"throughput  {s['throughput_rps']:.3f} requests/s, {s['output_tokens_per_s']:,.0f} output tokens/s "
               f"({s['output_tokens_per_s_per_gpu']:,.1f} per GPU, {s['gpus']} GPUs)")
    if "total_tokens_per_s" in s:
        gpus = s["gpus"] or math.nan
        out.append(f"            input {s['input_tokens_per_s']:,.0f} tokens/s, total {s['total_tokens_per_s']:,.0f} "
                   f"tokens/s ({s['total_tokens_per_s'] / gpus:,.1f} per GPU); "
                   f"{s['throughput_rps_per_gpu']:.4g} requests/s per GPU")
    user = s.get("user_tokens_per_s")
    if user and math.isfinite(user["mean"]):
        out.append(f"per user    {user['mean']:,.1f} output tokens/s on average while decoding (1 / TPOT; P50 "
                   f"{user['p50']:,.1f}, slowest {_min_user_speed(result):,.1f})")
    out.append(f"goodput     {s['goodput_rps']:.3f} requests/s meet the SLO ({result.slo.text()}): "
               f"{s['slo_attained']:.1%} of requests")
    if "kv_occupancy" in s:
        out.append(f"KV cache    {s['kv_occupancy']['mean']:.1%} of blocks in use on average, "
                   f"{s['kv_occupancy']['max']:.1%} at most; batch {s['batch_size']['mean']:.1f} sequences on "
                   f"average ({s['batch_size']['max']} at most); waiting {s['queue_length']['mean']:.1f} "
                   f"({s['queue_length']['max']} at most)")
    if s.get("kv_transfer_s"):
        kv = s["kv_transfer_s"]
        out.append(f"KV moves    {kv['count']:,} transfers, mean {_ms(kv['mean'])} ms, P99 {_ms(kv['p99'])} ms")
    if s.get("speculative"):
        sp = s["speculative"]
        out.append(f"speculative {sp['tokens_per_step']:.3f} tokens per step on average ({sp['accepted']:,} of "
                   f"{sp['proposed']:,} proposed tokens accepted: {sp['acceptance_rate']:.1%}; "
                   f"{sp['emitted_per_step']:.3f} emitted within the outputs' lengths); draft "
                   f"{sp['draft_share']:.1%}, verification and prompts {sp['verify_share']:.1%} of the engines' "
                   "time")
    little = s["little"]
    out.append(f"Little's law: mean in system {little['mean_in_system']:.4f} = arrival rate x mean latency "
               f"{little['rate_x_latency']:.4f}")
    return out


def benchmark_mode(result) -> str:
    """How the run's requests were sent, in the words of the engines' benchmarks."""
    req = result.requests
    if req.concurrency:
        until = f" until {req.duration:g} s" if req.duration else ""
        return (f"closed loop of {req.concurrency:,} concurrent users (each sends its next request when the "
                f"previous one ends){until}; {len(req):,} requests sent")
    if len(req) and not req.arrival.any():
        return f"offline: all {len(req):,} requests at time 0 (throughput)"
    span = float(req.arrival[-1] - req.arrival[0]) if len(req) > 1 else 0.0
    rate = f" at {(len(req) - 1) / span:.4g} requests/s" if span > 0 else ""
    return f"open loop: requests arrive at their times{rate}, whatever the replies"


def _min_user_speed(result) -> float:
    pr = result.per_request
    out = pr["output_tokens"]
    with np.errstate(invalid="ignore", divide="ignore"):
        speed = (out - 1) / (pr["finish_s"] - pr["first_token_s"])
    speed = speed[np.isfinite(speed) & (out > 1)]
    return float(speed.min()) if len(speed) else math.nan


def sweep_lines(rows: list[dict]) -> list[str]:
    """A rate sweep as a table: one line per rate."""
    head = (f"{'rate/s':>8}{'done/s':>9}{'tok/s':>10}{'good/s':>9}{'TTFT P50':>10}{'TTFT P99':>10}"
            f"{'TPOT P50':>10}{'TPOT P99':>10}{'E2E P99':>10}{'preempt':>9}")
    out = [head + "   (latencies in ms)"]
    for r in rows:
        s = r["summary"]
        out.append(f"{r['rate']:>8.3g}{s['throughput_rps']:>9.3f}{s['output_tokens_per_s']:>10,.0f}"
                   f"{s['goodput_rps']:>9.3f}{_ms(s['ttft_s']['p50']):>10}{_ms(s['ttft_s']['p99']):>10}"
                   f"{_ms(s['tpot_s']['p50']):>10}{_ms(s['tpot_s']['p99']):>10}{_ms(s['e2e_s']['p99']):>10}"
                   f"{s['preemptions']:>9,}")
    return out


def json_clean(x):
    """``x`` with NaN and infinities as None and numpy scalars as Python numbers (strict JSON)."""
    if isinstance(x, dict):
        return {str(k): json_clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_clean(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        x = float(x)
        return x if math.isfinite(x) else None
    return x


def _csv(path: Path, columns: dict[str, np.ndarray]) -> None:
    import pandas as pd

    frame = pd.DataFrame(columns)
    with atomic_file(path, "w", newline="") as f:
        frame.to_csv(f, index=False, float_format="%.9g", lineterminator="\n")


def write_tables(result, directory: Path) -> list[Path]:
    """The run's tables into ``directory`` (see the module docstring); returns the paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    summary = {"model": result.model.name, "system": result.system, "deployment": result.deployment.text(),
               "requests": result.requests.source, "slo": result.slo.text(), **result.summary}
    path = directory / "summary.json"
    with atomic_file(path, "w", encoding="utf-8") as f:
        json.dump(json_clean(summary), f, indent=1, sort_keys=True)
        f.write("\n")
    out.append(path)
    pr = dict(result.per_request)
    pr = {"request": np.arange(len(result.requests)), **pr}
    arrival = pr["arrival_s"]
    with np.errstate(invalid="ignore", divide="ignore"):
        pr["ttft_s"] = pr["first_token_s"] - arrival
        pr["e2e_s"] = pr["finish_s"] - arrival
        out_tokens = pr["output_tokens"]
        pr["tpot_s"] = np.where(out_tokens > 1, (pr["finish_s"] - pr["first_token_s"]) / (out_tokens - 1), np.nan)
    _csv(directory / "requests.csv", pr)
    out.append(directory / "requests.csv")
    _csv(directory / "iterations.csv", result.iterations)
    out.append(directory / "iterations.csv")
    reps = {"replica": [], "pool": [], "role": [], "design": [], "gpus": [], "kv_blocks": [], "block_size": [],
            "weights_bytes_per_gpu": [], "kv_bytes_per_gpu": [], "kernels": [], "experts": []}
    for info in result.replicas:
        reps["replica"].append(info.index)
        reps["pool"].append(info.pool)
        reps["role"].append(info.role)
        reps["design"].append(info.design)
        reps["gpus"].append(" ".join("/".join(stage) for stage in info.gpus))
        reps["kv_blocks"].append(info.memory.blocks)
        reps["block_size"].append(info.memory.block_size)
        reps["weights_bytes_per_gpu"].append(max(info.memory.weights))
        reps["kv_bytes_per_gpu"].append(max(info.memory.kv_bytes))
        reps["kernels"].append(info.kernels)
        reps["experts"].append(info.experts)  # what timed a mixture of experts' experts ("" for a dense model)
    _csv(directory / "replicas.csv", {k: np.asarray(v) for k, v in reps.items()})
    out.append(directory / "replicas.csv")
    if len(result.transfers.get("start", ())):
        t = dict(result.transfers)
        t["kind"] = np.asarray([TRANSFER_KINDS[int(k)] for k in t["kind"]])
        t["request"] = t["request"].astype(np.int64)
        _csv(directory / "transfers.csv", t)
        out.append(directory / "transfers.csv")
    return out


# ---------------------------------------------------------------------- figures
def _save(fig, base: Path, formats=("png", "svg"), dpi: int = 150) -> list[Path]:
    import matplotlib

    out = []
    for fmt in formats:
        buf = io.BytesIO()
        metadata = {"Date": None} if fmt == "svg" else {}
        with matplotlib.rc_context({"svg.hashsalt": "marssim", "svg.fonttype": "none"}):
            fig.savefig(buf, format=fmt, dpi=dpi, metadata=metadata)
        path = base.with_name(base.name + "." + fmt)
        with atomic_file(path, "wb") as handle:
            handle.write(buf.getvalue())
        out.append(path)
    return out


def _figure(w: float, h: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(w, h), layout="constrained")


def plot_run(result, png: str | Path) -> list[Path]:
    """Latency CDFs to ``png`` and the timeline (``<stem>-timeline``), as PNG and SVG."""
    png = Path(png)
    stem = png.with_suffix("")
    pr = result.per_request
    arrival = pr["arrival_s"]
    done = np.isfinite(pr["finish_s"])
    out_tokens = pr["output_tokens"]
    with np.errstate(invalid="ignore", divide="ignore"):
        series = {"TTFT": (pr["first_token_s"] - arrival)[done],
                  "TPOT": np.where(out_tokens > 1, (pr["finish_s"] - pr["first_token_s"]) / (out_tokens - 1),
                                   np.nan)[done],
                  "TBT (every token gap)": result.gaps, "E2E": (pr["finish_s"] - arrival)[done]}
    fig = _figure(10, 7)
    axes = fig.subplots(2, 2)
    slo = {"TTFT": result.slo.ttft, "TPOT": result.slo.tpot, "E2E": result.slo.e2e}
    for ax, (name, values) in zip(axes.flat, series.items()):
        values = np.sort(values[np.isfinite(values)])
        log = name.startswith("TBT")  # token gaps span decode steps to preemptions: orders of magnitude
        if log:
            values = values[values > 0]
        if len(values):
            ax.plot(values * 1e3, np.arange(1, len(values) + 1) / len(values), lw=1.2)
        bound = slo.get(name)
        if bound is not None:
            ax.axvline(bound * 1e3, color="tab:red", ls="--", lw=1, label="SLO")
            ax.legend(loc="lower right")
        for p in PERCENTILES:
            if len(values):
                ax.axhline(p / 100, color="0.85", lw=0.6, zorder=0)
        if log and len(values):
            ax.set_xscale("log")
        ax.set_xlabel(f"{name} (ms{', log scale' if log else ''})")
        ax.set_ylabel("fraction of requests" if not name.startswith("TBT") else "fraction of token gaps")
        ax.set_ylim(0, 1.01)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{result.model.name}: {result.deployment.text()}", fontsize=9)
    written = _save(fig, stem)
    written += _save(_timeline(result), stem.with_name(stem.name + "-timeline"))
    return written


_PER_REPLICA_LINES = 4  # more replicas than this in a pool: its median and percentile bands, not a line each
_GRID_POINTS = 600  # time points the bands are read at


def _timeline(result):
    """KV-cache use, waiting requests and batch size over time: a line per replica for a few
    replicas; for more, per pool the median over its replicas with the 25-75 and 0-100
    percentile bands (sixteen lines would overplot into one band)."""
    it = result.iterations
    fig = _figure(10, 7.5)
    axes = fig.subplots(3, 1, sharex=True)
    ran = set(int(r) for r in it["replica"]) if len(it["replica"]) else set()
    pools: dict[int, list[int]] = {}  # every replica of each pool (one that ran no iteration: at zero)
    for info in result.replicas:
        pools.setdefault(info.pool, []).append(info.index)
    for r in sorted(ran - {i for m in pools.values() for i in m}):
        pools.setdefault(0, []).append(r)
    replicas = sorted(i for m in pools.values() for i in m)
    with np.errstate(invalid="ignore", divide="ignore"):
        metrics = (it["kv_blocks"] / it["kv_capacity"] * 100, it["waiting"], it["prefill_seqs"] + it["decode_seqs"])
    end = float(it["end"].max()) if len(it["end"]) else 1.0
    grid = np.linspace(0.0, end, _GRID_POINTS)
    colours = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")
    banded = False
    for k, (pool, members) in enumerate(sorted(pools.items())):
        colour = colours[k % len(colours)]
        name = f"pool {pool}" if len(pools) > 1 else ""
        if len(members) <= _PER_REPLICA_LINES:
            for r in (m for m in members if m in ran):
                mask = it["replica"] == r
                label = f"replica {r}" + (f" ({name})" if name else "")
                for ax, values in zip(axes, metrics):
                    ax.step(it["end"][mask], values[mask], where="post", lw=0.8, label=label if ax is axes[0] else None)
            continue
        banded = True
        for ax, values in zip(axes, metrics):
            at = np.vstack([_steps_at(it["end"][it["replica"] == r], values[it["replica"] == r], grid)
                            for r in members])
            lo, q1, mid, q3, hi = np.nanpercentile(at, [0, 25, 50, 75, 100], axis=0)
            ax.fill_between(grid, lo, hi, step="post", color=colour, alpha=0.12, lw=0,
                            label=f"{name or 'replicas'}: min-max" if ax is axes[0] else None)
            ax.fill_between(grid, q1, q3, step="post", color=colour, alpha=0.3, lw=0,
                            label=f"{name or 'replicas'}: 25-75%" if ax is axes[0] else None)
            ax.step(grid, mid, where="post", color=colour, lw=1.0,
                    label=f"{name or 'replicas'}: median of {len(members)}" if ax is axes[0] else None)
    axes[0].set_ylabel("KV cache in use (%)")
    axes[1].set_ylabel("waiting requests")
    axes[2].set_ylabel("batch (sequences)")
    axes[2].set_xlabel("time (s)")
    for ax in axes:
        ax.grid(alpha=0.3)
    if replicas:
        axes[0].legend(fontsize=6, ncol=3 if banded else 4, loc="upper left")
    if banded:
        axes[0].set_title(f"{len(replicas)} replicas: per pool the median over its replicas and the bands their "
                          "values span at each time", fontsize=8)
    return fig


def _steps_at(t: np.ndarray, values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """A step function (``values[i]`` from ``t[i]`` on, 0 before the first) read at ``grid``."""
    order = np.argsort(t, kind="stable")
    t, values = t[order], values[order]
    k = np.searchsorted(t, grid, side="right") - 1
    return np.where(k >= 0, values[np.clip(k, 0, None)] if len(values) else 0.0, 0.0)


def plot_sweep(rows: list[dict], png: str | Path, title: str = "") -> list[Path]:
    """Throughput and goodput, and latency percentiles, against the arrival rate."""
    png = Path(png)
    rates = np.asarray([r["rate"] for r in rows])
    fig = _figure(10, 4)
    a, b = fig.subplots(1, 2)
    a.plot(rates, [r["summary"]["throughput_rps"] for r in rows], "o-", label="throughput")
    a.plot(rates, [r["summary"]["goodput_rps"] for r in rows], "s--", label="goodput (SLO met)")
    a.plot(rates, rates, color="0.7", lw=0.8, label="offered load")
    a.set_xlabel("arrival rate (requests/s)")
    a.set_ylabel("requests/s")
    a.legend()
    a.grid(alpha=0.3)
    for key, name, style in (("ttft_s", "TTFT", "o-"), ("tpot_s", "TPOT", "s-"), ("e2e_s", "E2E", "^-")):
        for p, ls in ((50, ":"), (99, "-")):
            b.plot(rates, [r["summary"][key][f"p{p}"] * 1e3 for r in rows], style[0] + ls, label=f"{name} P{p}")
    b.set_yscale("log")
    b.set_xlabel("arrival rate (requests/s)")
    b.set_ylabel("latency (ms)")
    b.legend(fontsize=7, ncol=2)
    b.grid(alpha=0.3, which="both")
    if title:
        fig.suptitle(title, fontsize=9)
    return _save(fig, png.with_suffix(""))


# ---------------------------------------------------------------------- Perfetto
def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


def _us(ns: int) -> str:
    """Integer nanoseconds as exact decimal microseconds."""
    q, r = divmod(int(ns), 1000)
    return str(q) if r == 0 else f"{q}.{r:03d}".rstrip("0")


def _trace_events(result):
    it = result.iterations
    infos = result.replicas
    ids, offsets = result.iteration_requests if result.iteration_requests is not None else (None, None)
    yield '{"ph":"M","name":"process_name","pid":0,"tid":0,"ts":0,"args":{"name":"network: KV transfers"}}'
    for info in infos:
        pid = info.index + 1
        name = f"replica {info.index} ({info.role}, pool {info.pool}, {' '.join('/'.join(s) for s in info.gpus)})"
        yield f'{{"ph":"M","name":"process_name","pid":{pid},"tid":{pid},"ts":0,"args":{{"name":{json.dumps(name)}}}}}'
        yield f'{{"ph":"M","name":"process_sort_index","pid":{pid},"tid":{pid},"ts":0,"args":{{"sort_index":{pid}}}}}'
        for v in range(len(info.gpus)):
            yield (f'{{"ph":"M","name":"thread_name","pid":{pid},"tid":{pid * 100 + v + 1},"ts":0,'
                   f'"args":{{"name":"engine {v}"}}}}')
    # which iteration first ran each request on each replica (flow ends), when the ids are kept
    first_on: dict[tuple[int, int], int] = {}
    n = len(it["start"])
    for k in range(n):
        pid = int(it["replica"][k]) + 1
        tid = pid * 100 + int(it["engine"][k]) + 1
        args = {"prefill_tokens": int(it["prefill_tokens"][k]), "decode_tokens": int(it["decode_tokens"][k]),
                "kv_blocks": int(it["kv_blocks"][k]), "waiting": int(it["waiting"][k])}
        if ids is not None:
            reqs = ids[offsets[k]:offsets[k + 1]].tolist()
            args["requests"] = reqs
            for r in reqs:
                first_on.setdefault((r, pid), k)
        label = f"P{int(it['prefill_seqs'][k])}/D{int(it['decode_seqs'][k])}"
        t0, t1 = _ns(it["start"][k]), _ns(it["end"][k])
        yield (f'{{"ph":"X","cat":"iteration","name":"{label}","pid":{pid},"tid":{tid},"ts":{_us(t0)},'
               f'"dur":{_us(t1 - t0)},"args":{json.dumps(args, separators=(",", ":"))}}}')
    # counters per replica: KV blocks in use and waiting requests, at each iteration's end
    for k in range(n):
        pid = int(it["replica"][k]) + 1
        yield (f'{{"ph":"C","name":"KV blocks","pid":{pid},"tid":{pid},"ts":{_us(_ns(it["end"][k]))},'
               f'"args":{{"engine {int(it["engine"][k])}":{int(it["kv_blocks"][k])}}}}}')
    tr = result.transfers
    kinds = tr.get("kind", np.zeros(0))
    kv = np.flatnonzero(kinds == TRANSFER_KINDS.index("kv"))
    lanes: list[float] = []
    pr = result.per_request
    for j, row in enumerate(kv):
        start, end = float(tr["start"][row]), float(tr["end"][row])
        lane = next((i for i, free in enumerate(lanes) if free <= start), len(lanes))
        if lane == len(lanes):
            lanes.append(end)
            yield f'{{"ph":"M","name":"thread_name","pid":0,"tid":{lane + 1},"ts":0,"args":{{"name":"lane {lane}"}}}}'
        lanes[lane] = end
        r = int(tr["request"][row])
        nodes = result.meta.get("node_names")
        src = nodes[int(tr["src"][row])] if nodes else int(tr["src"][row])
        dst = nodes[int(tr["dst"][row])] if nodes else int(tr["dst"][row])
        args = json.dumps({"request": r, "src": src, "dst": dst, "bytes": float(tr["bytes"][row])},
                          separators=(",", ":"))
        k0_ns, k1_ns = _ns(start), _ns(end)
        yield (f'{{"ph":"X","cat":"kv","name":"KV r{r}","pid":0,"tid":{lane + 1},"ts":{_us(k0_ns)},'
               f'"dur":{_us(k1_ns - k0_ns)},"args":{args}}}')
        if ids is None:
            continue
        src_pid = int(pr["replica"][r]) + 1
        dst_pid = int(pr["decode_replica"][r]) + 1
        k0 = first_on.get((r, src_pid))
        k1 = first_on.get((r, dst_pid))
        if k0 is None or k1 is None:
            continue
        # from the source iteration that ended with the request's first token
        t_src = float(pr["first_token_s"][r])
        src_tid = src_pid * 100 + 1
        for k in range(k0, n):
            if int(it["replica"][k]) + 1 == src_pid and abs(float(it["end"][k]) - t_src) <= 1e-12 * max(1.0, t_src):
                src_tid = src_pid * 100 + int(it["engine"][k]) + 1
                break
        dst_tid = dst_pid * 100 + int(it["engine"][k1]) + 1
        # each end inside its slice: the prefill's last nanosecond, the transfer's middle, the
        # decode iteration's first nanosecond (slices and flows on one nanosecond grid)
        yield (f'{{"ph":"s","cat":"kv","name":"KV","id":{j},"pid":{src_pid},"tid":{src_tid},'
               f'"ts":{_us(_ns(t_src) - 1)},"bp":"e"}}')
        yield (f'{{"ph":"t","cat":"kv","name":"KV","id":{j},"pid":0,"tid":{lane + 1},'
               f'"ts":{_us((k0_ns + k1_ns) // 2)},"bp":"e"}}')
        yield (f'{{"ph":"f","cat":"kv","name":"KV","id":{j},"pid":{dst_pid},"tid":{dst_tid},'
               f'"ts":{_us(_ns(it["start"][k1]) + 1)},"bp":"e"}}')


def write_trace(result, path: str | Path) -> int:
    """The Perfetto trace of ``result`` (run with ``trace=True`` for the requests of each
    iteration and the flow arrows) to ``path`` (gzip when it ends in ``.gz``); returns its size."""
    path = Path(path)
    from marssim import __version__

    other = json.dumps({"generator": f"marssim {__version__}", "time_unit": "microseconds",
                        "deployment": result.deployment.text(), "system": result.system}, sort_keys=True)

    def write(out) -> None:
        out.write('{"traceEvents":[\n')
        first = True
        for event in _trace_events(result):
            out.write(("" if first else ",\n") + event)
            first = False
        out.write(f'\n],"displayTimeUnit":"ms","otherData":{other}}}\n')

    if path.name.endswith(".gz"):
        with atomic_file(path, "wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
                with io.TextIOWrapper(gz, encoding="utf-8", newline="\n") as text:
                    write(text)
    else:
        with atomic_file(path, "w", encoding="utf-8", newline="\n") as text:
            write(text)
    return path.stat().st_size
