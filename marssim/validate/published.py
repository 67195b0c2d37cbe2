"""Predictions against published measurements: a table of runs others measured (a system, a
workload, a parallel configuration and the iteration time they report) evaluated by
:func:`marssim.plan.run`, each row's error stated with where the predicted time went.

A table is a CSV file (``#`` lines are its provenance) of one of two kinds, told apart by its
columns: training runs, with the columns ``name, system, workload, parallel,
measured_iteration_s, source`` and optionally ``measured_mfu``; or serving runs, with the columns
of :data:`~.published_serving.SERVE_COLUMNS` (``measured_output_tokens_per_s`` among them, blank
on a row that publishes only latencies) and optionally :data:`~.published_serving.LATENCY_COLUMNS`
(an arrival rate, the median or mean TTFT and TPOT), predicted by the serving engine
(:mod:`.published_serving`). The shipped tables
(``marssim.data.published()``) are found by their file stem, e.g. ``korthikanti2022-table5``.
The measured figures are checks, never fitted to.
"""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from marssim.errors import CapacityError, InputError

from .accuracy import summary_line
from .published_serving import (SERVE_COLUMNS, PublishedServing, ServingPrediction, format_serving, predict_serving,
                                read_serving_rows, serving_record)

__all__ = ["PublishedRun", "PublishedServing", "Prediction", "ServingPrediction", "load_published", "published_tables",
           "predict", "predict_all", "format_predictions", "TableKind", "table_kind"]

_COLUMNS = ("name", "system", "workload", "parallel", "measured_iteration_s", "source")


@dataclass(frozen=True)
class PublishedRun:
    """One measured run: ``measured_iteration_s`` seconds per iteration (``measured_mfu``: the
    model FLOPs utilisation it reports, NaN when it does not)."""

    name: str
    system: str
    workload: str
    parallel: str
    measured_iteration_s: float
    source: str
    measured_mfu: float = float("nan")


@dataclass(frozen=True)
class Prediction:
    """A published run and what marssim predicts for it (seconds, FLOP ratios): the iteration,
    MFU and HFU, and per GPU the time computing, in the pipeline bubble and in exposed
    communication per group; ``error``: (predicted - measured) / measured."""

    run: PublishedRun
    how: str
    iteration_s: float = float("nan")
    mfu: float = float("nan")
    hfu: float = float("nan")
    busy_s: float = float("nan")
    bubble_s: float = float("nan")
    exposed_s: dict = field(default_factory=dict)
    problem: str = ""
    wall_s: float = 0.0

    @property
    def error(self) -> float:
        return (self.iteration_s - self.run.measured_iteration_s) / self.run.measured_iteration_s


def published_tables() -> dict[str, Path]:
    """The shipped tables by name (file stem)."""
    from marssim.data import published

    return {p.stem: p for p in sorted(published().glob("*.csv"))}


class TableKind(str, Enum):
    """What a table's rows are: training runs (an iteration time each) or serving runs (output
    tokens/s)."""

    TRAIN = "train"
    SERVE = "serve"


def table_kind(columns: Sequence[str], file: str) -> TableKind:
    """The kind of table the header ``columns`` make (a serving table has
    ``measured_output_tokens_per_s``, a training table ``measured_iteration_s``); InputError
    naming the file and the columns missing for its kind, or both measured columns."""
    columns = tuple(columns)
    train, serve = "measured_iteration_s" in columns, "measured_output_tokens_per_s" in columns
    if train and serve:
        raise InputError(file, "", "expected one measured column: measured_iteration_s (training runs) or "
                                   "measured_output_tokens_per_s (serving runs), got both")
    kind, expected = (TableKind.SERVE, SERVE_COLUMNS) if serve else (TableKind.TRAIN, _COLUMNS)
    missing = [c for c in expected if c not in columns]
    if missing:
        what = "a serving table" if serve else f"a training table (or, for serving runs, {', '.join(SERVE_COLUMNS)})"
        raise InputError(file, "", f"expected the columns {', '.join(expected)} of {what}; "
                                   f"missing {', '.join(missing)}")
    return kind


