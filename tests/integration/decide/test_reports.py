"""``k3fleet report`` of real runs: HTML rendered in headless Chromium (DOM and a screenshot), JUnit XML
validated against the Jenkins JUnit schema, the Prometheus textfile parsed back with prometheus-client."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from decide_helpers import k3fleet

pytestmark = pytest.mark.integration

FIX = Path(__file__).resolve().parents[2] / "fixtures"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Where to keep the screenshot for a person to look at, when asked (K3FLEET_REPORT_SHOTS=DIR): the
# tests write nothing into the checkout.
SHOT_DIR = Path(os.environ["K3FLEET_REPORT_SHOTS"]) if os.environ.get("K3FLEET_REPORT_SHOTS") else None


@pytest.fixture(scope="module")
def decision(matched_audit: Path, change_check: Path, accept_run: Any,
             tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A decision over every kind of run: audit, change night (--check), acceptance, pasted captures."""
    base = tmp_path_factory.mktemp("report")
    tri = base / "triage"
    proc = k3fleet("triage", str(FIX / "triage" / "nvidia_smi_p4_550.txt"),
                   str(FIX / "triage" / "fm_journal_nothing_to_do.txt"), "--host", "gpu-x01", "--out", str(tri))
    assert proc.returncode == 1, proc.stderr
    out = base / "decision"
    proc = k3fleet("decide", str(matched_audit), str(change_check), str(accept_run("healthy")), str(tri),
                   "--reviewer", "carol <carol@example.org>", "--out", str(out))
    assert proc.returncode == 1, proc.stderr  # the pasted R550 host is a chain failure
    return out


def _report(run: Path, fmt: str, dest: Path) -> str:
    proc = k3fleet("report", str(run), "--format", fmt, "--out", str(dest))
    assert proc.returncode == 0, proc.stderr
    return dest.read_text()


def _rendered(page: Path, profile: Path) -> tuple[list[str], _Dom]:
    """``page`` opened in headless Chromium with its own profile: the flags it ran with and the DOM after its
    scripts ran."""
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--window-size=1400,2600"]
    dom = subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120,
                         check=False)
    assert dom.returncode == 0, dom.stderr[-2000:]
    parsed = _Dom()
    parsed.feed(dom.stdout)
    return flags, parsed


