"""The metered call's open for a group of calls (``money.charging.GroupOpener``,
``gw_open_calls``, app/services/money/sql/): opens that arrive while one is being
written share the next statement; each row gets its own answer, a refused row leaves
nothing of itself behind while the others of its statement are opened, a statement that
fails for another reason is retried row by row (one call's error never reaches another),
rows are locked in account order, and a group's statement gives up a lock wait after
``GROUP_LOCK_WAIT_MS`` instead of deadlocking or holding up every other open of
the process (the three deadlocks and the stall a review reproduced)."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import DBAPIError

from app.extensions import db
from app.models import IdempotencyRecord, LedgerTransaction, ModuleCall
from app.services.money import charging
from app.services.money.revenue_share import call_legs
from tests.gateway_helpers import balance_cents, mod, provider, provider_server  # noqa: F401
from tests.support.locks import waiting_for_a_lock, waits_for_the_counter_first

# --- the leader / followers, without a database --------------------------------------------


def _row(call_id: str) -> dict:
    return {"call_id": call_id}


def _queued(opener, n: int) -> None:
    """Wait until ``n`` opens queue behind the statement in flight."""
    deadline = time.monotonic() + 10
    while len(opener._queue) < n:
        assert time.monotonic() < deadline, f"{len(opener._queue)} of {n} queued"
        time.sleep(0.005)


def test_opens_arriving_during_a_write_share_the_next_statement(monkeypatch):
    groups: list[list[str]] = []
    first_started, release = threading.Event(), threading.Event()

    def write(rows, **kw):
        groups.append([r["call_id"] for r in rows])
        first_started.set()
        release.wait(10)  # the statement's round trip (the first one: until the rest queued)
        return {r["call_id"]: charging.Opened("insufficient" if r["call_id"].endswith("-poor") else "opened")
                for r in rows}

    monkeypatch.setattr(charging, "_open_group", write)
    opener = charging.GroupOpener()
    with ThreadPoolExecutor(max_workers=12) as pool:
        lead = pool.submit(opener.open, _row("c-0"))
        first_started.wait(2)
        rest = [f"c-{i}" + ("-poor" if i == 5 else "") for i in range(1, 12)]
        futures = {cid: pool.submit(opener.open, _row(cid)) for cid in rest}
        _queued(opener, len(rest))
        release.set()
        assert lead.result(5).outcome == "opened"
        outcomes = {cid: f.result(5).outcome for cid, f in futures.items()}
    assert outcomes == {cid: "insufficient" if cid.endswith("-poor") else "opened" for cid in rest}
    assert groups[0] == ["c-0"]
    assert sorted(c for g in groups[1:] for c in g) == sorted(rest)  # each written once
    assert len(groups) == 2  # ... all in ONE statement
    assert not opener._busy and opener._queue == []


def test_a_failed_group_is_retried_row_by_row(monkeypatch):
    """The group's statement fails for one bad row: every other row is opened alone, the
    bad row alone gets the error."""
    statements: list[list[str]] = []
    gate = threading.Event()

    def write(rows, **kw):
        ids = [r["call_id"] for r in rows]
        statements.append(ids)
        if len(statements) == 1:
            gate.wait(2)  # everyone else queues behind the first statement
        if "bad" in ids:
            raise DBAPIError("SELECT gw_open_calls(...)", {}, Exception("duplicate key value"))
        return {i: charging.Opened("opened") for i in ids}

    monkeypatch.setattr(charging, "_open_group", write)
    opener = charging.GroupOpener()
    with ThreadPoolExecutor(max_workers=8) as pool:
        first = pool.submit(opener.open, _row("a"))
        while not statements:
            time.sleep(0.005)
        queued = {cid: pool.submit(opener.open, _row(cid)) for cid in ("b1", "bad", "b2", "b3")}
        _queued(opener, 4)
        gate.set()
        assert first.result(5).outcome == "opened"
        for cid, f in queued.items():
            if cid == "bad":
                with pytest.raises(DBAPIError, match="duplicate key"):
                    f.result(5)
            else:
                assert f.result(5).outcome == "opened"
    assert sorted(statements[1]) == ["b1", "b2", "b3", "bad"]  # the group, then each alone
    assert sorted(map(tuple, statements[2:])) == [("b1",), ("b2",), ("b3",), ("bad",)]
    assert not opener._busy


def test_a_lone_rows_error_is_its_own(monkeypatch):
    def write(rows, **kw):
        raise DBAPIError("SELECT gw_open_calls(...)", {}, Exception("server closed the connection"))

    monkeypatch.setattr(charging, "_open_group", write)
    opener = charging.GroupOpener()
    with pytest.raises(DBAPIError, match="server closed"):
        opener.open(_row("solo"))
    assert not opener._busy and opener._queue == []


@pytest.mark.parametrize("value", ["0", "901"])
def test_the_lock_wait_setting_is_bounded(monkeypatch, value):
    """0 would mean no limit (a group could deadlock); 900+ would reach deadlock_timeout."""
    from config import ConfigError, load_config
    monkeypatch.setenv("GROUP_LOCK_WAIT_MS", value)
    with pytest.raises(ConfigError, match="GROUP_LOCK_WAIT_MS"):
        load_config({"APP_ENV": "test"})


def test_split_groups_are_counted(monkeypatch):
    from app import metrics

    def write(rows, *, lock_wait):
        if lock_wait and len(rows) > 1:
            raise DBAPIError("SELECT gw_open_calls(...)", {}, _LockNotAvailable("lock timeout"))
        return {r["call_id"]: charging.Opened("opened") for r in rows}

    before = metrics.STATEMENT_GROUPS.labels(statement="call_open", outcome="split")._value.get()
    monkeypatch.setattr(charging, "_open_group", write)
    opener = charging.GroupOpener()
    lead = _Gate()
    monkeypatch.setattr(opener, "_write", lead.wrap(opener._write))
    with ThreadPoolExecutor(max_workers=4) as pool:
        first = pool.submit(opener.open, _row("x0"))
        lead.started.wait(2)
        rest = [pool.submit(opener.open, _row(f"x{i}")) for i in range(1, 4)]
        _queued(opener, 3)
        lead.release.set()
        assert [f.result(5).outcome for f in [first, *rest]] == ["opened"] * 4
    assert metrics.STATEMENT_GROUPS.labels(statement="call_open", outcome="split")._value.get() == before + 1


class _Gate:
    """Holds the first group's statement until released (the others queue meanwhile)."""

    def __init__(self):
        self.started, self.release, self.n = threading.Event(), threading.Event(), 0

    def wrap(self, fn):
        def held(group):
            self.n += 1
            if self.n == 1:
                self.started.set()
                self.release.wait(10)
            return fn(group)
        return held


