"""Published serving measurements predicted by the serving engine: a fixed batch of ``requests``
requests of ``input_tokens`` prompt and ``output_tokens`` generated tokens, all arriving at once
(an engine's offline throughput benchmark, e.g. ``trtllm-bench throughput``), served by a
deployment of replicas (``marssim serve``'s ``--pool`` grammar) of a model on a system, and the
output tokens per second the run reaches, against the figure published.

A serving table is a CSV file (``#`` lines are its provenance) with the columns
:data:`SERVE_COLUMNS`; :func:`marssim.validate.published.load_published` tells it from a table
of training runs by its ``measured_output_tokens_per_s`` column. Units: tokens, requests,
seconds, tokens/s. The measured figures are checks, never fitted to.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from marssim.errors import CapacityError, InputError

from .accuracy import summary_line

__all__ = ["SERVE_COLUMNS", "PublishedServing", "ServingPrediction", "format_serving", "predict_serving",
           "read_serving_rows", "serving_record"]

SERVE_COLUMNS = ("name", "system", "model", "deployment", "input_tokens", "output_tokens", "requests",
                 "measured_output_tokens_per_s", "source")


@dataclass(frozen=True)
class PublishedServing:
    """One measured serving run: ``requests`` requests of ``input_tokens`` prompt tokens and
    ``output_tokens`` generated tokens each, all sent at time 0 to the ``deployment`` (pool
    settings, ``replicas=1,tp=2,...``) of ``model`` on ``system``; the engine generated
    ``measured_output_tokens_per_s`` output tokens per second over the whole run (all GPUs)."""

    name: str
    system: str
    model: str
    deployment: str
    input_tokens: int
    output_tokens: int
    requests: int
    measured_output_tokens_per_s: float
    source: str


@dataclass(frozen=True)
class ServingPrediction:
    """A published serving run and what the serving simulation predicts for it: output tokens/s
    over the run, its duration (s), the mean time to first token and per output token (s), the
    time-weighted mean batch (sequences per iteration), the preemptions; ``error``: (predicted -
    measured) / measured output tokens/s."""

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

    @property
    def error(self) -> float:
        return (self.output_tokens_per_s - self.run.measured_output_tokens_per_s) / \
            self.run.measured_output_tokens_per_s


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


def read_serving_rows(file: str, rows: Sequence[dict]) -> list[PublishedServing]:
    """The rows of a serving table (dicts keyed by :data:`SERVE_COLUMNS`, as ``csv.DictReader``
    gives them); InputError naming the file, the row and the column for anything missing or
    malformed."""
    out = []
    for i, row in enumerate(rows):
        where = f"row {i + 1}"
        for column in ("name", "system", "model", "deployment"):
            if not (row.get(column) or "").strip():
                raise InputError(file, f"{where}.{column}", "expected a value, got nothing")
        counts = {c: _count(row, c, file, where) for c in ("input_tokens", "output_tokens", "requests")}
        text = (row.get("measured_output_tokens_per_s") or "").strip()
        try:
            measured = float(text)
        except ValueError:
            raise InputError(file, f"{where}.measured_output_tokens_per_s",
                             f"expected output tokens per second, got {text!r}") from None
        if not measured > 0 or not math.isfinite(measured):
            raise InputError(file, f"{where}.measured_output_tokens_per_s",
                             f"expected a positive throughput, got {measured}")
        out.append(PublishedServing(row["name"].strip(), row["system"].strip(), row["model"].strip(),
                                    row["deployment"].strip(), counts["input_tokens"], counts["output_tokens"],
                                    counts["requests"], measured, (row.get("source") or "").strip()))
    return out


def predict_serving(run: PublishedServing, cost=None) -> ServingPrediction:
    """The serving simulation of one published run (:func:`marssim.plan.serve_stream`, seed 0:
    the requests are equal, so the seed draws nothing). A run the engine cannot take (a pool
    the model cannot split, no room for a KV cache) keeps the reason in ``problem``."""
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
        spec = RequestSpec(Arrivals("offline"), Lengths("fixed", run.input_tokens),
                           Lengths("fixed", run.output_tokens), run.requests)
        if cost is None:
            from marssim.cost import default_cost_model

            cost = default_cost_model()
        result = serve_stream(deployment, model, system, cost, spec)
    except (InputError, CapacityError) as err:
        return ServingPrediction(run, problem=str(err), wall_s=time.perf_counter() - start)
    s = result.summary
    if s["completed"] < run.requests:
        return ServingPrediction(run, problem=f"{s['completed']} of {run.requests} requests completed "
                                              f"({s['rejected']} rejected)", wall_s=time.perf_counter() - start)
    return ServingPrediction(run, "simulate", s["output_tokens_per_s"], s["duration_s"], s["ttft_s"]["mean"],
                             s["tpot_s"]["mean"], s.get("batch_size", {}).get("mean", math.nan), s["preemptions"],
                             wall_s=time.perf_counter() - start)


def format_serving(predictions: Sequence[ServingPrediction]) -> str:
    """One line per row within 120 columns: the lengths, measured and predicted output tokens/s,
    the error, and the predicted run's duration, mean TTFT and TPOT, mean batch and preemptions;
    then the mean and worst error."""
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
    return "\n".join(lines)


def serving_record(p: ServingPrediction) -> dict:
    """One prediction as a flat record (a CSV row)."""
    r = p.run
    return {"name": r.name, "system": r.system, "model": r.model, "deployment": r.deployment,
            "input_tokens": r.input_tokens, "output_tokens": r.output_tokens, "requests": r.requests,
            "source": r.source, "how": p.how, "measured_output_tokens_per_s": r.measured_output_tokens_per_s,
            "predicted_output_tokens_per_s": p.output_tokens_per_s,
            "error": p.error if not p.problem else math.nan, "duration_s": p.duration_s, "ttft_mean_s": p.ttft_s,
            "tpot_mean_s": p.tpot_s, "mean_batch": p.mean_batch, "preemptions": p.preemptions,
            "problem": p.problem, "wall_s": p.wall_s}
