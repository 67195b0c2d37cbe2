"""Published serving measurements predicted by the serving engine: ``requests`` requests of
``input_tokens`` prompt and ``output_tokens`` generated tokens, all arriving at once (an engine's
offline throughput benchmark, e.g. ``trtllm-bench throughput``) or at ``request_rate`` requests/s
as a Poisson process (an online benchmark, e.g. ``bench_serving --request-rate``), served by a
deployment of replicas (``marssim serve``'s ``--pool`` grammar) of a model on a system; what the
run measured (output tokens per second, the time to first token, the time per output token)
against the figures published.

A serving table is a CSV file (``#`` lines are its provenance) with the columns
:data:`SERVE_COLUMNS` and optionally :data:`LATENCY_COLUMNS`; :func:`marssim.validate.published.load_published`
tells it from a table of training runs by its ``measured_output_tokens_per_s`` column. A row gives
at least one measured figure; a blank one is not checked. The latency figures are per-request
statistics (``latency_statistic``: the ``mean`` or the ``median`` over the requests, as the
benchmark reports them) of the time to first token (``measured_ttft_ms``) and of the time per
output token after the first (``measured_tpot_ms``: a request's (end - first token) / (output
tokens - 1)); the prediction takes the same statistic over the simulated requests. Units: tokens,
requests, requests/s, tokens/s, ms in the table, seconds in the objects. Each error is
``(predicted - measured) / measured`` of its own figure. The measured figures are checks, never
fitted to.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from marssim.errors import CapacityError, InputError

from .accuracy import summary, summary_line

__all__ = ["LATENCY_COLUMNS", "SERVE_COLUMNS", "LatencyStatistic", "PublishedServing", "ServingPrediction",
           "figure_summaries", "format_serving", "predict_serving", "read_serving_rows", "serving_record"]

SERVE_COLUMNS = ("name", "system", "model", "deployment", "input_tokens", "output_tokens", "requests",
                 "measured_output_tokens_per_s", "source")
LATENCY_COLUMNS = ("request_rate", "latency_statistic", "measured_ttft_ms", "measured_tpot_ms")
"""Optional columns of a serving table: the Poisson arrival rate (requests/s; blank or ``inf``: all
requests at once), the statistic of the latency figures (``mean`` or ``median``), and the measured
time to first token and time per output token (ms; blank: not published)."""


class LatencyStatistic(str, Enum):
    """Which per-request statistic a published latency figure is."""

    MEAN = "mean"
    MEDIAN = "median"

    @property
    def key(self) -> str:
        """The key of the statistic in a serving summary's latency entries."""
        return "mean" if self is LatencyStatistic.MEAN else "p50"


@dataclass(frozen=True)
class PublishedServing:
    """One measured serving run: ``requests`` requests of ``input_tokens`` prompt tokens and
    ``output_tokens`` generated tokens each, sent at ``request_rate`` requests/s (Poisson; ``inf``:
    all at time 0) to the ``deployment`` (pool settings, ``replicas=1,tp=2,...``) of ``model`` on
    ``system``; the engine generated ``measured_output_tokens_per_s`` output tokens per second over
    the whole run (all GPUs), and the requests' ``statistic`` time to first token and time per
    output token were ``measured_ttft_s`` and ``measured_tpot_s`` seconds. A figure not published
    is NaN."""

    name: str
    system: str
    model: str
    deployment: str
    input_tokens: int
    output_tokens: int
    requests: int
    measured_output_tokens_per_s: float
    source: str
    request_rate: float = math.inf
    statistic: LatencyStatistic = LatencyStatistic.MEAN
    measured_ttft_s: float = math.nan
    measured_tpot_s: float = math.nan

    @property
    def offline(self) -> bool:
        """Whether every request arrives at time 0."""
        return math.isinf(self.request_rate)

    @property
    def has_latency(self) -> bool:
        """Whether the row publishes a latency figure or an arrival rate."""
        return not (self.offline and math.isnan(self.measured_ttft_s) and math.isnan(self.measured_tpot_s))