class _LockNotAvailable(Exception):
    sqlstate = "55P03"


def test_a_group_that_gave_up_a_lock_wait_goes_alone_without_the_limit(monkeypatch):
    """Even a one-row group: it gave up its lock wait so as not to hold up the queue; alone
    (outside the queue) the call waits as long as it takes."""
    waits: list[tuple[list[str], bool]] = []

    def write(rows, *, lock_wait):
        waits.append(([r["call_id"] for r in rows], lock_wait))
        if lock_wait:
            raise DBAPIError("SELECT gw_open_calls(...)", {}, _LockNotAvailable("canceling statement due to lock timeout"))
        return {r["call_id"]: charging.Opened("opened") for r in rows}

    from app import metrics

    before = metrics.STATEMENT_GROUPS.labels(statement="call_open", outcome="alone")._value.get()
    monkeypatch.setattr(charging, "_open_group", write)
    opener = charging.GroupOpener()
    assert opener.open(_row("one")).outcome == "opened"
    assert waits == [(["one"], True), (["one"], False)]
    assert not opener._busy
    assert metrics.STATEMENT_GROUPS.labels(statement="call_open", outcome="alone")._value.get() == before + 1


# --- gw_open_calls -------------------------------------------------------------------------


def _rows(app, specs):
    """``gw_open_calls`` rows for ``specs``: (account_id, idem_key, spend_key), 3¢ each."""
    from app.services.gateway import catalog

    m = catalog.get_module("svc")
    act = catalog.get_action(m, "ok")
    out = []
    for account_id, key, spend_key in specs:
        opened, row = charging.open_row(account_id=account_id, mode="live", mod=m, act=act, idem_key=key,
                                        req_hash="h-" + (key or "none"), price_micros=30_000, charged=True,
                                        legs=call_legs(account_id, 30_000, m.owner_agent_id),
                                        spend_key=spend_key)
        out.append((opened, row))
    return out


