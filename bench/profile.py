"""py-spy profiles of a hot path under load: the gunicorn workers are sampled while wrk
drives the route at the highest concurrency; the collapsed stacks are summarised into the
top functions by own time and by inclusive time (project files only), with file:line."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

from bench import report, setup

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
PROFILE_SECONDS = 8


def _pyspy() -> str | None:
    exe = Path(sys.executable).parent / "py-spy"
    return str(exe) if exe.exists() else shutil.which("py-spy")


def _short(path: str) -> str:
    root = str(setup.ROOT) + "/"
    if path.startswith(root):
        return path[len(root):]
    m = re.search(r"site-packages/(.*)", path)
    return m.group(1) if m else path


def summarize(collapsed: str, top: int = 25) -> dict:
    """Own-time and inclusive-time tables from py-spy's raw (collapsed) output."""
    own: Counter = Counter()
    incl: Counter = Counter()
    total = 0
    for line in collapsed.splitlines():
        if not line.strip():
            continue
        stack, _, count = line.rpartition(" ")
        try:
            n = int(count)
        except ValueError:
            continue
        total += n
        frames = []
        for raw in stack.split(";"):
            m = _FRAME.match(raw.strip())
            if not m:
                continue
            frames.append(f"{m['func']} ({_short(m['file'])}:{m['line'] or '?'})")
        if not frames:
            continue
        # the first frames are the process / thread names py-spy adds
        own[frames[-1]] += n
        for f in set(frames):
            incl[f] += n

    def table(counter: Counter, only_project: bool) -> list[dict]:
        rows = []
        for frame, n in counter.most_common():
            if only_project and not re.search(r"\((app|config|wsgi)[/.]", frame):
                continue
            rows.append({"frame": frame, "pct": round(100.0 * n / total, 1) if total else 0.0,
                         "samples": n})
            if len(rows) >= top:
                break
        return rows

    return {"samples": total, "top_own": table(own, False), "top_own_project": table(own, True),
            "top_inclusive_project": table(incl, True)}


def record(ctx, name: str, url: str, headers: dict, body: bytes, idempotency: bool = False,
           auth_keys: list[str] | None = None) -> dict:
    exe = _pyspy()
    if exe is None:
        return {"error": "py-spy not installed (pip install -r requirements-dev.txt)"}
    from bench.run import run_wrk, wrk_script

    raw = ctx.work / f"profile-{name}.txt"
    cmd = [exe, "record", "--pid", str(ctx.bench.gunicorn.pid), "--subprocesses", "--format", "raw",
           "--rate", "200", "--duration", str(PROFILE_SECONDS), "--output", str(raw), "--nonblocking", "--gil"]
    spy = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    hdrs = dict(headers)
    hdrs.setdefault("Content-Type", "application/json")
    load = threading.Thread(target=run_wrk, args=(url, wrk_script("POST", hdrs, body, idempotency, auth_keys),
                                                  max(ctx.bench.concurrency), PROFILE_SECONDS + 1))
    load.start()
    try:
        out, _ = spy.communicate(timeout=PROFILE_SECONDS + 60)
    except subprocess.TimeoutExpired:
        spy.kill()
        out = "py-spy timed out"
    load.join(timeout=PROFILE_SECONDS + 60)
    if not raw.exists():
        return {"error": f"py-spy produced no profile: {out.strip()[-500:]}"}
    summary = summarize(raw.read_text())
    report.RESULTS.mkdir(exist_ok=True)
    (report.RESULTS / f"profile-{name}.json").write_text(json.dumps(summary, indent=2))
    lines = [f"# py-spy profile of the {name} path, GIL holder only = CPU in Python ({summary['samples']} samples, "
             f"{PROFILE_SECONDS}s at c={max(ctx.bench.concurrency)}, all gunicorn workers)", "",
             "## Own time, project code", ""]
    lines += [f"{r['pct']:5.1f}%  {r['frame']}" for r in summary["top_own_project"]]
    lines += ["", "## Own time, everything (incl. libraries)", ""]
    lines += [f"{r['pct']:5.1f}%  {r['frame']}" for r in summary["top_own"]]
    lines += ["", "## Inclusive time, project code", ""]
    lines += [f"{r['pct']:5.1f}%  {r['frame']}" for r in summary["top_inclusive_project"]]
    (report.RESULTS / f"profile-{name}.txt").write_text("\n".join(lines) + "\n")
    ctx.log(f"profile {name}: {summary['samples']} samples -> bench/results/profile-{name}.txt")
    return {"samples": summary["samples"], "file": f"bench/results/profile-{name}.txt",
            "top_inclusive_project": summary["top_inclusive_project"][:10],
            "top_own": summary["top_own"][:10]}
