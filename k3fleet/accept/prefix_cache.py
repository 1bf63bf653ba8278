"""`accept prefix-cache`: prove that the server reuses a shared prompt prefix, or say why it cannot.

One run: a cold request whose prefix the server cannot have seen (a run nonce opens the system
prompt), warm requests with the same system prompt and tools and a controlled change in the user
turn, and a control whose system prompt differs from its first token. ``/metrics`` is read around
each window; TTFT comes from the stream; ``usage.prompt_tokens_details.cached_tokens`` is used when
the server reports it. Rules and sources: docs/acceptance.md ("accept prefix-cache").
"""

from __future__ import annotations

import json
import random
import secrets
import statistics
from collections.abc import Callable, Mapping
from typing import Any

import httpx
from pydantic import BaseModel, Field

from k3fleet.accept import explain, identity
from k3fleet.accept.answers import Answer, answer_of, compare
from k3fleet.accept.client import Endpoint, Exchange, max_model_len_of, model_card, post_json, stream_chat
from k3fleet.accept.metrics import MetricsError, MetricsSnapshot, delta, scrape
from k3fleet.accept.record import Recorder
from k3fleet.accept.result import ProbeResult, Status, finding
from k3fleet.accept.settle import Settle, settled_snapshot
from k3fleet.accept.settle import summary as settle_summary
from k3fleet.contracts import Severity
from k3fleet.models.findings import Finding

PROBE = "prefix_cache"
# Kimi K3's hybrid cache hits only on prefix_match_unit boundaries: 1536 tokens unless the server sets
# --prefix-match-unit (vLLM K3 post; open vLLM issue 50235 for the exact-multiple miss).
DEFAULT_MATCH_UNIT = 1536
# Chars per token used only to size the prompt before the server counts it (its /tokenize, where it has
# one); the judgement uses the server's own counts. A small-vocabulary tokenizer spends about a token per
# two characters: without /tokenize, a prompt that must fit a known context is sized at that rate.
_CHARS_PER_TOKEN = 4.0
_CHARS_PER_TOKEN_PESSIMISTIC = 2.0
# Room kept in the context besides the shared prefix: the user turn, the template's closing tokens.
_TURN_ROOM = 64
_WINDOW_METRICS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:prompt_tokens_cached",
                   "vllm:prompt_tokens")

Progress = Callable[[str], None]


class PrefixOptions(BaseModel):
    repeats: int = Field(default=5, ge=1, le=100, description="warm requests")
    # Size of the shared prefix, in match units (crosses several, never an exact multiple) or tokens.
    prefix_units: float = Field(default=4.4, gt=0, le=64)
    prefix_tokens: int | None = Field(default=None, ge=16, le=2_000_000)
    match_unit: int | None = Field(default=None, ge=1)
    max_tokens: int = Field(default=8, ge=1, le=4096)
    # Warm median TTFT must be below this fraction of the cold TTFT.
    ttft_ratio: float = Field(default=0.9, gt=0, le=1)
    timeout_s: float | None = Field(default=None, gt=0)
    # The served model of the run's target (``serve.model``): the target's default match unit applies to
    # that model alone; None (no target given) leaves an unpublished unit unknown.
    target_model: str | None = None
    # The cold request sent again once warm: its answer must be the cold one (greedy decoding).
    replays: int = Field(default=1, ge=1, le=20)
    # After each request, how long /metrics may take to count it and come to rest (k3fleet.accept.settle).
    settle_s: float = Field(default=10.0, gt=0, le=300)


# Fixed tool definitions: serialised with the body, byte-identical in every request of a run.
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "lookup_runbook", "description": "Fetch the runbook section for an alert.",
        "parameters": {"type": "object", "properties": {
            "alert": {"type": "string", "description": "alert name"},
            "severity": {"type": "string", "enum": ["page", "ticket", "info"]}},
            "required": ["alert"]}}},
    {"type": "function", "function": {
        "name": "open_ticket", "description": "Open a ticket in the on-call queue.",
        "parameters": {"type": "object", "properties": {
            "title": {"type": "string"},
            "labels": {"type": "array", "items": {"type": "string"}},
            "owner": {"type": "object", "properties": {"team": {"type": "string"}, "user": {"type": "string"}},
                      "required": ["team"]}},
            "required": ["title", "owner"]}}},
    {"type": "function", "function": {
        "name": "drain_node", "description": "Drain a node before maintenance.",
        "parameters": {"type": "object", "properties": {
            "node": {"type": "string"}, "reason": {"type": "string"},
            "wait_for_jobs": {"type": "boolean"}}, "required": ["node", "reason"]}}},
]

