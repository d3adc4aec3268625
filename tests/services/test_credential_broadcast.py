"""Plan and admin changes reach every worker like revocations (issue 36 item 7: a plan
change reached the other workers only after up to 30 s): the changing process drops the
account's cached credentials and broadcasts ``account:<id>``; a process receiving it
drops them too."""
from __future__ import annotations

from app import auth
from app.services.accounts import accounts


def _cached_plan(app, key: str) -> str:
    with app.test_request_context():
        return auth.resolve(key).plan


def test_a_plan_change_drops_the_accounts_cached_credentials(app, make_account):
    acct, other = make_account(), make_account()
    app.config["AUTH_CACHE_TTL"] = 60.0
    try:
        assert _cached_plan(app, acct.key) == "starter"
        _cached_plan(app, other.key)
        with app.app_context():
            accounts.set_plan(acct.id, "pro")
        assert _cached_plan(app, acct.key) == "pro"  # not the cached "starter"
        cached = {p.account_id for _, p, _ in auth._cache.values()}
        assert other.id in cached  # another account's entry stays
    finally:
        app.config["AUTH_CACHE_TTL"] = 0.0
        auth.clear_cache()


def test_a_received_account_broadcast_drops_that_accounts_entries(app, make_account):
    acct, other = make_account(), make_account()
    app.config["AUTH_CACHE_TTL"] = 60.0
    try:
        _cached_plan(app, acct.key)
        _cached_plan(app, other.key)
        auth._drop(f"account:{acct.id}")  # what the subscriber thread does with the message
        cached = {p.account_id for _, p, _ in auth._cache.values()}
        assert acct.id not in cached and other.id in cached
    finally:
        app.config["AUTH_CACHE_TTL"] = 0.0
        auth.clear_cache()
