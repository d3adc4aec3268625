"""The metered call's two PostgreSQL statements: one to open (charge) a call, one to
finalize it, each ONE autocommit statement on a connection of the process's pool
(``uow.run_one``: no BEGIN/COMMIT round trips; the connection is held only while the
statement runs, and the finalize writer thread takes one the same way). Everything else on the call path
stays in ``gateway.calls``.

* ``open_pg`` runs ``gw_open_calls(rows)`` (the server-side function in
  ``app/services/money/sql/gw_open_calls.sql``): Idempotency-Key reservation, the key's spend-limit reserve,
  conditional debit + ledger posting and the ``pending`` call row in ONE round trip,
  committed without waiting for the WAL flush (set inside the function; why that is
  safe: docs/performance.md, "What a crash can lose"). The opens of this process that
  arrive while one is being written share the next statement (``GroupOpener``: leader/followers, as the durable
  finalize's group commit); each row gets its own answer, and a refusal (insufficient
  funds, key spend limit) leaves nothing of its row behind (the function checks before
  it writes and reverts by hand what the refused row had written).
* ``finalize_pg`` marks the call ``succeeded`` with its receipt AND stores the
  Idempotency-Key's response in ONE statement (``gw_finalize_calls``, ``money/sql/``).
  Two ways, chosen by ``CALL_FINALIZE_DEFERRED``:

  - deferred (the default everywhere, tests included): the call is handed to the process's
    ``DeferredFinalizer`` thread and answered at once; the thread writes everything
    queued with one statement per round trip. What a crash can lose in between is the
    call's ``succeeded`` row (the sweep then refunds it: the caller keeps the answer and
    is not charged), never the customer's money (docs/performance.md, "What a crash can
    lose"). A call close to its sweep deadline is still written before its answer.
  - durable: committed before the answer leaves the process; finalizations that arrive
    while one is being written are grouped (``GroupFinalizer``: group commit,
    leader/followers), so under load one durable commit serves several calls.
"""
from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime, timedelta

import orjson
from flask import current_app
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from app import metrics
from app.ids import new_id
from app.models.base import utcnow
from app.services.platform.uow import end_reads, run_one, run_statement

log = logging.getLogger(__name__)

# Driver-level SQL (psycopg placeholders, explicit casts): the statements are fixed, so
# SQLAlchemy's compile and bind processing are skipped; the engine's events (statement
# counters, tracing) still see them.
# Opens a group of calls (money/sql/gw_open_calls.sql): one JSON document of rows, one answer per
# row; each of the statement's lock waits gives up after lock_wait_ms (0: no limit).
_OPEN = ("SELECT call_id, outcome, idem_hash, idem_status, idem_body "
         "FROM gw_open_calls(%(rows)s::jsonb, %(lock_wait_ms)s::integer)")

class OpenedCall(str):
    """A new call's id (a ``str``, as before) carrying its ``created_at``: the partition
    key of ``module_calls`` on PostgreSQL, so the statements that target
    this one row later (spend-key update, finalize, refund) prune to its month's partition
    instead of probing every month's primary-key index."""

    created_at: datetime
    deadline_at: datetime | None  # when the sweep may refund it (None: not known here)

    def __new__(cls, call_id: str, created_at: datetime, deadline_at: datetime | None = None):
        obj = super().__new__(cls, call_id)
        obj.created_at = created_at
        obj.deadline_at = deadline_at
        return obj


def created_at_of(call_id: str) -> datetime | None:
    """The partition key a call id carries (None for a plain id, e.g. from the sweep)."""
    return getattr(call_id, "created_at", None)


# Finalizes a group of calls: pending → succeeded (only those still pending: the sweep
# may have refunded one) and their keys' stored responses; answers the ids it moved.
# The function (money/sql/gw_finalize_calls.sql) finds each call by its primary key (pruned to its
# month at execution) with plans that do not depend on the statistics of the moment.
_FINALIZE = "SELECT id FROM gw_finalize_calls(%(rows)s::jsonb) AS id"


