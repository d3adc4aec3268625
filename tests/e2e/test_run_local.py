"""``make run`` (``deploy/run-local.sh``) with ``DATABASE_URL`` and ``REDIS_URL`` set, on a
checkout without ``instance/`` (a fresh clone that never ran the embedded default).

Two defects this catches: with ``DATABASE_URL`` set nothing created ``instance/``, so every
``>instance/….log`` redirect failed and the demo provider, demo LLM, demo facilitator and
scheduler silently never started (only gunicorn did); and with ``REDIS_URL`` set the jobs go
to RQ (``config.py``: ``JOBS_INLINE`` is off then) but the script ran no worker, so the
scheduler's periodic jobs, alert deliveries and auto top-ups stayed queued for ever."""
from __future__ import annotations

import os
import time

import pytest

from tests.conftest import base_config
from tests.support.apps import ROOT, app_env, fresh_database
from tests.support.procs import Proc, free_port, wait_http

IN_CI = bool(os.environ.get("CI"))


def test_make_run_with_redis_runs_a_worker_that_runs_the_jobs(app, tmp_path):
    if not os.environ.get("REDIS_URL"):
        if IN_CI:
            pytest.fail("Redis (REDIS_URL) is required in CI (.ci/run)")
        pytest.skip("needs Redis (REDIS_URL)")
    from redis import Redis
    from rq import Queue, Worker
    from rq.registry import FinishedJobRegistry

    env = app_env(base_config())
    env.pop("X402_FACILITATOR_URL", None)  # the script's own demo facilitator, on a free port
    port = free_port()
    env.update({"DATABASE_URL": fresh_database("runlocal"), "PORT": str(port),
                "DEMO_PROVIDER_PORT": str(free_port()), "DEMO_LLM_PORT": str(free_port()),
                "DEMO_FACILITATOR_PORT": str(free_port())})
    redis = Redis.from_url(env["REDIS_URL"])
    queue = Queue(app.config["RQ_QUEUE"], connection=redis)
    with Proc(["bash", str(ROOT / "deploy" / "run-local.sh")], name="make-run", env=env, cwd=ROOT,
              log=tmp_path / "run-local.log", grace=20) as proc:
        assert wait_http(f"http://127.0.0.1:{port}/healthz", timeout=120, proc=proc.popen) == 200
        deadline = time.monotonic() + 60
        # the scheduler enqueues its due periodic jobs at start; the worker must run them
        while time.monotonic() < deadline:
            if Worker.all(connection=redis) and FinishedJobRegistry(queue=queue).count > 0:
                break
            time.sleep(0.5)
        log = (tmp_path / "run-local.log").read_text(errors="replace")
        assert Worker.all(connection=redis), f"no RQ worker registered\n{log[-2000:]}"
        assert FinishedJobRegistry(queue=queue).count > 0, f"no job ran\n{log[-2000:]}"
        # the banner says "listening" once the gateway accepts connections (it was printed
        # before gunicorn started, seconds before its preloading master let workers listen)
        while "Gateway listening on" not in log and time.monotonic() < deadline + 10:
            time.sleep(0.2)
            log = (tmp_path / "run-local.log").read_text(errors="replace")
        assert 0 <= log.find("Booting worker") < log.find("Gateway listening on"), log[-2000:]
        # what it chose, for a flask command in another shell (config.py RUN_LOCAL_ENV)
        chosen = dict(line.split("=", 1) for line in
                      (ROOT / "instance" / "run-local.env").read_text().splitlines())
        facilitator = f"http://127.0.0.1:{env['DEMO_FACILITATOR_PORT']}"
        assert chosen["X402_FACILITATOR_URL"] == facilitator and chosen["RPC_URL_BASE"] == facilitator + "/rpc"
        assert chosen["DATABASE_URL"] == env["DATABASE_URL"] and chosen["PORT"] == str(port)
    assert not (ROOT / "instance" / "run-local.env").exists()  # removed on the way out


def test_make_run_refuses_a_port_in_use_naming_its_setting(tmp_path):
    """A demo server whose port another process holds used to fail in its own log while
    ``make run`` went on without it (and the gateway talked to whatever held the port):
    the script now refuses before starting anything, naming the setting to change."""
    import socket
    import subprocess

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        busy = str(holder.getsockname()[1])
        env = {**os.environ, "PORT": str(free_port()), "DEMO_PROVIDER_PORT": str(free_port()),
               "DEMO_LLM_PORT": busy, "DEMO_FACILITATOR_PORT": str(free_port()),
               "DATABASE_URL": "postgresql://nobody@127.0.0.1:9/never"}  # never reached
        env.pop("X402_FACILITATOR_URL", None)
        done = subprocess.run(["bash", str(ROOT / "deploy" / "run-local.sh")], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
    finally:
        holder.close()
    assert done.returncode == 1, done.stderr
    assert f"port {busy} (DEMO_LLM_PORT) is already in use" in done.stderr
    assert "flask" not in done.stdout.lower()  # nothing was started or migrated
