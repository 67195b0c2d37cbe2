"""A paged KV cache (vLLM's block manager): the cache of a replica is ``total`` blocks of
``block_size`` tokens each; a sequence holds ``ceil(tokens / block_size)`` blocks for the tokens
whose keys and values are cached.

* a new sequence is admitted only when its prompt's blocks leave at least the *watermark*
  (a fraction of all blocks) free, so running sequences keep room to grow;
* a decode step that needs a new block takes it; when none is free the scheduler preempts
  sequences (:mod:`.schedulers`): *recompute* frees their blocks (their tokens are prefilled again
  later), *swap* copies them to host memory (``swap_total`` blocks) and back;
* with prefix caching, the full blocks of a shared prompt prefix stay cached after their last
  reader ends and are reused by later sequences of the same prefix (least recently used first
  out when blocks run short).

Every change is checked: blocks never go below zero or above the total (the invariant the tests
read back from ``peak``).
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["BlockManager"]


class BlockManager:
    """Blocks of one replica (or one virtual engine of a pipeline-parallel replica)."""

    __slots__ = ("total", "free", "block_size", "watermark", "peak", "swap_total", "swap_free", "_prefixes",
                 "_cached_free")

    def __init__(self, total: int, block_size: int, watermark: float = 0.01, swap_total: int = 0) -> None:
        if total < 1 or block_size < 1:
            raise ValueError("a KV cache needs at least one block of at least one token")
        self.total = int(total)
        self.free = int(total)
        self.block_size = int(block_size)
        self.watermark = int(watermark * total)
        self.peak = 0
        self.swap_total = int(swap_total)
        self.swap_free = int(swap_total)
        # prefix id -> [blocks, readers]; entries without readers are evictable, oldest first
        self._prefixes: dict[int, list[int]] = {}
        self._cached_free: OrderedDict[int, None] = OrderedDict()

    @property
    def used(self) -> int:
        """Blocks held by sequences or by cached prefixes."""
        return self.total - self.free

    def blocks(self, tokens: int) -> int:
        """Blocks that ``tokens`` cached tokens take."""
        return -(-tokens // self.block_size)

    def available(self, keep: int = -1) -> int:
        """Blocks a sequence could get now: free ones and cached prefixes nobody reads (but
        ``keep``, a prefix the sequence is about to read)."""
        return self.free + sum(self._prefixes[p][0] for p in self._cached_free if p != keep)

    def can_admit(self, n: int, keep: int = -1) -> bool:
        """Whether a new sequence may take ``n`` blocks (leaving the watermark free); ``keep``: the
        cached prefix it will read (not evictable for it)."""
        return self.free - n >= self.watermark or bool(self._cached_free) and \
            self.available(keep) - n >= self.watermark

    def can_take(self, n: int) -> bool:
        """Whether ``n`` blocks can be taken now (free, or freed by evicting unread prefixes)."""
        return self.free >= n or bool(self._cached_free) and self.available() >= n

    def cached(self, prefix: int) -> int:
        """Blocks of ``prefix`` in the cache (0: none), without reading them."""
        entry = self._prefixes.get(prefix)
        return entry[0] if entry is not None else 0

    def take(self, n: int) -> None:
        """Take ``n`` blocks (evicting unread cached prefixes when the free ones do not suffice)."""
        while self.free < n and self._cached_free:
            prefix, _ = self._cached_free.popitem(last=False)
            self.free += self._prefixes.pop(prefix)[0]
        if n > self.free:
            raise RuntimeError(f"KV cache: {n} blocks asked for, {self.free} free of {self.total}")
        self.free -= n
        used = self.total - self.free
        if used > self.peak:
            self.peak = used

    def give(self, n: int) -> None:
        """Return ``n`` blocks."""
        self.free += n
        if self.free > self.total:
            raise RuntimeError(f"KV cache: {self.free} blocks free of {self.total}")

    # ------------------------------------------------------------------ swap space
    def swap_out(self, n: int) -> bool:
        """Move ``n`` blocks to host memory; False when the swap space is full."""
        if n > self.swap_free:
            return False
        self.swap_free -= n
        self.give(n)
        return True

    def swap_in(self, n: int) -> None:
        self.take(n)
        self.swap_free += n
        if self.swap_free > self.swap_total:
            raise RuntimeError("KV cache: more blocks swapped in than out")

    # ------------------------------------------------------------------ prefix caching
    def prefix_hit(self, prefix: int) -> int:
        """Cached blocks of shared prefix ``prefix`` (0: not cached); a hit is read until
        :meth:`release_prefix`."""
        entry = self._prefixes.get(prefix)
        if entry is None:
            return 0
        entry[1] += 1
        self._cached_free.pop(prefix, None)
        return entry[0]

    def keep_prefix(self, prefix: int, blocks: int) -> bool:
        """A sequence's first ``blocks`` blocks become the cached copy of ``prefix`` (the
        sequence keeps reading them); False when another copy is already cached."""
        if prefix in self._prefixes or blocks < 1:
            return False
        self._prefixes[prefix] = [blocks, 1]
        return True

    def release_prefix(self, prefix: int) -> None:
        """A reader of ``prefix`` is done; with no readers left the prefix stays cached but
        evictable."""
        entry = self._prefixes[prefix]
        entry[1] -= 1
        if entry[1] == 0:
            self._cached_free[prefix] = None
