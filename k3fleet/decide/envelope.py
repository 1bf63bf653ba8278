"""The tested envelope against the production profile: what a load run held, and each gap. Pure.

A run covers the profile only where it measured it (docs/decision.md "Decide against the
envelope"): the agent ramp or sustained run held the profile's concurrency, the ladder held its p99
context, the sustained run lasted its duration, the steps were judged by SLOs at least as strict as
the profile's, and the agent suite ran every production tool and response schema, the
invalid-schema case and (when the mix has image requests) the multimodal case. Anything short of
that is a gap, named, and never a pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from k3fleet.models.evidence import DataProtectionBrief, EvidenceSummary, LoadEvidence, ProfileBrief, Ref
from k3fleet.models.profile import profile_record

# Agent case names a production profile adds (k3fleet/accept/profile_cases.py).
TOOL_PREFIX = "tool:"
SCHEMA_PREFIX = "schema:"
INVALID_SCHEMA = "invalid_schema"
MULTIMODAL = "multimodal"


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def held_envelope(points: Sequence[Mapping[str, Any]], options: Mapping[str, Any]) -> dict[str, Any]:
    """From a load run's curve rows: the highest concurrency and longest context that held, the
    lowest that failed, and how long the sustained run held."""
    done = [p for p in points if not p.get("partial")]
    conc_rows = [p for p in done if p.get("phase") in ("agent_ramp", "sustained") and _num(p.get("concurrency"))]
    ok_conc = [int(p["concurrency"]) for p in conc_rows if p.get("verdict") == "ok"]
    bad_conc = [int(p["concurrency"]) for p in conc_rows if p.get("verdict") != "ok"]
    # A ladder row that was cut short (refused context) still says where it failed.
    ladder = [p for p in points if p.get("phase") == "long_input" and _num(p.get("context_tokens"))]
    ok_ctx = [int(p["context_tokens"]) for p in ladder if p.get("verdict") == "ok" and not p.get("partial")]
    bad_ctx = [int(p["context_tokens"]) for p in ladder if p.get("verdict") != "ok"]
    sustained = [p for p in points if p.get("phase") == "sustained"]
    held_s: float | None = None
    sustained_conc: int | None = None
    if sustained:
        sustained_conc = int(_num(sustained[0].get("concurrency")) or 0) or None
        if all(p.get("verdict") == "ok" and not p.get("partial") for p in sustained):
            planned = _num(options.get("sustained_s"))
            measured = sum(_num(p.get("duration_s")) or 0.0 for p in sustained)
            held_s = planned if planned is not None and len(sustained) >= 3 else measured
        else:
            held_s = sum(_num(p.get("duration_s")) or 0.0 for p in sustained
                         if p.get("verdict") == "ok" and not p.get("partial"))
    slo: dict[str, float] = {}
    for key, opt in (("ttft_p95_s", "ttft_p95_slo_s"), ("itl_p95_s", "itl_p95_slo_s"),
                     ("e2e_p95_s", "e2e_p95_slo_s"), ("error_rate", "error_rate_limit")):
        value = _num(options.get(opt))
        if value is not None:
            slo[key] = value
    rate_rows = [p for p in done if p.get("phase") in ("rate_ramp", "slo_search") and _num(p.get("rate_rps"))]
    ok_rate = [float(p["rate_rps"]) for p in rate_rows if p.get("verdict") == "ok"]
    bad_rate = [float(p["rate_rps"]) for p in rate_rows if p.get("verdict") != "ok"]
    return {"held_rps": max(ok_rate) if ok_rate else None, "failed_rps": min(bad_rate) if bad_rate else None,
            "held_concurrency": max(ok_conc) if ok_conc else None,
            "failed_concurrency": min(bad_conc) if bad_conc else None,
            "held_context": max(ok_ctx) if ok_ctx else None, "failed_context": min(bad_ctx) if bad_ctx else None,
            "sustained_s": held_s, "sustained_concurrency": sustained_conc, "slo": slo}


def slo_rate(data: Mapping[str, Any]) -> dict[str, Any]:
    """The SLO search's answer in a load result's ``data`` (``rate.slo``): the rate, the rate above it that
    missed, and the margin over the profile's rate; empty when no search ran."""
    rate = data.get("rate")
    slo = rate.get("slo") if isinstance(rate, Mapping) else None
    if not isinstance(slo, Mapping):
        return {}
    return {"slo_rps": _num(slo.get("rps")), "slo_rps_upper": _num(slo.get("upper_rps")),
            "rate_margin": _num(slo.get("margin"))}


