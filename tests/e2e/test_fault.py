"""CI's short money-under-fault run: worker kills and upstream hangs/resets during
concurrent idempotent calls (``make fault`` adds Redis and PostgreSQL outages)."""
from __future__ import annotations

import os

import pytest

from tests.fault.money_under_fault import main

pytestmark = pytest.mark.skipif(
    not (os.environ.get("REDIS_URL") and (os.environ.get("DATABASE_URL") or "").startswith("postgres")),
    reason="needs PostgreSQL and Redis",
)


def test_no_money_lost_or_created_under_worker_kills_and_upstream_faults():
    assert main(["--seconds", "8", "--clients", "6", "--faults", "kill,upstream",
                 "--redis-url", os.environ["REDIS_URL"]]) == 0
