"""CI's short money-under-fault run: worker kills and upstream hangs/resets during
concurrent idempotent calls (``make fault`` adds Redis and PostgreSQL outages)."""
from __future__ import annotations

import os
import socket

import pytest

from tests.fault.money_under_fault import main


def _system_postgres() -> bool:
    """The fault harness runs on the PostgreSQL at 127.0.0.1:5432 (it stops and starts it
    for its outages), whatever DATABASE_URL names."""
    try:
        socket.create_connection(("127.0.0.1", 5432), timeout=1).close()
        return True
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not (os.environ.get("REDIS_URL") and _system_postgres()),
                                reason="needs Redis and the PostgreSQL at 127.0.0.1:5432")


def test_no_money_lost_or_created_under_worker_kills_and_upstream_faults():
    assert main(["--seconds", "8", "--clients", "6", "--faults", "kill,upstream",
                 "--redis-url", os.environ["REDIS_URL"]]) == 0
