"""platform.tokens: single-use tokens — issued hashed, consumed once by one conditional
statement (replays, expiry, wrong purpose and concurrent second uses refused), purged by a
scheduled job."""
from __future__ import annotations

import threading
from datetime import timedelta

from sqlalchemy import func, select, update

from app.extensions import db
from app.ids import sha256_hex
from app.models import SingleUseToken
from app.models.base import utcnow
from app.services.platform import tokens
from app.tasks import job_paths as as_paths
from app.tasks.schedule import SCHEDULE


def stored_anywhere(secret: str) -> list[str]:
    """Names of the tables in which ``secret`` appears in any row, as text."""
    found = []
    for table in db.metadata.sorted_tables:
        rows = db.session.execute(select(table)).all()
        if any(secret in repr(tuple(row)) for row in rows):
            found.append(table.name)
    return found


def test_issue_then_consume_once(ctx):
    token = tokens.issue(tokens.SIGNUP, "a@example.com", 3600, {"k": 1})
    db.session.commit()
    row = tokens.lookup(tokens.SIGNUP, token)
    assert tokens.is_usable(row) and row.subject == "a@example.com"
    redeemed = tokens.consume(tokens.SIGNUP, token)
    db.session.commit()
    assert (redeemed.subject, redeemed.data) == ("a@example.com", {"k": 1})
    assert tokens.consume(tokens.SIGNUP, token) is None
    row = tokens.lookup(tokens.SIGNUP, token)
    assert row.used_at is not None and not tokens.is_usable(row)


def test_token_stored_hashed_only(ctx):
    token = tokens.issue(tokens.NEWSLETTER_CONFIRM, "sub_1", 3600)
    db.session.commit()
    assert len(token) >= 40
    assert db.session.execute(select(SingleUseToken.token_hash)).scalar_one() == sha256_hex(token)
    assert stored_anywhere(token) == []
    chosen = tokens.issue(tokens.AGENT_SIGNIN, None, 60, token="n_" + "a" * 32)  # a public nonce: hashed too
    db.session.commit()
    assert stored_anywhere(chosen) == []


def test_expired_refused(ctx):
    token = tokens.issue(tokens.SIGNUP, "a@example.com", 3600)
    db.session.execute(update(SingleUseToken).values(expires_at=utcnow() - timedelta(seconds=1)))
    db.session.commit()
    assert tokens.consume(tokens.SIGNUP, token) is None
    row = tokens.lookup(tokens.SIGNUP, token)
    assert row is not None and row.used_at is None and not tokens.is_usable(row)


def test_wrong_purpose_refused(ctx):
    token = tokens.issue(tokens.SIGNUP, "a@example.com", 3600)
    db.session.commit()
    assert tokens.lookup(tokens.NEWSLETTER_CONFIRM, token) is None
    assert tokens.consume(tokens.NEWSLETTER_CONFIRM, token) is None
    assert tokens.consume(tokens.SIGNUP, token) is not None


def test_unknown_and_malformed_refused(ctx):
    for bad in (None, "", "x" * 101, "never-issued"):
        assert tokens.consume(tokens.SIGNUP, bad) is None and tokens.lookup(tokens.SIGNUP, bad) is None


def test_consume_rolls_back_with_the_callers_transaction(ctx):
    token = tokens.issue(tokens.SIGNUP, "a@example.com", 3600)
    db.session.commit()
    assert tokens.consume(tokens.SIGNUP, token) is not None
    db.session.rollback()  # the caller's work failed: the token is not spent
    assert tokens.consume(tokens.SIGNUP, token) is not None


def test_find_usable_and_revoke(ctx):
    old = tokens.issue(tokens.WALLET_CONNECT, "acct:base:0xabc", 600)
    new = tokens.issue(tokens.WALLET_CONNECT, "acct:base:0xabc", 600)
    tokens.issue(tokens.WALLET_CONNECT, "other:base:0xabc", 600)
    db.session.commit()
    assert tokens.find_usable(tokens.WALLET_CONNECT, "acct:base:0xabc").token_hash == sha256_hex(new)
    tokens.consume(tokens.WALLET_CONNECT, new)
    assert tokens.find_usable(tokens.WALLET_CONNECT, "acct:base:0xabc").token_hash == sha256_hex(old)
    assert tokens.revoke(tokens.WALLET_CONNECT, "acct:base:0xabc") == 1  # the used one is kept
    assert tokens.find_usable(tokens.WALLET_CONNECT, "acct:base:0xabc") is None
    assert tokens.find_usable(tokens.WALLET_CONNECT, "other:base:0xabc") is not None


def test_concurrent_double_consume_only_one_wins(app):
    with app.app_context():
        token = tokens.issue(tokens.SIGNUP, "race@example.com", 3600)
        db.session.commit()
        db.session.remove()
    n = 6
    barrier = threading.Barrier(n)
    results = []

    def attempt():
        with app.app_context():
            try:
                barrier.wait()
                results.append(tokens.consume(tokens.SIGNUP, token) is not None)
                db.session.commit()
            finally:
                db.session.remove()

    threads = [threading.Thread(target=attempt) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * (n - 1) + [True]


def test_purge_deletes_spent_tokens_only(ctx):
    now = utcnow()
    fresh = tokens.issue(tokens.SIGNUP, "fresh@example.com", 3600)
    just_used = tokens.issue(tokens.SIGNUP, "used@example.com", 3600)
    tokens.issue(tokens.SIGNUP, "stale@example.com", 3600)
    tokens.issue(tokens.WALLET_CONNECT, "acct:base:0xabc", 600)
    tokens.issue(tokens.AGENT_SIGNIN, None, 300)
    db.session.commit()
    tokens.consume(tokens.SIGNUP, just_used)
    db.session.execute(update(SingleUseToken).where(SingleUseToken.subject == "stale@example.com")
                       .values(expires_at=now - timedelta(days=2)))
    db.session.execute(update(SingleUseToken).where(SingleUseToken.purpose != tokens.SIGNUP)
                       .values(expires_at=now - timedelta(days=1, minutes=1), used_at=None))
    db.session.commit()
    assert tokens.purge() == 3  # expired over a day ago: stale sign-up, wallet and agent nonces
    left = dict(db.session.execute(select(SingleUseToken.subject, SingleUseToken.used_at)).all())
    assert set(left) == {"fresh@example.com", "used@example.com"}  # a recent use is kept a day
    db.session.execute(update(SingleUseToken).where(SingleUseToken.used_at.is_not(None))
                       .values(used_at=now - timedelta(days=2)))
    db.session.commit()
    assert tokens.purge() == 1
    assert db.session.execute(select(func.count()).select_from(SingleUseToken)).scalar_one() == 1
    assert tokens.lookup(tokens.SIGNUP, fresh) is not None


def test_purge_is_scheduled_and_runs_from_its_job(ctx):
    assert ("tokens-purge", 3600, "app.tasks.tokens.purge") in as_paths(SCHEDULE)
    from app.tasks import tokens as token_jobs

    tokens.issue(tokens.SIGNUP, "a@example.com", 1)
    db.session.execute(update(SingleUseToken).values(expires_at=utcnow() - timedelta(days=3)))
    db.session.commit()
    assert token_jobs.purge() == 1