def _limit(app, key_id: str, micros: int, period: str = "day") -> str:
    """Give ``key_id`` a spend limit of ``micros`` per ``period``; returns the key id."""
    with app.app_context():
        db.session.execute(text("UPDATE api_keys SET spend_limit_micros = :m, spend_limit_period = :p "
                                "WHERE id = :k"), {"m": micros, "p": period, "k": key_id})
        db.session.commit()
        db.session.remove()
    return key_id


def _key_id(app, account_id: str) -> str:
    with app.app_context():
        kid = db.session.execute(text("SELECT id FROM api_keys WHERE account_id = :a ORDER BY created_at LIMIT 1"),
                                 {"a": account_id}).scalar_one()
        db.session.remove()
        return kid


def test_one_statement_opens_each_row_or_refuses_it_alone(app, make_account, mod, ledger_clean):
    """Five rows in ONE statement: two opened, one refused for funds, one for its key's
    spend limit, one whose key is taken. The refused rows leave nothing behind (no key
    record, no spend, no debit, no call, no posting); the others are booked in full."""
    rich, other, poor, limited = (make_account(cents=100), make_account(cents=100), make_account(cents=2),
                                  make_account(cents=100))
    limited_key = _limit(app, _key_id(app, limited.id), 20_000)
    with app.test_request_context():
        # the key "taken" is held by an earlier call of the rich account
        (first, first_row), = _rows(app, [(rich.id, "taken", None)])
        assert charging._open_group([first_row], lock_wait=False)[str(first)].outcome == "opened"
        made = _rows(app, [(poor.id, "poor-key", None), (rich.id, "r-1", None), (limited.id, "lim-key", limited_key),
                           (rich.id, "taken", None), (other.id, None, None)])
        answers = charging._open_group([r for _, r in made], lock_wait=True)
        db.session.remove()
    outcome = {str(c): answers[str(c)].outcome for c, _ in made}
    ids = [str(c) for c, _ in made]
    assert [outcome[i] for i in ids] == ["insufficient", "opened", "key_spend_limit", "existing", "opened"]
    assert answers[ids[3]].idem_status == "in_flight" and answers[ids[3]].idem_hash == "h-taken"
    with app.app_context():
        calls = dict(db.session.execute(select(ModuleCall.id, ModuleCall.status)).all())
        assert {i for i in ids if i in calls} == {ids[1], ids[4]}
        assert calls[ids[1]] == "pending" and calls[ids[4]] == "pending"
        keys = {(r.account_id, r.key): r.call_id for r in db.session.execute(select(IdempotencyRecord)).scalars()}
        assert (poor.id, "poor-key") not in keys and (limited.id, "lim-key") not in keys
        assert keys[(rich.id, "taken")] == str(first) and keys[(rich.id, "r-1")] == ids[1]
        refs = set(db.session.execute(select(LedgerTransaction.ref)).scalars())
        assert f"call:{ids[1]}" in refs and f"call:{ids[4]}" in refs
        assert f"call:{ids[0]}" not in refs and f"call:{ids[2]}" not in refs
        spent = db.session.execute(text("SELECT coalesce(sum(spent_micros), 0) FROM key_spend WHERE key_id = :k"),
                                   {"k": limited_key}).scalar_one()
        assert spent == 0
        db.session.remove()
    assert balance_cents(app, rich.id) == 100 - 2 * 3
    assert balance_cents(app, other.id) == 100 - 3
    assert balance_cents(app, poor.id) == 2
    assert balance_cents(app, limited.id) == 100
    ledger_clean()


