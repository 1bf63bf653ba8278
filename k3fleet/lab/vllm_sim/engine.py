"""The simulated engine: continuous batching in timed steps over a paged, prefix-cached KV cache.

One asyncio task runs engine steps, as vLLM's engine core does:

1. take the requests that arrived since the last step into the queue (vLLM's engine core reads its
   input queue between steps), then admit waiting requests (first come, first served) while fewer
   than ``max_num_seqs`` run and the KV cache can hold the prompt; a request that does not fit waits
   at the head of the queue;
2. spend the step's token budget (``max_num_batched_tokens``): one token for each decoding
   sequence, the rest on prompt chunks (chunked prefill) of sequences still prefilling;
3. a decoding sequence that needs a new block when none is free preempts the most recently admitted
   sequence (recompute: its blocks are freed and it goes back to the head of the queue); the
   preemption counter rises with that sequence's next output, not at the preemption;
4. the step takes ``itl_ms`` plus ``prefill_ms_per_token`` for each prompt token computed, so cache
   hits shorten time to first token and long prompts slow every stream in the batch;
5. every sequence that finished its prompt emits one token at the end of the step;
6. ``/metrics`` reports the queue as the step left it (``reported_running``, ``reported_waiting``),
   as vLLM's scheduler counts it for its Prometheus logger (``make_stats`` on each step's outputs):
   a request that arrives during a step is not in the queue yet and is admitted by the next
   schedule before any count sees it, so it never reads as waiting while a sequence slot and its
   blocks are free; only a request a schedule left waiting (``max_num_seqs`` reached, the KV cache
   full, or preempted) does.

Above ``crash_above_kv`` usage the engine dies like an out-of-memory engine core: every request
fails, ``/health`` fails, and (with ``restart_after_s``) it comes back empty after that long.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
from collections import deque
from dataclasses import dataclass, field

from k3fleet.lab.vllm_sim.config import SimConfig
from k3fleet.lab.vllm_sim.generate import Plan, change_answer
from k3fleet.lab.vllm_sim.kv_cache import Hist, Holding, KVCache

# Bucket bounds after vLLM's Prometheus loggers (docs/acceptance-load.md, "Metric names").
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)


class QueueFull(RuntimeError):
    """A request past the queue cap: vLLM answers 503 and counts an admission rejection."""


class EngineDead(RuntimeError):
    """The engine core died (KV pressure above the crash threshold)."""


@dataclass
class Stats:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    prompt_tokens_cached: int = 0
    prompt_tokens_computed: int = 0
    success: dict[str, int] = field(default_factory=dict)
    admission_rejections: dict[str, int] = field(default_factory=dict)
    corrupted_requests: int = 0
    ttft: Hist = field(default_factory=lambda: Hist(TTFT_BUCKETS))
    itl: Hist = field(default_factory=lambda: Hist(ITL_BUCKETS))
    e2e: Hist = field(default_factory=lambda: Hist(REQUEST_BUCKETS))
    queue: Hist = field(default_factory=lambda: Hist(REQUEST_BUCKETS))
    prefill: Hist = field(default_factory=lambda: Hist(REQUEST_BUCKETS))


_ids = itertools.count(1)


class SimRequest:
    """One request's life in the engine; its handler waits on ``wake`` and reads ``emitted``."""

    def __init__(self, token_ids: list[int], hashes: list[int], plan: Plan, max_tokens: int) -> None:
        self.seq = next(_ids)
        self.token_ids = token_ids
        self.hashes = hashes
        self.prompt_len = len(token_ids)
        self.plan = plan
        self.max_tokens = max_tokens
        self.arrival = time.monotonic()
        self.admitted_at: float | None = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.computed = 0          # prompt (+ recomputed output) tokens computed so far
        self.to_compute = self.prompt_len
        self.hit_tokens = 0        # cached tokens at first admission (what usage reports)
        self.emitted = 0           # output tokens generated
        self.unpublished_preemptions = 0  # counted with the request's next output, as vLLM does
        self.holding: Holding | None = None
        self.done = False
        self.error: str | None = None
        self.finish_reason: str | None = None
        self.wake = asyncio.Event()

    @property
    def target_tokens(self) -> int:
        return min(len(self.plan.items), self.max_tokens)


