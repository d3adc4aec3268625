"""Jobs plumbing: inline without Redis, a real RQ worker with Redis, the scheduler tick."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.apps import ROOT, app_env

needs_redis = pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs REDIS_URL")


def test_enqueue_runs_inline_without_redis(app):
    from app.tasks import enqueue

    with app.app_context():
        app.config["JOBS_INLINE"] = True
        assert enqueue("app.tasks.maintenance.ping", "hello") == "hello"


@needs_redis
def test_real_rq_worker_runs_job_in_app_context(app):
    from app.tasks import enqueue

    with app.app_context():
        app.config["JOBS_INLINE"] = False
        try:
            job = enqueue("app.tasks.maintenance.ping", "from-worker")
        finally:
            app.config["JOBS_INLINE"] = True
        assert job is not None
        env = app_env(app.config)
        out = subprocess.run([sys.executable, "-m", "flask", "--app", "wsgi", "worker", "--burst"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr[-2000:]
        job.refresh()
        assert job.is_finished and job.return_value() == "from-worker"


def test_scheduler_tick_enqueues_due_jobs_once_per_slot(app):
    from app.cli.jobs import _inline_slots, run_schedule_once

    with app.app_context():
        _inline_slots.clear()
        first = run_schedule_once(now=1_000_000.0)
        again = run_schedule_once(now=1_000_001.0)
        assert "flush-last-used" in first and "flush-last-used" not in again


@needs_redis
def test_each_deployment_on_one_redis_claims_its_own_slots(app, monkeypatch):
    """The slot claims carry the deployment's Redis prefix (RATELIMIT_KEY_PREFIX): two
    deployments sharing a Redis each run their sweeps. A scheduler of one skipped the
    other's calls-sweep slots (the fault run left 5 calls' keys 409 for 120 s while
    another test's scheduler ran beside it)."""
    import random

    from app.cli.jobs import run_schedule_once

    now = float(random.randrange(10**9, 2 * 10**9))
    with app.app_context():
        monkeypatch.setitem(app.config, "JOBS_INLINE", True)
        ran = []
        monkeypatch.setattr("app.tasks.enqueue", lambda func: ran.append(func))  # due, not run
        monkeypatch.setitem(app.config, "RATELIMIT_KEY_PREFIX", "deploy-a")
        first = run_schedule_once(now=now)
        assert "calls-sweep" in first
        assert "calls-sweep" not in run_schedule_once(now=now)  # the same deployment: once
        monkeypatch.setitem(app.config, "RATELIMIT_KEY_PREFIX", "deploy-b")
        assert "calls-sweep" in run_schedule_once(now=now)  # another one: its own slot
