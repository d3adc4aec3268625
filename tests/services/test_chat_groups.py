"""The chat completion's hold and settle as group statements (``money.holds_pg``:
``GroupHolder`` → ``gw_chat_holds``, ``GroupSettler`` → ``gw_chat_settles``): several
completions in ONE statement, each answered its own outcome; a refused row leaves nothing
of itself and does not touch the others; a group whose statement fails is written row by
row; concurrent completions of one process share statements and the books stay exact."""
from __future__ import annotations

import threading
from datetime import datetime, timezone

import pytest
from sqlalchemy import select, text

from app import metrics
from app.extensions import db
from app.models import ChatCompletion, KeySpend, LedgerTransaction
from app.services.money import charging, holds, holds_pg, ledger
from tests.api.test_chat import chat, fakes, upstreams  # noqa: F401
from tests.support.locks import waits_for_the_counter_first

HOLD = 5_000


def _hold_row(account_id: str, cid: str, hold: int = HOLD, key_id: str | None = None) -> dict:
    return {"id": cid, "account_id": account_id, "actor": None, "requested_model": "m", "stream": False,
            "hold": hold, "spend_key": key_id, "now": datetime.now(timezone.utc),
            "codes": [ledger.customer(account_id), holds.HOLD], "amounts": [-hold, hold]}


def _settle_row(account_id: str, cid: str, created_at, cost: int) -> dict:
    return {"id": cid, "created_at": created_at, "account_id": account_id,
            "customer": ledger.customer(account_id), "hold_code": holds.HOLD, "revenue": ledger.REVENUE,
            "hold": HOLD, "cost": cost, "model": "m", "provider": "p", "prompt_tokens": 1,
            "completion_tokens": 1, "estimated": False, "attempts": 1, "latency_ms": 1, "error": None,
            "now": datetime.now(timezone.utc)}


def _micros(app, account_id: str) -> int:
    with app.app_context():
        out = ledger.balance(ledger.customer(account_id))
        db.session.remove()
    return out


def _completions(app, *ids) -> dict:
    with app.app_context():
        rows = db.session.execute(select(ChatCompletion.id, ChatCompletion.status, ChatCompletion.cost_micros)
                                  .where(ChatCompletion.id.in_(ids))).all()
        db.session.remove()
    return {r[0]: (r[1], r[2]) for r in rows}


def _limited_key(app, account_id: str, limit_micros: int) -> str:
    from app.models import ApiKey

    with app.app_context():
        key = db.session.execute(select(ApiKey).where(ApiKey.account_id == account_id)).scalars().first()
        key.spend_limit_micros, key.spend_limit_period = limit_micros, "day"
        db.session.commit()
        out = key.id
        db.session.remove()
    return out


def test_one_hold_statement_answers_each_row_and_a_refusal_leaves_nothing(app, make_account, ledger_clean):
    rich, poor, limited = make_account(cents=100), make_account(cents=0), make_account(cents=100)
    key = _limited_key(app, limited.id, HOLD - 1)
    rows = [_hold_row(rich.id, "chatcmpl-g-rich"), _hold_row(poor.id, "chatcmpl-g-poor"),
            _hold_row(limited.id, "chatcmpl-g-lim", key_id=key), _hold_row(rich.id, "chatcmpl-g-rich2")]
    with app.test_request_context():
        answers = holds_pg.GroupHolder()._run(rows, lock_wait=True)
        db.session.remove()
    assert answers == {"chatcmpl-g-rich": "held", "chatcmpl-g-poor": "insufficient",
                       "chatcmpl-g-lim": "key_spend_limit", "chatcmpl-g-rich2": "held"}
    assert _micros(app, rich.id) == 1_000_000 - 2 * HOLD
    assert _micros(app, poor.id) == 0 and _micros(app, limited.id) == 1_000_000
    assert _completions(app, *answers) == {"chatcmpl-g-rich": ("held", 0), "chatcmpl-g-rich2": ("held", 0)}
    with app.app_context():  # the refused rows wrote no posting and counted nothing
        refs = db.session.execute(select(LedgerTransaction.ref).where(LedgerTransaction.kind == "chat_hold")).scalars()
        assert sorted(refs) == ["chat_hold:chatcmpl-g-rich", "chat_hold:chatcmpl-g-rich2"]
        assert db.session.execute(select(KeySpend).where(KeySpend.key_id == key)).scalars().all() == []
        db.session.remove()
    ledger_clean()