def test_a_refusal_after_the_spend_reservation_takes_it_back(app, make_account, mod, ledger_clean):
    """A key with room in its spend limit, an account without the funds: the spend
    counter reserved before the debit is taken back with the refusal, and a key that
    replaced an expired record is released (a retry with it is a new call)."""
    poor = make_account(cents=2)
    kid = _key_id(app, poor.id)
    with app.app_context():
        db.session.execute(text("UPDATE api_keys SET spend_limit_micros = 1000000, spend_limit_period = 'month' "
                                "WHERE id = :k"), {"k": kid})
        db.session.execute(text(
            "INSERT INTO idempotency_records (account_id, key, request_hash, call_id, status, created_at, expires_at) "
            "VALUES (:a, 'old-key', 'h-old', 'call_old', 'done', now() - interval '2 days', now() - interval '1 day')"),
            {"a": poor.id})
        db.session.commit()
        db.session.remove()
    with app.test_request_context():
        made = _rows(app, [(poor.id, "old-key", kid), (poor.id, None, kid)])
        answers = charging._open_group([r for _, r in made], lock_wait=True)
        db.session.remove()
    assert [answers[str(c)].outcome for c, _ in made] == ["insufficient", "insufficient"]
    with app.app_context():
        assert db.session.execute(text("SELECT coalesce(sum(spent_micros), 0) FROM key_spend WHERE key_id = :k"),
                                  {"k": kid}).scalar_one() == 0
        assert db.session.execute(text("SELECT count(*) FROM idempotency_records WHERE account_id = :a"),
                                  {"a": poor.id}).scalar_one() == 0
        db.session.remove()
    assert balance_cents(app, poor.id) == 2
    ledger_clean()


def test_rows_are_locked_in_account_order(app, make_account, mod, ledger_clean):
    """Another transaction holds the first account's row and then asks for the second's.
    The group, handed its rows in the other order, must take the first account first (and
    wait), not hold the second: that would be a deadlock, and PostgreSQL would fail one
    of the two after deadlock_timeout. Fails without the function's ORDER BY."""
    a, b = sorted([make_account(cents=100).id, make_account(cents=100).id])
    with app.test_request_context():
        made = _rows(app, [(b, None, None), (a, None, None)])
        db.session.remove()
    result: dict = {}

    def group():
        with app.test_request_context():
            try:
                result["answers"] = charging._open_group([r for _, r in made], lock_wait=False)
            except Exception as exc:  # noqa: BLE001 - the assertion below reports it
                result["error"] = exc

    with app.app_context():
        with db.engine.connect() as other:
            other.execute(text("UPDATE accounts SET balance_micros = balance_micros WHERE id = :a"), {"a": a})
            worker = threading.Thread(target=group)
            worker.start()
            _lock_waiters(app, 1)  # the group waits for account a
            other.execute(text("SET LOCAL lock_timeout = '5s'"))
            other.execute(text("UPDATE accounts SET balance_micros = balance_micros WHERE id = :b"), {"b": b})
            other.commit()
        worker.join(10)
        db.session.remove()
    assert "error" not in result, result.get("error")
    assert sorted(x.outcome for x in result["answers"].values()) == ["opened", "opened"]
    assert balance_cents(app, a) == 97 and balance_cents(app, b) == 97
    ledger_clean()


def test_concurrent_calls_through_the_route_share_statements(app, make_account, mod, ledger_clean, monkeypatch):
    """Calls through the real route while an open is held: they go out together and each
    gets its own call, charged once (the refused one not at all)."""
    from tests.gateway_helpers import call

    real = charging._open_group
    sizes: list[int] = []
    started, hold = threading.Event(), threading.Event()

    def held(rows, **kw):
        sizes.append(len(rows))
        if len(sizes) == 1:
            started.set()
            hold.wait(10)
        return real(rows, **kw)

    monkeypatch.setattr(charging, "_open_group", held)
    accts = [make_account(cents=100) for _ in range(6)] + [make_account(cents=1)]

    def one(i):
        with app.test_client() as c:
            r = call(c, accts[i], {"action": "ok", "i": i}, key=f"route-{i}")
            return i, r.status_code, r.get_json()

    with ThreadPoolExecutor(max_workers=7) as pool:
        futures = [pool.submit(one, 0)]
        assert started.wait(10)  # the first open is being written ...
        futures += [pool.submit(one, i) for i in range(1, 7)]
        opener = app.extensions["gateway.group_opener"]
        deadline = time.monotonic() + 10
        while len(opener._queue) < 6 and time.monotonic() < deadline:  # ... the others queue
            time.sleep(0.01)
        hold.set()
        answers = [f.result(10) for f in futures]
    for i, status, data in answers:
        if i == 6:
            assert status == 402, data
        else:
            assert status == 200, data
            assert data["result"]["echo"]["i"] == i
    assert sizes == [1, 6]  # the six queued meanwhile went out in ONE statement
    for a in accts[:6]:
        assert balance_cents(app, a.id) == 97
    assert balance_cents(app, accts[6].id) == 1
    ledger_clean()


