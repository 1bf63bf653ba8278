"""Repeated load runs: one run is one sample. ``repeat`` runs of the schedule give each figure of each step
a mean, its spread and a 95% confidence interval (Student's t), and the ceiling, the highest concurrency
held and the SLO rate theirs (docs/acceptance-load.md "Repeated runs").

The interval of a figure is ``mean +- t(0.975, n - 1) * s / sqrt(n)`` over the runs' values, ``s`` their
sample standard deviation; the critical values are the table of the NIST/SEMATECH e-Handbook of
Statistical Methods, section 1.3.6.7.2 "Critical Values of the Student's t Distribution"
(https://www.itl.nist.gov/div898/handbook/eda/section3/eda3672.htm), column 0.975, copied into
docs/acceptance-load.md.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from k3fleet.accept.result import ProbeResult

# t(0.975, df) for df = 1..30 (NIST/SEMATECH e-Handbook, table 1.3.6.7.2); above 30 the normal 1.96.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)
# The figures of a step row that get an interval.
FIGURES = ("ttft_p50_s", "ttft_p95_s", "itl_p50_s", "itl_p95_s", "e2e_p50_s", "e2e_p95_s", "rps",
           "output_tokens_per_s", "goodput", "goodput_rps", "waiting_max", "kv_usage_max")
_WORST = {"collapse": 3, "adjust_config": 2, "ceiling": 1, "stable": 0}
_STATUS = {"fail": 2, "inconclusive": 1, "pass": 0}


def t975(df: int) -> float:
    return _T975[df - 1] if 1 <= df <= len(_T975) else 1.96


def spread(values: Sequence[float]) -> dict[str, Any] | None:
    """n, mean, sample standard deviation, min, max and the 95% interval of ``values`` (``None`` when there
    are none; one value has no interval)."""
    xs = [float(v) for v in values]
    if not xs:
        return None
    n = len(xs)
    mean = statistics.fmean(xs)
    sd = statistics.stdev(xs) if n > 1 else None
    half = t975(n - 1) * sd / math.sqrt(n) if sd is not None else None
    return {"n": n, "mean": round(mean, 6), "stdev": None if sd is None else round(sd, 6),
            "min": min(xs), "max": max(xs),
            "ci95": None if half is None else [round(mean - half, 6), round(mean + half, 6)]}


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def combine(results: Sequence[ProbeResult]) -> ProbeResult:
    """The runs as one result: the last run's curves and samples as they were, its status and outcome the
    worst of the runs', and ``data.repeats`` with each run's outcome and the spread of every figure."""
    last = results[-1]
    runs = []
    for i, res in enumerate(results):
        d = res.data
        slo = ((d.get("rate") or {}).get("slo") or {}) if isinstance(d.get("rate"), Mapping) else {}
        held = [r["concurrency"] for r in d.get("curves", []) if r.get("phase") in ("agent_ramp", "sustained")
                and r.get("verdict") == "ok" and not r.get("partial")]
        runs.append({"run": i + 1, "status": res.status, "outcome": d.get("outcome"), "ceiling": d.get("ceiling"),
                     "held_concurrency": max(held) if held else None, "slo_rps": slo.get("rps"),
                     "held_rps": (d.get("rate") or {}).get("held_rps") if isinstance(d.get("rate"), Mapping)
                     else None, "requests": d.get("counts", {}).get("requests")})
    steps: dict[str, dict[str, Any]] = {}
    for res in results:
        for row in res.data.get("curves", []):
            if row.get("partial"):
                continue
            key = f"{row.get('phase')}: {row.get('step')}"
            slot = steps.setdefault(key, {"phase": row.get("phase"), "step": row.get("step"), "values": {},
                                          "verdicts": []})
            slot["verdicts"].append(row.get("verdict"))
            for fig in FIGURES:
                v = _num(row.get(fig))
                if v is not None:
                    slot["values"].setdefault(fig, []).append(v)
    figures = {key: {"phase": s["phase"], "step": s["step"], "verdicts": s["verdicts"],
                     **{fig: spread(vals) for fig, vals in s["values"].items()}} for key, s in steps.items()}
    envelope = {name: spread([r[name] for r in runs if _num(r[name]) is not None])
                for name in ("ceiling", "held_concurrency", "slo_rps", "held_rps")}
    status = max((r.status for r in results), key=lambda s: _STATUS.get(s, 1))
    outcomes = [r.data.get("outcome") for r in results]
    outcome = max((o for o in outcomes if o), key=lambda o: _WORST.get(o, 0), default=None)
    data = dict(last.data)
    data["outcome"] = outcome
    data["repeats"] = {"n": len(results), "runs": runs, "steps": figures, "envelope": envelope}
    reason = last.reason
    if len(set(outcomes)) > 1:
        reason = (f"the {len(results)} runs disagree ({', '.join(str(o) for o in outcomes)}): the worst, {outcome}, "
                  f"stands; last run: {last.reason}")
    elif len(results) > 1:
        reason = f"{len(results)} runs, each {outcome}: {last.reason}"
    # The last run's findings, and those of a kind only an earlier run had.
    seen = {f.check_id for f in last.findings}
    findings = list(last.findings)
    for res in results[:-1]:
        for f in res.findings:
            if f.check_id not in seen:
                seen.add(f.check_id)
                findings.append(f)
    return ProbeResult(probe="load", status=status, reason=reason, findings=findings, data=data)
