"""What a serving simulation records, and the figures an operator reads from it.

Per request: arrival, when its prefill first ran (queueing delay), its first token (TTFT), the
gaps between its tokens (time between tokens, TBT), its last token (end-to-end latency, E2E), its
time per output token (TPOT: ``(E2E - TTFT) / (output - 1)``), preemptions, its replicas, its KV
transfer. Per iteration: the engine, start and end, prefill and decode tokens and sequences,
KV-cache blocks in use, queue lengths. From those (:func:`summarise`):

* P50, P90, P99 and mean of TTFT, TPOT, TBT (over every gap between two tokens), E2E, queueing;
* throughput over the run (first arrival to last token): requests/s, output tokens/s, both per GPU;
  input and total (input and output) tokens/s, as the engines' ``throughput`` benchmarks count;
  per user: the output tokens after the first per second of decoding (``1 / TPOT``), a distribution
  over the requests;
* goodput: requests/s that met every SLO given (TTFT, TPOT, E2E bounds);
* KV-cache occupancy, queue length and batch size, time-weighted over each engine's iterations;
* speculative decoding (:mod:`.speculative`): sequence steps, proposed and accepted tokens, the
  acceptance rate, mean tokens per step, the draft's and the verification's share of the engines'
  busy time;
* Little's law: the time-average number of requests in the system (integrated as requests come
  and go) against arrival rate x mean latency; the two agree on every run (they must: the
  simulation counts requests in and out independently of the latencies it records).
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

import numpy as np

__all__ = ["Recorder", "WatchedRecorder", "ConstraintsMissed", "SLO", "summarise", "PERCENTILES",
           "ITERATION_COLUMNS"]

PERCENTILES = (50, 90, 99)
ITERATION_COLUMNS = ("replica", "engine", "start", "end", "prefill_tokens", "decode_tokens", "prefill_seqs",
                     "decode_seqs", "kv_blocks", "kv_capacity", "waiting", "running", "swapped")


@dataclass(frozen=True)
class SLO:
    """Service-level objectives (seconds; None: no bound): time to first token, time per output
    token, end-to-end latency. A request meets them when it is within every bound given."""

    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None

    def text(self) -> str:
        parts = [f"{k} <= {v * 1e3:g} ms" for k, v in (("TTFT", self.ttft), ("TPOT", self.tpot), ("E2E", self.e2e))
                 if v is not None]
        return ", ".join(parts) or "none"


class Recorder:
    """Collects a simulation's events for ``n`` requests (arrays indexed by request id)."""

    def __init__(self, n: int, *, requests_per_iteration: bool = False) -> None:
        self.started_at = np.full(n, np.nan)
        self.first = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.replica = np.full(n, -1, dtype=np.int32)
        self.decode_replica = np.full(n, -1, dtype=np.int32)
        self.preemptions = np.zeros(n, dtype=np.int32)
        self.gap_max = np.zeros(n)
        self.kv_start = np.full(n, np.nan)
        self.kv_end = np.full(n, np.nan)
        self.rejected = np.zeros(n, dtype=bool)
        self.finished_count = np.zeros(n, dtype=np.int32)
        self.gaps = array("d")
        self.iterations = {c: array("d") for c in ITERATION_COLUMNS}
        self.keep_requests = requests_per_iteration
        self.iteration_requests = array("q")
        self.iteration_offsets = array("q", [0])
        # requests in the system over time (Little's law), counted as they come and go
        self.in_system = 0
        self.area = 0.0
        self._last = 0.0
        self.window_start = math.nan
        self.stops_on_reject = False
        # a closed loop: when each request was sent (its arrival), and who hears of its end
        self.sent_at = np.full(n, np.nan)
        self.on_finish = None
        # speculative decoding: sequence steps, tokens proposed, accepted, emitted; seconds drafting, verifying
        self.spec = {"steps": 0, "proposed": 0, "accepted": 0, "emitted": 0, "draft_s": 0.0, "verify_s": 0.0}

    # ------------------------------------------------------------------ requests
    def arrived(self, now: float) -> None:
        if math.isnan(self.window_start):
            self.window_start = now
            self._last = now
        self.area += self.in_system * (now - self._last)
        self._last = now
        self.in_system += 1

    def started(self, s, now: float) -> None:
        self.started_at[s.id] = now

    def first_token(self, s, now: float) -> None:
        self.first[s.id] = now

    def gap(self, s, gap: float) -> None:
        self.gaps.append(gap)
        if gap > self.gap_max[s.id]:
            self.gap_max[s.id] = gap

    def preempted(self, s) -> None:
        self.preemptions[s.id] += 1

    def speculated(self, steps: int, proposed: int, accepted: int, emitted: int) -> None:
        spec = self.spec
        spec["steps"] += steps
        spec["proposed"] += proposed
        spec["accepted"] += accepted
        spec["emitted"] += emitted

    def spec_time(self, draft: float, verify: float) -> None:
        self.spec["draft_s"] += draft
        self.spec["verify_s"] += verify

    def finished(self, s, now: float) -> None:
        i = s.id
        self.finish[i] = now
        self.finished_count[i] += 1
        self.area += self.in_system * (now - self._last)
        self._last = now
        self.in_system -= 1
        if self.on_finish is not None:
            self.on_finish(i)

    def keep(self, n: int) -> None:
        """Keep the first ``n`` requests' records (a closed loop that sent only those)."""
        for name in ("started_at", "first", "finish", "replica", "decode_replica", "preemptions", "gap_max",
                     "kv_start", "kv_end", "rejected", "finished_count", "sent_at"):
            setattr(self, name, getattr(self, name)[:n])

    # ------------------------------------------------------------------ iterations
    def iteration(self, replica: int, engine: int, start: float, end: float, work, scheduler) -> None:
        it = self.iterations
        pt = 0
        for _, q in work.prefills:
            pt += q
        decode_tokens = len(work.decodes) * (1 + scheduler.lookahead)  # verified tokens, when speculative
        values = (replica, engine, start, end, pt, decode_tokens, len(work.prefills), len(work.decodes),
                  scheduler.bm.used, scheduler.bm.total, len(scheduler.waiting), len(scheduler.running),
                  len(scheduler.swapped))
        for name, value in zip(ITERATION_COLUMNS, values):
            it[name].append(value)
        if self.keep_requests:
            ids = self.iteration_requests
            for s, _ in work.prefills:
                ids.append(s.id)
            for s in work.decodes:
                ids.append(s.id)
            self.iteration_offsets.append(len(ids))


