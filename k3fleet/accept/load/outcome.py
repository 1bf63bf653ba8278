"""The outcome of a load run and its words: ``stable``, ``ceiling``, ``adjust_config`` or ``collapse``
from the curve and the server's samples, the findings beside it, and the probe result's data."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any, Literal

from k3fleet.accept.gpu_telemetry import peaks, phase_curves
from k3fleet.accept.load.monitor import Monitor
from k3fleet.accept.load.options import OPEN_LOOP, PHASES, LoadOptions
from k3fleet.accept.load.rate import rate_envelope
from k3fleet.accept.load.shots import SERVER_KINDS, Tally
from k3fleet.accept.load.steps import Curve
from k3fleet.accept.oom import oom_records
from k3fleet.accept.result import ProbeResult, finding
from k3fleet.models.findings import Finding

Outcome = Literal["stable", "ceiling", "adjust_config", "collapse"]
_OOM = re.compile(r"out of memory|\bOOM\b", re.IGNORECASE)


class Report:
    """Judges a finished (or interrupted) run from what its parts recorded."""

    def __init__(self, opts: LoadOptions, tally: Tally, monitor: Monitor, curve: Curve, display_url: str, *,
                 refused_context: int | None, tokens_per_word: float, calibrated: bool,
                 max_model_len: int | None, search: dict[str, Any] | None = None,
                 trace: dict[str, Any] | None = None) -> None:
        self.opts = opts
        self.tally = tally
        self.monitor = monitor
        self.curve = curve
        self.display_url = display_url
        self.refused_context = refused_context
        self.tokens_per_word = tokens_per_word
        self.calibrated = calibrated
        self.max_model_len = max_model_len
        self.search = search
        self.trace = trace

    def result(self) -> ProbeResult:
        outcome, ceiling, reason, findings = self._outcome()
        findings = [*findings, *self._side_findings()]
        tally, monitor, shots, unread = self.tally, self.monitor, self.tally.shots, self.monitor.unread()
        ran = sorted({r["phase"] for r in self.curve.rows}, key=PHASES.index)
        incomplete = tally.interrupted or tally.budget_hit is not None
        status: Literal["pass", "fail", "inconclusive"]
        if tally.interrupted:
            status, reason = "inconclusive", f"interrupted: {len(shots)} requests measured; {reason}"
        elif outcome is None:
            status = "inconclusive"
        elif outcome == "stable" and incomplete:
            status, reason = "inconclusive", f"{tally.budget_hit}: the envelope was not fully tested"
        elif outcome == "stable" and unread:
            status = "inconclusive"
            reason = ("stable on client figures only: the server's " + ", ".join(unread)
                      + " could not be read, and missing server evidence is not stability")
        else:
            status = "pass" if outcome == "stable" else "fail"
        kinds = Counter(s.kind for s in shots if not s.ok)
        data: dict[str, Any] = {
            "outcome": outcome, "ceiling": ceiling, "envelope": self.opts.envelope,
            "phases": ran, "curves": self.curve.rows, "samples": monitor.samples, "failures": tally.failures,
            "counts": {"requests": len(shots), "ok": len(shots) - tally.errors, "errors": dict(kinds),
                       "timeouts": kinds.get("timeout", 0), "health_failures": monitor.health_failures,
                       "restarts": monitor.restarts,
                       "oom_events": sum(1 for s in shots if s.message and _OOM.search(s.message)),
                       "preemptions": monitor.delta_total("preemptions"),
                       "retries": sum(s.retries for s in shots),
                       "retried": dict(Counter(k for s in shots for k in s.retried_kinds)),
                       "duplicate_tool_calls": sum(1 for s in shots if s.duplicate_tool_call)},
            "oom_records": oom_records(shots, monitor.samples, self.display_url),
            "calibration": {"tokens_per_word": round(self.tokens_per_word, 4), "from_usage": self.calibrated},
            "options": self.opts.model_dump(mode="json"),
            "interrupted": tally.interrupted, "bound": tally.budget_hit,
            "metrics_errors": monitor.metrics_errors, "old_metric_names": monitor.old_names,
            "unread_metrics": unread, "max_model_len": self.max_model_len,
            "elapsed_s": round(tally.elapsed(), 3),
        }
        curves = phase_curves(monitor.samples)
        data["gpu"] = {"source": self.opts.telemetry_url, "curves": curves, "peaks": peaks(curves),
                       "errors": monitor.telemetry_errors,
                       **({} if self.opts.telemetry_url else {"note": "no GPU telemetry source (telemetry_url): GPU "
                                                                      "memory, power and utilisation are unknown"})}
        if any(r["phase"] in OPEN_LOOP for r in self.curve.rows):
            data["rate"] = rate_envelope(self.curve.rows, self.search, self.opts)
        if self.trace is not None:
            data["trace"] = self.trace
        return ProbeResult(probe="load", status=status, reason=reason, findings=findings, data=data)

    def _side_findings(self) -> list[Finding]:
        out: list[Finding] = []
        monitor = self.monitor
        if monitor.old_names:
            out.append(finding(check_id="accept.load.old_metric_names", severity="warning", layer="config",
                               message="the server exposes only removed metric names (" + ", ".join(monitor.old_names)
                                       + "): queue and KV curves are missing; upgrade vLLM"))
        if monitor.metrics_errors:
            out.append(finding(check_id="accept.load.metrics_unavailable", severity="warning", layer="http",
                               message=f"/metrics could not be read during the run: {monitor.metrics_errors[0]}"))
        for name in monitor.unread():
            out.append(finding(check_id="accept.load.metric_unread", severity="warning", layer="http",
                               message=f"{name} could not be read during the run: what it shows (running, "
                                       "waiting, KV usage, preemptions) is unknown, not fine", evidence=name))
        if monitor.telemetry_url and not any("gpus" in s for s in monitor.samples):
            why = monitor.telemetry_errors[0] if monitor.telemetry_errors else "no sample was taken"
            out.append(finding(check_id="accept.load.telemetry_unavailable", severity="warning", layer="http",
                               message=f"GPU telemetry could not be read during the run: {why}; GPU memory, power "
                                       "and utilisation are unknown, not fine"))
        dups = [s for s in self.tally.shots if s.duplicate_tool_call]
        if dups:
            dup = dups[0]
            out.append(finding(check_id="accept.load.retry_duplicate_tool_call", severity="warning", layer="traffic",
                               message=f"{len(dups)} retried request(s) called a tool an earlier attempt had already "
                                       f"streamed (first at {dup.t:.1f} s, {dup.phase} {dup.step}, after "
                                       f"{', '.join(dup.retried_kinds)}): a client that retries would run the tool "
                                       "twice; make tool calls idempotent or retry only before the first tool-call "
                                       "delta"))
        pre = self.monitor.delta_total("preemptions")
        if pre:
            first = next((r for r in self.curve.rows if r.get("preemptions_delta")), None)
            where = f", first at {first['concurrency']} session(s) ({first['phase']})" if first else ""
            out.append(finding(check_id="accept.load.preemptions", severity="warning", layer="traffic",
                               message=f"{pre:.0f} preemption(s) during the run{where}: the KV cache ran full: load "
                                       "pressure, not a fault; limit traffic or give the KV cache more room"))
        for rec in oom_records(self.tally.shots, self.monitor.samples, self.display_url):
            if rec["topology"]:
                kv = ", ".join(f"engine {e} {v:.2f}" for e, v in sorted(rec["memory_before"]["kv_by_engine"].items()))
                out.append(finding(check_id="accept.load.topology_oom", severity="warning", layer="environment",
                                   message=f"OOM at {rec['t_s']:g}s ({rec['phase']} {rec['step']}) with uneven KV "
                                           f"pressure across engines ({kv}): a topology OOM, not capacity; check "
                                           "the data-parallel placement and expert balance", evidence=rec["message"]))
                break
        if not self.calibrated and self.tally.shots:
            out.append(finding(check_id="accept.load.no_usage", severity="info", layer="http",
                               message="the server reports no usage: context lengths are estimated at "
                                       f"{self.tokens_per_word} tokens per word"))
        if self.tally.budget_hit:
            out.append(finding(check_id="accept.load.bound", severity="warning", layer="traffic",
                               message=self.tally.budget_hit))
        return out

    def _outcome(self) -> tuple[Outcome | None, int | None, str, list[Finding]]:
        rows = self.curve.rows
        findings: list[Finding] = []
        server_rows = [r for r in rows if r["verdict"] == "server"]
        if server_rows or self.monitor.restarts or (self.monitor.health_failures and rows):
            r = server_rows[0] if server_rows else None
            where = (f"{r['phase']} at {r['step']}" if r else "during the run")
            why = self._server_why(r)
            findings.append(finding(check_id="accept.load.collapse", severity="error", layer="environment",
                                    message=f"the server failed under load ({where}): {why}",
                                    evidence=json.dumps(self.tally.failures[:3], default=str)))
            return "collapse", None, f"collapse {where}: {why}; expand capacity", findings
        envelope = self.opts.envelope["max_context_tokens"]
        refused = self.refused_context
        ctx_rows = [r for r in rows if r["verdict"] == "context" and r["phase"] != "long_input"]
        if (refused is not None and (envelope is None or refused <= envelope)) or ctx_rows:
            what = (f"a {refused}-token context" if refused is not None else
                    f"agent contexts of about {ctx_rows[0].get('prompt_tokens_mean') or '?'} tokens")
            findings.append(finding(check_id="accept.load.context_refused", severity="error", layer="config",
                                    message=f"{what} is refused by the server inside the tested envelope "
                                            f"({envelope} tokens): raise --max-model-len (and KV capacity) "
                                            "or lower the envelope"))
            return "adjust_config", None, f"{what} is refused inside the envelope", findings
        for r in rows:
            if r["phase"] == "long_input" and r["verdict"] == "errors":
                findings.append(finding(check_id="accept.load.long_input_errors", severity="warning", layer="traffic",
                                        message=f"long input {r['step']}: {self._slo_text(r)}"))
        # A step cut short by Ctrl-C or a bound says nothing about latency at its concurrency.
        ramp = [r for r in rows if r["phase"] == "agent_ramp" and not r.get("partial")]
        sustained = [r for r in rows if r["phase"] == "sustained" and not r.get("partial")]
        ok_ramp = [r["concurrency"] for r in ramp if r["verdict"] == "ok"]
        bad = [r for r in ramp if r["verdict"] != "ok"] or [r for r in sustained if r["verdict"] != "ok"]
        if bad:
            first_bad = bad[0]
            held = [c for c in ok_ramp if c < first_bad["concurrency"]]
            if not held:
                findings.append(finding(check_id="accept.load.collapse", severity="error", layer="environment",
                                        message=f"not even {first_bad['concurrency']} session(s) stay within the SLO "
                                                f"({self._slo_text(first_bad)})"))
                return "collapse", None, (f"no tested concurrency holds the SLO ({self._slo_text(first_bad)}); "
                                          "expand capacity"), findings
            ceiling = max(held)
            findings.append(finding(check_id="accept.load.ceiling", severity="warning", layer="traffic",
                                    message=f"stable up to {ceiling} concurrent sessions; at "
                                            f"{first_bad['concurrency']} ({first_bad['phase']}): "
                                            f"{self._pressure_text(first_bad)}; limit traffic to {ceiling}"))
            return "ceiling", ceiling, (f"stable only up to {ceiling} concurrent sessions "
                                        f"({self._pressure_text(first_bad)} at {first_bad['concurrency']})"), findings
        # Open loop: the rate ramp stops at the first rate whose goodput misses the target. The SLO search's
        # misses are how it brackets the rate, never a failure of the run.
        rate_rows = [r for r in rows if r["phase"] == "rate_ramp" and not r.get("partial")]
        rate_bad = [r for r in rate_rows if r["verdict"] != "ok"]
        if rate_bad:
            first_bad = rate_bad[0]
            held_rates = [r["rate_rps"] for r in rate_rows
                          if r["verdict"] == "ok" and r["rate_rps"] < first_bad["rate_rps"]]
            why = f"{self._pressure_text(first_bad)}, goodput {first_bad.get('goodput') or 0:.0%}"
            if not held_rates:
                findings.append(finding(check_id="accept.load.collapse", severity="error", layer="environment",
                                        message=f"not even {first_bad['rate_rps']:g} requests/s (open loop) meet the "
                                                f"SLO ({why})"))
                return "collapse", None, f"no tested request rate holds the SLO ({why}); expand capacity", findings
            top = max(held_rates)
            findings.append(finding(check_id="accept.load.rate_ceiling", severity="warning", layer="traffic",
                                    message=f"goodput holds up to {top:g} requests/s (open loop); at "
                                            f"{first_bad['rate_rps']:g}: {why}; limit the rate to {top:g}/s"))
            return "ceiling", None, f"stable only up to {top:g} requests/s ({why} at {first_bad['rate_rps']:g})", \
                findings
        # Replayed production traffic at its own rate: a miss is the server failing the traffic it must carry.
        trace_bad = [r for r in rows if r["phase"] == "trace" and not r.get("partial") and r["verdict"] != "ok"]
        if trace_bad:
            r = trace_bad[0]
            why = f"{self._pressure_text(r)}, goodput {r.get('goodput') or 0:.0%}"
            findings.append(finding(check_id="accept.load.trace_slo", severity="error", layer="environment",
                                    message=f"the replayed trace ({r['step']}, {r['rate_rps']:g} requests/s) does not "
                                            f"meet the SLO: {why}"))
            return "collapse", None, f"replayed traffic does not meet the SLO ({why}); expand capacity", findings
        if not [r for r in rows if not r.get("partial")]:
            return None, None, "no step completed", findings
        return "stable", None, self._stable_text(rows), findings

    def _stable_text(self, rows: list[dict[str, Any]]) -> str:
        """The figures behind "stable", for the terminal: what was tested and what it held."""
        done = [r for r in rows if not r.get("partial")]
        closed = [r for r in done if r["phase"] in ("agent_ramp", "sustained")]
        rates = [r for r in done if r["phase"] in OPEN_LOOP]
        if rates and not closed:
            top_rate = max(r["rate_rps"] for r in rates if r["verdict"] == "ok") if any(
                r["verdict"] == "ok" for r in rates) else 0
            return (f"stable in the open loop: goodput met the SLO up to {top_rate:g} requests/s (the most "
                    f"tested that held): {len(self.tally.shots)} requests, {self.tally.errors} errors")
        loaded = [r for r in done if r["phase"] != "long_input"] or done
        top = max(r["concurrency"] for r in loaded)
        p95 = [r["ttft_p95_s"] for r in loaded if r.get("ttft_p95_s") is not None]
        ttft = (f"TTFT p95 {max(p95):.2f} s (worst step; SLO {self.opts.ttft_p95_slo_s:g} s)" if p95
                else "no TTFT measured")
        return (f"stable up to {top} concurrent sessions (the most tested): {len(self.tally.shots)} requests, {ttft}, "
                f"{self.tally.errors} errors, no ceiling found")

    def _server_why(self, row: Mapping[str, Any] | None) -> str:
        parts = []
        if row is not None and row.get("errors"):
            parts.append(", ".join(f"{n} {k}" for k, n in row["errors"].items()))
        if self.monitor.health_failures:
            parts.append(f"{self.monitor.health_failures} /health failure(s)")
        if self.monitor.restarts:
            parts.append(f"{self.monitor.restarts} restart(s)")
        first = next((f for f in self.tally.failures if f["kind"] in SERVER_KINDS), None)
        if first and first.get("message"):
            parts.append(f"first: {first['message']}")
        return "; ".join(parts) or "server errors"

    def _pressure_text(self, row: Mapping[str, Any]) -> str:
        """What the server said at a step that did not hold: its queue, its preemptions, else the SLO."""
        if row.get("verdict") == "queued":
            running = f", {row['running_max']:.0f} running at most" if row.get("running_max") is not None else ""
            return (f"the server queued requests (vllm:num_requests_waiting {row['waiting_p50']:.0f} for most of the "
                    f"time the step offered its sessions, up to {row['waiting_max']:.0f}{running})")
        if row.get("verdict") == "preempted":
            return (f"the KV cache ran full: {row['preemptions_delta']:.0f} preemption(s) "
                    "(vllm:num_preemptions_total)")
        return self._slo_text(row)

    def _slo_text(self, row: Mapping[str, Any]) -> str:
        bits = []
        if row.get("errors"):
            bits.append("errors " + ", ".join(f"{n} {k}" for k, n in row["errors"].items()))
        if row.get("ttft_p95_s") is not None:
            bits.append(f"TTFT p95 {row['ttft_p95_s']:.2f} s (SLO {self.opts.ttft_p95_slo_s:g})")
        if row.get("itl_p95_s") is not None:
            bits.append(f"ITL p95 {row['itl_p95_s'] * 1000:.0f} ms (SLO {self.opts.itl_p95_slo_s * 1000:g})")
        if row.get("waiting_max"):
            bits.append(f"up to {row['waiting_max']:.0f} waiting")
        return ", ".join(bits) or row.get("verdict", "")