# --- what the review reproduced: a group gives up its lock wait instead ---------------------


def _run_group(app, rows, out, name):
    def go():
        with app.test_request_context():
            try:
                out[name] = charging._open_group(rows, lock_wait=True)
            except Exception as exc:  # noqa: BLE001 - the test's assertions report it
                out[name] = exc
            db.session.remove()
    t = threading.Thread(target=go)
    t.start()
    return t


def _lock_waiters(app, n: int) -> None:
    """Wait until ``n`` of the test database's ``gw_open_calls`` statements are waiting
    for a lock (so the interleaving a test sets up has really happened)."""
    waiting_for_a_lock("gw_open_calls", n)


def _gave_up(result) -> bool:
    return isinstance(result, DBAPIError) and getattr(result.orig, "sqlstate", None) == "55P03"


def _group_gives_way_to_writer(app, made, first, second) -> None:
    """Another writer runs ``first`` (sql, params: takes a lock), the group of ``made``'s
    rows starts and waits for a lock, the writer runs ``second`` (wants a lock the group
    may hold) and rolls back (its effect is not what is tested). No deadlock: the group
    gives up its wait and the writer goes through."""
    rows = [r for _, r in made]
    out: dict = {}
    with app.app_context():
        with db.engine.connect() as writer:
            writer.execute(text("SET LOCAL lock_timeout = '5s'"))
            writer.execute(text(first[0]), first[1])
            t = _run_group(app, rows, out, "group")
            _lock_waiters(app, 1)
            try:
                writer.execute(text(second[0]), second[1])
                writer.rollback()
                out["writer"] = "ok"
            except Exception as exc:  # noqa: BLE001 - the caller's assertions report it
                out["writer"] = exc
        t.join(10)
        db.session.remove()
    group, writer = out["group"], out["writer"]
    _no_deadlock(group, writer)
    assert writer == "ok" and _gave_up(group), (group, writer)


def _no_deadlock(*results):
    assert not any("deadlock detected" in str(r) for r in results), results


def test_same_key_in_two_groups(app, make_account, mod):
    """Two processes' groups both carry (A, k) (a duplicate request); one also an earlier
    row of A. G1 holds A and waits for the key G2 inserted, G2 holds the key and waits for
    A: a deadlock (reported after 1 s, a 500) before 0028; now one group gives up its wait
    and the other goes through."""
    a = make_account(cents=100).id
    with app.test_request_context():
        g1 = _rows(app, [(a, None, None), (a, "k", None)])
        g2 = _rows(app, [(a, "k", None)])
        db.session.remove()
    out: dict = {}
    with app.app_context():
        with db.engine.connect() as other:  # holds A so that both groups queue behind it
            other.execute(text("SET LOCAL lock_timeout = '5s'"))
            other.execute(text("UPDATE accounts SET balance_micros = balance_micros WHERE id = :a"), {"a": a})
            t1 = _run_group(app, [r for _, r in g1], out, "g1")
            _lock_waiters(app, 1)  # g1 waits for A at its first row
            t2 = _run_group(app, [r for _, r in g2], out, "g2")
            _lock_waiters(app, 2)  # g2 inserted (A, k), waits for A
            other.commit()  # g1 takes A, then waits for g2's key: the cycle
        t1.join(10)
        t2.join(10)
        db.session.remove()
    _no_deadlock(out["g1"], out["g2"])
    if not (_gave_up(out["g1"]) or _gave_up(out["g2"])):
        # on a loaded machine g2 may win A after the commit: then no cycle formed, g2 went
        # through and g1's (A, k) found its key (the case this test is about is the other one)
        assert isinstance(out["g1"], dict) and any(o.outcome == "existing" for o in out["g1"].values()), out
    assert all(_gave_up(r) or isinstance(r, dict) for r in out.values()), out


