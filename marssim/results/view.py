"""What a person is shown of a folded run: one row per GPU class (or per pipeline stage when the
classes are many), or the GPUs asked for.

A folded run simulates one GPU per class of identical GPUs (``meta["fold"]``: each GPU's
representative); its interval log holds the representatives' kernels only. :func:`shown_devices`
picks the rows a timeline should have, and :func:`folded_view` makes the Result the traces and
figures draw: those devices' compute intervals (a GPU a representative stood for gets a copy of
its representative's), every transfer, and a ``label`` column naming each row's stage and how
many GPUs it stands for.
"""

from __future__ import annotations

from dataclasses import replace

from marssim.lazymodule import lazy_module

from .result import Result

pd = lazy_module("pandas")  # imported when a table is first built

__all__ = ["MAX_ROWS", "shown_devices", "folded_view"]

MAX_ROWS = 32
"""The most device rows a default timeline of a folded run shows (it then fits a screen)."""


def _classes(result: Result) -> dict[str, list[str]]:
    """Each representative's GPUs, in the devices table's order."""
    fold = result.meta.get("fold") or {}
    out: dict[str, list[str]] = {}
    for gpu in result.devices.index:
        gpu = str(gpu)
        if gpu in fold:
            out.setdefault(fold[gpu], []).append(gpu)
    return out


def shown_devices(result: Result, max_rows: int = MAX_ROWS) -> list[str]:
    """The devices a timeline of ``result`` shows by default: every device of an unfolded run;
    of a folded run one representative per class, or when there are more than ``max_rows``
    classes, per pipeline stage the representative of its largest class."""
    classes = _classes(result)
    if not classes:
        return [str(d) for d in result.devices.index]
    reps = list(classes)
    if len(reps) <= max_rows:
        return reps
    stage_of = result.meta.get("stage_of") or {}
    best: dict[int, str] = {}
    for rep in reps:
        s = stage_of.get(rep, 0)
        if s not in best or len(classes[rep]) > len(classes[best[s]]):
            best[s] = rep
    return [best[s] for s in sorted(best)]


def _label(result: Result, device: str, classes: dict[str, list[str]], per_stage: bool) -> str:
    stage = (result.meta.get("stage_of") or {}).get(device)
    fold = result.meta.get("fold") or {}
    rep = fold.get(device, device)
    parts = [] if stage is None else [f"stage {stage}"]
    if device == rep and rep in classes:
        n = len(classes[rep])
        if per_stage:
            in_stage = sum(len(m) for r, m in classes.items() if (result.meta.get("stage_of") or {}).get(r) == stage)
            parts.append(f"x{n} of {in_stage} GPUs")
        elif n > 1:
            parts.append(f"x{n} GPUs")
    elif device != rep:
        parts.append(f"as {rep}")
    return ", ".join(parts)


def folded_view(result: Result, devices: list[str] | None = None, max_rows: int = MAX_ROWS) -> Result:
    """``result`` as traces and figures draw it: the rows of ``devices`` (default
    :func:`shown_devices`), each GPU's compute intervals (a copy of its representative's for a GPU
    a folded run stood for), every transfer, and a ``label`` column in the devices table. An
    unfolded result with ``devices`` None is returned as it is."""
    classes = _classes(result)
    if not classes and devices is None:
        return result
    fold = result.meta.get("fold") or {}
    chosen = devices if devices is not None else shown_devices(result, max_rows)
    per_stage = devices is None and len(classes) > max_rows
    iv = result.intervals
    compute = iv["kind"] == "compute"
    # a transfer's end on a GPU not shown is drawn on the row that stands for it: its class's
    # representative, or the row of its pipeline stage
    stage_of = result.meta.get("stage_of") or {}
    row_of_stage = {stage_of.get(d): d for d in reversed(chosen)}
    display = {}
    for gpu, rep in fold.items():
        if gpu not in chosen:
            display[gpu] = rep if rep in chosen else row_of_stage.get(stage_of.get(gpu), gpu)
    transfers = iv[~compute]
    if display and len(transfers):
        src = transfers["src"].map(lambda x: display.get(x, x))
        dst = transfers["dst"].map(lambda x: display.get(x, x))
        transfers = transfers.assign(src=src, dst=dst, resource=src + "->" + dst)
    parts = [transfers]
    for dev in chosen:
        rep = fold.get(dev, dev)
        rows = iv[compute & (iv["resource"] == rep)]
        if rep != dev:
            rows = rows.assign(resource=dev)
        parts.append(rows)
    merged = pd.concat(parts, ignore_index=True).sort_values(["start", "kind", "task"], kind="stable")
    table = result.devices.loc[[d for d in chosen if d in result.devices.index]].copy()
    table["label"] = [_label(result, str(d), classes, per_stage) for d in table.index]
    memories = result.memories
    reps_shown = {fold.get(d, d) for d in chosen}
    mem_keep = [n for n in memories.index if str(n) in reps_shown or str(n) not in fold]
    timeline = result.memory_timeline
    if len(timeline):
        timeline = timeline[timeline["node"].astype(str).isin(set(map(str, mem_keep)))]
    return replace(result, intervals=merged.reset_index(drop=True), devices=table, memories=memories.loc[mem_keep],
                   memory_timeline=timeline)