@dataclass(frozen=True)
class Opened:
    """What ``gw_open_calls`` answered for a call: ``opened``, ``insufficient`` /
    ``key_spend_limit`` / ``member_budget`` (refused: nothing of it was written), or ``existing`` (the key is
    taken: its stored hash, status and body)."""

    outcome: str
    idem_hash: str | None = None
    idem_status: str | None = None
    idem_body: str | None = None


def open_pg(*, account_id: str, mode: str, mod, act, idem_key: str | None, req_hash: str | None,
            price_micros: int, charged: bool, legs: list[tuple[str, int]],
            spend_key: str | None = None, actor: str | None = None,
            call_id: str | None = None) -> tuple[str, Opened]:
    """One round trip, committed by itself: the whole charging transaction of a new call
    of ``act`` of ``mod`` (catalog snapshots), in one ``gw_open_calls`` statement with
    the other opens of this process queued meanwhile (``GroupOpener``); ``spend_key``:
    the API key whose spend limit applies (None: no limit); ``call_id``: the id to give
    the call (default: a new one; the x402 path names it before its payment is booked).
    Returns the new call id and the function's answer for it."""
    opened, row = open_row(account_id=account_id, mode=mode, mod=mod, act=act, idem_key=idem_key,
                           req_hash=req_hash, price_micros=price_micros, charged=charged, legs=legs,
                           spend_key=spend_key, actor=actor, call_id=call_id)
    # A stale pooled connection is retried once (run_one) with the SAME call id, so a first
    # attempt that did commit makes the retry fail (duplicate call id / key in flight)
    # instead of charging twice. The session's reads end first (as before every group
    # statement): a follower must not hold a connection while it waits for the leader's
    # statement, which may need it (a pool or PgBouncer's server connections all held by
    # waiting followers: nobody moves).
    end_reads()
    return opened, _group_opener().open(row)


def open_row(*, account_id: str, mode: str, mod, act, idem_key: str | None, req_hash: str | None,
             price_micros: int, charged: bool, legs: list[tuple[str, int]],
             spend_key: str | None = None, actor: str | None = None,
             call_id: str | None = None) -> tuple[OpenedCall, dict]:
    """A new call's id and its ``gw_open_calls`` row (``open_pg``'s arguments)."""
    cfg = current_app.config
    call_id = call_id or new_id("call")
    now = utcnow()
    legs = sorted(legs, key=lambda leg: leg[1])  # debits first, as ledger.post orders them
    deadline = now + timedelta(seconds=act.timeout_seconds + cfg["CALL_SWEEP_MARGIN_SECONDS"])
    row = {
        "call_id": call_id, "account_id": account_id, "actor": actor, "module_id": mod.id, "slug": mod.slug,
        "action": act.name, "mode": mode, "price": price_micros, "charged": charged,
        "owner_agent_id": mod.owner_agent_id, "idem_key": idem_key, "req_hash": req_hash,
        "now": now, "deadline": deadline,
        "idem_expires": now + timedelta(seconds=cfg["IDEMPOTENCY_TTL_SECONDS"]),
        "codes": [c for c, _ in legs], "amounts": [a for _, a in legs], "spend_key": spend_key}
    return OpenedCall(call_id, now, deadline), row


def finalize_pg(*, call_id: str, account_id: str, idem_key: str | None, ok: bool,
                provider_status: int, receipt: dict, finished_at, response_body: str) -> bool:
    """``pending → succeeded`` plus the key's stored response, in one autocommit
    statement possibly shared with other calls of this process. ``call_id`` must carry
    its ``created_at`` (``OpenedCall``).

    With ``CALL_FINALIZE_DEFERRED`` and a sweep deadline at least half the sweep margin
    (``CALL_SWEEP_MARGIN_SECONDS``) away, the row is handed to the process's
    ``DeferredFinalizer`` and True is returned at once (the write follows within a round
    trip or so). Otherwise the statement is committed durably before this returns
    (``GroupFinalizer``), and False means the call was no longer pending (the sweep
    refunded it)."""
    created_at = created_at_of(call_id)
    if created_at is None:
        raise ValueError("finalize_pg needs the call's created_at (an OpenedCall)")
    row = {"id": str(call_id), "created_at": created_at, "ok": ok,
           "provider_status": provider_status, "receipt": receipt,
           "finished_at": finished_at, "account_id": account_id,
           "idem_key": idem_key, "response_body": response_body}
    deadline = getattr(call_id, "deadline_at", None)
    app = current_app._get_current_object()
    cfg = app.config
    if (cfg["CALL_FINALIZE_DEFERRED"] and deadline is not None
            and (deadline - finished_at).total_seconds() >= cfg["CALL_SWEEP_MARGIN_SECONDS"] / 2):
        _deferred_finalizer(app).submit(row)
        return True
    end_reads()  # no connection held while waiting for the group's leader (open_pg)
    return _group_finalizer().finalize(_Member(row))


