"""Blocks of transfers that a lowering adds many times: worked out once, added in bulk.

A collective schedule on a set of devices, or the point-to-point flows of one re-distribution,
gives the same transfers (nodes, bytes, routes, and their order of dependence among themselves)
every time it is lowered; only the task ids it starts from and the tasks it waits for differ.
A :class:`TransferBlock` holds the fixed part, with dependences inside the block as offsets
from its first task, so emitting it is a few list extensions instead of a Python call per
transfer (:meth:`marssim.taskgraph.TaskGraphBuilder.transfers`). The tasks added are exactly
those that one-by-one :meth:`~marssim.taskgraph.TaskGraphBuilder.transfer` calls add.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from marssim.system import System
from marssim.taskgraph import TaskGraphBuilder

__all__ = ["TransferBlock", "collective_block", "flow_block", "emit_collective", "emit_flows", "unique"]


@dataclass(frozen=True, slots=True)
class TransferBlock:
    """Transfers added together, in order. Per transfer: ``rank`` (the sending rank of a
    collective, or the index of the sending holder of a re-distribution), ``src``/``dst`` (node
    indices), ``nbytes`` (bytes, > 0), ``pair_of`` (index into ``pairs``, the distinct
    ``(src, dst)`` node names in first-use order) and ``inner`` (offsets from the block's first
    task of the transfers of the block it waits for). ``ready``: per rank, offsets of the
    transfers after which the rank's result is ready (collectives only)."""

    rank: tuple[int, ...]
    src: tuple[int, ...]
    dst: tuple[int, ...]
    nbytes: tuple[float, ...]
    pairs: tuple[tuple[str, str], ...]
    pair_of: tuple[int, ...]
    inner: tuple[tuple[int, ...], ...]
    ready: tuple[tuple[int, ...], ...] = ()

    def __len__(self) -> int:
        return len(self.rank)


def _pairs(names: Sequence[tuple[str, str]]) -> tuple[tuple[tuple[str, str], ...], tuple[int, ...]]:
    """Distinct pairs in first-use order, and the index of each entry's pair among them."""
    index: dict[tuple[str, str], int] = {}
    of = tuple(index.setdefault(p, len(index)) for p in names)
    return tuple(index), of


def collective_block(system: System, devices: Sequence[str], steps, gather: bool) -> TransferBlock:
    """The transfers of collective schedule ``steps`` (flows ``(src rank, dst rank, bytes)``
    per step; see :mod:`marssim.collectives.schedules`) on ``devices``, as
    :func:`marssim.lower.expand_collective` adds them: rank ``i``'s send of step ``k`` waits for
    the rank's initial data, its receives of step ``k-1`` and its sends of step ``k-1``;
    zero-byte flows are skipped. ``gather``: a rank's result is every piece it received and
    sent last (all-gather, all-reduce), else its last receives (reduce-scatter)."""
    n = len(devices)
    node = system.node_index
    rank, inner, nbytes, names = [], [], [], []
    last_recv: list[list[int]] = [[] for _ in range(n)]
    last_send: list[list[int]] = [[] for _ in range(n)]
    for step in steps:
        recv: list[list[int]] = [[] for _ in range(n)]
        send: list[list[int]] = [[] for _ in range(n)]
        for src, dst, size in step:
            if size <= 0:
                continue
            if devices[src] == devices[dst]:
                raise ValueError(f"transfer from {devices[src]} to itself")
            t = len(rank)
            rank.append(src)
            inner.append((*last_recv[src], *last_send[src]))
            nbytes.append(float(size))
            names.append((devices[src], devices[dst]))
            recv[dst].append(t)
            send[src].append(t)
        for i in range(n):
            if recv[i]:
                last_recv[i] = recv[i]
            if send[i]:
                last_send[i] = send[i]
    ready = tuple((*last_recv[i], *last_send[i]) if gather else tuple(last_recv[i]) for i in range(n))
    pairs, pair_of = _pairs(names)
    return TransferBlock(tuple(rank), tuple(node[a] for a, _ in names), tuple(node[b] for _, b in names),
                         tuple(nbytes), pairs, pair_of, tuple(inner), ready)


def flow_block(system: System, holder_devices: Sequence[str], flows: Sequence[tuple[int, str, float]]) -> TransferBlock:
    """Point-to-point flows ``(holder index, destination node, bytes > 0)``, each waiting only
    for its holder's data."""
    node = system.node_index
    names = [(holder_devices[hi], dst) for hi, dst, _ in flows]
    pairs, pair_of = _pairs(names)
    return TransferBlock(tuple(hi for hi, _, _ in flows), tuple(node[a] for a, _ in names),
                         tuple(node[b] for _, b in names), tuple(float(b) for _, _, b in flows), pairs, pair_of,
                         ((),) * len(flows))


def emit_collective(builder: TaskGraphBuilder, block: TransferBlock, initial: Sequence[Sequence[int]],
                    collective: int, op: str, micro_batch: int) -> list[tuple[int, ...]]:
    """Add ``block`` (from :func:`collective_block`) where rank ``i`` starts after the tasks
    ``initial[i]``; returns per rank the tasks after which its result is ready."""
    first = len(builder)
    init = [unique(ts) for ts in initial]
    preds = [init[r] + tuple([first + k for k in rel]) if rel else init[r] for r, rel in zip(block.rank, block.inner)]
    if preds:
        builder.transfers(block.pairs, block.pair_of, block.src, block.dst, block.nbytes, preds,
                          collective=collective, op=op, micro_batch=micro_batch)
    return [init[i] + tuple([first + k for k in rel]) if rel else init[i] for i, rel in enumerate(block.ready)]


def emit_flows(builder: TaskGraphBuilder, block: TransferBlock, holder_ready: Sequence[Sequence[int]],
               collective: int, op: str, micro_batch: int) -> int:
    """Add ``block`` (from :func:`flow_block`), each flow waiting for ``holder_ready`` of its
    holder (not de-duplicated, as given); returns the first task's id."""
    return builder.transfers(block.pairs, block.pair_of, block.src, block.dst, block.nbytes,
                             [holder_ready[hi] for hi in block.rank], collective=collective, op=op,
                             micro_batch=micro_batch)


def unique(items: Sequence[int]) -> tuple[int, ...]:
    """Items in first-seen order without repeats."""
    if len(items) < 2:
        return tuple(items)
    return tuple(dict.fromkeys(items))