def load_published(name_or_path: str | Path) -> list[PublishedRun] | list[PublishedServing]:
    """The rows of a table (a path, or a shipped table's name): :class:`PublishedRun` rows of a
    training table, :class:`PublishedServing` rows of a serving table (:func:`table_kind`);
    InputError naming the file, the row and the column for anything missing or malformed."""
    path = Path(name_or_path)
    if not path.is_file():
        tables = published_tables()
        if str(name_or_path) not in tables:
            raise InputError(str(name_or_path), "", f"no such file; expected a CSV of published runs or one of the "
                                                    f"shipped tables: {', '.join(tables)}")
        path = tables[str(name_or_path)]
    file = str(path)
    from marssim.limits import MAX_CSV_BYTES, check_file_size

    check_file_size(path, MAX_CSV_BYTES, "a table of published runs")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise InputError(file, "", f"not a text file (byte {err.start:,} is not UTF-8); expected a CSV table") from None
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    reader = csv.DictReader(lines)
    if table_kind(reader.fieldnames or (), file) is TableKind.SERVE:
        served = read_serving_rows(file, list(reader))
        if not served:
            raise InputError(file, "", "expected at least one row")
        return served
    rows = []
    for i, row in enumerate(reader):
        where = f"row {i + 1}"
        try:
            measured = float(row["measured_iteration_s"])
        except (TypeError, ValueError):
            raise InputError(file, f"{where}.measured_iteration_s",
                             f"expected seconds, got {row['measured_iteration_s']!r}") from None
        if not measured > 0 or not math.isfinite(measured):
            raise InputError(file, f"{where}.measured_iteration_s", f"expected a positive time, got {measured}")
        for column in ("name", "system", "workload", "parallel"):
            if not (row.get(column) or "").strip():
                raise InputError(file, f"{where}.{column}", "expected a value, got nothing")
        mfu = row.get("measured_mfu") or ""
        rows.append(PublishedRun(row["name"].strip(), row["system"].strip(), row["workload"].strip(),
                                 row["parallel"].strip(), measured, (row.get("source") or "").strip(),
                                 float(mfu) if mfu.strip() else float("nan")))
    if not rows:
        raise InputError(file, "", "expected at least one row")
    return rows


def predict(run: PublishedRun, cost=None, how: str = "simulate") -> Prediction:
    """The prediction of one published run (``how``: ``simulate`` or ``estimate``). A row the
    simulator refuses (a configuration its memory model says does not fit, say) keeps the reason
    in ``problem``."""
    from marssim.parallel import parse_parallel
    from marssim.plan import bind_parallel, run as run_plan, workload_sets_batch
    from marssim.specs import split_spec
    from marssim.system import load_system
    from marssim.workload import load_workload

    start = time.perf_counter()
    try:
        system = load_system(run.system)
        graph = load_workload(run.workload)
        cfg = parse_parallel(run.parallel, where=run.name)
        given = split_spec(run.parallel, named=False).params
        cfg, graph = bind_parallel(cfg, graph, system, run.name, micro_batch_given="micro_batch" in given,
                                   batch_given=workload_sets_batch(run.workload), order_given="order" in given)
        done = run_plan(cfg, graph, system, cost, how=how, memory_policy="ignore", detail=False)
    except (InputError, CapacityError) as err:
        return Prediction(run, how, problem=str(err), wall_s=time.perf_counter() - start)
    rep = done.report
    exposed = {k: v for k, v in rep.exposed_s.items() if k != "bubble"}
    return Prediction(run, how, rep.iteration_s, rep.mfu, rep.hfu, rep.busy_s, rep.exposed_s.get("bubble", 0.0),
                      exposed, wall_s=time.perf_counter() - start)


