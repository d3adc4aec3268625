"""The one process helper of tests, bench, fault and fuzz harnesses.

``Proc`` starts a command (own environment, working directory, output to a log file) in its
own session, waits for it to answer on an HTTP URL or a TCP port, lists its children, and
stops it: SIGTERM to the process, SIGKILL to its whole process group after a grace period,
then every straggler of the group is killed too, so nothing it started outlives it.
``Processes`` keeps several and stops them in reverse order. Both are context managers;
``start``/``stop`` are the explicit API. Plus the loopback helpers around them:
``free_port``, ``wait_http``, ``wait_port``, ``http``, the /proc readers
``children``/``descendants``, and ``probe`` (a script in a fresh interpreter).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts connections on ``host:port``."""
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, port)) == 0


def _check_alive(proc: subprocess.Popen | None, what: str) -> None:
    if proc is not None and proc.poll() is not None:
        raise RuntimeError(f"process for {what} exited with {proc.returncode}")


def http(url: str, *, method: str = "GET", body: bytes | None = None,
         headers: dict | None = None, timeout: float = 10.0) -> tuple[int, bytes]:
    """One loopback HTTP request (no proxies); returns (status, body) for any status."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with _NO_PROXY.open(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_http(url: str, *, timeout: float = 30.0, proc: subprocess.Popen | None = None,
              method: str = "GET") -> int:
    """Poll ``url`` until it answers any HTTP status; returns that status. Fails early
    when ``proc`` exits."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        _check_alive(proc, url)
        try:
            return http(url, method=method, timeout=2)[0]
        except Exception as exc:  # noqa: BLE001 - not up yet
            last = exc
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up within {timeout}s: {last}")


def wait_port(port: int, *, host: str = "127.0.0.1", timeout: float = 30.0,
              proc: subprocess.Popen | None = None) -> None:
    """Wait until ``host:port`` accepts connections."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _check_alive(proc, f"{host}:{port}")
        if port_open(port, host):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{host}:{port} did not open within {timeout}s")


def _parents() -> dict[int, list[int]]:
    """ppid -> child pids of every process (from /proc)."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out.setdefault(ppid, []).append(int(entry))
    return out


def children(pid: int) -> list[int]:
    """Direct child pids of ``pid``."""
    return sorted(_parents().get(pid, []))


def descendants(root: int) -> list[int]:
    """``root`` and every process below it."""
    parent = _parents()
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(parent.get(pid, []))
    return out


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Proc:
    """One command run in its own session; output (stdout and stderr) goes to ``log`` (a
    path, appended to) or nowhere. ``grace`` is how long SIGTERM is given before SIGKILL."""

    def __init__(self, cmd: list[str], *, name: str | None = None, env: dict | None = None,
                 cwd: str | Path | None = None, log: str | Path | None = None, grace: float = 10.0):
        self.cmd, self.env, self.cwd, self.grace = [str(c) for c in cmd], env, cwd, grace
        self.name = name or Path(self.cmd[0]).name
        self.log = Path(log) if log else None
        self.popen: subprocess.Popen | None = None

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> Proc:
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL
        try:
            self.popen = subprocess.Popen(self.cmd, env=self.env, cwd=self.cwd, stdout=out,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True)
        finally:
            if self.log:
                out.close()
        return self

    def stop(self, grace: float | None = None, *, sweep: bool = True) -> int | None:
        """SIGTERM, then SIGKILL to the group after ``grace``; with ``sweep`` kill what is
        left of the group too (``sweep=False`` lets a test see what the process left
        running; call ``kill_leftovers`` after). Returns the exit status (None if it was
        never started)."""
        proc = self.popen
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(self.grace if grace is None else grace)
            except subprocess.TimeoutExpired:
                _killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        if sweep:
            self.kill_leftovers()
        return proc.returncode

    def kill_leftovers(self) -> None:
        """SIGKILL whatever is left of the process group (children that outlived it)."""
        if self.popen is not None:
            _killpg(self.popen.pid, signal.SIGKILL)

    def __enter__(self) -> Proc:
        if self.popen is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- state ----------------------------------------------------------------------
    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.poll() if self.popen else None

    def poll(self) -> int | None:
        return self.popen.poll()

    def signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def wait(self, timeout: float | None = None) -> int:
        return self.popen.wait(timeout)

    def children(self) -> list[int]:
        return children(self.pid)

    def output(self) -> str:
        """What the process wrote so far ('' without a log file)."""
        if not self.log or not self.log.exists():
            return ""
        return self.log.read_text(errors="replace")

    # -- readiness ------------------------------------------------------------------
    def wait_http(self, url: str, *, timeout: float = 30.0, method: str = "GET") -> int:
        return wait_http(url, timeout=timeout, proc=self.popen, method=method)

    def wait_port(self, port: int, *, timeout: float = 30.0) -> None:
        wait_port(port, timeout=timeout, proc=self.popen)

    def wait_output(self, text: str, *, timeout: float = 30.0) -> bool:
        """Wait until ``text`` appears in the log; False on timeout or when the process exits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.output():
                return True
            if self.popen.poll() is not None:
                return text in self.output()
            time.sleep(0.1)
        return False


class Processes:
    """Several ``Proc``s started together and stopped in reverse order (also on errors)."""

    def __init__(self):
        self.started: list[Proc] = []

    def start(self, cmd: list[str], **kwargs) -> Proc:
        proc = Proc(cmd, **kwargs).start()
        self.started.append(proc)
        return proc

    def stop(self, proc: Proc) -> None:
        if proc in self.started:
            self.started.remove(proc)
        proc.stop()

    def stop_all(self) -> None:
        while self.started:
            proc = self.started.pop()
            try:
                proc.stop()
            except Exception:  # noqa: BLE001 - teardown goes on
                pass

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all()


def probe(script: str, *args: str, **env: str) -> tuple[dict, str]:
    """Run ``script`` (``python -c``, from the repository root, with ``args``) in a fresh
    interpreter whose environment has no ``OTEL_*`` variable except those in ``env``, and
    return the JSON of its last ``PROBE {...}`` line with its whole stdout: for what only
    shows at import or process start (e.g. tracing switched on by the environment)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", script, *args], cwd=Path(__file__).resolve().parents[2],
                         capture_output=True, text=True, timeout=120, env={**clean, **env})
    assert out.returncode == 0, out.stderr[-2000:]
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("PROBE ")][-1]
    return json.loads(line[6:]), out.stdout