_WORDS = ("driver", "fabric", "manager", "node", "drain", "canary", "wave", "rollback", "snapshot", "journal",
          "kernel", "module", "persistence", "topology", "rail", "switch", "queue", "latency", "throughput",
          "cache", "prefix", "token", "budget", "operator", "reviewer", "evidence", "manifest", "digest",
          "image", "container", "runtime", "scheduler", "partition", "reservation", "maintenance", "window",
          "alert", "threshold", "baseline", "capacity", "ceiling", "envelope", "replica", "shard", "expert",
          "tensor", "pipeline", "context", "prompt", "reasoning", "parser", "contract", "schema", "argument")


def system_prompt(nonce: str, target_tokens: int, chars_per_token: float = _CHARS_PER_TOKEN) -> str:
    """A long, fixed system prompt opened by the run nonce: same nonce and size, same bytes, always."""
    rng = random.Random(0x4B33)  # fixed seed: the text is part of the probe, not of the run
    parts = [f"Run {nonce}. You are the on-call assistant for a GPU serving fleet. "
             "Follow the handbook below exactly.\n"]
    size = len(parts[0])
    section = 1
    while size < target_tokens * chars_per_token:
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(18, 30)))
        line = f"\u00a7{section}. {words.capitalize()}.\n"
        parts.append(line)
        size += len(line)
        section += 1
    return "".join(parts)


def tools_for(nonce: str) -> list[dict[str, Any]]:
    """The fixed tools, the first description opened by the run nonce: chat templates (Kimi's among them)
    render tool declarations before the system prompt, so the nonce must lead there too for the cold
    and control requests to be unseen from their first tokens."""
    tools = json.loads(json.dumps(TOOLS))
    fn = tools[0]["function"]
    fn["description"] = f"[run {nonce}] " + fn["description"]
    return tools


def user_turn(case: int) -> str:
    """The controlled change: only the case number and ticket differ between warm requests."""
    return f"Case {case:02d}: give the first step for ticket OPS-{4100 + case} in one short line."


def _messages(system: str, case: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user_turn(case)}]


def _body(endpoint: Endpoint, system: str, tools: list[dict[str, Any]], case: int,
          opts: PrefixOptions) -> dict[str, Any]:
    return {"model": endpoint.model, "messages": _messages(system, case), "tools": tools, "tool_choice": "none",
            "max_tokens": opts.max_tokens, "temperature": 0, "logprobs": True, "top_logprobs": 2, "stream": True,
            "stream_options": {"include_usage": True}}


def _usage(ex: Exchange) -> tuple[int | None, int | None]:
    """prompt_tokens and cached_tokens from the stream's usage chunk (cached only when reported)."""
    resp = ex.response if isinstance(ex.response, Mapping) else {}
    usage = resp.get("usage") if isinstance(resp.get("usage"), Mapping) else None
    if usage is None:
        return None, None
    prompt = usage.get("prompt_tokens")
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    return (prompt if isinstance(prompt, int) else None), (cached if isinstance(cached, int) else None)


async def _snapshot(client: httpx.AsyncClient, endpoint: Endpoint, window: str, rec: Recorder) -> tuple[
        Any, str | None]:
    try:
        snap = await scrape(client, endpoint.base_url)
    except MetricsError as exc:
        return None, str(exc)
    rec.snapshot(f"{PROBE}_{window}", snap.raw)
    return snap, None


def _deltas(before: Any, after: Any, model: str) -> dict[str, float | None]:
    if before is None or after is None:
        return {name: None for name in _WINDOW_METRICS}
    out = {name: delta(before, after, name, model) for name in _WINDOW_METRICS}
    if out["vllm:prompt_tokens_cached"] is None:
        # Older V1 servers count cached prompt tokens only by source.
        a = before.counter("vllm:prompt_tokens_by_source", model, {"source": "local_cache_hit"})
        b = after.counter("vllm:prompt_tokens_by_source", model, {"source": "local_cache_hit"})
        if a is not None and b is not None and b >= a:
            out["vllm:prompt_tokens_cached"] = b - a
    return out