class _Dom(HTMLParser):
    """Elements of a dumped DOM: (tag, attributes, text directly inside)."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str], list[str]]] = []
        self._stack: list[int] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}, []))
        if tag not in ("meta", "br", "input", "img", "link", "circle", "line", "polyline"):
            self._stack.append(len(self.elements) - 1)

    def handle_endtag(self, tag: str) -> None:
        while self._stack:
            idx = self._stack.pop()
            if self.elements[idx][0] == tag:
                break

    def handle_data(self, data: str) -> None:
        if self._stack and data.strip():
            self.elements[self._stack[-1]][2].append(data.strip())

    def find(self, tag: str | None = None, **attrs: str) -> list[tuple[str, dict[str, str], list[str]]]:
        return [e for e in self.elements if (tag is None or e[0] == tag)
                and all(e[1].get(k.replace("_", "-")) == v for k, v in attrs.items())]


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium (scripts/report-deps.sh)")
def test_html_renders_in_headless_chromium(decision: Path, tmp_path: Path) -> None:
    page = tmp_path / "decision.html"
    html = _report(decision, "html", page)
    # Self-contained: nothing is fetched when the page is opened.
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", html)
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    flags, parsed = _rendered(page, tmp_path / "chromium-profile")
    # The inline script ran in the browser: it marks the body and counts what needs attention.
    assert parsed.find("body", data_rendered="yes", data_kind="decision")
    count = parsed.find(id="problem-count")
    assert count and re.fullmatch(r"\d+ item\(s\) need attention", " ".join(count[0][2])), count
    verdict = parsed.find(id="decision")
    assert verdict and verdict[0][1]["data-outcome"] == "rebuild_environment"
    assert verdict[0][1]["data-approved"] == "false"
    items = {e[1]["data-item"]: e[1]["data-status"] for e in parsed.find("tr") if "data-item" in e[1]}
    assert items["hosts.driver_branch"] == "fail" and items["prefix_cache.warm"] == "pass"
    # The sign-off checklist is read whole: nothing of it starts hidden, and the page leads with what to do.
    hidden = [e[1]["data-item"] for e in parsed.find("tr") if "data-item" in e[1] and "hidden" in e[1].get("class", "")]
    assert hidden == [], hidden
    nxt = parsed.find(id="next")
    assert nxt and nxt[0][0] == "p", nxt
    assert items["signoff.reviewer"] == "pass"
    hosts = {e[1]["data-host"] for e in parsed.find("tr") if "data-host" in e[1]}
    assert hosts == {"gpu-m01", "gpu-m02"}
    stages = [e[1]["data-stage"] for e in parsed.find("tr") if "data-stage" in e[1]]
    assert "draining" in stages and "rebooting" in stages
    assert parsed.find("li", data_rule="chain.mismatch")
    # The load curves of the acceptance run, drawn as inline SVG charts with one line per series.
    charts = {e[1].get("aria-label") for e in parsed.elements if e[0] == "svg" and e[1].get("class") == "chart"}
    assert {"long_input: latency", "agent_ramp: latency", "agent_ramp: queue", "sustained: latency"} <= charts, charts
    lines = [(e[1]["data-label"], len(e[1]["points"].split())) for e in parsed.elements if e[0] == "polyline"]
    assert lines and all(n >= 1 for _, n in lines)
    assert any(label == "TTFT p50" and n >= 2 for label, n in lines), lines  # across the ladder or the ramp
    shot = tmp_path / "decision.png"
    done = subprocess.run([*flags, f"--screenshot={shot}", page.as_uri()], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0 and shot.is_file() and shot.stat().st_size > 20_000, done.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if SHOT_DIR is not None:
        SHOT_DIR.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, SHOT_DIR / "decision.png")


def test_junit_validates_against_the_ci_schema(decision: Path, story_audit: Path, accept_run: Any,
                                               tmp_path: Path) -> None:
    import xml.etree.ElementTree as ET

    import xmlschema

    schema = xmlschema.XMLSchema(FIX / "report" / "junit-10.xsd")
    for run in (decision, story_audit, accept_run("healthy")):
        text = _report(run, "junit", tmp_path / f"{run.name}.xml")
        schema.validate(text)
        root = ET.fromstring(text)
        cases = root.findall(".//testcase")
        assert int(root.get("tests", "0")) == len(cases) > 0
        pairs = [(c.get("classname"), c.get("name")) for c in cases]
        assert len(pairs) == len(set(pairs)), "GitLab keeps only the first of a duplicated classname + name"
    audit_xml = ET.fromstring((tmp_path / f"{story_audit.name}.xml").read_text())
    by = {(c.get("classname"), c.get("name")): c for c in audit_xml.iter("testcase")}
    verdict = json.loads((story_audit / "verdict.json").read_text())
    unreachable = [h for h, v in verdict["hosts"].items() if v["status"] == "unreachable"]
    assert unreachable and by[(f"k3fleet.audit.{unreachable[0]}", "driver.branch")].find("skipped") is not None
    low = next(h for h, v in verdict["hosts"].items() if any(f["check_id"] == "driver.branch" for f in v["findings"]))
    failure = by[(f"k3fleet.audit.{low}", "driver.branch")].find("failure")
    assert failure is not None and failure.get("type") == "critical"
    decision_xml = ET.fromstring((tmp_path / "decision.xml").read_text())
    missing = {c.get("name") for c in decision_xml.iter("testcase")
               if c.get("classname") == "k3fleet.decision.checklist" and c.find("error") is not None}
    # Missing evidence is an error (never a pass, never a skip), item by item as the decision lists it.
    decided = json.loads((decision / "decision.json").read_text())
    assert missing == set(decided["missing"]) and missing


def test_prometheus_textfile_parses_back(decision: Path, story_audit: Path, tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    prom = tmp_path / "k3fleet.prom"
    text = _report(decision, "prom", prom)
    assert not list(tmp_path.glob(".k3fleet.prom.*")), "the temporary file was renamed in place"
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert all(name.startswith("k3fleet_") for name in families)
    outcome = {s.labels["outcome"]: s.value for s in families["k3fleet_decision_outcome"].samples}
    assert outcome == {"go_live": 0.0, "observe_with_limits": 0.0, "rebuild_environment": 1.0,
                       "expand_capacity": 0.0}
    assert [s.value for s in families["k3fleet_decision_approved"].samples] == [0.0]
    info = families["k3fleet_run_info"].samples[0]
    assert info.name == "k3fleet_run_info" and info.labels["kind"] == "decision" and info.value == 1.0
    items = {s.labels["item"]: s.labels["status"] for s in families["k3fleet_checklist_item_status"].samples}
    assert items["hosts.driver_branch"] == "fail"
    for family in families.values():
        for s in family.samples:
            assert s.timestamp is None, "no timestamps in a textfile"
    audit_text = _report(story_audit, "prom", tmp_path / "audit.prom")
    audit = {f.name: f for f in text_string_to_metric_families(audit_text)}
    checks = [s for s in audit["k3fleet_check_status"].samples if s.labels["check"] == "driver.branch"]
    verdict = json.loads((story_audit / "verdict.json").read_text())
    assert {s.labels["host"] for s in checks} == set(verdict["hosts"])
    assert {s.labels["status"] for s in checks} >= {"fail", "pass", "skipped"}


def test_markdown_and_bad_input(decision: Path, tmp_path: Path) -> None:
    md = _report(decision, "md", tmp_path / "d.md")
    assert md.startswith("# k3fleet decision: rebuild_environment (NOT approved)")
    assert "## Sign-off checklist" in md and "## Change-night timeline" in md
    bad = k3fleet("report", str(decision), "--format", "pdf")
    assert bad.returncode == 2 and "--format 'pdf'" in bad.stderr
    not_run = k3fleet("report", str(tmp_path), "--format", "md")
    assert not_run.returncode == 2 and "not a k3fleet run directory" in not_run.stderr
    into_dir = k3fleet("report", str(decision), "--format", "md", "--out", str(tmp_path))
    assert into_dir.returncode == 2 and "is a directory" in into_dir.stderr
    copy = tmp_path / "tampered"
    shutil.copytree(decision, copy)
    (copy / "decision.json").write_text((copy / "decision.json").read_text().replace("rebuild", "go_liv", 1))
    refused = k3fleet("report", str(copy), "--format", "html")
    assert refused.returncode == 3 and "decision.json: changed" in refused.stderr


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium (scripts/report-deps.sh)")
def test_audit_html_says_what_its_filter_hides_and_what_to_do_next(story_audit: Path, tmp_path: Path) -> None:
    """Rendered in headless Chromium: passing rows start hidden on an audit, and every table that hides
    rows says how many; the page leads with the next step; the screenshot is kept when asked."""
    page = tmp_path / "audit.html"
    _report(story_audit, "html", page)
    flags, parsed = _rendered(page, tmp_path / "profile")
    hidden = [e for e in parsed.find("tr") if "data-status" in e[1] and "hidden" in e[1].get("class", "")]
    notes = [" ".join(e[2]) for e in parsed.find("p") if e[1].get("class") == "filtered" and e[2]]
    assert hidden and notes, notes
    assert sum(int(n.split(" of ", 1)[0]) for n in notes) == len(hidden), (notes, len(hidden))
    assert all("untick" in n for n in notes)
    count = " ".join(parsed.find(id="problem-count")[0][2])
    assert count.endswith(f"; {len(hidden)} passed row(s) hidden"), count
    nxt = " ".join(t for e in parsed.find(id="next") for t in e[2])
    assert "k3fleet plan --run" in nxt, nxt
    if SHOT_DIR is not None:
        shot = tmp_path / "audit.png"
        subprocess.run([*flags, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120, check=True)
        SHOT_DIR.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, SHOT_DIR / "audit.png")


def test_the_gpu_panel_never_calls_a_faulty_host_healthy(story_audit: Path, tmp_path: Path) -> None:
    """The default lab fleet holds a GPU that fell off the bus (Xid 79 on gpu-a06) and a host whose GPUs
    NVML cannot read (gpu-a08, driver/library mismatch): both are named in the GPU panel, with the check
    that failed, and the 'every GPU healthy' line counts neither."""
    html = _report(story_audit, "html", tmp_path / "a.html")
    panel = html[html.index('<section id="gpus">'):]
    panel = panel[:panel.index("</section>")]
    xid = re.search(r'<tr data-host="gpu-a06" data-fault="true">.*?</tr>', panel)
    assert xid and "gpu.xid" in xid.group(0) and "Xid 79" in xid.group(0), panel[:3000]
    unread = re.search(r'<tr data-host="gpu-a08" data-unreadable="true">.*?</tr>', panel)
    assert unread and "no GPU could be read" in unread.group(0), panel[:3000]
    lead = re.search(r'<p class="attention">(\d+) host\(s\) need attention: ([^<]*)</p>', panel)
    assert lead and {"gpu-a06", "gpu-a08"} <= set(re.findall(r"gpu-a\d+", lead.group(2))), panel[:1000]
    healthy = re.search(r"<p>([\d,]+) other host\(s\): every GPU healthy and idle\.</p>", panel)
    hosts = json.loads((story_audit / "verdict.json").read_text())["hosts"]
    measured = sum(1 for h in (hosts.values() if isinstance(hosts, dict) else hosts)
                   if (h.get("status") if isinstance(h, dict) else None) != "unreachable")
    assert healthy and int(healthy.group(1)) + int(lead.group(1)) == measured, (healthy, lead, measured)
