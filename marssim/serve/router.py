"""Routers: which replica of a pool a request goes to.

``round_robin`` in turn; ``least_tokens`` the replica with the fewest outstanding tokens (prompt
tokens still to prefill and output tokens still to generate, of the requests it holds; vLLM's
production stack and Dynamo route by such load); ``least_requests`` the fewest unfinished
requests; ``random`` uniformly (seeded). Ties go to the lowest replica index.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Router"]


class Router:
    """Picks a replica from ``replicas`` (objects with ``outstanding`` and ``assigned``)."""

    def __init__(self, kind: str, replicas: list, seed: int = 0) -> None:
        if kind not in ("round_robin", "least_tokens", "least_requests", "random"):
            raise ValueError(f"unknown router {kind!r}")
        self.kind = kind
        self.replicas = replicas
        self._next = 0
        self._rng = np.random.default_rng(seed)

    def pick(self):
        reps = self.replicas
        if len(reps) == 1:
            return reps[0]
        kind = self.kind
        if kind == "round_robin":
            r = reps[self._next % len(reps)]
            self._next += 1
            return r
        if kind == "least_tokens":
            best = reps[0]
            for r in reps:
                if r.outstanding < best.outstanding:
                    best = r
            return best
        if kind == "least_requests":
            best = reps[0]
            for r in reps:
                if r.assigned < best.assigned:
                    best = r
            return best
        return reps[int(self._rng.integers(len(reps)))]
