"""A request in flight: what of its prompt is cached, what it has generated, the blocks it holds.

Counting convention (vLLM's): a prefill of ``target`` tokens (the prompt, or after a preemption by
recompute the prompt and every token generated so far) caches their keys and values and samples
one token; a decode step feeds the last sampled token, caches its key and value (its attention
reads ``computed + 1`` tokens) and samples the next. A request is done when it has generated
``output`` tokens, the first from its prefill.
"""

from __future__ import annotations

__all__ = ["Seq"]


class Seq:
    """One request's state in the engines (times in seconds, counts in tokens or blocks)."""

    __slots__ = ("id", "arrival", "prompt", "output", "prefix", "prefix_tokens", "computed", "target", "generated",
                 "blocks", "prefix_blocks", "first_token", "last_token", "scheduled", "preemptions", "swapped",
                 "done", "replica", "ve", "kept_prefix")

    def __init__(self, rid: int, arrival: float, prompt: int, output: int, prefix: int = -1,
                 prefix_tokens: int = 0) -> None:
        self.id = rid
        self.arrival = arrival
        self.prompt = prompt
        self.output = output
        self.prefix = prefix
        self.prefix_tokens = prefix_tokens
        self.computed = 0  # tokens whose keys and values are cached
        self.target = prompt  # tokens the current prefill must cache
        self.generated = 0
        self.blocks = 0  # blocks this sequence holds alone
        self.prefix_blocks = 0  # blocks of a cached shared prefix it reads
        self.first_token = -1.0
        self.last_token = -1.0
        self.scheduled = -1.0
        self.preemptions = 0
        self.swapped = False
        self.done = False
        self.replica = -1
        self.ve = None
        self.kept_prefix = False

    @property
    def outstanding(self) -> int:
        """Tokens still to process: prefill tokens and output tokens to generate."""
        return (self.target - self.computed if self.computed < self.target else 0) + self.output - self.generated

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (f"Seq({self.id}, prompt={self.prompt}, output={self.output}, computed={self.computed}, "
                f"target={self.target}, generated={self.generated}, blocks={self.blocks})")