@dataclass(frozen=True)
class ServingPrediction:
    """A published serving run and what the serving simulation predicts for it: output tokens/s
    over the run, its duration (s), the mean time to first token and per output token (s), the
    same statistic of them as the run's published one (``ttft_stat_s``, ``tpot_stat_s``), the
    time-weighted mean batch (sequences per iteration), the preemptions. ``error``: (predicted -
    measured) / measured output tokens/s, ``ttft_error`` and ``tpot_error`` the same of the
    latency statistic; NaN where the figure is not published or the run was not predicted."""

    run: PublishedServing
    how: str = "simulate"
    output_tokens_per_s: float = float("nan")
    duration_s: float = float("nan")
    ttft_s: float = float("nan")
    tpot_s: float = float("nan")
    mean_batch: float = float("nan")
    preemptions: int = 0
    problem: str = ""
    wall_s: float = 0.0
    ttft_stat_s: float = float("nan")
    tpot_stat_s: float = float("nan")

    @property
    def error(self) -> float:
        return (self.output_tokens_per_s - self.run.measured_output_tokens_per_s) / \
            self.run.measured_output_tokens_per_s

    @property
    def ttft_error(self) -> float:
        return (self.ttft_stat_s - self.run.measured_ttft_s) / self.run.measured_ttft_s

    @property
    def tpot_error(self) -> float:
        return (self.tpot_stat_s - self.run.measured_tpot_s) / self.run.measured_tpot_s


def _count(row: dict, column: str, file: str, where: str) -> int:
    text = (row.get(column) or "").strip()
    try:
        value = int(text)
    except ValueError:
        raise InputError(file, f"{where}.{column}", f"expected a whole number of {column.split('_')[-1]}, "
                                                    f"got {text!r}") from None
    if value < 1:
        raise InputError(file, f"{where}.{column}", f"expected at least 1, got {value}")
    return value


def _figure(row: dict, column: str, file: str, where: str, what: str) -> float:
    """A positive finite number from ``column`` (NaN when blank); InputError otherwise."""
    text = (row.get(column) or "").strip()
    if not text:
        return math.nan
    try:
        value = float(text)
    except ValueError:
        raise InputError(file, f"{where}.{column}", f"expected {what}, got {text!r}") from None
    if not value > 0 or not math.isfinite(value):
        raise InputError(file, f"{where}.{column}", f"expected a positive {what}, got {text}")
    return value


def _rate(row: dict, file: str, where: str) -> float:
    text = (row.get("request_rate") or "").strip()
    if text.lower() in ("", "inf"):
        return math.inf
    return _figure(row, "request_rate", file, where, "requests per second (or inf: all at once)")


def _statistic(row: dict, file: str, where: str, needed: bool) -> LatencyStatistic:
    text = (row.get("latency_statistic") or "").strip()
    if not text:
        if needed:
            raise InputError(file, f"{where}.latency_statistic", "expected mean or median (which statistic over "
                                                                 "the requests the latency figures are), got nothing")
        return LatencyStatistic.MEAN
    try:
        return LatencyStatistic(text)
    except ValueError:
        raise InputError(file, f"{where}.latency_statistic", f"expected mean or median, got {text!r}") from None


def read_serving_rows(file: str, rows: Sequence[dict]) -> list[PublishedServing]:
    """The rows of a serving table (dicts keyed by :data:`SERVE_COLUMNS` and optionally
    :data:`LATENCY_COLUMNS`, as ``csv.DictReader`` gives them); InputError naming the file, the
    row and the column for anything missing or malformed, or a row with no measured figure."""
    out = []
    for i, row in enumerate(rows):
        where = f"row {i + 1}"
        for column in ("name", "system", "model", "deployment"):
            if not (row.get(column) or "").strip():
                raise InputError(file, f"{where}.{column}", "expected a value, got nothing")
        counts = {c: _count(row, c, file, where) for c in ("input_tokens", "output_tokens", "requests")}
        measured = _figure(row, "measured_output_tokens_per_s", file, where, "throughput (output tokens per second)")
        ttft_ms = _figure(row, "measured_ttft_ms", file, where, "time to first token (ms)")
        tpot_ms = _figure(row, "measured_tpot_ms", file, where, "time per output token (ms)")
        if all(math.isnan(v) for v in (measured, ttft_ms, tpot_ms)):
            raise InputError(file, f"{where}.measured_output_tokens_per_s",
                             "expected a measured figure: output tokens per second, or measured_ttft_ms or "
                             "measured_tpot_ms; got none")
        statistic = _statistic(row, file, where, needed=not (math.isnan(ttft_ms) and math.isnan(tpot_ms)))
        if not math.isnan(tpot_ms) and counts["output_tokens"] < 2:
            raise InputError(file, f"{where}.measured_tpot_ms", "a time per output token needs at least 2 output "
                                                                "tokens a request")
        out.append(PublishedServing(row["name"].strip(), row["system"].strip(), row["model"].strip(),
                                    row["deployment"].strip(), counts["input_tokens"], counts["output_tokens"],
                                    counts["requests"], measured, (row.get("source") or "").strip(),
                                    _rate(row, file, where), statistic, ttft_ms / 1e3, tpot_ms / 1e3))
    return out


