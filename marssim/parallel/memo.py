"""Bounded memos that threads may share: the derived values many configurations of one workload
(or one system) reuse -- op rules, prepared graphs, shard timings, rank layouts.

* :class:`BoundedCache`: at most ``size`` values, the least recently used dropped first, every
  write under one lock (a read is one step of the ordered dictionary under the interpreter's
  lock, see :meth:`BoundedCache.get`). A value is made outside the lock (making it may read other
  memos); two threads that miss the same key at once both make it and the first stored is kept
  and returned to both, so every caller sees one value per key.
* :class:`OwnerMemo`: per live owner object (a graph, a system; held weakly, so its memo goes
  with it), one :class:`BoundedCache` per kind of key (a key's kind: its first element when it is
  a tuple, else the key itself), each bounded by its kind's size.

The memoised values are pure functions of their keys: dropping one only costs making it again.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GRAPH_MEMO", "BoundedCache", "OwnerMemo", "graph_cached"]

_MISSING = object()


@dataclass(eq=False)
class BoundedCache:
    """A least-recently-used memo of at most ``size`` values, safe to share between threads."""

    size: int
    _data: OrderedDict = field(default_factory=OrderedDict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"a BoundedCache holds at least one value, not {self.size}")

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._data

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value of ``key`` (now the most recently used), or ``default``. Without the lock: a
        read and a move of the ordered dictionary are each one step under the interpreter's lock
        (a value dropped by another thread between them is simply not moved)."""
        data = self._data
        hit = data.get(key, _MISSING)
        if hit is _MISSING:
            return default
        try:
            data.move_to_end(key)
        except KeyError:  # dropped meanwhile by a thread storing another value
            pass
        return hit

    def put(self, key: Hashable, value: Any) -> Any:
        """Store ``value`` under ``key`` (replacing any), dropping the least recently used values
        past ``size``; returns ``value``."""
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)
        return value

    def get_or_make(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """The value of ``key``, made by ``make()`` (outside the lock) on a miss; when another
        thread stored one meanwhile, that one."""
        hit = self.get(key, _MISSING)
        if hit is not _MISSING:
            return hit
        value = make()
        with self._lock:
            hit = self._data.get(key, _MISSING)
            if hit is not _MISSING:
                self._data.move_to_end(key)
                return hit
            self._data[key] = value
            while len(self._data) > self.size:
                self._data.popitem(last=False)
        return value

    def keys(self) -> list:
        """The keys, least recently used first (a copy)."""
        with self._lock:
            return list(self._data)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


def kind_of(key: Hashable) -> Hashable:
    """The kind of a memo key: its first element when it is a non-empty tuple, else the key."""
    return key[0] if isinstance(key, tuple) and key else key


@dataclass(eq=False)
class OwnerMemo:
    """Per live owner object (held weakly), a :class:`BoundedCache` per kind of key: ``sizes``
    bounds the kinds it names, ``default_size`` every other kind."""

    default_size: int
    sizes: Mapping[Hashable, int] = field(default_factory=dict)
    _owners: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def cache(self, owner: object, kind: Hashable) -> BoundedCache:
        """The cache of ``kind`` kept with ``owner`` (made on first use)."""
        with self._lock:
            kinds = self._owners.get(owner)
            if kinds is None:
                kinds = self._owners[owner] = {}
            hit = kinds.get(kind)
            if hit is None:
                hit = kinds[kind] = BoundedCache(self.sizes.get(kind, self.default_size))
            return hit

    def get_or_make(self, owner: object, key: Hashable, make: Callable[[], Any]) -> Any:
        """The value of ``key`` kept with ``owner``, made by ``make()`` on first use."""
        return self.cache(owner, kind_of(key)).get_or_make(key, make)


GRAPH_MEMO = OwnerMemo(default_size=16, sizes={
    # per layer layout (cheap to make again): a search's thousands of configurations hold a bounded set
    "rules": 8, "layouts": 8, "units": 8, "rank_parameters": 8, "low_precision_parameters": 8, "saved_per_layer": 8,
    "rank_weight_bytes": 8, "unit blocks": 8, "zero3 plans": 8, "zero3 live bytes": 8,
    "prepared": 32, "prepared from": 1,  # a graph rebuilt per micro-batch size, recomputation and context-parallel degree
    "shards": 8,  # shard timings, per cost model
})
"""The values derived from a workload graph that many configurations of it share (rules,
prepared graphs, shard timings), kept with the graph while it lives."""


def graph_cached(graph: object, key: Hashable, make: Callable[[], Any]) -> Any:
    """The value of ``key`` kept with ``graph`` in :data:`GRAPH_MEMO`, made by ``make()`` on first
    use. Read it, do not change it (other configurations share it)."""
    return GRAPH_MEMO.get_or_make(graph, key, make)
