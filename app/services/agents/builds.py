"""Agent-built modules: submissions (SPEC endpoints 9–10) and operator review.

A submission is ``pending_review`` until an admin approves or rejects it (CLI
``flask modules …`` or ``/api/admin/modules/…``). Approval creates (or updates) the
``Module`` row — ``source="agent"``, ``owner_agent_id`` = the submitting agent,
``upstream_url`` = the submission's webhook, ``provider_auth`` = Standard Webhooks with
the submission's ``whsec_`` secret — with one ``ModuleAction`` per submitted action at
the submitted price, so it is listed and callable through ``/v1/module/{slug}/call``.

Slugs: ``^[a-z0-9][a-z0-9-]{0,63}$``. A slug belongs to whoever's module uses it (a
catalog module or another agent's approved module → 409); at most one submission per
slug is pending at a time (unique ``pending_slug``; 409 otherwise). An agent may
resubmit its own slug (new price or actions); the live module changes on approval.
"""
from __future__ import annotations

import re

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from app.errors import Conflict, Forbidden, InvalidRequest, NotFound
from app.extensions import db
from app.ids import new_id
from app.models import Agent, Module, ModuleAction, ModuleSubmission
from app.models.base import utcnow
from app.services.gateway import catalog
from app.services.platform import netguard
from app.services.platform.uow import after_commit, transactional, unit_of_work
from app.services.agents.identity import get_agent, new_webhook_secret, send_event

SLUG_RE = catalog.SLUG_RE  # the gateway's slug rule (matched with fullmatch here)
ACTION_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")  # within catalog.ACTION_RE (no dot: tools)
MAX_ACTIONS = 50
MAX_PRICE_CENTS = 1_000_000  # 10,000 USD per call
# a build's webhook becomes its module's upstream URL on approval: what that column holds
MAX_WEBHOOK_CHARS = Module.__table__.c.upstream_url.type.length


def submit(agent_id: str | None, *, slug: str, price_cents: int, actions: list[str],
           webhook: str | None = None, description: str | None = None) -> ModuleSubmission:
    """Record a submission for review (202). The caller must be an agent. One unit of work."""
    try:
        with unit_of_work():
            return _submit(agent_id, slug, description, price_cents, actions, webhook)
    except IntegrityError:
        raise Conflict(f"A submission for slug '{slug}' is already pending review.") from None


def _submit(agent_id, slug, description, price_cents, actions, webhook) -> ModuleSubmission:
    if not agent_id:
        raise Forbidden("Only agents submit modules: sign in as the agent and use its session.")
    agent = get_agent(agent_id)
    if agent.mode != "live":  # an approved build is a live, charging module; earnings are live money
        raise Forbidden("A test-mode agent cannot submit modules: an approved module is live and "
                        "earns live money. Register the agent with a live key.")
    if not isinstance(slug, str) or not SLUG_RE.fullmatch(slug):
        raise InvalidRequest("slug: must match ^[a-z0-9][a-z0-9-]{0,63}$ (lower-case letters, digits, '-').")
    if not isinstance(price_cents, int) or isinstance(price_cents, bool) \
            or not 0 <= price_cents <= MAX_PRICE_CENTS:
        raise InvalidRequest(f"price_cents: must be an integer from 0 to {MAX_PRICE_CENTS}.")
    if not actions:
        raise InvalidRequest("actions: must list at least one action.")
    if len(actions) > MAX_ACTIONS:
        raise InvalidRequest(f"actions: at most {MAX_ACTIONS} actions.")
    bad = [a for a in actions if not isinstance(a, str) or not ACTION_RE.fullmatch(a)]
    if bad:
        raise InvalidRequest(f"actions: each action must match {ACTION_RE.pattern} (no dot).")
    if len(set(actions)) != len(actions):
        raise InvalidRequest("actions: must not contain duplicates.")
    url = webhook if webhook is not None else agent.webhook
    if not url:
        raise Conflict("webhook: required when the agent has no webhook (the agent's stored state).")
    if len(url) > MAX_WEBHOOK_CHARS:  # else its approval fails: the module cannot hold it
        if webhook is not None:
            raise InvalidRequest(f"webhook: at most {MAX_WEBHOOK_CHARS} characters.")
        raise Conflict(f"webhook: the agent's webhook is longer than a module's {MAX_WEBHOOK_CHARS} "
                       "characters; send a shorter `webhook` with the build.")
    netguard.validate_url(url, field="webhook")
    _check_slug_owner(slug, agent.id)
    sub = ModuleSubmission(id=new_id("bld"), agent_id=agent.id, slug=slug, pending_slug=slug,
                           description=(description or "").strip(), price_cents=price_cents,
                           actions=list(actions), webhook=url, webhook_secret=new_webhook_secret(),
                           status="pending_review", created_at=utcnow())
    db.session.add(sub)
    return sub


def _check_slug_owner(slug: str, agent_id: str) -> None:
    owner = db.session.execute(
        select(Module.source, Module.owner_agent_id).where(Module.slug == slug)).first()
    if owner is not None and owner[1] != agent_id:
        raise Conflict(f"The slug '{slug}' is taken.")
    pending = db.session.execute(
        select(ModuleSubmission.agent_id).where(ModuleSubmission.pending_slug == slug)).first()
    if pending is not None:
        raise Conflict(f"The slug '{slug}' is taken." if pending[0] != agent_id
                       else f"A submission for slug '{slug}' is already pending review.")