def repeat_intervals(data: Mapping[str, Any]) -> dict[str, Any]:
    """From a repeated load run's ``data.repeats``: the number of runs and the 95% intervals the envelope is
    judged by: the SLO rate and the highest concurrency held, and the worst TTFT / inter-token / end-to-end
    p95 interval of the steps that held in every run (their high ends). Empty for a single run."""
    rep = data.get("repeats")
    if not isinstance(rep, Mapping) or not _num(rep.get("n")):
        return {}
    out: dict[str, list[float]] = {}
    env: Mapping[str, Any] = rep["envelope"] if isinstance(rep.get("envelope"), Mapping) else {}
    for key in ("slo_rps", "held_concurrency"):
        ci = (env.get(key) or {}).get("ci95") if isinstance(env.get(key), Mapping) else None
        if isinstance(ci, list) and len(ci) == 2 and all(_num(v) is not None for v in ci):
            out[key] = [float(ci[0]), float(ci[1])]
    steps: Mapping[str, Any] = rep["steps"] if isinstance(rep.get("steps"), Mapping) else {}
    for fig in ("ttft_p95_s", "itl_p95_s", "e2e_p95_s"):
        worst: list[float] | None = None
        for st in steps.values():
            if not isinstance(st, Mapping) or st.get("phase") == "long_input" or st.get("phase") == "slo_search":
                continue
            if not st.get("verdicts") or any(v != "ok" for v in st["verdicts"]):
                continue
            ci = (st.get(fig) or {}).get("ci95") if isinstance(st.get(fig), Mapping) else None
            if isinstance(ci, list) and len(ci) == 2 and all(_num(v) is not None for v in ci) and (
                    worst is None or float(ci[1]) > worst[1]):
                worst = [float(ci[0]), float(ci[1])]
        if worst is not None:
            out[fig] = worst
    return {"repeats": int(rep["n"]), "intervals": out}


