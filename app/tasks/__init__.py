"""Background jobs: ``enqueue()`` sends a job to RQ when Redis is configured and runs it
inline otherwise (the embedded default). Jobs are thin functions in ``app/tasks/*.py``
that take ids (never ORM objects) and call services; they always run in an app context.

Anything that must not be lost is written to the database first (outbox) by the
service that enqueues it; the periodic sweeps declared in ``app/tasks/schedule.py``
re-enqueue whatever is still undelivered, so losing Redis loses nothing.
"""
from __future__ import annotations

import logging
from typing import Callable

from flask import current_app, has_app_context

log = logging.getLogger(__name__)

_app = None  # the app used by jobs running in an RQ worker process


def _job_path(func: Callable | str) -> str:
    if isinstance(func, str):
        return func
    return f"{func.__module__}.{func.__name__}"


def job_paths(entries) -> list[tuple[str, int, str]]:
    """Schedule entries ``(name, interval, function)`` with the function as its dotted
    path (the name RQ records for the job)."""
    return [(name, interval, _job_path(func)) for name, interval, func in entries]


def _import(path: str) -> Callable:
    import importlib

    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def run_job(path: str, args: tuple, kwargs: dict):
    """Entry point of every RQ job: runs ``path(*args, **kwargs)`` in an app context."""
    global _app
    func = _import(path)
    if has_app_context():
        return func(*args, **kwargs)
    if _app is None:
        from app import create_app

        _app = create_app()
    with _app.app_context():
        try:
            return func(*args, **kwargs)
        finally:
            from app.extensions import db

            db.session.remove()


def get_queue(name: str | None = None):
    from rq import Queue

    from app.extensions import get_redis

    return Queue(name or current_app.config["RQ_QUEUE"], connection=get_redis(),
                 default_timeout=300)


def enqueue(func: Callable | str, *args, job_id: str | None = None, delay: float | None = None,
            inline_errors: bool = False, **kwargs):
    """Run ``func(*args, **kwargs)`` in the background (RQ) or inline (no Redis).

    Inline failures are logged, not raised (the outbox sweep retries), unless
    ``inline_errors``. Returns the RQ job or the inline result. When Redis is
    configured but unreachable, the job is left to the outbox sweep and None is returned.
    """
    path = _job_path(func)
    if current_app.config.get("JOBS_INLINE"):
        try:
            return run_job(path, args, kwargs)
        except Exception:
            if inline_errors:
                raise
            log.exception("inline job %s failed", path)
            return None
    try:
        queue = get_queue()
        if delay:
            from datetime import timedelta

            return queue.enqueue_in(timedelta(seconds=delay), run_job, path, args, kwargs,
                                    job_id=job_id)
        return queue.enqueue(run_job, path, args, kwargs, job_id=job_id)
    except Exception:
        log.warning("could not enqueue %s (Redis unavailable); the outbox sweep will retry", path)
        return None