def test_a_poor_row_gives_its_key_reservation_back(app, make_account, ledger_clean):
    """The key's limit had room, the balance had not: the reservation counted first is
    given back in the same statement."""
    poor = make_account(cents=0)
    key = _limited_key(app, poor.id, 10 * HOLD)
    with app.test_request_context():
        answers = holds_pg.GroupHolder()._run([_hold_row(poor.id, "chatcmpl-g-p", key_id=key)], lock_wait=True)
        db.session.remove()
    assert answers == {"chatcmpl-g-p": "insufficient"}
    with app.app_context():
        spent = db.session.execute(select(KeySpend.spent_micros).where(KeySpend.key_id == key)).scalars().all()
        db.session.remove()
    assert spent in ([], [0])
    ledger_clean()


def test_one_settle_statement_settles_each_row_and_skips_one_released(app, make_account, ledger_clean):
    a, b = make_account(cents=100), make_account(cents=100)
    rows = [_hold_row(a.id, "chatcmpl-s-a"), _hold_row(b.id, "chatcmpl-s-b"), _hold_row(a.id, "chatcmpl-s-gone")]
    with app.test_request_context():
        assert set(holds_pg.GroupHolder()._run(rows, lock_wait=True).values()) == {"held"}
        assert holds.release("chatcmpl-s-gone", error="test", created_at=rows[2]["now"])
        settler = holds_pg.GroupSettler()
        got = settler._run([_settle_row(a.id, "chatcmpl-s-a", rows[0]["now"], 1_200),
                            _settle_row(b.id, "chatcmpl-s-b", None, 9_999),  # found without its time; capped
                            _settle_row(a.id, "chatcmpl-s-gone", rows[2]["now"], 1_000)], lock_wait=True)
        db.session.remove()
    assert {cid: v[0] for cid, v in got.items()} == {"chatcmpl-s-a": 1_200, "chatcmpl-s-b": HOLD}
    assert settler._answer(got, {"id": "chatcmpl-s-gone"}) is None  # no longer held: nothing written
    assert _micros(app, a.id) == 1_000_000 - 1_200 and _micros(app, b.id) == 1_000_000 - HOLD
    assert _completions(app, "chatcmpl-s-a", "chatcmpl-s-b", "chatcmpl-s-gone") == {
        "chatcmpl-s-a": ("settled", 1_200), "chatcmpl-s-b": ("settled", HOLD), "chatcmpl-s-gone": ("released", 0)}
    ledger_clean()


def test_a_failed_hold_group_is_written_row_by_row(app, make_account, ledger_clean):
    """One row of the group cannot be written (its completion id is taken: the statement
    fails on the posting's unique ref, nothing of the group committed): every other row is
    held alone, and the taken one answers ``held`` (what a retry after a committed first
    attempt means) without holding twice."""
    a, b = make_account(cents=100), make_account(cents=100)
    with app.test_request_context():
        assert holds_pg.GroupHolder()._run([_hold_row(a.id, "chatcmpl-f-taken")], lock_wait=True) == {
            "chatcmpl-f-taken": "held"}
        db.session.remove()
    before = metrics.STATEMENT_GROUPS.labels(statement="chat_hold", outcome="split")._value.get()
    holder = holds_pg.GroupHolder()
    gate, started = threading.Event(), threading.Event()
    real = holder._run

    def slow_first(rows, *, lock_wait):
        if not started.is_set():  # the first statement waits until the others queued behind it
            started.set()
            gate.wait(5)
        return real(rows, lock_wait=lock_wait)

    holder._run = slow_first
    out: dict = {}

    def hold(row):
        with app.test_request_context():
            app.extensions["money.group_holder"] = holder
            try:
                out[row["id"]] = holds_pg.hold(completion_id=row["id"], account_id=row["account_id"],
                                               requested_model="m", stream=False, hold_micros=HOLD, key_id=None,
                                               now=row["now"], legs=list(zip(row["codes"], row["amounts"])))
            finally:
                db.session.remove()

    first = threading.Thread(target=hold, args=(_hold_row(b.id, "chatcmpl-f-lead"),))
    first.start()
    assert started.wait(5)
    others = [threading.Thread(target=hold, args=(_hold_row(x, cid),))
              for x, cid in ((a.id, "chatcmpl-f-taken"), (b.id, "chatcmpl-f-b"), (a.id, "chatcmpl-f-a"))]
    for t in others:
        t.start()
    deadline = threading.Event()
    while len(holder._queue) < 3 and not deadline.wait(0.005):
        pass
    gate.set()
    for t in [first, *others]:
        t.join(10)
    app.extensions.pop("money.group_holder", None)
    assert out == {"chatcmpl-f-lead": "held", "chatcmpl-f-taken": "held", "chatcmpl-f-b": "held",
                   "chatcmpl-f-a": "held"}
    assert metrics.STATEMENT_GROUPS.labels(statement="chat_hold", outcome="split")._value.get() == before + 1
    assert _micros(app, a.id) == 1_000_000 - 2 * HOLD and _micros(app, b.id) == 1_000_000 - 2 * HOLD
    ledger_clean()


