"""Module catalog: modules (catalog-loaded or agent-built) and their priced actions."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.extensions import db
from app.models.base import JSONType, UTCDateTime, utcnow


class Module(db.Model):
    """A callable module. Only ``status == "approved"`` modules are listed and callable.

    ``source`` is ``catalog`` (loaded from YAML by ``flask catalog load``) or ``agent``
    (an agent submission, owned by ``owner_agent_id``; its upstream is the agent's webhook).
    ``provider_auth`` says how the gateway authenticates to the upstream, e.g.
    ``{"type": "header", "header": "X-Api-Key", "env": "DEMO_PROVIDER_KEY"}`` or
    ``{"type": "standard_webhooks", "secret": "whsec_…"}`` (agent modules).
    """

    __tablename__ = "modules"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    slug: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(120))
    description: Mapped[str] = mapped_column(Text, default="")
    # display name of the provider; an agent's module is listed under its agent's current
    # name (``owner_name``), this column keeps the name it had at approval
    owner: Mapped[str] = mapped_column(String(120), default="")
    owner_agent_id: Mapped[str | None] = mapped_column(String(32), index=True)
    # a catalog module owned by an account (or organisation): it earns the owner's share
    owner_account_id: Mapped[str | None] = mapped_column(ForeignKey("accounts.id"), index=True)
    source: Mapped[str] = mapped_column(String(16), default="catalog")  # catalog | agent
    status: Mapped[str] = mapped_column(String(24), default="approved")
    upstream_url: Mapped[str] = mapped_column(String(500))
    sandbox_url: Mapped[str | None] = mapped_column(String(500))
    provider_auth: Mapped[dict | None] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)

    actions: Mapped[list["ModuleAction"]] = relationship(
        back_populates="module", cascade="all, delete-orphan", order_by="ModuleAction.name")
    owner_agent: Mapped["Agent | None"] = relationship(  # noqa: F821 - app.models.agents
        primaryjoin="foreign(Module.owner_agent_id) == Agent.id", viewonly=True)

    @property
    def owner_name(self) -> str:
        """The name the module is listed under: its owner agent's name now (an agent renamed
        after approval is listed under its new name), else ``owner``."""
        return self.owner_agent.name if self.owner_agent is not None else (self.owner or "")

    @property
    def listed_description(self) -> str:
        """The description listed: the module's, else, for an agent's module submitted
        without one, "Agent-built module by <its agent's name now>" (approvals before
        2026-11-29 stored that text with the name of then, ``owner``: read as none)."""
        if self.owner_agent is not None and self.description in ("", None, f"Agent-built module by {self.owner}."):
            return f"Agent-built module by {self.owner_agent.name}."
        return self.description or ""


class ModuleAction(db.Model):
    """One priced action of a module and how it maps to the upstream."""

    __tablename__ = "module_actions"
    __table_args__ = (UniqueConstraint("module_id", "name", name="uq_module_actions_module_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    module_id: Mapped[int] = mapped_column(ForeignKey("modules.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    description: Mapped[str] = mapped_column(Text, default="")
    price_cents: Mapped[int] = mapped_column(Integer, default=0)
    method: Mapped[str] = mapped_column(String(8), default="POST")
    path: Mapped[str] = mapped_column(String(300), default="/")
    timeout_seconds: Mapped[float] = mapped_column(db.Float, default=10.0)
    active: Mapped[bool] = mapped_column(db.Boolean, default=True)

    module: Mapped[Module] = relationship(back_populates="actions")
