"""Chat billing: hold the estimated maximum before the upstream call, settle to the exact
cost (or release) after, and sweep holds left behind by a crashed process.

Ledger postings (integer micros, DESIGN §3):

* hold    ``chat_hold``   ref ``chat_hold:<id>``:   customer −H, ``hold:chat`` +H
* settle  ``chat_settle`` ref ``chat_settle:<id>``: ``hold:chat`` −H, customer +(H − C), revenue +C
* release ``chat_release`` ref ``chat_settle:<id>``: ``hold:chat`` −H, customer +H

Settle and release share one ref and both flip the completion row from ``held`` with a
conditional UPDATE, so a completion is settled or released exactly once. A settle never
charges more than the hold (C ≤ H): a cost above it (the prompt was longer than estimated)
is capped by ``gw_chat_settle`` alone (recorded in the posting's meta as
``shortfall_micros``; logged here); the usage the caller sees is what was charged.

The hold and the settle are ONE autocommit statement each (``holds_pg``: the money
engine's ``gw_chat_holds`` reserves a limited key's spend, ``gw_chat_settles`` gives its
unused part back to the period it was counted in; both post through ``gw_post``, and
each is shared by the completions of the process that arrive while one is written); the
release stays a unit of work (``ledger.post``, the same ``gw_post``) and finds its row by
id and ``created_at``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

from sqlalchemy import func, select, update

from app.extensions import db
from app.models import ChatCompletion
from app.models.base import utcnow
from app.services.money import spend
from app.services.billing import bazaar, paywall
from app.services.money import holds_pg, ledger
from app.services.platform.uow import read, transactional, unit_of_work

log = logging.getLogger(__name__)

HOLD = "hold:chat"
CHAT_PATH = "/v1/chat/completions"
_COMPLETIONS = ChatCompletion.__table__


@dataclass(frozen=True)
class PaidRoute:
    """The route a hold is taken for, as its x402 payment request names it (the 402 of a
    short balance, and the fresh request when a payment is refused): ``path`` (the
    resource URL's), ``description`` and ``extensions`` (its Bazaar metadata)."""

    path: str
    description: str
    extensions: Callable[[], dict]


CHAT = PaidRoute(CHAT_PATH, "Chat completion", bazaar.chat_completion)
MESSAGES = PaidRoute("/v1/messages", "Message (Anthropic Messages API)", bazaar.message)


def hold(completion_id: str, account_id: str, requested_model: str, hold_micros: int,
         stream: bool, key_id: str | None = None, actor: str | None = None, route: PaidRoute = CHAT):
    """Record the completion as ``held`` and move ``hold_micros`` from the customer to the
    hold account, in one unit of work; returns the hold's time (``created_at``, which
    ``settle`` takes). 402 ``payment_required`` when the balance is short (its x402
    request names ``route``: ``CHAT`` or ``MESSAGES``); 402
    ``key_spend_limit_reached`` when the hold does not fit ``key_id``'s spend limit, 402
    ``member_budget_exceeded`` when it does not fit its member's monthly budget.
    PostgreSQL: ONE autocommit statement (``gw_chat_holds``, ``money/sql/``), the key's
    spend-limit reservation included; a refusal leaves nothing."""
    try:
        return _hold_pg(completion_id, account_id, requested_model, hold_micros, stream, key_id, actor)
    except ledger.InsufficientFunds:
        usd = f"{hold_micros / ledger.MICROS_PER_USD:.6f}"
        raise paywall.payment_required(
            -(-hold_micros // ledger.MICROS_PER_CENT), subject="This completion",
            cost=f"up to {usd} USD (its estimated maximum, held before the call)",
            alternative="lower max_tokens", path=route.path,
            x402_retry="retry with a PAYMENT-SIGNATURE (x402) header paying the hold", description=route.description,
            headers={"X-Price-Micros": str(hold_micros)}, extensions=route.extensions()) from None


def _hold_legs(account_id: str, hold_micros: int) -> list[tuple[str, int]]:
    return [(ledger.customer(account_id), -hold_micros), (HOLD, hold_micros)]


def _hold_pg(completion_id: str, account_id: str, requested_model: str, hold_micros: int,
             stream: bool, key_id: str | None, actor: str | None = None):
    """``gw_chat_holds``, ONE autocommit statement for every key (``holds_pg.hold``,
    possibly shared with other completions' holds): the key's spend-limit reservation is
    in it, and a refusal leaves nothing. No WAL-flush wait
    for its commit (the function sets it): settle/release commits durably before the
    answer is sent, and PostgreSQL flushes the WAL in order. A server crash before that may
    lose the hold; then the caller was not charged (for a stream already under way: as when
    the sweep releases the hold of a crashed process) and no money was created or lost
    (docs/performance.md, "What a crash can lose")."""
    now = utcnow()
    outcome = holds_pg.hold(completion_id=completion_id, account_id=account_id, requested_model=requested_model,
                            stream=stream, hold_micros=hold_micros, key_id=key_id, now=now, actor=actor,
                            legs=_hold_legs(account_id, hold_micros))
    if outcome == "key_spend_limit":
        raise spend.refusal(key_id, hold_micros, now)
    if outcome == "member_budget":
        raise spend.budget_refusal(key_id, hold_micros, now)
    if outcome == "insufficient":
        raise ledger.InsufficientFunds(account_id, hold_micros)
    return now


def _flip(completion_id: str, values: dict, *where) -> bool:
    res = db.session.execute(
        update(_COMPLETIONS).where(_COMPLETIONS.c.id == completion_id, _COMPLETIONS.c.status == "held", *where)
        .values(settled_at=utcnow(), **values))
    return res.rowcount == 1


def _at(created_at) -> list:
    """The condition that finds a completion in its partition: its ``created_at``, when known."""
    return [] if created_at is None else [_COMPLETIONS.c.created_at == created_at]


def settle(completion_id: str, account_id: str, hold_micros: int, cost_micros: int, *,
           model: str, provider: str, prompt_tokens: int, completion_tokens: int,
           estimated: bool, attempts: int, latency_ms: int, error: str | None = None,
           created_at=None) -> int | None:
    """Charge the exact cost and return the rest of the hold; returns the micros charged
    (by the earlier settle when it was already settled: nothing is written again; None
    when it was released). ``created_at``: what ``hold`` returned (finds the row in one
    partition).
    PostgreSQL: ONE autocommit statement (``gw_chat_settles``, which also gives the key's
    unused reservation back; possibly shared with other completions' settles), committed
    durably before it returns."""
    done = holds_pg.settle(
        completion_id=completion_id, created_at=created_at, account_id=account_id,
        customer=ledger.customer(account_id), hold_code=HOLD, revenue=ledger.REVENUE,
        hold_micros=hold_micros, cost_micros=cost_micros, model=model, provider=provider,
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, estimated=estimated,
        attempts=attempts, latency_ms=latency_ms, error=(error or None) and error[:300], now=utcnow())
    if done is None:
        # Not held any more: settled by an earlier attempt of this same settle (its
        # connection died after the COMMIT, ``run_one`` retried) — then that charge is the
        # answer — or released (the stale-hold sweep): None.
        return _settled_charge(completion_id, created_at)
    charge = done[0]
    if charge < cost_micros:
        log.warning("chat_settle_capped: completion %s cost %s micros, held %s; charged %s",
                    completion_id, cost_micros, hold_micros, charge)
    return charge


def _settled_charge(completion_id: str, created_at) -> int | None:
    """What a settled completion was charged; None when it is not settled (released)."""
    where = [ChatCompletion.id == completion_id, ChatCompletion.status == "settled"]
    if created_at is not None:
        where.append(ChatCompletion.created_at == created_at)
    rows = read(select(ChatCompletion.cost_micros).where(*where))
    return int(rows[0][0]) if rows else None


@transactional
def release(completion_id: str, *, error: str, attempts: int = 0, stale_before=None, created_at=None) -> bool:
    """Return the whole hold (nothing charged); usage counts it as an errored call (from
    the completion row, ``billing.usage_log``). One unit of work. ``created_at``: what
    ``hold`` returned (the sweep reads it with the id): the row is then found by id AND
    ``created_at``, in one partition, instead of probing every month's primary-key index.
    With ``stale_before`` (the sweep) only if its request is still silent since then: a
    stream that extended its hold meanwhile keeps it."""
    at = _at(created_at)
    row = db.session.execute(
        select(_COMPLETIONS.c.account_id, _COMPLETIONS.c.hold_micros, _COMPLETIONS.c.spend_key_id,
               _COMPLETIONS.c.created_at, _COMPLETIONS.c.spend_reserved_from, _COMPLETIONS.c.actor,
               _COMPLETIONS.c.budget_member_id)
        .where(_COMPLETIONS.c.id == completion_id, _COMPLETIONS.c.status == "held", *at)).first()
    if row is None:
        return False
    account_id, hold_micros, spend_key_id, held_at, reserved_from, actor, member = row
    alive = [func.coalesce(_COMPLETIONS.c.alive_at, _COMPLETIONS.c.created_at) < stale_before] \
        if stale_before is not None else []
    if not _flip(completion_id, {"status": "released", "attempts": attempts, "error": error[:300]},
                 _COMPLETIONS.c.created_at == held_at, *alive):
        return False
    spend.release(spend_key_id, hold_micros, reserved_from, org=account_id, member=member, at=held_at)
    if hold_micros:
        ledger.post("chat_release", [(HOLD, -hold_micros), (ledger.customer(account_id), hold_micros)],
                    ref=f"chat_settle:{completion_id}", account_id=account_id, actor=actor)
    return True


@transactional
def record_sandbox(completion_id: str, account_id: str, *, requested_model: str, model: str,
                   provider: str, cost_micros: int, prompt_tokens: int, completion_tokens: int,
                   estimated: bool, attempts: int, latency_ms: int, stream: bool,
                   error: str | None = None) -> None:
    """Test-mode completion: a record and test-mode usage, no ledger movement."""
    db.session.add(ChatCompletion(
        id=completion_id, account_id=account_id, mode="test", requested_model=requested_model,
        model=model, provider=provider, status="sandbox", stream=stream, cost_micros=cost_micros,
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, usage_estimated=estimated,
        attempts=attempts, latency_ms=latency_ms, error=(error or None) and error[:300],
        settled_at=utcnow()))


@transactional
def extend(completion_id: str) -> bool:
    """The request holding this completion's money is alive (a stream calls it while it
    runs): the stale-hold sweep leaves the hold alone for another TTL. One unit of work."""
    res = db.session.execute(update(_COMPLETIONS).where(_COMPLETIONS.c.id == completion_id,
                                                        _COMPLETIONS.c.status == "held")
                             .values(alive_at=utcnow()))
    return res.rowcount == 1


def stale(cutoff):
    """Condition: a ``held`` completion whose request gave no sign of life since ``cutoff``."""
    return (ChatCompletion.status == "held") & (func.coalesce(ChatCompletion.alive_at, ChatCompletion.created_at)
                                                 < cutoff)


def release_stale_holds(older_than_seconds: float, limit: int = 500) -> int:
    """Release holds whose completion is still ``held`` and whose request gave no sign of
    life (creation or ``extend``) for ``older_than_seconds`` (the process handling it died):
    the customer gets the whole hold back. A live stream's hold is never released. Returns
    how many."""
    cutoff = utcnow() - timedelta(seconds=older_than_seconds)
    with unit_of_work():  # a read, ended before the releases
        rows = db.session.execute(
            select(ChatCompletion.id, ChatCompletion.created_at).where(stale(cutoff))
            .order_by(ChatCompletion.created_at).limit(limit)).all()
    done = 0
    for cid, created_at in rows:
        if release(cid, error="stale hold released by the sweep (the request did not finish)",
                   stale_before=cutoff, created_at=created_at):
            done += 1
    return done