@pytest.mark.parametrize("n", [12])
def test_concurrent_completions_share_statements_and_charge_each_once(app, fakes, make_account,  # noqa: F811
                                                                      ledger_clean, n):
    """Twelve completions at once in one process: the holds and settles that arrive while
    one statement is being written share the next; each completion is charged once."""
    written = lambda s: metrics.STATEMENT_GROUPS.labels(statement=s, outcome="written")._value.get()  # noqa: E731
    before = {s: written(s) for s in ("chat_hold", "chat_settle")}
    accts = [make_account(cents=100) for _ in range(3)]
    statuses: list[int] = []
    barrier = threading.Barrier(n)

    def one(i):
        with app.test_client() as client:
            barrier.wait(5)
            statuses.append(chat(client, accts[i % 3], model="m-small", max_tokens=100).status_code)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert statuses == [200] * n
    with app.app_context():
        rows = db.session.execute(text(
            "SELECT account_id, count(*), sum(cost_micros) FROM chat_completions "
            "WHERE status = 'settled' GROUP BY account_id")).all()
        db.session.remove()
    per = {r[0]: (r[1], r[2]) for r in rows}
    for a in accts:  # 4 completions each, charged exactly what their rows say, nothing held
        count, cost = per[a.id]
        assert count == n // 3 and _micros(app, a.id) == 1_000_000 - cost
    assert written("chat_hold") + written("chat_settle") > sum(before.values()), "no statement was shared"
    ledger_clean()


def test_the_process_keeps_one_holder_and_one_settler(app):
    with app.test_request_context():
        made = [charging.per_app(app, name, cls) for name, cls in
                (("money.group_holder", holds_pg.GroupHolder), ("money.group_settler", holds_pg.GroupSettler))]
        assert [charging.per_app(app, "money.group_holder", holds_pg.GroupHolder),
                charging.per_app(app, "money.group_settler", holds_pg.GroupSettler)] == made


def test_a_settle_takes_the_keys_counter_before_the_balance_row(app, make_account, ledger_clean):
    """The lock order of every money operation (docs/money.md, "Lock order"): a settle
    waiting for its key's spend counter (held by another transaction, e.g. a hold of the
    same key) has not yet locked the account's balance row, so that transaction can take
    it. Failed before: the settle credited the balance first and gave the reservation back
    after, so a hold of the same key (counter first, balance second) could wait on it
    crosswise."""
    acct = make_account(cents=100)
    key = _limited_key(app, acct.id, 10 * HOLD)
    row = _hold_row(acct.id, "chatcmpl-lo-1", key_id=key)
    with app.test_request_context():
        assert holds_pg.GroupHolder()._run([row], lock_wait=False) == {"chatcmpl-lo-1": "held"}
        db.session.remove()
    done: dict = {}

    def settle():
        with app.test_request_context():
            done.update(holds_pg.GroupSettler()._run([_settle_row(acct.id, "chatcmpl-lo-1", row["now"], 1_000)],
                                                     lock_wait=False))
            db.session.remove()

    with app.app_context():
        waits_for_the_counter_first(key, acct.id, settle, "gw_chat_settles")
        db.session.remove()
    assert done["chatcmpl-lo-1"][0] == 1_000
    assert _micros(app, acct.id) == 1_000_000 - 1_000
    ledger_clean()