def _predict_one(args: tuple) -> Prediction | ServingPrediction:
    run, cost, how = args
    if isinstance(run, PublishedServing):
        return predict_serving(run, cost)
    return predict(run, cost, how)


def predict_all(runs: Sequence[PublishedRun | PublishedServing], cost=None, how: str = "simulate",
                executor: Executor | None = None,
                progress: Callable[[Prediction | ServingPrediction], None] | None = None
                ) -> list[Prediction | ServingPrediction]:
    """Every run predicted, in order, on ``executor`` (one run per task) or here; serving runs
    by the serving simulation whatever ``how`` says (it has no closed form of an offline run)."""
    if cost is None:
        from marssim.cost import default_cost_model

        cost = default_cost_model()
    items = [(r, cost, how) for r in runs]
    outs = executor.map(_predict_one, items) if executor is not None else map(_predict_one, items)
    done = []
    for p in outs:
        done.append(p)
        if progress is not None:
            progress(p)
    return done


def format_predictions(predictions: Sequence[Prediction] | Sequence[ServingPrediction]) -> str:
    """One line per row: measured and predicted iteration (s), the error, MFU and HFU, and where a
    GPU's predicted time went (computing, bubble, the two groups with the most exposed
    communication), within 120 columns; then the mean and worst error. Serving rows:
    :func:`~.published_serving.format_serving`."""
    if predictions and all(isinstance(p, ServingPrediction) for p in predictions):
        return format_serving(predictions)
    w = min(37, max([22] + [len(p.run.name) + 1 for p in predictions]))  # the run's name, whole where it fits
    lines = [f"{'run':<{w}}{'measured s':>11}{'predicted':>11}{'error':>8}{'MFU':>7}{'HFU':>7}{'busy':>7}"
             f"{'bubble':>8}  exposed communication"]
    for p in predictions:
        name = p.run.name[:w - 1]
        if p.problem:
            lines.append(f"{name:<{w}}{p.run.measured_iteration_s:>11.3f}  not predicted: {p.problem}"[:120])
            continue
        it = p.iteration_s
        groups = sorted(((v, k.upper()) for k, v in p.exposed_s.items() if v > 0), reverse=True)[:2]
        exposed = " ".join(f"{g} {v / it:.1%}" for v, g in groups) or "-"
        lines.append(f"{name:<{w}}{p.run.measured_iteration_s:>11.3f}{it:>11.3f}{p.error:>+8.1%}"
                     f"{p.mfu:>7.1%}{p.hfu:>7.1%}{p.busy_s / it:>7.1%}{p.bubble_s / it:>8.1%}  {exposed}")
    lines.append(summary_line(predictions))
    lines.append("(busy, bubble, exposed communication: shares of the predicted iteration, per GPU)")
    return "\n".join(lines)


def write_predictions(predictions: Sequence[Prediction | ServingPrediction], path: str | Path) -> Path:
    """The predictions as CSV (atomically): one row per run (a serving run's columns are
    :func:`~.published_serving.serving_record`'s)."""
    import pandas as pd

    from marssim.fsutil import atomic_file

    rows = []
    for p in predictions:
        if isinstance(p, ServingPrediction):
            rows.append(serving_record(p))
            continue
        rows.append({"name": p.run.name, "system": p.run.system, "workload": p.run.workload,
                     "parallel": p.run.parallel, "source": p.run.source, "how": p.how,
                     "measured_iteration_s": p.run.measured_iteration_s, "predicted_iteration_s": p.iteration_s,
                     "error": p.error if not p.problem else math.nan, "mfu": p.mfu, "hfu": p.hfu, "busy_s": p.busy_s,
                     "bubble_s": p.bubble_s, **{f"exposed_{k}_s": v for k, v in sorted(p.exposed_s.items())},
                     "problem": p.problem, "wall_s": p.wall_s})
    with atomic_file(path) as handle:
        pd.DataFrame(rows).to_csv(handle, index=False)
    return Path(path)
