"""Agent jobs: purge of expired sessions (and, by the token purge, of spent sign-in nonces);
both agent jobs are scheduled."""
from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from app.tasks import job_paths as as_paths
from app.extensions import db
from app.models import AgentSession, SingleUseToken
from app.models.base import utcnow
from app.tasks import agents as agent_jobs
from app.tasks import tokens as token_jobs
from app.tasks.schedule import SCHEDULE
from tests.agentkit import Keypair, nonce, register, sign_in


def test_purge_expired(app, client, account):
    kp = Keypair()
    register(client, account, kp)
    sign_in(client, kp)            # one used nonce + one session
    sign_in(client, kp)
    nonce(client)                  # one fresh nonce
    with app.app_context():
        old = utcnow() - timedelta(days=2)
        first = db.session.query(AgentSession).order_by(AgentSession.created_at).first()
        db.session.execute(update(AgentSession).where(AgentSession.id == first.id).values(expires_at=old))
        db.session.execute(update(SingleUseToken).where(SingleUseToken.used_at.is_not(None)).values(expires_at=old))
        db.session.commit()
        assert agent_jobs.purge_expired() + token_jobs.purge() == 3
        assert db.session.query(SingleUseToken).count() == 1 and db.session.query(AgentSession).count() == 1
        assert agent_jobs.purge_expired() + token_jobs.purge() == 0


def test_agent_jobs_are_scheduled():
    paths = {path for _, _, path in as_paths(SCHEDULE)}
    assert {"app.tasks.agents.settle_due", "app.tasks.agents.purge_expired"} <= paths