def predict_serving(run: PublishedServing, cost=None, seed: int = 0) -> ServingPrediction:
    """The serving simulation of one published run (:func:`marssim.plan.serve_stream`; the
    Poisson arrivals of an online run drawn with ``seed``, an offline run's equal requests draw
    nothing). A run the engine cannot take (a pool the model cannot split, no room for a KV
    cache) keeps the reason in ``problem``."""
    from marssim.plan import serve_stream
    from marssim.serve.deployment import Deployment, check_deployment, parse_pool
    from marssim.serve.model import load_model
    from marssim.serve.requests import Arrivals, Lengths, RequestSpec
    from marssim.system import load_system

    start = time.perf_counter()
    try:
        model = load_model(run.model)
        system = load_system(run.system)
        deployment = Deployment((parse_pool(run.deployment, f"{run.name}: deployment"),))
        check_deployment(deployment, f"{run.name}: deployment")
        arrivals = Arrivals("offline") if run.offline else Arrivals("poisson", rate=run.request_rate)
        spec = RequestSpec(arrivals, Lengths("fixed", run.input_tokens), Lengths("fixed", run.output_tokens),
                           run.requests)
        if cost is None:
            from marssim.cost import default_cost_model

            cost = default_cost_model()
        result = serve_stream(deployment, model, system, cost, spec, seed=seed)
    except (InputError, CapacityError) as err:
        return ServingPrediction(run, problem=str(err), wall_s=time.perf_counter() - start)
    s = result.summary
    if s["completed"] < run.requests:
        return ServingPrediction(run, problem=f"{s['completed']} of {run.requests} requests completed "
                                              f"({s['rejected']} rejected)", wall_s=time.perf_counter() - start)
    key = run.statistic.key
    return ServingPrediction(run, "simulate", s["output_tokens_per_s"], s["duration_s"], s["ttft_s"]["mean"],
                             s["tpot_s"]["mean"], s.get("batch_size", {}).get("mean", math.nan), s["preemptions"],
                             wall_s=time.perf_counter() - start, ttft_stat_s=s["ttft_s"][key],
                             tpot_stat_s=s["tpot_s"][key])


@dataclass(frozen=True)
class _FigureError:
    """One figure's error as :func:`~.accuracy.summary` reads it."""

    error: float
    problem: str = ""


def figure_summaries(predictions: Sequence[ServingPrediction]) -> dict[str, dict[str, float]]:
    """:func:`~.accuracy.summary` of each published figure over the rows that publish it and were
    predicted: ``output_tokens_per_s``, ``ttft`` and ``tpot`` (the rows' own statistic)."""
    errors = {"output_tokens_per_s": [_FigureError(p.error, p.problem) for p in predictions],
              "ttft": [_FigureError(p.ttft_error, p.problem) for p in predictions],
              "tpot": [_FigureError(p.tpot_error, p.problem) for p in predictions]}
    return {name: summary(rows) for name, rows in errors.items()}


def _cell(value: float, width: int, form: str) -> str:
    """``value`` right-aligned in ``width`` columns in ``form`` (``+.1%``, ``.2f``; a leading ``+``
    signs it); ``-`` when NaN (not published)."""
    if math.isnan(value):
        return f"{'-':>{width}}"
    sign = "+" if form.startswith("+") else ""
    return format(value, f">{sign}{width}{form.lstrip('+')}")


def _if(measured: float, predicted: float) -> float:
    """``predicted`` where a figure was published (``measured`` not NaN), else NaN."""
    return math.nan if math.isnan(measured) else predicted


def _format_throughput(predictions: Sequence[ServingPrediction]) -> list[str]:
    header = (f"{'run':<33}{'ISL/OSL':>11}{'measured':>10}{'predicted':>10}{'error':>8}{'run s':>8}{'TTFT s':>8}"
              f"{'TPOT ms':>8}{'batch':>7}{'preempt':>8}")
    lines = [header]
    for p in predictions:
        r = p.run
        lengths = f"{r.input_tokens}/{r.output_tokens}"
        if p.problem:
            lines.append(f"{r.name[:32]:<33}{lengths:>11}{r.measured_output_tokens_per_s:>10.0f}  not predicted: "
                         f"{p.problem}"[:120])
            continue
        lines.append(f"{r.name[:32]:<33}{lengths:>11}{r.measured_output_tokens_per_s:>10.0f}"
                     f"{p.output_tokens_per_s:>10.0f}{p.error:>+8.1%}{p.duration_s:>8.1f}{p.ttft_s:>8.1f}"
                     f"{p.tpot_s * 1e3:>8.1f}{p.mean_batch:>7.0f}{p.preemptions:>8d}")
    lines.append(summary_line(predictions))
    lines.append("(output tokens/s of the whole run, all GPUs; run s, TTFT, TPOT, batch: the predicted run's)")
    return lines