class _Member:
    """One row waiting in a group: its values, then its outcome."""

    __slots__ = ("row", "event", "lead", "result", "error")

    def __init__(self, row: dict):
        self.row = row
        self.event = threading.Event()
        self.lead = False
        self.result = None
        self.error: BaseException | None = None

    def outcome(self):
        if self.error is not None:
            raise self.error
        return self.result


class GroupCommit(ABC):
    """Group commit, per process and database (leader / followers), of one kind of
    statement (``_write``: ONE statement for a group of rows, setting each member's
    ``result`` or ``error``).

    A request that finds nobody writing becomes the leader: it takes every row queued so
    far (its own included) and writes them with ONE statement on its own connection (one
    round trip, one commit). Requests arriving meanwhile queue up and wait; when the
    statement returns, the leader wakes them with their outcomes and hands the lead to
    the first one queued since, which writes the next group. So a row alone is written at
    once (no timer, no added latency), and under load one statement serves as many rows
    as arrived during the previous one."""

    def __init__(self):
        self._lock = threading.Lock()
        self._queue: list[_Member] = []
        self._busy = False

    @abstractmethod
    def _write(self, group: list[_Member]) -> None:
        """ONE statement for ``group``, setting each member's ``result`` (or ``error``)."""

    def submit(self, item: _Member):
        """Queue ``item``, write it (as the leader) or wait for the leader that does;
        its outcome (or its error, raised)."""
        with self._lock:
            self._queue.append(item)
            lead = not self._busy
            self._busy = True
        if not lead:
            item.event.wait()
            if not item.lead:
                return item.outcome()
        with self._lock:
            group, self._queue = self._queue, []
        try:
            self._write(group)
        except BaseException as exc:  # noqa: BLE001 - every member of the group gets it
            for m in group:
                m.error = exc
        finally:
            with self._lock:
                successor = self._queue[0] if self._queue else None
                if successor is None:
                    self._busy = False
            for m in group:
                if m is not item:
                    m.event.set()
            if successor is not None:
                successor.lead = True
                successor.event.set()
        return item.outcome()


class GroupFinalizer(GroupCommit):
    """The durable finalize's group commit: each caller still gets its answer only after
    its row is durable; if the statement fails, every call of that group gets the error
    (and refunds itself, as before). A member's outcome: whether its call was still
    pending (``_write_group``)."""

    def _write(self, group: list[_Member]) -> None:
        done = _write_group([m.row for m in group])
        for m in group:
            m.result = m.row["id"] in done

    def finalize(self, item: _Member) -> bool:
        return self.submit(item)