async def _shared_prefix_tokens(client: httpx.AsyncClient, endpoint: Endpoint, system: str,
                                tools: list[dict[str, Any]], rec: Recorder) -> int | None:
    """Exact shared prefix from vLLM's /tokenize (cold vs warm conversation), when the server has it."""
    token_lists = []
    for case in (0, 1):
        ex = await post_json(client, endpoint, "/tokenize",
                             {"model": endpoint.model, "messages": _messages(system, case), "tools": tools,
                              "add_generation_prompt": True}, probe=PROBE, label=f"tokenize_{case}")
        rec.exchange(ex)
        toks = ex.response.get("tokens") if ex.ok and isinstance(ex.response, Mapping) else None
        if not isinstance(toks, list):
            return None
        token_lists.append(toks)
    common = 0
    for a, b in zip(token_lists[0], token_lists[1], strict=False):
        if a != b:
            break
        common += 1
    return common


async def run_prefix_cache(endpoint: Endpoint, opts: PrefixOptions | None = None, *,
                           recorder: Recorder | None = None, progress: Progress | None = None,
                           client: httpx.AsyncClient | None = None) -> ProbeResult:
    opts = opts or PrefixOptions()
    rec = recorder if recorder is not None else Recorder()
    say = progress or (lambda _msg: None)
    if client is None:
        async with endpoint.async_client(2) as own:
            return await _run(own, endpoint, opts, rec, say)
    return await _run(client, endpoint, opts, rec, say)


async def _count_tokens(client: httpx.AsyncClient, endpoint: Endpoint, system: str, tools: list[dict[str, Any]],
                        case: int, rec: Recorder, label: str) -> list[Any] | None:
    """The conversation's prompt tokens from the server's /tokenize; None where it has none."""
    ex = await post_json(client, endpoint, "/tokenize",
                         {"model": endpoint.model, "messages": _messages(system, case), "tools": tools,
                          "add_generation_prompt": True}, probe=PROBE, label=label)
    rec.exchange(ex)
    toks = ex.response.get("tokens") if ex.ok and isinstance(ex.response, Mapping) else None
    return toks if isinstance(toks, list) else None


