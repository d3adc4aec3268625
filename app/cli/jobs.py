"""``flask worker`` (RQ) and ``flask scheduler`` (the periodic schedule)."""
from __future__ import annotations

import logging
import time

import click
from flask import current_app
from flask.cli import with_appcontext

log = logging.getLogger(__name__)


@click.command("worker")
@click.option("--burst", is_flag=True, help="Exit when the queue is empty.")
@with_appcontext
def worker_cmd(burst):
    """Run an RQ worker on REDIS_URL (jobs run in this app's context)."""
    from rq import SimpleWorker

    from app.extensions import get_redis
    from app.tasks import get_queue

    redis = get_redis()
    if redis is None:
        raise click.ClickException("REDIS_URL is not set: jobs run inline, no worker needed.")
    worker = SimpleWorker([get_queue()], connection=redis)
    worker.work(burst=burst, with_scheduler=True, logging_level="INFO")


def run_schedule_once(now: float | None = None) -> list[str]:
    """Enqueue every schedule entry that is due in the current slot; returns their names."""
    from app.extensions import get_redis, redis_key
    from app.tasks import enqueue
    from app.tasks.schedule import SCHEDULE

    now = now or time.time()
    redis = get_redis()
    due = []
    for name, interval, func in SCHEDULE:
        slot = int(now // interval)
        if redis is not None:
            # the deployment's own claim: another deployment (or a test) on the same Redis
            # has its own prefix, and its scheduler must not skip a slot of this one
            claim = redis_key("schedule", name, str(slot))
            try:
                if not redis.set(claim, "1", nx=True, ex=interval * 2):
                    continue
            except Exception:
                log.warning("scheduler: Redis unavailable, skipping %s", name)
                continue
        else:
            last = _inline_slots.get(name)
            if last == slot:
                continue
            _inline_slots[name] = slot
        enqueue(func)
        due.append(name)
    return due


_inline_slots: dict[str, int] = {}


@click.command("scheduler")
@click.option("--once", is_flag=True, help="Run one tick and exit.")
@click.option("--tick", default=5.0, help="Seconds between ticks.")
@with_appcontext
def scheduler_cmd(once, tick):
    """Enqueue periodic jobs (alert evaluation, sweeps, settlement, …) on schedule."""
    app = current_app._get_current_object()
    log.info("scheduler started (%s)", "rq" if app.config.get("REDIS_URL") else "inline")
    while True:
        names = run_schedule_once()
        if names:
            log.info("scheduled: %s", ", ".join(names))
        if once:
            click.echo(", ".join(names))
            return
        time.sleep(tick)