class GroupStatement(GroupCommit):
    """Group commit of a statement that answers each of its rows (the metered call's
    open, the chat completion's hold and settle): the rows of this process that arrive
    while one statement is being written go together in the next one, each answered its
    own outcome, refusals included. A statement that fails for anything else (a duplicate
    id after a lost connection, a deadlock with another writer: nothing of it was
    committed, or ``run_one``'s same-id rule applies) is not the whole group's answer:
    each member is then written alone (``submit_alone``), so one row's error never reaches
    another. A group statement (one row included) gives up a lock wait after
    ``GROUP_LOCK_WAIT_MS`` the same way (its ``p_lock_wait_ms``): a group may
    hold several accounts' rows, so a long wait could be a deadlock, and every row of the
    process queues behind the statement in flight. The limit is PostgreSQL's
    ``lock_timeout``, so it applies to each wait: a statement that meets several short
    waits in turn can hold the queue for several limits (at most one wait per lock its
    rows take). Alone, outside the queue, a row waits for its locks as long as it takes,
    as it did before grouping.

    A subclass names its statement (``statement``: the metric's label) and its row key
    (``key``), and runs the statement (``_run``: ONE statement for the rows, each key's
    answer)."""

    statement = ""
    key = ""

    @abstractmethod
    def _run(self, rows: list[dict], *, lock_wait: bool) -> dict:
        """ONE autocommit statement for ``rows``; each row key's answer. ``lock_wait``:
        each lock wait lasts at most ``GROUP_LOCK_WAIT_MS``, then the statement
        fails with nothing written (``_lock_wait_over``); without it, as long as it takes."""

    def _write(self, group: list[_Member]) -> None:
        try:
            answers = self._run([m.row for m in group], lock_wait=True)
        except DBAPIError as exc:
            if len(group) == 1 and not _lock_wait_over(exc):
                raise  # one row's own error
            metrics.statement_groups(self.statement, "split" if len(group) > 1 else "alone")
            log.info("%s group of %d split: %s", self.statement, len(group),
                     type(getattr(exc, "orig", exc)).__name__)
            for m in group:
                m.error = _Alone(str(exc))
            return
        if len(group) > 1:
            metrics.statement_groups(self.statement, "written")
        for m in group:
            try:
                m.result = self._answer(answers, m.row)
            except RuntimeError as exc:
                m.error = exc

    def write(self, row: dict):
        """``row``'s answer: written with the rows queued meanwhile, or alone when that
        group's statement failed. The caller ends the session's reads first
        (``uow.end_reads``): a follower must not hold a connection while it waits."""
        try:
            return self.submit(_Member(row))
        except _Alone:
            return self.submit_alone(row)

    def submit_alone(self, row: dict):
        return self._answer(self._run([row], lock_wait=False), row)

    def _answer(self, answers: dict, row: dict):
        """``row``'s answer in ``answers`` (none: not seen, but never another row's answer)."""
        found = answers.get(row[self.key])
        if found is None:
            raise RuntimeError(f"{self.statement} gave no answer for {row[self.key]}")
        return found


class GroupOpener(GroupStatement):
    """The open's group statement (``gw_open_calls``, ``money/sql/``): each call answered
    its own ``Opened`` (``GroupStatement``). A missing answer: the key's record vanished
    between its conflict and its read."""

    statement, key = "call_open", "call_id"

    def _run(self, rows: list[dict], *, lock_wait: bool) -> dict[str, Opened]:
        return _open_group(rows, lock_wait=lock_wait)

    def open(self, row: dict) -> Opened:
        return self.write(row)


class _Alone(Exception):
    """A group's statement failed: its members are written one by one."""


_writers_lock = threading.Lock()


def per_app(app, name: str, make):
    """The app's writer ``name`` (one per app, so per database; made on first use)."""
    writer = app.extensions.get(name)
    if writer is None:
        with _writers_lock:
            writer = app.extensions.setdefault(name, make())
    return writer


def _group_finalizer() -> GroupFinalizer:
    return per_app(current_app, "gateway.group_finalizer", GroupFinalizer)


def _group_opener() -> GroupOpener:
    return per_app(current_app, "gateway.group_opener", GroupOpener)


def _open_group(rows: list[dict], *, lock_wait: bool) -> dict[str, Opened]:
    """ONE autocommit statement opening ``rows`` (``gw_open_calls``: one JSON document);
    each call id's answer. A refusal is an answer (nothing of that row written), not an
    error. ``lock_wait``: each lock wait of the statement lasts at most
    ``GROUP_LOCK_WAIT_MS``, then it fails with nothing written
    (``_lock_wait_over``); without it, a wait lasts as long as it takes."""
    wait = current_app.config["GROUP_LOCK_WAIT_MS"] if lock_wait else 0
    found = run_one(_OPEN, {"rows": orjson.dumps(rows).decode(), "lock_wait_ms": wait})
    return {r[0]: Opened(*r[1:]) for r in found}


