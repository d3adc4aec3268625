"""``wsgi:app`` with the plan table's rate limits replaced from ``TEST_PLAN_RATE_LIMITS``
(JSON ``{"starter": "10/hour"}``), for tests that run gunicorn and need a limit whose
window does not end during the test (a machine's speed must not decide the result)."""
from __future__ import annotations

import json
import os

from wsgi import app

_limits = json.loads(os.environ.get("TEST_PLAN_RATE_LIMITS") or "{}")
app.config["PLANS"] = {name: {**plan, **({"rate_limit": _limits[name]} if name in _limits else {})}
                       for name, plan in app.config["PLANS"].items()}