def traffic_baseline(points: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """What the accepted load looked like to the server, for ``watch`` to judge live traffic by: the
    prefix-cache hit ratio of the load's own sessions (hits over queries summed over the steps that
    held), their TTFT / inter-token / e2e latency (the worst p50 and p95 of those steps), the queue
    they left (most requests waiting) and their request rate. The sustained steps when they held,
    else every agent-ramp step that held; empty when none held. Never the synthetic ratio of the
    prefix-cache probe: that is a controlled pair of requests, not traffic."""
    done = [p for p in points if not p.get("partial") and p.get("verdict") == "ok"]
    rows = [p for p in done if p.get("phase") == "sustained"] or [p for p in done if p.get("phase") == "agent_ramp"]
    if not rows:
        return {}
    out: dict[str, float] = {"steps": float(len(rows))}
    queries = [q for q in (_num(p.get("prefix_cache_queries_delta")) for p in rows) if q is not None]
    hits = [h for h in (_num(p.get("prefix_cache_hits_delta")) for p in rows) if h is not None]
    if queries and hits and len(queries) == len(hits) and sum(queries) > 0:
        out["hit_ratio"] = round(sum(hits) / sum(queries), 4)
    for key in ("ttft_p50_s", "ttft_p95_s", "itl_p50_s", "itl_p95_s", "e2e_p50_s", "e2e_p95_s", "waiting_max"):
        values = [v for v in (_num(p.get(key)) for p in rows) if v is not None]
        if values:
            out[key] = max(values)
    rates = [v for v in (_num(p.get("rps")) for p in rows) if v is not None]
    if rates:
        out["rps"] = round(sum(rates) / len(rates), 3)
    requests = [v for v in (_num(p.get("requests")) for p in rows) if v is not None]
    if requests:
        out["requests"] = sum(requests)
    return out


def profile_brief(loaded: Any, ref: Ref | None) -> ProfileBrief:
    """A :class:`k3fleet.models.profile.LoadedProfile` as the decision keeps it."""
    p = loaded.profile
    return ProfileBrief(name=p.name, concurrency=p.concurrency, context_typical=p.context_tokens.typical,
                        context_p99=p.context_tokens.p99, context_max=p.context_tokens.max, sustained_s=p.sustained_s,
                        request_rate_rps=p.request_rate_rps, mix=p.mix.model_dump(),
                        slo={k: v for k, v in p.slo.model_dump().items() if v is not None},
                        tools=list(loaded.tool_names),
                        schemas=sorted(loaded.schemas), rate_limits=list(p.rate_limits),
                        data_protection=DataProtectionBrief(**p.data_protection.model_dump())
                        if p.data_protection is not None else None,
                        sha256=profile_record(loaded)["sha256"], ref=ref)


def tested_text(ld: LoadEvidence | None) -> str:
    if ld is None:
        return "no load run"
    parts = [f"{ld.held_concurrency} concurrent" if ld.held_concurrency else "no concurrency held",
             *([f"{ld.slo_rps:g} requests/s within the SLO (open loop)"] if ld.slo_rps else
               [f"{ld.held_rps:g} requests/s held (open loop)"] if ld.held_rps else []),
             f"{ld.held_context}-token context" if ld.held_context else "no context held",
             f"{ld.sustained_s:g} s sustained" if ld.sustained_s else "no sustained run held"]
    text = ", ".join(parts)
    if ld.replayed:
        text += (f" (and a replayed trace of {ld.replayed.get('requests')} requests, "
                 f"x{ld.replayed.get('speed')})")
    return text


def _ran(s: EvidenceSummary, case: str) -> bool:
    ag = s.accept.agent if s.accept else None
    return ag is not None and any(c.name == case and c.runs > 0 for c in ag.cases)


def envelope_gaps(s: EvidenceSummary) -> list[tuple[str, list[Ref]]]:
    """Every way the tested envelope falls short of the profile (empty without a profile)."""
    p = s.profile
    if p is None:
        return []
    ld = s.accept.load if s.accept else None
    ag = s.accept.agent if s.accept else None
    pref = [p.ref] if p.ref else []
    out: list[tuple[str, list[Ref]]] = []
    if ld is None:
        out.append((f"no load run: the profile's {p.concurrency} concurrent requests, {p.context_p99}-token p99 "
                    f"context and {p.sustained_s:g} s sustained are untested", pref))
    else:
        refs = [ld.ref, *pref]
        if (ld.held_concurrency or 0) < p.concurrency:
            out.append((f"concurrency: the load held {ld.held_concurrency or 0} concurrent sessions, the profile "
                        f"peaks at {p.concurrency}", refs))
        if (ld.held_context or 0) < p.context_p99:
            out.append((f"context: the ladder held {ld.held_context or 0} tokens, the profile's p99 is "
                        f"{p.context_p99}", refs))
        need = p.sustained_s * s.policy.sustained_tolerance
        if (ld.sustained_s or 0) < need or (ld.sustained_concurrency or 0) < p.concurrency:
            out.append((f"sustained: {ld.sustained_s or 0:g} s at {ld.sustained_concurrency or 0} concurrent, the "
                        f"profile sustains {p.concurrency} for {p.sustained_s:g} s", refs))
        if p.request_rate_rps is not None:
            rate = ld.slo_rps
            if rate is None:
                held = f"held {ld.held_rps:g} requests/s" if ld.held_rps else "held no open-loop rate"
                out.append((f"rate: no SLO search found the highest rate within the SLO ({held}), the profile "
                            f"peaks at {p.request_rate_rps:g} requests/s", refs))
            elif rate < p.request_rate_rps:
                out.append((f"rate: goodput meets the SLO up to {rate:g} requests/s, the profile peaks at "
                            f"{p.request_rate_rps:g}", refs))
        out += _interval_gaps(ld, p, refs)
        for key, label in (("ttft_p95_s", "TTFT p95"), ("itl_p95_s", "inter-token p95"),
                           ("e2e_p95_s", "end-to-end p95"), ("error_rate", "error rate")):
            tested, want = ld.slo.get(key), p.slo.get(key)
            if want is None:
                continue
            if tested is None:
                out.append((f"SLO: the load run does not say which {label} limit judged its steps (the profile's "
                            f"is {want:g})", refs))
            elif tested > want:
                out.append((f"SLO: the steps were judged by {label} <= {tested:g}, the profile promises "
                            f"{want:g}", refs))
    wanted = [TOOL_PREFIX + t for t in p.tools] + [SCHEMA_PREFIX + n for n in p.schemas] + [INVALID_SCHEMA]
    if p.multimodal:
        wanted.append(MULTIMODAL)
    absent = [c for c in wanted if not _ran(s, c)]
    if absent:
        where = [ag.ref, *pref] if ag is not None else pref
        out.append((f"agent cases of the profile did not run: {', '.join(absent)} (accept agent --profile)", where))
    return out


def _interval_gaps(ld: LoadEvidence, p: ProfileBrief, refs: list[Ref]) -> list[tuple[str, list[Ref]]]:
    """A repeated run's figure whose 95% interval crosses the profile's limit: the envelope is not shown to
    hold, whatever the mean says (docs/decision.md, rule ``envelope.gap``)."""
    out: list[tuple[str, list[Ref]]] = []
    iv, n = ld.intervals, ld.repeats or 0
    rate = iv.get("slo_rps")
    if rate is not None and p.request_rate_rps is not None and rate[0] < p.request_rate_rps:
        out.append((f"rate: the SLO rate's 95% interval over {n} runs ({rate[0]:g}-{rate[1]:g} requests/s) reaches "
                    f"below the profile's {p.request_rate_rps:g}", refs))
    conc = iv.get("held_concurrency")
    if conc is not None and conc[0] < p.concurrency:
        out.append((f"concurrency: the held concurrency's 95% interval over {n} runs ({conc[0]:g}-{conc[1]:g}) "
                    f"reaches below the profile's {p.concurrency}", refs))
    for key, label in (("ttft_p95_s", "TTFT p95"), ("itl_p95_s", "inter-token p95"), ("e2e_p95_s", "end-to-end p95")):
        ci, limit = iv.get(key), p.slo.get(key)
        if ci is not None and limit is not None and ci[1] > limit:
            out.append((f"SLO: the held steps' {label} 95% interval over {n} runs ({ci[0]:g}-{ci[1]:g} s) crosses "
                        f"the profile's {limit:g} s", refs))
    return out


def unproven(s: EvidenceSummary) -> list[str]:
    """What the evidence cannot say about production: the envelope's gaps, or everything a profile would say."""
    privacy = "data protection: retention of logs and run directories, who may read the evidence"
    if s.profile is not None:
        return [text for text, _ in envelope_gaps(s)] + ([privacy] if s.profile.data_protection is None else [])
    ld = s.accept.load if s.accept else None
    return [privacy,
            f"production concurrency (tested: {ld.held_concurrency if ld and ld.held_concurrency else 'none'})",
            f"production p99 context (tested: {ld.held_context if ld and ld.held_context else 'none'} tokens)",
            f"sustained duration (tested: {f'{ld.sustained_s:g} s' if ld and ld.sustained_s else 'none'})",
            "the production tool and response schemas", "multimodal requests, if production sends them",
            "the production SLOs"]