class ConstraintsMissed(Exception):
    """A run stopped once it could no longer meet a bound (``what`` says which)."""

    def __init__(self, what: str, now: float = math.nan) -> None:
        super().__init__(what, now)  # SimPy raises it again from its arguments
        self.what = what
        self.now = now

    def __str__(self) -> str:
        return f"{self.what} (certain at {self.now:.6g} s of simulated time)"


class WatchedRecorder(Recorder):
    """A :class:`Recorder` that stops the run (:class:`ConstraintsMissed`) as soon as a bound on a
    percentile of TTFT, TBT, TPOT, E2E or queueing delay can no longer be met: ``terms`` are
    ``(metric, quantile, limit s)``. The percentile of ``n`` values (numpy's linear
    interpolation) is at least the ``k``-th smallest, ``k = floor(q (n - 1))`` (0-based), so once
    ``n - k`` values exceed the limit it exceeds it too, whatever the values still to come;
    ``n`` is the number of requests (TTFT, E2E, queueing; every one must be served), of requests
    with more than one output token (TPOT), or of gaps between tokens (TBT). A rejected request
    misses the constraints outright."""

    def __init__(self, n: int, terms, output: np.ndarray, *, requests_per_iteration: bool = False) -> None:
        super().__init__(n, requests_per_iteration=requests_per_iteration)
        count = {"ttft": n, "e2e": n, "queue": n, "tpot": int((output > 1).sum()), "tbt": int((output - 1).sum())}
        self._terms: dict[str, list] = {}
        for metric, q, limit in terms:
            m = count[metric]
            if m < 1:
                continue
            k = int(math.floor(q * (m - 1)))
            self._terms.setdefault(metric, []).append([limit, m - k, 0, f"{metric} at quantile {q:g} above {limit:g} s"])
        self._gap_terms = self._terms.get("tbt", [])
        self.stops_on_reject = True

    def _over(self, metric: str, value: float, now: float) -> None:
        for term in self._terms.get(metric, ()):
            if value > term[0]:
                term[2] += 1
                if term[2] >= term[1]:
                    raise ConstraintsMissed(term[3], now)

    def started(self, s, now: float) -> None:
        super().started(s, now)
        self._over("queue", now - s.arrival, now)

    def first_token(self, s, now: float) -> None:
        super().first_token(s, now)
        self._over("ttft", now - s.arrival, now)

    def gap(self, s, gap: float) -> None:
        super().gap(s, gap)
        for term in self._gap_terms:
            if gap > term[0]:
                term[2] += 1
                if term[2] >= term[1]:
                    raise ConstraintsMissed(term[3], s.last_token)

    def finished(self, s, now: float) -> None:
        super().finished(s, now)
        self._over("e2e", now - s.arrival, now)
        if s.output > 1:
            self._over("tpot", (now - s.first_token) / (s.output - 1), now)


def _stats(values: np.ndarray) -> dict[str, float]:
    values = values[np.isfinite(values)]
    if not len(values):
        return {"mean": math.nan, **{f"p{p}": math.nan for p in PERCENTILES}, "max": math.nan}
    out = {"mean": float(values.mean())}
    for p, v in zip(PERCENTILES, np.percentile(values, PERCENTILES)):
        out[f"p{p}"] = float(v)
    out["max"] = float(values.max())
    return out


