"""The engine schedulers: which sequences an iteration runs, with how many tokens each.

One :class:`Scheduler` per engine (per virtual engine of a pipeline-parallel replica, as vLLM
runs ``pp`` of them), over its :class:`~.kvcache.BlockManager`. Queues: ``waiting`` (arrived or
preempted by recompute, first come first served), ``running`` (admitted, in admission order),
``swapped`` (preempted to host memory), ``incoming`` (a decode pool's requests whose KV cache has
arrived). Policies (``SchedulerConfig.kind``):

``static``
    When the previous batch is done, up to ``max_num_seqs`` waiting requests form a batch, each
    reserving the blocks of its prompt and output; one iteration prefills them all, then decode
    iterations run until the batch's last request ends (finished requests leave the iterations,
    new ones wait for the next batch).
``continuous``
    vLLM's default scheduler: if nothing is swapped out, waiting prompts are admitted in order
    while the token budget (``max_batched_tokens``), the sequence cap (``max_num_seqs``, running
    ones included) and the blocks (leaving the watermark) allow, and prefilled in an iteration of
    their own; otherwise every running sequence decodes one token, taking a new block when its
    context crosses one, preempting the latest admitted sequences when blocks run out (by
    recompute or swap), and swapped sequences come back when nothing was preempted. With
    ``mixed`` the admitted prompts join the decodes in one iteration (Orca). With
    ``scheduler_steps`` above 1 (vLLM's multi-step scheduling) a decode-only iteration opens a
    block of that many decode iterations of the running sequences: prompts that arrive meanwhile
    wait for its end (a block ends early when its sequences are done).
``chunked``
    Sarathi-Serve's stall-free batching (vLLM's chunked prefill): every iteration first the running
    decodes, then the chunks of prompts already started, then new prompts, each chunk as large as
    the remaining token budget allows.

Capacity policy (``SchedulerConfig.capacity``, TensorRT-LLM's ``CapacitySchedulerPolicy``):
``max_utilization`` (the default, vLLM's and SGLang's way) admits a prompt when its own blocks
are free and preempts when decodes run out of blocks; ``guaranteed_no_evict`` (TensorRT-LLM's
default) admits a request only when the blocks of its prompt and whole output fit beside the
whole prompts and outputs of the running requests, so no decode ever preempts. The request's
output length stands for its ``max_tokens`` (what a benchmark sets).

With speculative decoding (:mod:`.speculative`) a decoding sequence takes the blocks of its next
token and the ``spec_k`` proposed after it (they are verified together), counts ``spec_k + 1``
tokens against the token budget, and after the step keeps the blocks of the tokens accepted.

A scheduler with role ``prefill`` hands a request over when its prefill is done (it keeps the
blocks until its KV cache has left); one with role ``decode`` takes requests from ``incoming``
(and prefills locally only what it preempted by recompute).
"""

from __future__ import annotations

from collections import deque

from .deployment import SchedulerConfig
from .kvcache import BlockManager
from .sequence import Seq

__all__ = ["Scheduler", "Work"]


class Work:
    """An iteration: prefill chunks ``(seq, tokens)``, decoding sequences, and the blocks swapped
    out and in before it runs (in all, and per request: ``(request id, blocks)``)."""

    __slots__ = ("prefills", "decodes", "swap_out", "swap_in", "swapped_out", "swapped_in")

    def __init__(self) -> None:
        self.prefills: list[tuple[Seq, int]] = []
        self.decodes: list[Seq] = []
        self.swap_out = 0
        self.swap_in = 0
        self.swapped_out: list[tuple[int, int]] = []
        self.swapped_in: list[tuple[int, int]] = []

    def __bool__(self) -> bool:
        return bool(self.prefills or self.decodes or self.swap_out)