async def _sized_prompt(client: httpx.AsyncClient, endpoint: Endpoint, nonce: str, target: int, limit: int | None,
                        rec: Recorder) -> tuple[float, int | None, str]:
    """Chars per token that give a prompt of about ``target`` tokens, never above ``limit``: measured with
    the server's /tokenize (three tries at most), else estimated. (chars per token, measured tokens, method)."""
    tools = tools_for(nonce)
    cpt = _CHARS_PER_TOKEN
    measured: int | None = None
    for attempt in range(1, 4):
        toks = await _count_tokens(client, endpoint, system_prompt(nonce, target, cpt), tools, 0, rec,
                                   f"size_{attempt}")
        if toks is None:
            if attempt > 1:
                break
            # No /tokenize: an estimate, pessimistic where the context is known to be tight.
            if limit is not None and target * _CHARS_PER_TOKEN / _CHARS_PER_TOKEN_PESSIMISTIC > limit:
                cpt = _CHARS_PER_TOKEN_PESSIMISTIC
            return cpt, None, "estimate"
        measured = len(toks)
        fits = limit is None or measured <= limit
        if fits and abs(measured - target) <= max(16, target // 20):
            break
        # Scale the text by what the server counted (the tools and the template are a fixed part of it).
        cpt = max(0.5, cpt * target / max(measured, 1))
    if measured is not None and limit is not None and measured > limit:
        cpt *= 0.8 * limit / measured
        toks = await _count_tokens(client, endpoint, system_prompt(nonce, target, cpt), tools, 0, rec, "size_4")
        measured = len(toks) if toks is not None else None
    return cpt, measured, "tokenize"


async def _run(client: httpx.AsyncClient, endpoint: Endpoint, opts: PrefixOptions, rec: Recorder,
               say: Progress) -> ProbeResult:
    findings: list[Finding] = []
    data: dict[str, Any] = {"repeats": opts.repeats}
    # The model must be served (exit 2 otherwise) and its context bounds the prompt.
    max_len = max_model_len_of(await model_card(client, endpoint))
    s0, metrics_error = await _snapshot(client, endpoint, "0_before", rec)
    data["server"] = await identity.live(client, endpoint, s0)
    cfg = s0.cache_config() if s0 is not None else None
    unit, unit_source = _match_unit(cfg, opts, endpoint.model)
    data.update(match_unit=unit, match_unit_source=unit_source, cache_config=cfg, metrics_error=metrics_error,
                prefix_caching_enabled=s0.prefix_caching_enabled() if s0 is not None else None,
                old_names=s0.old_names() if s0 is not None else [], max_model_len=max_len)
    if unit_source == "target default":
        findings.append(finding(
            check_id="accept.prefix_cache.unit_target_default", severity="info", layer="config",
            message=f"the server publishes no prefix_match_unit or block_size: the target's default unit ({unit}) "
                    f"is used because {endpoint.model} is the target's model"))
    limit = max_len - opts.max_tokens - _TURN_ROOM if max_len is not None else None
    if unit is not None and limit is not None and limit <= unit:
        return _no_room(findings, data, unit, max_len, opts)
    desired = opts.prefix_tokens if opts.prefix_tokens is not None else int((unit or 1024) * opts.prefix_units)
    target = min(desired, limit) if limit is not None else desired
    nonce, control_nonce = secrets.token_hex(8), secrets.token_hex(8)
    cpt, measured, sizing = await _sized_prompt(client, endpoint, nonce, target, limit, rec)
    data["prompt_sizing"] = {"method": sizing, "target_tokens": target, "desired_tokens": desired, "limit": limit,
                             "measured_tokens": measured, "text_scale": round(cpt, 3)}
    if sizing == "estimate":
        findings.append(finding(
            check_id="accept.prefix_cache.size_estimated", severity="info", layer="http",
            message=f"the server has no /tokenize: the prompt was sized by an estimate ({cpt:g} characters a token), "
                    "not measured"))
    system, tools = system_prompt(nonce, target, cpt), tools_for(nonce)
    control_system, control_tools = system_prompt(control_nonce, target, cpt), tools_for(control_nonce)
    data["nonce"] = nonce

    def stream(system_text: str, tool_defs: list[dict[str, Any]], case: int, label: str) -> Any:
        return stream_chat(client, endpoint, _body(endpoint, system_text, tool_defs, case, opts), probe=PROBE,
                           label=label, timeout_s=opts.timeout_s)

    say(f"prefix-cache: cold request (prompt about {measured or target} tokens ({sizing}), match unit {unit})")
    settles: list[Settle] = []

    async def after(window: str, before: MetricsSnapshot | None) -> MetricsSnapshot | None:
        # Attribute counters to a request only once the server has published it (k3fleet.accept.settle).
        if before is None:
            return None
        snap, settle = await settled_snapshot(client, endpoint.base_url, before=before, names=_WINDOW_METRICS,
                                              model=endpoint.model, window=window, bound_s=opts.settle_s,
                                              scrape_timeout_s=opts.timeout_s)
        settles.append(settle)
        if snap is not None:
            rec.snapshot(f"{PROBE}_{window}", snap.raw)
        return snap

    cold = rec.exchange(await stream(system, tools, 0, "cold"))
    if cold.error:
        return _error(cold, data)
    s1 = await after("1_after_cold", s0)
    warm: list[Exchange] = []
    per_warm: list[MetricsSnapshot | None] = []
    prev = s1
    for case in range(1, opts.repeats + 1):
        say(f"prefix-cache: warm request {case}/{opts.repeats}")
        ex = rec.exchange(await stream(system, tools, case, f"warm_{case}"))
        if ex.error:
            return _error(ex, data)
        warm.append(ex)
        prev = await after(f"2_after_warm_{case}", prev)
        per_warm.append(prev)
    s2 = prev
    # The cold request again: now answered from the cache, it must give the cold answer (greedy decoding).
    replays: list[Exchange] = []
    for n in range(1, opts.replays + 1):
        say(f"prefix-cache: the cold request again, warm ({n}/{opts.replays})")
        ex = rec.exchange(await stream(system, tools, 0, f"replay_{n}"))
        if ex.error:
            return _error(ex, data)
        replays.append(ex)
        prev = await after(f"3_after_replay_{n}", prev)
    s_replay = prev
    say("prefix-cache: control request (changed system prompt)")
    control = rec.exchange(await stream(control_system, control_tools, 1, "control"))
    if control.error:
        return _error(control, data)
    s3 = await after("4_after_control", s_replay)
    data["settle"] = {"bound_s": opts.settle_s, **settle_summary(settles)}
    exact = await _shared_prefix_tokens(client, endpoint, system, tools, rec)

    windows = {"cold": _deltas(s0, s1, endpoint.model), "warm": _deltas(s1, s2, endpoint.model),
               "replay": _deltas(s2, s_replay, endpoint.model), "control": _deltas(s_replay, s3, endpoint.model)}
    warm_windows = [_deltas(a, b, endpoint.model) for a, b in zip([s1, *per_warm[:-1]], per_warm, strict=True)]
    data["per_warm_request"] = warm_windows
    cold_p, cold_c = _usage(cold)
    warm_u = [_usage(ex) for ex in warm]
    ctrl_p, ctrl_c = _usage(control)
    data["windows"] = windows
    data["prompt_tokens"] = {"cold": cold_p, "warm": [p for p, _ in warm_u], "control": ctrl_p}
    ttft_warm = [ex.ttft_s for ex in warm if ex.ttft_s is not None]
    data["ttft_s"] = {"cold": cold.ttft_s, "warm": ttft_warm,
                      "warm_median": statistics.median(ttft_warm) if ttft_warm else None, "control": control.ttft_s}

    # The shared prefix: exact from /tokenize, else bounded by the prompt counts (the user turn and the
    # chat template's closing tokens are the only part that is not shared).
    prompts = [p for p in [cold_p, *(p for p, _ in warm_u)] if p is not None]
    low: int | None
    high: int | None
    if exact is not None:
        low = high = exact
        method = "tokenize"
    elif prompts:
        high = min(prompts) - 1
        low = max(0, min(prompts) - _user_turn_allowance())
        method = "usage_estimate"
    else:
        low = high = None
        method = None
    data["prefix_tokens"] = {"low": low, "high": high, "method": method}
    exp_low = (low // unit) * unit if low is not None and unit else None
    exp_high = (high // unit) * unit if high is not None and unit else None
    data["expected_cached_tokens"] = {"low": exp_low, "high": exp_high}
    excluded = [i + 1 for i, (p, _) in enumerate(warm_u) if p is not None and unit and p % unit == 0]
    data["excluded_exact_multiple"] = excluded
    if excluded:
        findings.append(finding(
            check_id="accept.prefix_cache.exact_multiple", severity="info", layer="model",
            message=f"warm request(s) {excluded} were an exact multiple of the {unit}-token unit, a known K3 miss "
                    "(vLLM issue 50235): left out of the judgement", evidence=f"prompt_tokens {data['prompt_tokens']}"))
    valid = [(p, c) for i, (p, c) in enumerate(warm_u) if i + 1 not in excluded]
    usage_cached = [c for _, c in valid if c is not None]
    n_valid = len(valid)
    warm_metric_cached = windows["warm"]["vllm:prompt_tokens_cached"]
    per_request = [w["vllm:prompt_tokens_cached"] for i, w in enumerate(warm_windows) if i + 1 not in excluded]
    if usage_cached and len(usage_cached) == n_valid:
        cached_warm: list[float] = [float(c) for c in usage_cached]
        cached_source = "usage"
    elif per_request and all(c is not None for c in per_request):
        cached_warm = [float(c) for c in per_request if c is not None]
        cached_source = "metrics per request"
    elif warm_metric_cached is not None and n_valid and not excluded:
        cached_warm = [warm_metric_cached / n_valid]
        cached_source = "metrics"
    else:
        cached_warm, cached_source = [], None
    ctrl_cached: float | None = float(ctrl_c) if ctrl_c is not None else windows["control"]["vllm:prompt_tokens_cached"]
    data["cached_tokens"] = {"cold": cold_c, "warm": cached_warm, "control": ctrl_cached, "source": cached_source}

    problems = [p for s in settles if (p := s.problem(opts.settle_s)) is not None]
    if problems and data["prefix_caching_enabled"] is not False:
        status, reason = _unsettled(findings, settles, problems)
    else:
        status, reason = _judge(findings, data, windows, unit, exp_low, exp_high, high, cached_warm, ctrl_cached,
                                s0, opts)
    status, reason = _judge_answers(findings, data, cold, replays, status, reason)
    data["explain"] = explain.window(s0, s3, endpoint.model)
    extra = explain.findings_of(PROBE, data["explain"])
    findings.extend(extra)
    bad = [f for f in extra if f.failed]
    if bad:
        status, reason = "fail", bad[0].message if status != "fail" else f"{reason}; {bad[0].message}"
    return ProbeResult(probe=PROBE, status=status, reason=reason, findings=findings, data=data)


def _unsettled(findings: list[Finding], settles: list[Settle], problems: list[str]) -> tuple[Status, str]:
    """Counters that never counted a request, or never came to rest, cannot be attributed: say which."""
    never = [s for s in settles if s.error is None and not s.counted]
    fid = "counter_never_moved" if never else "counters_not_settled"
    for problem in problems:
        findings.append(finding(f"accept.prefix_cache.{fid}", "warning", problem, layer="http"))
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return "inconclusive", f"{problems[0]}{more}: no counter delta is attributed to a request"


def _judge_answers(findings: list[Finding], data: dict[str, Any], cold: Exchange, replays: list[Exchange],
                   status: Status, reason: str) -> tuple[Status, str]:
    """Correctness beside reuse: each warm replay's answer against the cold answer (k3fleet.accept.answers)."""
    reference: Answer = answer_of(cold.label, cold.chunks)
    comparisons = [compare(reference, answer_of(ex.label, ex.chunks)) for ex in replays]
    replay_w = data["windows"].get("replay") or {}
    hits = replay_w.get("vllm:prefix_cache_hits")
    usage_hit = any((_usage(ex)[1] or 0) > 0 for ex in replays)
    hit_seen = usage_hit or (hits is not None and hits > 0)
    data["answers"] = {"basis": comparisons[0].basis if comparisons else None, "replay_hit_seen": hit_seen,
                       "comparisons": [c.model_dump() for c in comparisons]}
    changed = [c for c in comparisons if not c.same and not c.near_tie]
    for c in comparisons:
        if not c.same and c.near_tie:
            findings.append(finding(
                "accept.prefix_cache.answer_near_tie", "info",
                f"{c.warm} left the cold answer at token {c.first_difference}, where the cold answer's two best "
                "tokens were a near tie: a different summation order may break such a tie; not counted as changed",
                layer="model", evidence=f"cold {c.cold_excerpt!r} vs warm {c.warm_excerpt!r}"))
    if not changed:
        return status, reason
    c = changed[0]
    where = f"at {'token' if c.basis == 'tokens' else 'character'} {c.first_difference}"
    if not hit_seen:
        findings.append(finding(
            "accept.prefix_cache.answer_not_deterministic", "warning",
            f"the cold request answered differently when sent again ({c.warm}, {where}) at temperature 0 without a "
            "cache hit: the server is not deterministic, so the comparison says nothing about the cache",
            layer="model", evidence=f"cold {c.cold_excerpt!r} vs {c.warm} {c.warm_excerpt!r}"))
        return status, reason
    findings.append(finding(
        "accept.prefix_cache.answer_changed", "error",
        f"a cache hit changed the answer: {c.warm} (the cold request sent again, served from the cache) differs from "
        f"the cold answer {where} at temperature 0 ({c.basis} compared)", layer="model",
        evidence=f"cold {c.cold_excerpt!r} vs {c.warm} {c.warm_excerpt!r}"))
    lead = (f"a cache hit changed the answer ({len(changed)} of {len(comparisons)} warm replays differ from the "
            "cold answer)")
    if status == "fail":
        return "fail", f"{lead}; {reason}"
    return "fail", lead


def _user_turn_allowance() -> int:
    # Generous: the user turn at two characters a token plus the template's role and end markers.
    return len(user_turn(99)) // 2 + 32


def _match_unit(cfg: Mapping[str, str] | None, opts: PrefixOptions, model: str) -> tuple[int | None, str]:
    """The unit hits land on: the option, else what the server reports (``prefix_match_unit``, else its
    ``block_size``: whole blocks), else the target's default for the target's own model only."""
    if opts.match_unit is not None:
        return opts.match_unit, "option"
    for key, source in (("prefix_match_unit", "cache_config_info"), ("block_size", "cache_config_info block_size")):
        raw = (cfg or {}).get(key)
        # vLLM writes the string "None" when there is no hybrid unit.
        if raw is not None and raw.strip().isdigit() and int(raw) > 0:
            return int(raw), source
    if opts.target_model is not None and _same_model(model, opts.target_model):
        return DEFAULT_MATCH_UNIT, "target default"
    return None, "unknown"


def _same_model(model: str, target_model: str) -> bool:
    """The served model is the target's (by its last path part: a local copy of the same weights counts)."""
    return model.rstrip("/").rsplit("/", 1)[-1].lower() == target_model.rstrip("/").rsplit("/", 1)[-1].lower()


def _no_room(findings: list[Finding], data: dict[str, Any], unit: int, max_len: int | None,
             opts: PrefixOptions) -> ProbeResult:
    reason = (f"the server's context ({max_len} tokens) cannot hold one {unit}-token match unit besides the user "
              f"turn and {opts.max_tokens} output tokens: a hit cannot be shown")
    findings.append(finding(check_id="accept.prefix_cache.context_below_unit", severity="warning", layer="config",
                            message=reason, evidence=f"max_model_len {max_len}, match unit {unit} "
                                                     f"({data['match_unit_source']})"))
    return ProbeResult(probe=PROBE, status="inconclusive", reason=reason, findings=findings, data=data)


def _error(ex: Exchange, data: dict[str, Any]) -> ProbeResult:
    kind = ex.error_kind or "protocol"
    return ProbeResult(probe=PROBE, status="error", reason=ex.error or "request failed", data=data,
                       findings=[finding(check_id=f"accept.endpoint.{kind}", severity="error", layer="http",
                                         message=ex.error or "request failed", evidence=ex.label)])


_COUNTERS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:prompt_tokens_cached")


def _judge(findings: list[Finding], data: dict[str, Any], windows: dict[str, dict[str, float | None]],
           unit: int | None, exp_low: int | None, exp_high: int | None, high: int | None, cached_warm: list[float],
           ctrl_cached: float | None, s0: Any, opts: PrefixOptions) -> tuple[Status, str]:
    """Counters and cached-token counts decide; TTFT is reported beside them and never decides: on a
    small model or a noisy host warm and cold differ by milliseconds either way."""
    def add(fid: str, severity: Severity, message: str, layer: str | None = None, evidence: str | None = None) -> None:
        findings.append(finding(f"accept.prefix_cache.{fid}", severity, message, layer=layer, evidence=evidence))

    if data["prefix_caching_enabled"] is False:
        add("caching_off", "error", "prefix caching is off on the server (cache_config_info enable_prefix_caching="
            "False); Kimi K3 needs --enable-prefix-caching", "config", str(data["cache_config"]))
        return "fail", "prefix caching is off in vllm:cache_config_info"
    if s0 is not None and s0.is_old_server:
        add("old_server", "warning", "the server exposes only removed metric names "
            f"({', '.join(s0.old_names())}): its cache counters cannot be read as current ones", "config")
        return "inconclusive", "old server: only removed metric names on /metrics, the cache counters cannot be read"
    warm_w, ctrl_w = windows["warm"], windows["control"]
    # What is missing comes first: without counters or cached-token counts nothing else can decide.
    missing = [n for n in _COUNTERS if warm_w.get(n) is None]
    usage_cached = data["cached_tokens"]["source"] == "usage"
    if len(missing) == len(_COUNTERS) and not usage_cached:
        where = (f"/metrics could not be read ({data['metrics_error']})" if data["metrics_error"] is not None
                 else "/metrics has none of " + ", ".join(missing))
        add("metrics_unavailable" if data["metrics_error"] is not None else "counters_missing", "warning",
            f"the server reports no prefix-cache evidence: {where}, and no "
            "usage.prompt_tokens_details.cached_tokens (vLLM: --enable-prompt-tokens-details)", "http",
            ", ".join(missing))
        lead = (f"no /metrics to see the prefix-cache counters ({data['metrics_error']})"
                if data["metrics_error"] is not None else f"no prefix-cache counters ({', '.join(missing)})")
        return "inconclusive", f"{lead} and no cached_tokens in usage: reuse cannot be shown (TTFT alone never decides)"
    for name in missing:
        add("counter_missing", "warning", f"{name} is not on /metrics", "http", name)
    if unit is None:
        add("unit_unknown", "warning", "the server publishes neither prefix_match_unit nor block_size in "
            "vllm:cache_config_info and the model is not the target's: pass --match-unit", "config")
        return "inconclusive", ("the prefix match unit is unknown (no prefix_match_unit or block_size): "
                                "pass --match-unit")
    if exp_low is None or high is None:
        add("no_usage", "warning", "the server reported no usage.prompt_tokens: the prefix length is unknown", "http")
        return "inconclusive", "the prefix length is unknown (no usage in the stream)"
    if exp_low < unit:
        add("prefix_below_unit", "warning",
            f"the shared prefix (about {data['prefix_tokens']['low']}-{high} tokens) is not surely one full "
            f"{unit}-token match unit: a hit cannot be shown", None)
        return "inconclusive", f"the shared prefix is shorter than one match unit ({unit} tokens)"

    failed: list[str] = []
    unknown: list[str] = []
    for name, what in (("vllm:prefix_cache_queries", "queries"), ("vllm:prefix_cache_hits", "hits")):
        d = warm_w[name]
        if d is None:
            unknown.append(f"{name} is not on /metrics")
        elif d <= 0:
            add(f"no_{what}", "error", f"{name} did not rise over the warm requests", "model",
                f"warm window delta {d}")
            failed.append(f"prefix-cache {what} did not rise")
    if not cached_warm:
        unknown.append("cached prompt tokens are reported neither in usage nor on /metrics")
    else:
        low_seen = min(cached_warm)
        if low_seen < exp_low:
            add("cached_below_prefix", "error",
                f"warm requests reused {low_seen:.0f} cached prompt tokens, expected at least {exp_low} (the shared "
                f"prefix rounded down to the {unit}-token match unit)", "model",
                f"cached {cached_warm}, expected {exp_low}-{exp_high}")
            failed.append(f"cached tokens {low_seen:.0f} < {exp_low}")
        elif max(cached_warm) > high + 1:
            add("cached_above_prefix", "warning",
                f"warm requests report {max(cached_warm):.0f} cached tokens, more than the shared prefix ({high}): "
                "other traffic on the server may be in the window", "model")
    cold_t, warm_t = data["ttft_s"]["cold"], data["ttft_s"]["warm_median"]
    if cold_t is not None and warm_t is not None and warm_t >= cold_t * opts.ttft_ratio:
        add("ttft_not_lower", "warning",
            f"warm TTFT {warm_t * 1000:.0f} ms is not below {opts.ttft_ratio:.0%} of the cold {cold_t * 1000:.0f} ms "
            "(reported, not judged: the counters decide)", "model")
    hits_ctrl = ctrl_w["vllm:prefix_cache_hits"]
    if ctrl_cached is not None and ctrl_cached >= unit:
        add("control_hit", "error", f"the control request (changed system prompt) reused {ctrl_cached:.0f} cached "
            "tokens: the cache matches something other than the shared prefix, or other traffic is in the window",
            "model")
        failed.append("control was a hit")
    elif ctrl_cached is None and hits_ctrl is not None and hits_ctrl >= unit:
        add("control_hit", "error", f"prefix-cache hits rose by {hits_ctrl:.0f} over the control request", "model")
        failed.append("control was a hit")
    if failed:
        return "fail", "; ".join(failed)
    if unknown:
        for u in unknown:
            add("not_measured", "warning", u)
        return "inconclusive", "; ".join(unknown)
    ttft = ""
    if cold_t is not None and warm_t is not None:
        ttft = f", warm TTFT {warm_t * 1000:.0f} ms vs cold {cold_t * 1000:.0f} ms"
        if warm_t >= cold_t * opts.ttft_ratio:
            ttft += " (no latency benefit seen: the counters carry the proof)"
    return "pass", (f"warm requests reused {min(cached_warm):.0f}+ cached tokens of a {high}-token prefix "
                    f"(unit {unit}, {data['match_unit_source']}), hits rose, control not a hit{ttft}")
