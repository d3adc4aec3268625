"""Bench accounts, created through the app's own services (run as a subprocess with the
run's production environment): ``python -m bench.fixtures N GRANT_CENTS`` creates N
enterprise-plan accounts, each with a full-scope live key and GRANT_CENTS of operator
credit posted through the ledger, and prints ``[{"account_id", "key"}, ...]`` as JSON."""
from __future__ import annotations

import json
import sys


def main(n: int, grant_cents: int) -> list[dict]:
    from app import create_app
    from app.scopes import ALL_SCOPES
    from app.services.accounts import accounts
    from app.services.accounts import keys

    app = create_app()
    out = []
    with app.app_context():
        for i in range(n):
            acct = accounts.create_account(f"bench{i}@bench.example.com", plan="enterprise")
            _, secret = keys.mint(acct.id, "bench", ALL_SCOPES)
            accounts.grant_credits(acct.id, grant_cents, "bench funding")
            out.append({"account_id": acct.id, "key": secret})
    return out


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]))))