def _format_latency(predictions: Sequence[ServingPrediction]) -> list[str]:
    lines = [f"{'':<45}{'output tokens/s':^23}{'TTFT ms':^23}{'TPOT ms':^21}",
             (f"{'run':<24}{'req/s':>6}{'ISL/OSL':>10}{'stat':>5}{'meas':>8}{'pred':>8}{'error':>7}{'meas':>8}"
              f"{'pred':>8}{'error':>7}{'meas':>7}{'pred':>7}{'error':>7}{'batch':>6}")]
    for p in predictions:
        r = p.run
        rate = "inf" if r.offline else f"{r.request_rate:g}"
        stat = "p50" if r.statistic is LatencyStatistic.MEDIAN else "mean"
        if math.isnan(r.measured_ttft_s) and math.isnan(r.measured_tpot_s):
            stat = "-"
        head = f"{r.name[:23]:<24}{rate:>6}{f'{r.input_tokens}/{r.output_tokens}':>10}{stat:>5}"
        if p.problem:
            lines.append(f"{head}  not predicted: {p.problem}"[:120])
            continue
        lines.append(f"{head}{_cell(r.measured_output_tokens_per_s, 8, '.0f')}{p.output_tokens_per_s:>8.0f}"
                     f"{_cell(p.error, 7, '+.1%')}{_cell(r.measured_ttft_s * 1e3, 8, '.1f')}"
                     f"{_cell(_if(r.measured_ttft_s, p.ttft_stat_s) * 1e3, 8, '.1f')}{_cell(p.ttft_error, 7, '+.1%')}"
                     f"{_cell(r.measured_tpot_s * 1e3, 7, '.2f')}"
                     f"{_cell(_if(r.measured_tpot_s, p.tpot_stat_s) * 1e3, 7, '.2f')}"
                     f"{_cell(p.tpot_error, 7, '+.1%')}{p.mean_batch:>6.0f}")
    for name, s in figure_summaries(predictions).items():
        if s["rows"]:
            lines.append(f"{name.replace('ttft', 'TTFT').replace('tpot', 'TPOT'):<20} {s['rows']} rows: mean |error| "
                         f"{s['mean_abs']:.2%}, worst {s['worst_abs']:.2%}, mean signed {s['mean']:+.2%}")
    lines.append("(output tokens/s of the whole run, all GPUs; TTFT, TPOT: each row's statistic over its requests, "
                 "p50 the median;")
    lines.append(" -: not published; batch: the predicted run's mean sequences an iteration)")
    return lines


def format_serving(predictions: Sequence[ServingPrediction]) -> str:
    """One line per row within 120 columns, then the mean and worst error of each figure. A table
    of offline throughput alone: the lengths, measured and predicted output tokens/s, the error,
    and the predicted run's duration, mean TTFT and TPOT, mean batch and preemptions. A table
    with arrival rates or latency figures: the rate, the lengths, the latency statistic, and the
    measured, predicted and error of output tokens/s, TTFT and TPOT, and the mean batch."""
    latency = any(p.run.has_latency for p in predictions)
    return "\n".join(_format_latency(predictions) if latency else _format_throughput(predictions))


def serving_record(p: ServingPrediction) -> dict:
    """One prediction as a flat record (a CSV row; times in seconds)."""
    r = p.run
    ok = not p.problem
    return {"name": r.name, "system": r.system, "model": r.model, "deployment": r.deployment,
            "input_tokens": r.input_tokens, "output_tokens": r.output_tokens, "requests": r.requests,
            "request_rate": r.request_rate, "source": r.source, "how": p.how,
            "measured_output_tokens_per_s": r.measured_output_tokens_per_s,
            "predicted_output_tokens_per_s": p.output_tokens_per_s,
            "error": p.error if ok else math.nan, "duration_s": p.duration_s, "ttft_mean_s": p.ttft_s,
            "tpot_mean_s": p.tpot_s, "latency_statistic": r.statistic.value,
            "measured_ttft_s": r.measured_ttft_s, "predicted_ttft_s": p.ttft_stat_s,
            "ttft_error": p.ttft_error if ok else math.nan, "measured_tpot_s": r.measured_tpot_s,
            "predicted_tpot_s": p.tpot_stat_s, "tpot_error": p.tpot_error if ok else math.nan,
            "mean_batch": p.mean_batch, "preemptions": p.preemptions, "problem": p.problem, "wall_s": p.wall_s}
