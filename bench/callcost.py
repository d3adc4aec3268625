"""CPU of one metered call in the gateway's own process, in-process and sequential, for
A/B of hot-path changes: ``python bench/callcost.py [TREE ...]``.

Sets up what ``make bench`` sets up (its production environment, a fresh database
``BENCH_DATABASE`` (default ``gw_callcost``) migrated with ``flask db upgrade``, the nginx
fake upstream, the bench module, ``BENCH_ACCOUNTS`` (4) funded enterprise accounts), then
starts one worker process per code tree — this checkout, then each ``TREE`` given (e.g.
a ``git worktree`` of another commit; same schema) — that imports that tree's
``wsgi:app`` (the thin entry included) and calls it directly from one thread, a unique
Idempotency-Key each call, keys round-robin. The trees take turns: ``BENCH_ROUNDS``
(default 15) rounds of ``BENCH_CALLS`` (default 400) calls each, so every tree sees the
same phases of a shared machine. Per tree it prints the median over rounds of

* ``process``: CPU of the worker process per call (``time.process_time``: the request
  thread plus the finalize writer and the other threads);
* ``thread``: CPU of the calling thread alone (``time.thread_time``),

and, with two trees or more, each tree's median per-round ratio to the first tree's.
PostgreSQL's and nginx's CPU are not in these figures (``make bench`` reports
PostgreSQL's). ``BENCH_CPROFILE=FILE``: each worker also writes a cProfile of its measured
calls to FILE.N (N: the tree's place, from 0; its figures then include the profiler's overhead). Nothing is written under ``bench/results/``; everything it started is
stopped at the end.
"""
from __future__ import annotations

import io
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CALLS = int(os.environ.get("BENCH_CALLS", "400"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "15"))
ACCOUNTS = int(os.environ.get("BENCH_ACCOUNTS", "4"))
WARM = 300  # calls before measuring: caches filled, connections made, statements prepared


def worker(keys: list[str]) -> None:
    """One tree's side (``--worker``): read a number of calls per line on stdin, make them,
    answer one JSON line of CPU milliseconds per call."""
    from wsgi import app

    from bench.scenarios import MODULE_BODY as body
    from bench.seed import MODULE_SLUG

    path = f"/v1/module/{MODULE_SLUG}/call"

    def one(i: int) -> None:
        environ = {
            "REQUEST_METHOD": "POST", "PATH_INFO": path, "SCRIPT_NAME": "", "QUERY_STRING": "",
            "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8000", "SERVER_PROTOCOL": "HTTP/1.1",
            "REMOTE_ADDR": "127.0.0.1", "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(body),
            "wsgi.errors": sys.stderr, "wsgi.multithread": True, "wsgi.multiprocess": True,
            "wsgi.run_once": False, "wsgi.version": (1, 0),
            "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body)),
            "HTTP_HOST": "127.0.0.1:8000", "HTTP_AUTHORIZATION": f"Bearer {keys[i % len(keys)]}",
            "HTTP_IDEMPOTENCY_KEY": uuid.uuid4().hex,
        }
        status = []
        out = b"".join(app(environ, lambda s, h, exc_info=None: status.append(s)))
        if not status or not status[0].startswith("200"):
            raise SystemExit(f"call answered {status}: {out[:300]!r}")

    profile_to = os.environ.get("BENCH_CPROFILE")  # a file: cProfile of the measured calls
    profiler = None
    if profile_to:
        import cProfile

        profiler = cProfile.Profile(time.thread_time)  # CPU of the calling thread, not wall time
    done = 0
    for line in sys.stdin:
        n = int(line)
        if profiler is not None and done >= WARM:
            profiler.enable()
        p0, t0 = time.process_time(), time.thread_time()
        for _ in range(n):
            one(done)
            done += 1
        p1, t1 = time.process_time(), time.thread_time()
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(profile_to)
        print(json.dumps({"process": (p1 - p0) / n * 1e3, "thread": (t1 - t0) / n * 1e3}), flush=True)


def main(trees: list[Path]) -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("BENCH_DATABASE", "gw_callcost")
    os.environ.setdefault("BENCH_REDIS_URL", "redis://127.0.0.1:6379/10")
    from bench import fixtures, scenarios, seed, setup
    from tests.support import procs

    work = ROOT / "bench" / ".work" / "callcost"
    work.mkdir(parents=True, exist_ok=True)
    ports = {name: procs.free_port() for name in ("upstream", "proxy", "gunicorn")}
    env = setup.app_env(ports, work)
    workers = []
    try:
        setup.recreate_database(env, work)
        setup.start_nginx(ports, work)
        ctx = scenarios.Context(bench=None, env=env, ports=ports, work=work,
                                upstream=f"http://127.0.0.1:{ports['upstream']}", gateway="", paths={},
                                log=print)
        seed.load_bench_module(ctx)
        os.environ.update(env)
        keys = [a["key"] for a in fixtures.main(ACCOUNTS, scenarios.GRANT_CENTS)]
        for tree in trees:
            wenv = dict(env, PYTHONPATH=str(tree), BENCH_CALLCOST_KEYS=json.dumps(keys))
            if os.environ.get("BENCH_CPROFILE"):
                wenv["BENCH_CPROFILE"] = f"{os.environ['BENCH_CPROFILE']}.{len(workers)}"
            workers.append(subprocess.Popen(
                [sys.executable, str(tree / "bench" / "callcost.py"), "--worker"], cwd=tree, env=wenv,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                stderr=(work / f"worker-{len(workers)}.log").open("w")))

        def run(proc, n: int) -> dict:
            proc.stdin.write(f"{n}\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            if not line:
                raise SystemExit(f"worker {proc.args} stopped (exit {proc.wait()}): see {work}/worker-*.log")
            return json.loads(line)

        for proc in workers:
            run(proc, WARM)
        rows: list[list[dict]] = [[] for _ in trees]
        for r in range(ROUNDS):
            order = range(len(trees)) if r % 2 == 0 else reversed(range(len(trees)))
            for i in order:
                rows[i].append(run(workers[i], CALLS))
            print(f"round {r + 1}: " + "  ".join(f"{t.name}: {rows[i][-1]['process']:.3f}/{rows[i][-1]['thread']:.3f}"
                                               for i, t in enumerate(trees)), flush=True)
        print(f"median of {ROUNDS} rounds of {CALLS} calls, CPU ms per metered call (process / calling thread):")
        for i, tree in enumerate(trees):
            line = (f"  {str(tree):40s} {statistics.median(x['process'] for x in rows[i]):.3f} / "
                    f"{statistics.median(x['thread'] for x in rows[i]):.3f}")
            if i:
                ratio = statistics.median(a["process"] / b["process"] for a, b in zip(rows[i], rows[0]))
                line += f"   x{ratio:.3f} of the first (median per-round ratio, process)"
            print(line)
    finally:
        for proc in workers:
            proc.kill()
        setup.RUNNING.stop_all()


if __name__ == "__main__":
    sys.path[0] = str(ROOT)  # not bench/ (its profile.py would shadow the standard library's)
    if sys.argv[1:2] == ["--worker"]:
        worker(json.loads(os.environ["BENCH_CALLCOST_KEYS"]))
    else:
        main([ROOT] + [Path(a).resolve() for a in sys.argv[1:]])