def test_an_existing_rows_key_lock_and_a_refund(app, make_account, mod):
    """A group's row answered ``existing`` keeps the key's record locked (ON CONFLICT DO
    UPDATE locks the conflicting row even when its WHERE is false) while a later row waits
    for the account — which a refund of that key's call holds while it waits to delete the
    record (refunds.refund's order). Before 0028: a deadlock; now the group gives up and
    the refund goes through."""
    a = make_account(cents=100).id
    with app.test_request_context():
        (first, first_row), = _rows(app, [(a, "k1", None)])
        assert charging._open_group([first_row], lock_wait=False)[str(first)].outcome == "opened"
        made = _rows(app, [(a, "k1", None), (a, "k2", None)])  # a duplicate k1, a new k2
        db.session.remove()
    # the refund: account a first; the group meanwhile answers existing for k1 (record
    # locked) and waits for account a; then the refund wants k1's record
    _group_gives_way_to_writer(
        app, made,
        ("UPDATE accounts SET balance_micros = balance_micros + 30000 WHERE id = :a", {"a": a}),
        ("DELETE FROM idempotency_records WHERE account_id = :a AND key = 'k1'", {"a": a}))


def test_a_writer_locking_two_accounts_in_another_order(app, make_account, mod):
    """An agent's funding debits the owner, then credits the agent (ledger.post: debits
    first), whatever their ids; a group with a call of each takes the lower id first. A
    deadlock before 0028; now the group gives up and the funding goes through."""
    agent_acct, owner_acct = sorted([make_account(cents=100).id, make_account(cents=100).id])
    with app.test_request_context():
        made = _rows(app, [(agent_acct, None, None), (owner_acct, None, None)])
        db.session.remove()
    # the funding: the owner's account first; the group meanwhile locks the agent's and
    # waits for the owner's; then the funding wants the agent's
    _group_gives_way_to_writer(
        app, made,
        ("UPDATE accounts SET balance_micros = balance_micros - 10000 WHERE id = :o", {"o": owner_acct}),
        ("UPDATE accounts SET balance_micros = balance_micros + 10000 WHERE id = :g", {"g": agent_acct}))
    assert balance_cents(app, agent_acct) == 100 and balance_cents(app, owner_acct) == 100


def test_one_accounts_locked_row_does_not_hold_up_other_accounts(app, make_account, mod, ledger_clean):
    """A transaction holds account A's row. An open of A leads and waits; an open of B in
    the same process queues behind it. Before 0028 B waited as long as A's row stayed
    locked (no limit); now A's statement gives up after the lock wait, A waits alone
    outside the queue, and B is opened meanwhile. Both are charged once."""
    a, b = make_account(cents=100).id, make_account(cents=100).id
    with app.test_request_context():
        (ra,), (rb,) = _rows(app, [(a, None, None)]), _rows(app, [(b, None, None)])
        db.session.remove()
    opener = charging.GroupOpener()
    done: dict = {}

    def open_(name, row):
        with app.test_request_context():
            done[name] = opener.open(row[1]).outcome
            db.session.remove()

    with app.app_context():
        with db.engine.connect() as other:
            other.execute(text("UPDATE accounts SET balance_micros = balance_micros WHERE id = :a"), {"a": a})
            ta = threading.Thread(target=open_, args=("a", ra))
            ta.start()
            _lock_waiters(app, 1)  # A's statement (a group of one) waits for A's row ...
            tb = threading.Thread(target=open_, args=("b", rb))
            tb.start()
            tb.join(5)  # ... and B, queued behind it, is opened once it gives up
            b_done_while_a_locked = dict(done)
            other.commit()
        ta.join(10)
        tb.join(10)
        db.session.remove()
    assert b_done_while_a_locked == {"b": "opened"}, done
    assert done == {"a": "opened", "b": "opened"}
    assert balance_cents(app, a) == 97 and balance_cents(app, b) == 97
    ledger_clean()


