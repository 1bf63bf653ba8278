"""``k3fleet report``: one view, four formats, and an atomic file write for each."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from k3fleet.errors import UsageError
from k3fleet.report.view import ReportView

FORMATS = ("md", "html", "junit", "prom")


def render(view: ReportView, fmt: str) -> str:
    if fmt == "md":
        from k3fleet.report.decision_md import render_markdown

        return render_markdown(view)
    if fmt == "html":
        from k3fleet.report.html import render_html

        return render_html(view)
    if fmt == "junit":
        from k3fleet.report.junit import render_junit

        return render_junit(view)
    if fmt == "prom":
        from k3fleet.report.prom import render_prom

        return render_prom(view)
    raise UsageError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")


def write_atomic(path: Path, text: str) -> None:
    """Temp file in the same directory, fsync, rename: a reader (node_exporter) never sees half a file.

    The temporary name does not end in ``.prom``, so the textfile collector ignores it.
    """
    parent = path.parent
    if path.is_dir():
        raise UsageError(f"--out {path} is a directory: give a file name")
    if not parent.is_dir():
        raise UsageError(f"--out {path}: directory {parent} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
    except OSError as exc:
        raise UsageError(f"--out {path}: cannot write in {parent}: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise UsageError(f"--out {path}: write failed: {exc.strerror or exc}") from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
