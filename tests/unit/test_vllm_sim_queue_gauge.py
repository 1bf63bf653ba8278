"""The simulator's queue gauges read as vLLM's do: the queue as the last engine step left it, so a request that
arrives during a step while a sequence slot is free never reads as waiting (vLLM's scheduler counts
``len(self.waiting)`` in ``make_stats`` on each step's outputs, and its engine core takes new requests from its
input queue only between steps; docs/acceptance-load.md, "The simulator"). Steps are driven one at a time, so
what is asserted depends on the order of events, never on how fast the machine runs them."""

from __future__ import annotations

import asyncio

from k3fleet.accept.metrics import parse_metrics
from k3fleet.lab.vllm_sim import SimConfig
from k3fleet.lab.vllm_sim.engine import Engine, SimRequest
from k3fleet.lab.vllm_sim.exposition import render
from k3fleet.lab.vllm_sim.generate import Plan
from k3fleet.lab.vllm_sim.tokenizer import encode


def _request(eng: Engine, text: str, tokens: int = 8) -> SimRequest:
    ids = encode(text)
    return SimRequest(ids, eng.kv.block_hashes(ids), Plan(items=[("content", " word")] * tokens), tokens)


def _queue(eng: Engine) -> tuple[float | None, float | None]:
    """(running, waiting) as a scrape of /metrics reads them."""
    body, content_type = render(eng)
    page = parse_metrics(body.decode(), content_type)
    return page.gauge("vllm:num_requests_running"), page.gauge("vllm:num_requests_waiting")


async def _submit_during_a_step(eng: Engine, req: SimRequest) -> asyncio.Future[None]:
    """Starts one step and submits ``req`` once that step has scheduled and runs (sleeps for its time);
    the step still running is returned."""
    step = asyncio.ensure_future(eng.step())
    await asyncio.sleep(0)
    eng.submit(req)
    return step


def test_a_request_that_arrives_during_a_step_with_a_free_slot_never_reads_as_waiting() -> None:
    async def run() -> list[tuple[float | None, float | None]]:
        eng = Engine(SimConfig(itl_ms=5.0, prefill_ms_per_token=0.0, max_num_seqs=2))
        seen = []
        eng.submit(_request(eng, "first session"))
        await eng.step()
        seen.append(_queue(eng))
        late = _request(eng, "second session")
        step = await _submit_during_a_step(eng, late)
        assert late in eng.inbox  # arrived after this step's schedule: the next one admits it
        seen.append(_queue(eng))
        await step
        seen.append(_queue(eng))
        await eng.step()
        seen.append(_queue(eng))
        return seen

    # 2 sessions against 2 slots: the second one's request is never counted as waiting, before, during or after
    # the step it arrived in; the next step runs both.
    assert asyncio.run(run()) == [(1.0, 0.0), (1.0, 0.0), (1.0, 0.0), (2.0, 0.0)]


def test_requests_a_schedule_leaves_waiting_read_as_waiting() -> None:
    async def run() -> list[tuple[float | None, float | None]]:
        eng = Engine(SimConfig(itl_ms=5.0, prefill_ms_per_token=0.0, max_num_seqs=1))
        seen = [_queue(eng)]
        eng.submit(_request(eng, "first session"))
        eng.submit(_request(eng, "second session"))
        await eng.step()
        seen.append(_queue(eng))
        # The third arrives during a step while the one slot is taken.
        step = await _submit_during_a_step(eng, _request(eng, "third session"))
        await step
        seen.append(_queue(eng))
        await eng.step()
        seen.append(_queue(eng))
        return seen

    # --max-num-seqs 1: the schedule admits one and leaves the other waiting; the third is counted once a schedule
    # has seen it and left it waiting too.
    assert asyncio.run(run()) == [(0.0, 0.0), (1.0, 1.0), (1.0, 1.0), (1.0, 2.0)]
