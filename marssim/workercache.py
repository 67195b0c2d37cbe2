"""A problem (graph, system, cost model, ...) shipped to worker processes once per process.

The caller pickles the problem once (:func:`pickled`) and sends its key and bytes with a task;
each process unpickles the bytes of a key on first use and keeps the result
(:func:`worker_copy`), so a task carries no work beyond its own items. A caller may send the key
alone once the workers have the problem: a process without it answers :data:`MISSING`, and the
caller sends that task again with the bytes.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable
from typing import Any

__all__ = ["pickled", "worker_copy", "Missing"]


class Missing:
    """What :func:`worker_copy` returns for a key sent without its bytes that this process does
    not hold (test with ``isinstance``: it comes back from a worker as a new instance)."""


def pickled(problem: object) -> tuple[str, bytes]:
    """``problem`` pickled, and the key (SHA-1 of the bytes) its worker copies are kept under."""
    blob = pickle.dumps(problem, protocol=pickle.HIGHEST_PROTOCOL)
    return hashlib.sha1(blob).hexdigest(), blob


def worker_copy(store: dict[str, Any], key: str, blob: bytes | None, build: Callable[[bytes], Any] = pickle.loads,
                keep: int = 1) -> Any:
    """The object of ``key`` in ``store`` (this process's copies), built from ``blob`` on first
    use; ``store`` is emptied first when it already holds ``keep`` objects. A :class:`Missing`
    when ``blob`` is None and ``store`` does not hold ``key``."""
    hit = store.get(key)
    if hit is None:
        if blob is None:
            return Missing()
        if len(store) >= keep:
            store.clear()
        hit = store[key] = build(blob)
    return hit
