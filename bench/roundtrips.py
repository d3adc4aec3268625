"""Round trips per request, counted (not timed): SQL statements, commits, Redis commands
and upstream HTTP requests of one warm request on each hot path. Noise-free, so it shows
what the wall-clock figures of a shared machine cannot.

``sql`` counts the statements SQLAlchemy sends; ``pg`` counts every PostgreSQL round trip
at the driver (psycopg): those statements plus the pool's pre-ping and the transaction
commands psycopg sends on its own (``BEGIN``, ``COMMIT``, ``ROLLBACK``). A statement run
in autocommit costs one ``pg``; one inside a transaction costs it plus its share of
``BEGIN`` / ``COMMIT``.

Run by ``bench/run.py`` as ``python -m bench.roundtrips SPEC_JSON`` in the run's
production environment, after the bench accounts and the bench module exist. SPEC_JSON is
``[{"name", "method", "path", "headers", "body", "idempotency"}]``; prints JSON counts.
"""
from __future__ import annotations

import json
import sys
import uuid
from collections import Counter


def main(spec: list[dict]) -> dict:
    import redis.connection
    import urllib3.connectionpool
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from app.services.money.charging import drain_finalizer
    from app.services.platform.uow import statement_events
    from bench.passthrough import create_bench_app

    app = create_bench_app()  # the product app plus the passthrough baseline route
    counts: Counter = Counter()

    orig_send = redis.connection.AbstractConnection.send_packed_command
    # every outbound request, requests' or urllib3's directly (platform.http.Upstream)
    pool_cls = urllib3.connectionpool.HTTPConnectionPool
    orig_http = pool_cls.urlopen
    pg_patches = _count_pg(counts)

    def send_packed(self, command, check_health=True):
        counts["redis"] += 1
        return orig_send(self, command, check_health)

    def http_send(self, method, url, *args, **kwargs):
        counts["upstream_http"] += 1
        return orig_http(self, method, url, *args, **kwargs)

    redis.connection.AbstractConnection.send_packed_command = send_packed
    pool_cls.urlopen = http_send
    out = {}
    # every engine (the app's one pool)
    @event.listens_for(Engine, "before_cursor_execute")
    def _sql(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001
        counts["sql"] += 1

    @event.listens_for(Engine, "commit")
    def _commit(conn):  # noqa: ARG001
        counts["commits"] += 1

    client = app.test_client()
    # the hot path's statements through SQLAlchemy's execution, so ``sql`` counts them
    # (uow.statement_events; their round trips are the same)
    events = statement_events()
    events.__enter__()
    for item in spec:
        def once():
            headers = dict(item.get("headers") or {})
            if item.get("idempotency"):
                headers["Idempotency-Key"] = "rt-" + uuid.uuid4().hex
            body = item.get("body")
            return client.open(item["path"], method=item["method"], headers=headers,
                               data=body.encode() if body else None,
                               content_type="application/json" if body else None)

        for _ in range(3):  # warm: credential, catalog and connection caches
            once()
        # A metered call's finalize may be written after its answer (the process's
        # finalize writer): wait for it, so it is counted with its own request.
        drain_finalizer(app)
        counts.clear()
        resp = once()
        drain_finalizer(app)
        out[item["name"]] = {"status": resp.status_code, **{k: counts[k] for k in
                                                             ("sql", "pg", "commits", "redis", "upstream_http")}}
    events.__exit__(None, None, None)
    redis.connection.AbstractConnection.send_packed_command = orig_send
    pool_cls.urlopen = orig_http
    for owner, name, orig in pg_patches:
        setattr(owner, name, orig)
    return out


def _count_pg(counts: Counter) -> list[tuple]:
    """Count psycopg's round trips: cursor executes (statements, pre-pings) and the
    transaction commands of ``_exec_command``. Returns what to restore (none without psycopg)."""
    try:
        import psycopg
        from psycopg._connection_base import BaseConnection
    except ImportError:
        return []
    orig_exec, orig_cmd = psycopg.Cursor.execute, BaseConnection._exec_command

    def execute(self, *args, **kwargs):
        counts["pg"] += 1
        return orig_exec(self, *args, **kwargs)

    def exec_command(self, *args, **kwargs):
        counts["pg"] += 1
        return orig_cmd(self, *args, **kwargs)

    psycopg.Cursor.execute, BaseConnection._exec_command = execute, exec_command
    return [(psycopg.Cursor, "execute", orig_exec), (BaseConnection, "_exec_command", orig_cmd)]


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