def test_a_refused_second_debit_credits_back_the_first(app, make_account, mod, ledger_clean):
    """Legs that debit two accounts (the function allows it; ``revenue_share.call_legs`` makes one):
    the second refused, the first is credited back, nothing stays."""
    from app.services.money import ledger
    from app.services.gateway import catalog

    rich, poor = make_account(cents=100).id, make_account(cents=1).id
    with app.test_request_context():
        m = catalog.get_module("svc")
        act = catalog.get_action(m, "ok")
        opened, row = charging.open_row(account_id=rich, mode="live", mod=m, act=act, idem_key="mk",
                                        req_hash="h", price_micros=60_000, charged=True,
                                        legs=[(ledger.customer(rich), -30_000), (ledger.customer(poor), -30_000),
                                              (ledger.REVENUE, 60_000)])
        assert charging._open_group([row], lock_wait=False)[str(opened)].outcome == "insufficient"
        db.session.remove()
    assert balance_cents(app, rich) == 100 and balance_cents(app, poor) == 1
    ledger_clean()


def test_a_committed_group_sent_again_charges_nothing_twice(app, make_account, mod, ledger_clean):
    """What ``run_one`` does after a commit whose answer was lost: the same rows again.
    The whole statement fails (the duplicate call id), and alone each row is ``existing``
    (with a key) or fails the same way: every call charged once."""
    from sqlalchemy.exc import IntegrityError

    a, b, c = (make_account(cents=100).id for _ in range(3))
    with app.test_request_context():
        rows = [r for _, r in _rows(app, [(a, "ka", None), (b, None, None), (c, "kc", None)])]
        first = charging._open_group(rows, lock_wait=True)
        with pytest.raises(IntegrityError):
            charging._open_group(rows, lock_wait=True)
        alone = []
        for r in rows:
            try:
                alone.append(charging.GroupOpener().submit_alone(r).outcome)
            except IntegrityError:
                alone.append("duplicate")
        db.session.remove()
    assert {v.outcome for v in first.values()} == {"opened"}
    assert alone == ["existing", "duplicate", "existing"]
    assert [balance_cents(app, x) for x in (a, b, c)] == [97, 97, 97]
    ledger_clean()


def test_an_open_waits_in_the_group_holding_no_connection(app, client, make_account, mod, monkeypatch,
                                                          ledger_clean):
    """A follower waits for the leader's statement; it must not hold a connection meanwhile
    (the session's reads of the credential lookup end before the open joins the group):
    followers holding every server connection behind PgBouncer left the leader waiting
    for one, and the calls hung (tests/e2e/test_connection_budget.py, 60 s timeouts).
    Failed before: the session was still in its transaction when the open queued."""
    from tests.gateway_helpers import call

    seen = []
    real = charging.GroupOpener.open

    def spy(self, row):
        seen.append(db.session.registry.has() and db.session().in_transaction())
        return real(self, row)

    monkeypatch.setattr(charging.GroupOpener, "open", spy)
    acct = make_account(cents=100)
    r = call(client, acct, {"action": "ok"}, key="held-1")  # the tests run without the credential cache
    assert r.status_code == 200, r.get_json()
    assert seen == [False]
    ledger_clean()


def test_a_refund_takes_the_keys_counter_before_the_balance_row(app, make_account, mod, ledger_clean):
    """The lock order of every money operation (docs/money.md, "Lock order"): a refund
    waiting for its key's spend counter (held by another transaction, e.g. an open of the
    same key) has not yet locked the account's balance row. Failed before: the refund
    credited the balance first and gave the reservation back after, so an open of the same
    key (counter first, balance second) could wait on it crosswise."""
    from app.services.money import refunds

    acct = make_account(cents=100).id
    key = _limit(app, _key_id(app, acct), 1_000_000)
    with app.test_request_context():
        (opened, row), = _rows(app, [(acct, "rk", key)])
        assert charging._open_group([row], lock_wait=False)[str(opened)].outcome == "opened"
        db.session.remove()
    done = []

    def refund():
        with app.test_request_context():
            done.append(refunds.refund(opened, "provider_error"))
            db.session.remove()

    with app.app_context():
        waits_for_the_counter_first(key, acct, refund, "gw_spend_release")
        db.session.remove()
    assert done == [True]
    assert balance_cents(app, acct) == 100
    ledger_clean()