class Scheduler:
    """The scheduler of one engine (see the module docstring). ``sink`` receives the events of
    its requests (tokens, preemptions, handoffs, completions)."""

    def __init__(self, cfg: SchedulerConfig, blocks: BlockManager, role: str, sink, accept=None) -> None:
        """``accept(n)``: the accepted proposals of ``n`` sequences' speculative steps (an
        array; :func:`~.speculative.draw_accepted`), needed when ``cfg`` decodes speculatively."""
        self.cfg = cfg
        self.lookahead = cfg.lookahead
        self.accept = accept
        self.bm = blocks
        self.role = role
        self.sink = sink
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.swapped: deque[Seq] = deque()
        self.incoming: deque[Seq] = deque()
        self.caching = cfg.prefix_caching
        self.guaranteed = cfg.capacity == "guaranteed_no_evict" and cfg.kind != "static"  # static reserves anyway
        self._block_left = 0  # multi-step scheduling: decode steps left in the block under way
        self._final = 0  # guaranteed_no_evict: blocks the running requests hold once their outputs are done
        self._kind = {"static": self._static, "continuous": self._continuous, "chunked": self._chunked}[cfg.kind]

    @property
    def unfinished(self) -> int:
        """Requests here that are not done (waiting, running, swapped or arriving)."""
        return len(self.waiting) + len(self.running) + len(self.swapped) + len(self.incoming)

    def final_blocks(self, s: Seq) -> int:
        """Blocks ``s`` holds here once its output is done (its prompt alone in a prefill pool)."""
        return self.bm.blocks(s.prompt + (s.output if self.role != "prefill" else 0))

    def reserve_tokens(self, seq: Seq) -> int:
        """Tokens whose blocks a request arriving with its KV cache needs here."""
        return seq.prompt + seq.output if self.cfg.kind == "static" else seq.computed

    # ------------------------------------------------------------------ policies
    def schedule(self, now: float) -> Work | None:
        """The next iteration, or None when there is nothing to run."""
        work = self._kind(now)
        return work if work else None

    def _static(self, now: float) -> Work:
        work = Work()
        cap = self.cfg.max_num_seqs
        if self.running:
            self._decodes(work)  # blocks were reserved for the whole output: no preemption
            return work
        while self.incoming and len(self.running) < cap:
            self.running.append(self.incoming.popleft())
        if self.running:
            self._decodes(work)
            return work
        bm = self.bm
        while self.waiting and len(self.running) < cap:
            s = self.waiting[0]
            need = self.final_blocks(s)
            if not bm.can_take(need):
                break
            self.waiting.popleft()
            bm.take(need)
            s.blocks = need
            s.computed = 0
            self._started(s, now)
            self.running.append(s)
            work.prefills.append((s, s.target))
        return work

    def _continuous(self, now: float) -> Work:
        work = Work()
        self._take_incoming()
        if self.cfg.mixed:
            preempted = self._decodes(work)
            if not preempted:
                self._swap_in(work)
            if not self.swapped:
                self._admit(work, self.cfg.max_batched_tokens - len(work.decodes) * (1 + self.lookahead), now,
                            whole=True)
            return work
        if self._block_left > 0:  # multi-step: the block's next decode step, nothing admitted before its end
            self._block_left -= 1
            self._decodes(work)
            if work.decodes:
                return work
            self._block_left = 0  # every sequence of the block is done: it ends here
        if not self.swapped:
            self._admit(work, self.cfg.max_batched_tokens, now, whole=True)
        if not work.prefills:
            preempted = self._decodes(work)
            if not preempted:
                self._swap_in(work)
            if work.decodes:
                self._block_left = self.cfg.scheduler_steps - 1
        return work

    def _chunked(self, now: float) -> Work:
        work = Work()
        self._take_incoming()
        preempted = self._decodes(work)
        budget = self.cfg.max_batched_tokens - len(work.decodes) * (1 + self.lookahead)
        for s in self.running:
            if budget <= 0:
                break
            if s.computed < s.target:
                q = min(s.target - s.computed, budget)
                work.prefills.append((s, q))
                budget -= q
        if not preempted:
            budget -= self._swap_in(work)
        if not self.swapped and budget > 0:
            self._admit(work, budget, now, whole=False)
        return work

    # ------------------------------------------------------------------ pieces
    def _take_incoming(self) -> None:
        cap = self.cfg.max_num_seqs
        while self.incoming and len(self.running) < cap:
            s = self.incoming.popleft()
            if self.guaranteed:
                self._final += self.final_blocks(s)
            self.running.append(s)

    def _started(self, s: Seq, now: float) -> None:
        if s.scheduled < 0:
            s.scheduled = now
            self.sink.started(s, now)

    def _admit(self, work: Work, budget: int, now: float, whole: bool) -> None:
        """Admit waiting prompts in order while the budget, the sequence cap and the blocks allow
        (``whole``: a prompt only whole, else a chunk of what the budget leaves)."""
        bm = self.bm
        cap = self.cfg.max_num_seqs
        bs = bm.block_size
        while self.waiting and len(self.running) < cap and budget > 0:
            s = self.waiting[0]
            hit = bm.cached(s.prefix) if self.caching and s.prefix >= 0 else 0
            skip = min(hit * bs, s.target - 1)
            q = s.target - skip
            if whole and q > budget and (work.prefills or q <= self.cfg.max_batched_tokens):
                break  # a prompt larger than the whole budget (only a recomputation) goes alone
            need = bm.blocks(s.target) - hit
            if not bm.can_admit(need, s.prefix if hit else -1):
                break
            if self.guaranteed:
                final = self.final_blocks(s)
                if self._final + final > bm.total - bm.watermark and self.running:
                    break
                self._final += final
            self.waiting.popleft()
            if hit:
                s.prefix_blocks = bm.prefix_hit(s.prefix)
            s.computed = skip
            bm.take(need)
            s.blocks = need
            if skip:
                self.sink.progress(s, skip)
            self._started(s, now)
            self.running.append(s)
            if not whole:
                q = min(q, budget)
            work.prefills.append((s, q))
            budget -= q

    def _decodes(self, work: Work) -> bool:
        """Every running sequence past its prefill decodes one token, taking a new block when it
        needs one; when none is free the latest admitted sequences are preempted (the sequence
        itself last). Returns whether anything was preempted."""
        bm = self.bm
        running = self.running
        out = work.decodes
        preempted = False
        i = 0
        while i < len(running):
            s = running[i]
            if s.computed < s.target:
                i += 1
                continue
            need = bm.blocks(s.computed + 1 + self.lookahead) - s.blocks - s.prefix_blocks
            if need > 0:
                while not bm.can_take(need):
                    victim = running[-1]
                    self._preempt(victim, work)
                    preempted = True
                    if victim is s:
                        break
                if s.swapped or s.computed < s.target:  # the sequence itself went
                    break
                bm.take(need)
                s.blocks += need
            out.append(s)
            i += 1
        return preempted

    def _preempt(self, s: Seq, work: Work) -> None:
        """Take ``s`` (the last running sequence) out: to host memory with ``swap`` (when it is
        decoding, reads no cached prefix and the swap space has room), else by recompute."""
        self.running.pop()
        if self.guaranteed:
            self._final -= self.final_blocks(s)
        s.preemptions += 1
        self.sink.preempted(s)
        bm = self.bm
        if self.cfg.preemption == "swap" and s.computed >= s.target and not s.prefix_blocks and \
                bm.swap_out(s.blocks):
            work.swap_out += s.blocks
            work.swapped_out.append((s.id, s.blocks))
            s.swapped = True
            self.swapped.append(s)
            return
        before = s.outstanding
        bm.give(s.blocks)
        s.blocks = 0
        if s.prefix_blocks:
            bm.release_prefix(s.prefix)
            s.prefix_blocks = 0
        s.computed = 0
        s.target = s.prompt + s.generated
        self.sink.rework(s, s.outstanding - before)
        self.waiting.appendleft(s)

    def _swap_in(self, work: Work) -> int:
        """Bring swapped sequences back (oldest first) while the blocks (leaving the watermark)
        and the sequence cap allow; they decode in this iteration. Returns how many came back."""
        bm = self.bm
        cap = self.cfg.max_num_seqs
        n = 0
        while self.swapped and len(self.running) < cap:
            s = self.swapped[0]
            grow = bm.blocks(s.computed + 1 + self.lookahead) - s.blocks
            if not bm.can_admit(s.blocks + max(grow, 0)):
                break
            self.swapped.popleft()
            bm.swap_in(s.blocks)
            work.swap_in += s.blocks
            work.swapped_in.append((s.id, s.blocks))
            if grow > 0:
                bm.take(grow)
                s.blocks += grow
            s.swapped = False
            self.running.append(s)
            work.decodes.append(s)
            n += 1
        return n

    # ------------------------------------------------------------------ after the iteration
    def complete(self, work: Work, now: float) -> None:
        """Account an iteration that ended at ``now``: cached tokens, sampled tokens, requests
        done or handed over."""
        sink = self.sink
        gone = False
        for s, q in work.prefills:
            s.computed += q
            sink.progress(s, q)
            if s.computed >= s.target:
                self._token(s, now)
                if self.caching and s.prefix >= 0 and not s.prefix_blocks:
                    keep = min(s.prefix_tokens // self.bm.block_size, s.blocks)
                    if keep and self.bm.keep_prefix(s.prefix, keep):
                        s.blocks -= keep
                        s.prefix_blocks = keep
                if s.generated >= s.output:
                    self._finish(s, now)
                    gone = True
                elif self.role == "prefill":
                    s.ve = None
                    if self.guaranteed:
                        self._final -= self.final_blocks(s)
                    sink.handoff(s, now, self)
                    gone = True
        if self.lookahead and work.decodes:
            gone = self._speculated(work.decodes, now) or gone
        else:
            for s in work.decodes:
                s.computed += 1
                self._token(s, now)
                if s.generated >= s.output:
                    self._finish(s, now)
                    gone = True
        if gone:
            self.running = [s for s in self.running if s.ve is self and not s.done]

    def _speculated(self, decodes: list[Seq], now: float) -> bool:
        """The speculative steps of ``decodes`` ended at ``now``: each sequence emits its accepted
        proposals and one token more (at most what it still has to generate), caches them, and
        gives back the blocks of the rejected slots. Returns whether a request finished."""
        accepted = self.accept(len(decodes))
        bm = self.bm
        gone = False
        emitted_total = 0
        for s, a in zip(decodes, accepted):
            n = min(int(a) + 1, s.output - s.generated)
            emitted_total += n
            s.computed += n
            gap = (now - s.last_token) / n
            for _ in range(n):
                s.generated += 1
                self.sink.gap(s, gap)
            s.last_token = now
            if s.generated >= s.output:
                self._finish(s, now)
                gone = True
                continue
            extra = s.blocks + s.prefix_blocks - bm.blocks(s.computed)
            if extra > 0:
                bm.give(extra)
                s.blocks -= extra
        self.sink.speculated(len(decodes), len(decodes) * self.lookahead, int(accepted.sum()), emitted_total)
        return gone

    def _token(self, s: Seq, now: float) -> None:
        s.generated += 1
        if s.first_token < 0:
            s.first_token = now
            self.sink.first_token(s, now)
        else:
            self.sink.gap(s, now - s.last_token)
        s.last_token = now

    def _finish(self, s: Seq, now: float) -> None:
        s.done = True
        if self.guaranteed:
            self._final -= self.final_blocks(s)
        self.release(s)
        self.sink.finished(s, now)

    def release(self, s: Seq) -> None:
        """Free the blocks ``s`` holds here (done, or its KV cache has left for a decode pool)."""
        self.bm.give(s.blocks)
        s.blocks = 0
        if s.prefix_blocks:
            self.bm.release_prefix(s.prefix)
            s.prefix_blocks = 0