def summarise(arrival: np.ndarray, output: np.ndarray, rec: Recorder, iterations: dict[str, np.ndarray],
              gpus: int, slo: SLO, prompt: np.ndarray | None = None) -> dict:
    """The run's figures (see the module docstring); times in seconds, rates per second.
    ``prompt`` (tokens per request) adds the input and total token throughputs."""
    done = np.isfinite(rec.finish)
    ttft = rec.first - arrival
    e2e = rec.finish - arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(output > 1, (rec.finish - rec.first) / (output - 1), np.nan)
    queue = rec.started_at - arrival
    start = float(arrival[done].min()) if done.any() else 0.0
    end = float(rec.finish[done].max()) if done.any() else 0.0
    window = end - start
    completed = int(done.sum())
    out_tokens = int(output[done].sum())
    meets = done.copy()
    if slo.ttft is not None:
        meets &= ttft <= slo.ttft
    if slo.tpot is not None:
        meets &= ~(tpot > slo.tpot)
    if slo.e2e is not None:
        meets &= e2e <= slo.e2e
    summary = {
        "requests": int(len(arrival)), "completed": completed, "rejected": int(rec.rejected.sum()),
        "duration_s": window,
        "throughput_rps": completed / window if window > 0 else math.nan,
        "output_tokens_per_s": out_tokens / window if window > 0 else math.nan,
        "gpus": gpus,
        "goodput_rps": int(meets.sum()) / window if window > 0 else math.nan,
        "slo_attained": float(meets.sum() / completed) if completed else math.nan,
        "ttft_s": _stats(ttft[done]), "tpot_s": _stats(tpot[done]), "tbt_s": _stats(np.asarray(rec.gaps)),
        "e2e_s": _stats(e2e[done]), "queue_s": _stats(queue[done]),
        "preemptions": int(rec.preemptions.sum()),
    }
    summary["throughput_rps_per_gpu"] = summary["throughput_rps"] / gpus if gpus else math.nan
    summary["output_tokens_per_s_per_gpu"] = summary["output_tokens_per_s"] / gpus if gpus else math.nan
    # what a user sees: the tokens after the first, per second of decoding (1 / TPOT of its request)
    with np.errstate(invalid="ignore", divide="ignore"):
        summary["user_tokens_per_s"] = _stats(np.where(tpot[done] > 0, 1.0 / tpot[done], np.nan))
    if prompt is not None:
        in_tokens = int(prompt[done].sum())
        summary["input_tokens_per_s"] = in_tokens / window if window > 0 else math.nan
        summary["total_tokens_per_s"] = (in_tokens + out_tokens) / window if window > 0 else math.nan
    # Little's law: L (integrated) vs lambda x W over the same window
    little_l = rec.area / window if window > 0 else math.nan
    lam = completed / window if window > 0 else math.nan
    summary["little"] = {"mean_in_system": little_l, "rate_x_latency": lam * float(e2e[done].mean()) if completed
                         else math.nan}
    it = iterations
    if len(it["start"]):
        dur = it["end"] - it["start"]
        total = float(dur.sum())
        weights = dur / total if total > 0 else np.full(len(dur), 1.0 / len(dur))
        occupancy = it["kv_blocks"] / it["kv_capacity"]
        batch = it["prefill_seqs"] + it["decode_seqs"]
        summary["kv_occupancy"] = {"mean": float((occupancy * weights).sum()), "max": float(occupancy.max())}
        summary["batch_size"] = {"mean": float((batch * weights).sum()), "max": int(batch.max())}
        summary["batch_tokens"] = {"mean": float(((it["prefill_tokens"] + it["decode_tokens"]) * weights).sum()),
                                   "max": int((it["prefill_tokens"] + it["decode_tokens"]).max())}
        summary["queue_length"] = {"mean": float((it["waiting"] * weights).sum()), "max": int(it["waiting"].max())}
        summary["iterations"] = int(len(dur))
    else:
        summary["iterations"] = 0
    spec = rec.spec
    if spec["steps"]:
        busy = spec["draft_s"] + spec["verify_s"]
        summary["speculative"] = {
            "steps": spec["steps"], "proposed": spec["proposed"], "accepted": spec["accepted"],
            "acceptance_rate": spec["accepted"] / spec["proposed"] if spec["proposed"] else math.nan,
            "tokens_per_step": (spec["accepted"] + spec["steps"]) / spec["steps"],
            "emitted_per_step": spec["emitted"] / spec["steps"],
            "draft_share": spec["draft_s"] / busy if busy > 0 else math.nan,
            "verify_share": spec["verify_s"] / busy if busy > 0 else math.nan}
    return summary