def list_builds(*, agent_id: str | None, account_id: str, mode: str = "live") -> list[ModuleSubmission]:
    """The caller's submissions, newest first: an agent's own, or (for a key of an owner
    account) those of every agent the account owns in the key's mode (a test key never
    sees a live agent's builds, nor their webhook secrets)."""
    q = select(ModuleSubmission).order_by(ModuleSubmission.created_at.desc(), ModuleSubmission.id)
    if agent_id:
        q = q.where(ModuleSubmission.agent_id == agent_id)
    else:
        q = q.join(Agent, Agent.id == ModuleSubmission.agent_id).where(
            Agent.owner_account_id == account_id, Agent.mode == mode)
    return list(db.session.execute(q.limit(500)).scalars())


# --- review ---------------------------------------------------------------------------

def pending() -> list[ModuleSubmission]:
    return list(db.session.execute(
        select(ModuleSubmission).where(ModuleSubmission.status == "pending_review")
        .order_by(ModuleSubmission.created_at, ModuleSubmission.id)).scalars())


def _pending_for(slug: str) -> ModuleSubmission:
    sub = db.session.execute(
        select(ModuleSubmission).where(ModuleSubmission.pending_slug == slug)
        .with_for_update()).scalar_one_or_none() if isinstance(slug, str) else None
    if sub is None:
        raise NotFound(f"No submission for slug '{slug}' is pending review.")
    return sub


def approve(slug: str, *, reviewer: str, notes: str | None = None) -> ModuleSubmission:
    """Approve the pending submission for ``slug``: create or update its module (listed
    and callable from now on) and notify the agent (``module.approved``). One unit of work."""
    try:
        with unit_of_work():
            return _approve(slug, reviewer, notes)
    except IntegrityError:
        raise Conflict(f"The slug '{slug}' was taken concurrently; reject this submission.") from None


def _approve(slug: str, reviewer: str, notes: str | None) -> ModuleSubmission:
    sub = _pending_for(slug)
    agent = db.session.get(Agent, sub.agent_id)
    if agent.disabled_at is not None:  # its key is no longer trusted: nor is the server it submitted
        raise Conflict(f"The agent that submitted '{slug}' was disabled by its owner; reject this submission.")
    mod = db.session.execute(select(Module).where(Module.slug == slug)).scalar_one_or_none()
    if mod is not None and mod.owner_agent_id != agent.id:
        raise Conflict(f"The slug '{slug}' now belongs to another module; reject this submission.")
    now = utcnow()
    if mod is None:
        mod = Module(slug=slug, source="agent", created_at=now, actions=[])
        db.session.add(mod)
    mod.name = slug
    mod.description = sub.description or ""  # listed as "Agent-built module by <its name now>" (Module)
    mod.owner = agent.name
    mod.owner_agent_id = agent.id
    mod.source = "agent"
    mod.status = "approved"
    mod.upstream_url = sub.webhook
    mod.sandbox_url = None  # test-mode keys do not reach agents' servers for free
    mod.provider_auth = {"type": "standard_webhooks", "secret": sub.webhook_secret}
    mod.updated_at = now
    by_name = {a.name: a for a in mod.actions}
    for name in sub.actions:
        act = by_name.get(name)
        if act is None:
            mod.actions.append(ModuleAction(name=name, description="", price_cents=sub.price_cents,
                                            method="POST", path="/", timeout_seconds=10.0,
                                            active=True))
        else:
            act.price_cents, act.active, act.method, act.path = sub.price_cents, True, "POST", "/"
    for name, act in by_name.items():
        if name not in sub.actions:
            act.active = False
    _close(sub, "approved", reviewer, notes, now)
    _notify(agent, "module.approved", sub)
    return sub


@transactional
def reject(slug: str, *, reviewer: str, reason: str) -> ModuleSubmission:
    """Reject the pending submission for ``slug`` with a reason the agent can read."""
    reason = (reason or "").strip()
    if not reason:
        raise InvalidRequest("reason: must not be empty.")
    sub = _pending_for(slug)
    agent = db.session.get(Agent, sub.agent_id)
    _close(sub, "rejected", reviewer, reason, utcnow())
    _notify(agent, "module.rejected", sub)
    return sub


def _close(sub: ModuleSubmission, status: str, reviewer: str, notes: str | None, now) -> None:
    sub.status = status
    sub.pending_slug = None
    sub.review_notes = (notes or "").strip() or None
    sub.reviewed_by = reviewer
    sub.reviewed_at = now


def _notify(agent: Agent, event: str, sub: ModuleSubmission) -> None:
    """In the review's unit of work: queue the signed review event for the agent's webhook
    (the outbox enqueues it after commit) and, after commit, drop this process's cached
    catalog snapshots (other processes refresh within CATALOG_CACHE_TTL)."""
    after_commit(catalog.invalidate_cache)
    send_event(agent, event, {"agent_id": agent.id, "submission_id": sub.id, "slug": sub.slug,
                              "status": sub.status, "review_notes": sub.review_notes},
               source=f"submission:{sub.id}")