class Engine:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.kv = KVCache(cfg.kv_blocks, cfg.block_size, prefix_caching=cfg.prefix_caching,
                          match_unit=cfg.prefix_match_unit if cfg.prefix_caching else 0)
        self.inbox: deque[SimRequest] = deque()   # arrived since the last step's schedule
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        # The queue as the last step left it (what /metrics reports; see the module's docstring, step 6).
        self.reported_running = 0
        self.reported_waiting = 0
        self.stats = Stats()
        self.started_at = time.time()
        self._defect_rng = random.Random(cfg.seed ^ 0xCAC4E)
        self.dead = False
        self.dead_since: float | None = None
        self.restarts = 0
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="vllm-sim-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._fail_all("server shutting down")

    def submit(self, req: SimRequest) -> None:
        if self.dead:
            raise EngineDead("EngineCore encountered an issue. See stack trace for the root cause.")
        cap = self.cfg.max_num_queued_reqs
        if cap is not None and len(self.waiting) + len(self.inbox) >= cap:
            self.stats.admission_rejections["max_num_queued_reqs"] = (
                self.stats.admission_rejections.get("max_num_queued_reqs", 0) + 1)
            raise QueueFull(f"the waiting queue is full (max_num_queued_reqs={cap})")
        self.inbox.append(req)
        self._arrived.set()

    def abort(self, req: SimRequest) -> None:
        """The client went away: free what the request holds."""
        if req.done:
            return
        req.done = True
        req.finish_reason = "abort"
        if req in self.running:
            self.running.remove(req)
        else:
            for queue in (self.waiting, self.inbox):
                with contextlib.suppress(ValueError):
                    queue.remove(req)
        self._release(req)

    # -- the step loop ---------------------------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            if self.dead:
                if self.cfg.restart_after_s is None:
                    await asyncio.sleep(3600)
                    continue
                await asyncio.sleep(self.cfg.restart_after_s)
                self._restart()
                continue
            if not self.running and not self.waiting and not self.inbox:
                self._report()
                self._arrived.clear()
                await self._arrived.wait()
                continue
            await self.step()

    async def step(self) -> None:
        """One engine step (the module's docstring, 1 to 6): schedule, run for its time, emit, report."""
        prefill_tokens, emitting = self._schedule()
        await asyncio.sleep(self.cfg.itl_ms / 1000.0 + prefill_tokens * self.cfg.prefill_ms_per_token / 1000.0)
        if self.cfg.crash_above_kv is not None and self.kv.usage > self.cfg.crash_above_kv:
            self._crash()
            return
        self._emit(emitting)
        self._report()

    def _report(self) -> None:
        """The step's stats: the queue as the schedule and the step's outputs left it."""
        self.reported_running = len(self.running)
        self.reported_waiting = len(self.waiting)

    def _schedule(self) -> tuple[int, list[SimRequest]]:
        cfg = self.cfg
        self.waiting.extend(self.inbox)
        self.inbox.clear()
        budget = cfg.max_num_batched_tokens
        decoding = [r for r in self.running if r.computed >= r.to_compute]
        budget -= len(decoding)
        # Blocks for the next token of every decoding sequence; preempt the newest when short.
        for req in list(decoding):
            if req.done or req.holding is None:
                continue
            while not self.kv.grow(req.holding, req.prompt_len + req.emitted + 1):
                victim = self.running[-1]
                self._preempt(victim)
                if victim is req:
                    break
        decoding = [r for r in self.running if r.computed >= r.to_compute]
        # Admit from the head of the queue while a sequence slot and the prompt's blocks are free.
        while self.waiting and len(self.running) < cfg.max_num_seqs:
            req = self.waiting[0]
            total = req.to_compute + 1
            hit = self.kv.lookup(req.hashes, req.prompt_len)
            holding = self.kv.admit(req.hashes, hit, total)
            if holding is None:
                self.kv.queries -= req.prompt_len
                self.kv.hits -= hit
                break
            self.waiting.popleft()
            req.holding = holding
            req.computed = hit
            if req.admitted_at is None:
                req.admitted_at = time.monotonic()
                req.hit_tokens = hit
                if hit and self._defect_rng.random() < cfg.defects.get("warm_answer_changed", 0.0):
                    change_answer(req.plan)
                self.stats.queue.observe(req.admitted_at - req.arrival)
            self.stats.prompt_tokens_cached += hit
            self.running.append(req)
        # Chunked prefill with what is left of the budget.
        prefill_tokens = 0
        finishing: list[SimRequest] = []
        for req in self.running:
            if req.computed >= req.to_compute or budget <= 0:
                continue
            chunk = min(req.to_compute - req.computed, budget)
            req.computed += chunk
            budget -= chunk
            prefill_tokens += chunk
            if req.computed >= req.to_compute:
                finishing.append(req)
                if req.holding is not None:
                    self.kv.commit(req.holding, req.hashes)
        self.stats.prompt_tokens_computed += prefill_tokens
        return prefill_tokens, decoding + finishing

    def _emit(self, emitting: list[SimRequest]) -> None:
        now = time.monotonic()
        for req in emitting:
            if req.done:
                continue
            if req.first_token_at is None:
                req.first_token_at = now
                self.stats.ttft.observe(now - req.arrival)
                if req.admitted_at is not None:
                    self.stats.prefill.observe(now - req.admitted_at)
                self.stats.prompt_tokens += req.prompt_len
            elif req.last_token_at is not None:
                self.stats.itl.observe(now - req.last_token_at)
            req.last_token_at = now
            req.emitted += 1
            self.stats.generation_tokens += 1
            self.stats.preemptions += req.unpublished_preemptions
            req.unpublished_preemptions = 0
            if req.emitted >= req.target_tokens:
                self._finish(req, "length" if req.target_tokens < len(req.plan.items) else req.plan.finish_reason)
            req.wake.set()

    def _finish(self, req: SimRequest, reason: str) -> None:
        req.done = True
        req.finish_reason = reason
        self.stats.success[reason] = self.stats.success.get(reason, 0) + 1
        if self._defect_rng.random() < self.cfg.defects.get("corrupted_request", 0.0):
            # vLLM counts a request whose outputs held NaN/inf logits (vllm:corrupted_requests).
            self.stats.corrupted_requests += 1
        self.stats.e2e.observe(time.monotonic() - req.arrival)
        with contextlib.suppress(ValueError):
            self.running.remove(req)
        self._release(req)

    def _preempt(self, req: SimRequest) -> None:
        self.running.remove(req)
        self._release(req)
        # Recompute: the prompt and everything generated so far are computed again on re-admission.
        req.computed = 0
        req.to_compute = req.prompt_len + req.emitted
        self.waiting.appendleft(req)
        # vLLM's scheduler records the preemption as an event of the request, and the event reaches the
        # Prometheus counter with that request's next output (docs/acceptance-load.md, "Server evidence"):
        # the counter lags the preemption by the request's wait for re-admission and recompute.
        req.unpublished_preemptions += 1

    def _release(self, req: SimRequest) -> None:
        if req.holding is not None:
            self.kv.release(req.holding)
            req.holding = None

    def _fail_all(self, why: str) -> None:
        for req in [*self.running, *self.waiting, *self.inbox]:
            req.done = True
            req.error = why
            self._release(req)
            req.wake.set()
        self.running.clear()
        self.waiting.clear()
        self.inbox.clear()
        self._report()

    def _crash(self) -> None:
        self.dead = True
        self.dead_since = time.time()
        self._fail_all(f"EngineCore died: KV cache usage {self.kv.usage:.2f} above {self.cfg.crash_above_kv} "
                       "(simulated CUDA out of memory)")

    def _restart(self) -> None:
        self.kv.reset()
        self.stats = Stats()
        self.started_at = time.time()
        self.dead = False
        self.dead_since = None
        self.restarts += 1
