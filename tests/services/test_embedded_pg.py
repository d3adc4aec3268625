"""The embedded PostgreSQL of ``make run`` and ``make test`` without ``DATABASE_URL``
(app/services/platform/embedded_pg.py). It runs whatever ``DATABASE_URL`` names, so a
run on another server (CI's) still exercises the embedded default."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest

from app.services.platform import embedded_pg

ROOT = Path(__file__).resolve().parents[2]


def _postmaster(pgdata: Path) -> str:
    return (pgdata / "postmaster.pid").read_text().split("\n")[0]


@pytest.fixture
def instance():
    """A directory of its own under /tmp, not pytest's ``tmp_path``: as root the server runs
    as ``embedded_postgres``, which must traverse the parents, and any pytest run of the same
    user puts /tmp/pytest-of-<user> back to 0700 (a run of another worktree did, mid-test)."""
    path = Path(tempfile.mkdtemp(prefix="gw-embedded-pg-"))
    yield path / "instance"
    shutil.rmtree(path, ignore_errors=True)


def test_one_server_per_instance_shared_by_every_process_and_stopped_at_the_end(instance):
    pgdata = instance / "pg"
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["INSTANCE_PATH"] = str(instance)
    try:
        # Two processes needing it at once (gunicorn and the scheduler of `make run`, say):
        # the first runs initdb and starts it, the other waits for it and finds the same one.
        procs = [subprocess.Popen([sys.executable, "-m", "app.services.platform.embedded_pg", "start"],
                                  cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
        outs = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
        urls = {out.strip() for out, _ in outs}
        assert urls == {f"postgresql://postgres:@/gateway?host={pgdata}"}, urls
        postmaster = _postmaster(pgdata)
        with psycopg.connect(urls.pop()) as conn:
            assert int(conn.execute("SHOW server_version_num").fetchone()[0]) >= 180000
            assert not conn.execute("SHOW listen_addresses").fetchone()[0]  # a Unix socket only

        # The app's configuration without DATABASE_URL (a `flask` command in another
        # terminal) uses that server: no second one.
        probe = ("from config import load_config; "
                 "print(load_config({'APP_ENV': 'development'})['SQLALCHEMY_DATABASE_URI'])")
        out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip() == f"postgresql+psycopg://postgres:@/gateway?host={pgdata}"
        assert _postmaster(pgdata) == postmaster
    finally:
        stopped = embedded_pg.stop(pgdata)
    assert stopped and not (pgdata / "postmaster.pid").exists()
    assert embedded_pg.stop(pgdata) is False  # nothing left to stop

    # Started again (the next `make run`), it keeps its data.
    url = embedded_pg.start(pgdata, database="other")
    try:
        with psycopg.connect(url) as conn:
            names = {r[0] for r in conn.execute("SELECT datname FROM pg_database")}
        assert {"gateway", "other"} <= names
    finally:
        assert embedded_pg.stop(pgdata)
    # The same process starts it again after that stop (no stale handle of the one before).
    url = embedded_pg.start(pgdata, database="other")
    try:
        psycopg.connect(url).close()
    finally:
        assert embedded_pg.stop(pgdata)
