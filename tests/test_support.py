"""The shared test infrastructure itself: the stand-in server base (routes, recording,
injected faults) and the process helper (readiness, SIGTERM then SIGKILL, no leftovers)."""
from __future__ import annotations

import sys
import time

import pytest
import requests

from tests.support.procs import Proc, free_port, port_open
from tests.support.standin import Reply, StandIn, recorder


def test_standin_routes_records_and_faults():
    s = StandIn({("GET", "/a"): lambda req: (200, {"q": req.query}),
                 ("POST", "/p*"): lambda req: Reply(201, req.body, {"X-Seen": "1"}, "text/plain")})
    with s as url:
        assert requests.get(url + "/a?x=1").json() == {"q": {"x": "1"}}
        r = requests.post(url + "/prefix", data=b"raw")
        assert (r.status_code, r.content, r.headers["X-Seen"]) == (201, b"raw", "1")
        assert requests.get(url + "/nope").status_code == 404
        s.inject("status", status=503, times=1)
        assert [requests.get(url + "/a").status_code for _ in range(2)] == [503, 200]
        s.inject("reset")
        with pytest.raises(requests.ConnectionError):
            requests.get(url + "/a")
        s.inject("delay", seconds=0.3)
        with pytest.raises(requests.ReadTimeout):  # held back past this client's patience ...
            requests.get(url + "/a", timeout=0.05)
        assert requests.get(url + "/a").status_code == 200  # ... and answered, later
        s.inject("hang", seconds=0.1)
        with pytest.raises(requests.ConnectionError):
            requests.get(url + "/a")
        s.clear_faults()
        assert requests.get(url + "/a").status_code == 200
    assert [r.target for r in s.requests][:3] == ["/a?x=1", "/prefix", "/nope"]
    assert s.requests[1].body == b"raw" and s.requests[1].headers["content-length"] == "3"


def test_recorder_answers_statuses_in_turn():
    rec = recorder([500, 200])
    with rec as url:
        assert [requests.post(url, json={}).status_code for _ in range(3)] == [500, 200, 200]


def test_proc_waits_and_kills_what_ignores_sigterm(tmp_path):
    # a parent that ignores SIGTERM and a child of it that would outlive it
    code = ("import signal, subprocess, sys, time, http.server, threading;"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN);"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
            "print(child.pid, flush=True);"
            "srv = http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), http.server.BaseHTTPRequestHandler);"
            "srv.serve_forever()")
    port = free_port()
    proc = Proc([sys.executable, "-c", code, str(port)], log=tmp_path / "p.log", grace=0.5)
    with proc:
        assert proc.wait_http(f"http://127.0.0.1:{port}/") == 501  # any status counts
        assert proc.wait_output("\n", timeout=10)
        child = int(proc.output().split()[0])
        assert proc.children() == [child]
    assert proc.returncode == -9 and not port_open(port)
    time.sleep(0.2)
    assert _state(child) in (None, "Z")  # the group was killed too: gone or a zombie awaiting its reaper


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None
