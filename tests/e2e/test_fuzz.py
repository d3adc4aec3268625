"""CI's bounded schemathesis run (``make fuzz`` runs a bigger budget)."""
from __future__ import annotations

import os

import pytest

from tests.fuzz.run_fuzz import main

pytestmark = pytest.mark.skipif(
    not (os.environ.get("DATABASE_URL") or "").startswith("postgres") and not os.environ.get("RUN_FUZZ"),
    reason="run once per CI (in the PostgreSQL pass) or with RUN_FUZZ=1",
)


def test_schemathesis_all_checks_pass():
    assert main(["--max-examples", "8"]) == 0
