"""Paged KV cache with automatic prefix caching, as vLLM's block pool keeps it.

* A prompt is cut into full blocks of ``block_size`` token ids; block i's hash chains block i-1's
  hash with its own ids, so a block can only hit when everything before it matches.
* Blocks held by running sequences are in use; cached blocks nobody holds stay in the cache as
  evictable (least recently used first) and are reclaimed when a new block is needed.
* Kimi K3's hybrid cache keeps recurrent state only on ``prefix_match_unit`` boundaries: a hit is
  rounded down to a whole number of units, and a prompt whose length is an exact multiple of the
  unit does not hit at all (vLLM issue 50235). Unit 0 means block granularity (a plain model).
* The last prompt token is always computed (it produces the first output token), so at most
  ``len - 1`` tokens can come from the cache.
"""

from __future__ import annotations

import bisect
import time
from collections import OrderedDict
from dataclasses import dataclass, field


class Hist:
    """Cumulative-bucket histogram as Prometheus exposes it."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, float]]:
        out, acc = [], 0
        for bound, n in zip([*map(str, self.bounds), "+Inf"], self.counts, strict=True):
            acc += n
            out.append((bound, float(acc)))
        return out

    @property
    def count(self) -> int:
        return sum(self.counts)


# KV block residency buckets, seconds (the simulator's; vLLM 0.30+ samples kv_block_* histograms).
RESIDENCY_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


@dataclass
class Holding:
    """What one sequence holds: cached (shared, hashed) blocks by hash, and private blocks."""

    cached: list[int] = field(default_factory=list)
    private: int = 0

    @property
    def blocks(self) -> int:
        return len(self.cached) + self.private


class KVCache:
    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool, match_unit: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.match_unit = match_unit
        self._refs: dict[int, int] = {}                        # cached block hash -> holders
        self._evictable: OrderedDict[int, None] = OrderedDict()  # ref-0 cached blocks, LRU first
        self._private = 0
        self.queries = 0   # prompt tokens looked up (vLLM counts queries and hits in tokens)
        self.hits = 0
        # Residency of cached blocks, as vLLM's kv_block_* histograms sample it: when each was cached and when
        # nobody held it any more; observed on eviction (lifetime, idle before eviction) and on a hit of an idle
        # block (the reuse gap).
        self._born: dict[int, float] = {}
        self._idle_since: dict[int, float] = {}
        self.lifetime = Hist(RESIDENCY_BUCKETS)
        self.idle_before_evict = Hist(RESIDENCY_BUCKETS)
        self.reuse_gap = Hist(RESIDENCY_BUCKETS)

    # -- state -----------------------------------------------------------------------------------
    @property
    def used(self) -> int:
        """Blocks held by running sequences (vLLM's kv_cache_usage_perc numerator)."""
        return self._private + len(self._refs) - len(self._evictable)

    @property
    def free(self) -> int:
        """Blocks obtainable now, evicting cached blocks nobody holds."""
        return self.num_blocks - self.used

    @property
    def usage(self) -> float:
        return self.used / self.num_blocks

    @property
    def cached_blocks(self) -> int:
        return len(self._refs)

    # -- hashing and lookup ----------------------------------------------------------------------
    def block_hashes(self, token_ids: list[int]) -> list[int]:
        bs = self.block_size
        out: list[int] = []
        prev = 0
        for i in range(0, len(token_ids) - bs + 1, bs):
            prev = hash((prev, tuple(token_ids[i:i + bs])))
            out.append(prev)
        return out

    def lookup(self, hashes: list[int], prompt_len: int) -> int:
        """Tokens of this prompt the cache can serve (counted as a query of ``prompt_len`` tokens)."""
        self.queries += prompt_len
        if not self.prefix_caching:
            return 0
        n = 0
        limit = (prompt_len - 1) // self.block_size
        for h in hashes[:limit]:
            if h not in self._refs:
                break
            n += 1
        tokens = n * self.block_size
        if self.match_unit:
            # An exact multiple of the unit misses outright (vLLM issue 50235).
            tokens = 0 if prompt_len % self.match_unit == 0 else (tokens // self.match_unit) * self.match_unit
        self.hits += tokens
        return tokens

    # -- allocation ------------------------------------------------------------------------------
    def _take(self, n: int) -> bool:
        """Make ``n`` blocks available for private use, evicting LRU cached blocks if needed."""
        if n > self.free:
            return False
        spare = self.num_blocks - self._private - len(self._refs)
        while spare < n and self._evictable:
            h, _ = self._evictable.popitem(last=False)
            del self._refs[h]
            now = time.monotonic()
            self.lifetime.observe(now - self._born.pop(h, now))
            self.idle_before_evict.observe(now - self._idle_since.pop(h, now))
            spare += 1
        self._private += n
        return True

    def admit(self, hashes: list[int], hit_tokens: int, total_tokens: int) -> Holding | None:
        """Hold the hit blocks and allocate the rest of ``total_tokens``; None if it does not fit."""
        hit_blocks = hit_tokens // self.block_size
        shared = hashes[:hit_blocks]
        need = -(-total_tokens // self.block_size) - hit_blocks
        newly_held = [h for h in shared if self._refs.get(h, 0) == 0]
        if need > self.free - len(newly_held):
            return None
        now = time.monotonic()
        for h in shared:
            self._refs[h] = self._refs.get(h, 0) + 1
            self._evictable.pop(h, None)
            idle = self._idle_since.pop(h, None)
            if idle is not None:
                self.reuse_gap.observe(now - idle)
        if not self._take(need):
            self.release(Holding(cached=list(shared)))
            return None
        return Holding(cached=list(shared), private=need)

    def commit(self, holding: Holding, hashes: list[int]) -> None:
        """After prefill: the prompt's computed full blocks become cached blocks others can hit."""
        if not self.prefix_caching:
            return
        held = set(holding.cached)
        for h in hashes:
            if h in held or holding.private <= 0:
                continue
            if h in self._refs:
                # Computed twice concurrently: as in vLLM, the duplicate stays this request's own
                # block (it is not merged into the cached copy), so both occupy the cache.
                continue
            self._refs[h] = 1
            self._born[h] = time.monotonic()
            holding.private -= 1
            self._private -= 1
            holding.cached.append(h)
            held.add(h)

    def grow(self, holding: Holding, total_tokens: int) -> bool:
        """One more block when a decoding sequence crosses a block edge; False if none is free."""
        if -(-total_tokens // self.block_size) <= holding.blocks:
            return True
        if not self._take(1):
            return False
        holding.private += 1
        return True

    def release(self, holding: Holding) -> None:
        for h in holding.cached:
            left = self._refs.get(h, 0) - 1
            if left < 0:
                continue
            self._refs[h] = left
            if left == 0:
                self._idle_since[h] = time.monotonic()
                self._evictable[h] = None
                self._evictable.move_to_end(h)
        self._private -= holding.private
        holding.cached = []
        holding.private = 0

    def reset(self) -> None:
        self.lifetime, self.idle_before_evict, self.reuse_gap = (Hist(RESIDENCY_BUCKETS) for _ in range(3))
        self._born.clear()
        self._idle_since.clear()
        self._refs.clear()
        self._evictable.clear()
        self._private = 0
        self.queries = 0
        self.hits = 0