def _lock_wait_over(exc: DBAPIError) -> bool:
    """The statement gave up a lock wait (``lock_timeout``: SQLSTATE 55P03)."""
    return getattr(exc.orig, "sqlstate", None) == "55P03"


def _write_group(rows: list[dict]) -> set[str]:
    """ONE autocommit statement finalizing ``rows`` (passed as one JSON document: cheaper
    to adapt than nine arrays); the ids it moved to ``succeeded``."""
    return {row[0] for row in run_statement(_FINALIZE, {"rows": orjson.dumps(rows).decode()})}


# --- answer first, write after (CALL_FINALIZE_DEFERRED) ----------------------------------

# A call is finalized after its answer only when its sweep deadline is at least half the
# sweep margin away (``finalize_pg``; 30 s by default: a call that finished later is
# written before its answer, as in durable mode), so the write, and its retries while
# the database restarts, normally lands long before the sweep could refund the call.

# Waits between attempts while the database refuses the statement (then 5 s each).
_RETRY_WAITS = (0.05, 0.2, 0.5, 1.0, 2.0, 5.0)
# How long a stopping process waits for its queue to be written (atexit).
DRAIN_SECONDS = 10.0
# The most rows one statement carries; a group this large is written without waiting.
BATCH_MAX_ROWS = 256


