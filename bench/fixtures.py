"""Bench accounts, created through the app's own services (run as a subprocess with the
run's production environment): ``python -m bench.fixtures N GRANT_CENTS [READ_KEYS]``
creates N enterprise-plan accounts, each with a full-scope live key and GRANT_CENTS of
operator credit posted through the ledger, and prints ``[{"account_id", "key"}, ...]`` as
JSON. The first account is on the bench's own plan (``passthrough.BENCH_PLAN``: enterprise
with ten times its rate limit, so ``metered-1acct`` measures its balance row, not the
plan's limit) and also gets ``read_keys``: its key plus READ_KEYS - 1 more live keys (the
usage reads and ``metered-1acct`` rotate over them, see ``scenarios``)."""
from __future__ import annotations

import json
import sys


def main(n: int, grant_cents: int, read_keys: int = 1) -> list[dict]:
    from app import create_app
    from app.scopes import ALL_SCOPES
    from app.services.accounts import accounts
    from app.services.accounts import keys
    from bench.passthrough import BENCH_PLAN, add_bench_plan

    app = create_app()
    add_bench_plan(app)
    out = []
    with app.app_context():
        for i in range(n):
            acct = accounts.create_account(f"bench{i}@bench.example.com", plan=BENCH_PLAN if i == 0 else "enterprise")
            _, secret = keys.mint(acct.id, "bench", ALL_SCOPES)
            accounts.grant_credits(acct.id, grant_cents, "bench funding")
            out.append({"account_id": acct.id, "key": secret})
        if out:
            out[0]["read_keys"] = [out[0]["key"]] + [keys.mint(out[0]["account_id"], f"bench-read-{j}",
                                                               ALL_SCOPES)[1]
                                                     for j in range(1, read_keys)]
    return out


if __name__ == "__main__":
    print(json.dumps(main(*(int(a) for a in sys.argv[1:4]))))