class DeferredFinalizer:
    """The process's finalize writer: calls are answered as soon as their receipt is
    signed, and ONE thread writes the queued finalizations with one ``gw_finalize_calls``
    statement per group (one round trip and one WAL flush for the whole group, like
    ``GroupFinalizer`` but with no caller waiting on it). A group is what is queued when
    its first row has waited ``CALL_FINALIZE_BATCH_MS`` (or ``BATCH_MAX_ROWS`` rows, or a
    drain or stop asks): at low concurrency a statement per call cost ~15 % of a call's
    CPU in Python alone (bench/DIARY.md, "The finalize window").

    * A statement that fails for a lost connection or a database that is down is tried
      again (``_RETRY_WAITS``, then every 5 s) until it is written: calls only open
      while the database answers, so the queue cannot grow while it does not.
    * Any other error (a row the function refuses) splits the group: each row is written
      alone, and one that still fails is logged and left ``pending`` for the sweep.
    * A call the sweep refunded before its row was written (it stays refunded: the caller
      got its answer and is not charged) is logged as ``call_finalize_late``.
    * When the process stops normally (gunicorn's graceful stop, ``sys.exit``) the queue
      is written before it exits (``atexit``, up to ``DRAIN_SECONDS``). A process killed
      outright loses its queue: those calls stay ``pending`` and the sweep refunds them
      after their deadline (docs/performance.md, "What a crash can lose")."""

    def __init__(self, app):
        self._app = app
        # how long the first queued row waits for others to share its statement
        self._window = app.config["CALL_FINALIZE_BATCH_MS"] / 1000
        self._cond = threading.Condition()
        self._queue: list[dict] = []
        self._oldest = 0.0  # time.monotonic() when the queue last went from empty to not
        self._writing = 0  # rows taken from the queue and not yet written
        self._hurry = 0  # drain() callers waiting: write without waiting out the window
        self._thread: threading.Thread | None = None
        self._pid: int | None = None
        self._stopping = False

    def submit(self, row: dict) -> None:
        """Queue ``row`` (a ``gw_finalize_calls`` row) for the writer thread. Only the
        first row of a group (and a full group) wakes the writer: the rows queued during
        its window join it without a wake-up each."""
        with self._cond:
            if self._pid != os.getpid() or self._thread is None or not self._thread.is_alive():
                self._start()
            self._queue.append(row)
            if len(self._queue) == 1:
                self._oldest = time.monotonic()
                self._cond.notify_all()
            elif len(self._queue) == BATCH_MAX_ROWS:
                self._cond.notify_all()

    def _start(self) -> None:
        """(Re)start the writer thread: first use, after a fork (a forked child has no
        thread and must not write its parent's queue), or after it died."""
        if self._pid != os.getpid():
            self._queue = []
            self._writing = 0
            self._hurry = 0
            atexit.register(self.close)
        self._pid = os.getpid()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="finalize-writer", daemon=True)
        self._thread.start()

    def pending(self) -> int:
        """Finalizations queued or being written."""
        with self._cond:
            return len(self._queue) + self._writing

    def drain(self, timeout: float = DRAIN_SECONDS) -> bool:
        """Wait until everything queued so far is written; False on timeout."""
        end = time.monotonic() + timeout
        with self._cond:
            self._hurry += 1
            self._cond.notify_all()
            try:
                while self._queue or self._writing:
                    left = end - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(left)
            finally:
                self._hurry -= 1
        return True

    def close(self, timeout: float = DRAIN_SECONDS) -> bool:
        """Write what is queued, then stop the thread (process exit)."""
        if self._pid != os.getpid():
            return True
        done = self.drain(timeout)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if not done:
            log.error("finalize writer stopped with %d calls unwritten; the sweep refunds them",
                      self.pending())
        return done

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    return
                self._gather()
                group, self._queue = self._queue[:BATCH_MAX_ROWS], self._queue[BATCH_MAX_ROWS:]
                self._writing = len(group)
            try:
                self._write(group)
            except BaseException:  # noqa: BLE001 - the thread must live on; rows go to the sweep
                log.exception("finalize writer: %d calls left pending for the sweep", len(group))
            finally:
                with self._cond:
                    self._writing = 0
                    self._cond.notify_all()

    def _gather(self) -> None:
        """(Lock held, queue not empty.) Let the group grow until its first row has
        waited ``CALL_FINALIZE_BATCH_MS``, it holds ``BATCH_MAX_ROWS`` rows, or a drain or
        stop wants it written now."""
        end = self._oldest + self._window
        while len(self._queue) < BATCH_MAX_ROWS and not self._stopping and not self._hurry:
            left = end - time.monotonic()
            if left <= 0:
                return
            self._cond.wait(left)

    def _write(self, group: list[dict]) -> None:
        attempt = 0
        while True:
            try:
                with self._app.app_context():
                    done = _write_group(group)
            except DBAPIError as exc:
                if _transient(exc):
                    metrics.finalize_writer("retried", len(group))
                    wait = _RETRY_WAITS[min(attempt, len(_RETRY_WAITS) - 1)]
                    log.warning("finalize writer: database unavailable (%s); %d calls, retry in %.2f s",
                                type(exc.orig).__name__, len(group), wait)
                    attempt += 1
                    time.sleep(wait)
                    continue
                if len(group) > 1:  # find the row the statement refuses; write the others
                    for row in group:
                        self._write([row])
                    return
                metrics.finalize_writer("refused")
                log.error("finalize writer: call %s refused (%s); left pending for the sweep",
                          group[0]["id"], exc.orig)
                return
            late = [row["id"] for row in group if row["id"] not in done]
            for call_id in late:
                log.warning("call_finalize_late: call %s was refunded before its finalize "
                            "was written; answered and not charged", call_id)
            metrics.finalize_writer("written", len(group) - len(late))
            if late:
                metrics.finalize_writer("late", len(late))
            return


def _transient(exc: DBAPIError) -> bool:
    """A lost connection or a database that is down or restarting (worth a retry)."""
    return bool(exc.connection_invalidated) or isinstance(exc, (OperationalError, InterfaceError))


def _deferred_finalizer(app) -> DeferredFinalizer:
    """The app's finalize writer."""
    return per_app(app, "gateway.deferred_finalizer", lambda: DeferredFinalizer(app))


def drain_finalizer(app, timeout: float = DRAIN_SECONDS) -> bool:
    """Wait until the app's deferred finalizations are written (tests, shutdown hooks)."""
    writer = app.extensions.get("gateway.deferred_finalizer")
    return True if writer is None else writer.drain(timeout)
