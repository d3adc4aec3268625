"""Module catalog: YAML loading (``flask catalog load``), the public listing, and the
per-process cache of module snapshots used by the call path.

YAML format (one module per file under ``catalog/modules/``, or a file with a top-level
``modules:`` list)::

    slug: echo                      # [a-z0-9-], unique
    name: Echo
    description: Returns what you send.
    owner: Demo Provider
    status: approved                # approved | disabled (only approved are listed/callable)
    upstream_url: ${DEMO_PROVIDER_URL:-http://127.0.0.1:8901}/echo
    sandbox_url: ${DEMO_PROVIDER_URL:-http://127.0.0.1:8901}/sandbox/echo   # optional
    provider_auth: {type: header, header: X-Provider-Key, env: DEMO_PROVIDER_SECRET,
                    default: demo-provider-dev-secret}   # default: never used in production
    actions:
      - name: echo
        description: Echo the body.
        price_cents: 1
        method: POST                # POST | PUT | PATCH | GET | DELETE
        path: /                     # appended to the base URL
        timeout_seconds: 5

``${VAR:-default}`` / ``${VAR}`` in URLs is expanded from the environment at load time.
Loading is an idempotent upsert by slug: prices, URLs and actions change, actions that
disappeared from the file are deactivated (not deleted), and call history is untouched
because every call stores its own price. Modules built by agents are never touched.
"""
from __future__ import annotations

import glob
import os
import re
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import yaml
from flask import current_app
from sqlalchemy import select
from sqlalchemy.orm import selectinload

from app.errors import CatalogError, InvalidRequest, ModuleNotFound, UnknownAction
from app.extensions import db
from app.models import Module, ModuleAction
from app.services.platform.uow import unit_of_work

SLUG_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
# An action is a tool name's second half (``tools.tool_name``): only characters every MCP
# client and model API accepts in a function name (no dot).
ACTION_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
METHODS = ("POST", "PUT", "PATCH", "GET", "DELETE")
_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


# --- snapshots (immutable, cached per process) ---------------------------------------

@dataclass(frozen=True)
class ActionSnap:
    name: str
    price_cents: int
    method: str
    path: str
    timeout_seconds: float


@dataclass(frozen=True)
class ModuleSnap:
    id: int
    slug: str
    owner_agent_id: str | None
    upstream_url: str
    sandbox_url: str | None
    provider_auth: dict | None
    actions: dict  # name -> ActionSnap


_cache: dict[str, tuple[float, ModuleSnap | None]] = {}
_cache_lock = threading.Lock()


def invalidate_cache() -> None:
    """Drop this process's snapshots (other processes refresh within CATALOG_CACHE_TTL)."""
    with _cache_lock:
        _cache.clear()


def _snapshot(m: Module) -> ModuleSnap:
    return ModuleSnap(
        # the earner of the owner's share: the owner agent, else the owner account
        id=m.id, slug=m.slug, owner_agent_id=m.owner_agent_id or m.owner_account_id, upstream_url=m.upstream_url,
        sandbox_url=m.sandbox_url, provider_auth=dict(m.provider_auth) if m.provider_auth else None,
        actions={a.name: ActionSnap(a.name, int(a.price_cents), a.method.upper(), a.path,
                                    float(a.timeout_seconds))
                 for a in m.actions if a.active},
    )


def get_module(slug: str) -> ModuleSnap:
    """The approved module ``slug`` (cached ``CATALOG_CACHE_TTL`` seconds) or 404."""
    now = time.monotonic()
    hit = _cache.get(slug)
    if hit is None or hit[0] <= now:
        snap = None
        if SLUG_RE.match(slug):
            m = db.session.execute(
                select(Module).options(selectinload(Module.actions))
                .where(Module.slug == slug, Module.status == "approved")
            ).scalar_one_or_none()
            snap = _snapshot(m) if m is not None else None
        with _cache_lock:
            if len(_cache) > 10_000:
                _cache.clear()
            _cache[slug] = (now + float(current_app.config["CATALOG_CACHE_TTL"]), snap)
        hit = _cache[slug]
    if hit[1] is None:
        raise ModuleNotFound(f"No approved module '{slug[:64]}'.")
    return hit[1]


def get_action(mod: ModuleSnap, name) -> ActionSnap:
    act = mod.actions.get(name) if isinstance(name, str) else None
    if act is None:
        raise UnknownAction(f"Module '{mod.slug}' has no action '{str(name)[:64]}'; "
                            f"actions: {', '.join(sorted(mod.actions))}.")
    return act


# --- public listing ------------------------------------------------------------------


def list_modules() -> list[Module]:
    rows = db.session.execute(
        select(Module).options(selectinload(Module.actions), selectinload(Module.owner_agent))
        .where(Module.status == "approved").order_by(Module.slug)
    ).scalars().all()
    return list(rows)


def describe_module(slug: str) -> Module:
    m = db.session.execute(
        select(Module).options(selectinload(Module.actions), selectinload(Module.owner_agent))
        .where(Module.slug == slug, Module.status == "approved")
    ).scalar_one_or_none()
    if m is None:
        raise ModuleNotFound(f"No approved module '{slug[:64]}'.")
    return m


# --- YAML loading --------------------------------------------------------------------

def expand_env(value: str) -> str:
    def repl(match):
        name, default = match.group(1), match.group(2)
        val = os.environ.get(name)
        if val in (None, ""):
            if default is None:
                raise CatalogError(f"environment variable {name} is not set")
            return default
        return val

    return _ENV_RE.sub(repl, value)


def _url(value, where: str, required: bool) -> str | None:
    if value in (None, ""):
        if required:
            raise CatalogError(f"{where}: required")
        return None
    url = expand_env(str(value)).rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CatalogError(f"{where}: must be an http(s) URL, got {url!r}")
    return url


def _auth(value, where: str) -> dict | None:
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") not in ("header", "standard_webhooks"):
        raise CatalogError(f"{where}: type must be 'header' or 'standard_webhooks'")
    if value["type"] == "header":
        if not value.get("header") or not value.get("env"):
            raise CatalogError(f"{where}: a header auth needs 'header' and 'env'")
    elif not str(value.get("secret", "")).startswith("whsec_"):
        raise CatalogError(f"{where}: a standard_webhooks auth needs a 'whsec_…' secret")
    return dict(value)


def parse_module(doc: dict, where: str) -> dict:
    """Validate one module definition; returns normalized values."""
    if not isinstance(doc, dict):
        raise CatalogError(f"{where}: a module must be a mapping")
    slug = str(doc.get("slug", ""))
    if not SLUG_RE.match(slug):
        raise CatalogError(f"{where}: slug {slug!r} must match {SLUG_RE.pattern}")
    where = f"{where} ({slug})"
    status = doc.get("status", "approved")
    if status not in ("approved", "disabled"):
        raise CatalogError(f"{where}: status must be approved or disabled")
    actions = doc.get("actions")
    if not isinstance(actions, list) or not actions:
        raise CatalogError(f"{where}: actions must be a non-empty list")
    parsed, seen = [], set()
    for i, a in enumerate(actions):
        w = f"{where}: actions[{i}]"
        if not isinstance(a, dict):
            raise CatalogError(f"{w}: must be a mapping")
        name = str(a.get("name", ""))
        if not ACTION_RE.match(name) or name in seen:
            raise CatalogError(f"{w}: name {name!r} missing, invalid or duplicated")
        seen.add(name)
        price = a.get("price_cents")
        if not isinstance(price, int) or isinstance(price, bool) or price < 0:
            raise CatalogError(f"{w}: price_cents must be an integer >= 0")
        method = str(a.get("method", "POST")).upper()
        if method not in METHODS:
            raise CatalogError(f"{w}: method must be one of {', '.join(METHODS)}")
        path = str(a.get("path", "/"))
        if not path.startswith("/"):
            raise CatalogError(f"{w}: path must start with /")
        timeout = a.get("timeout_seconds", 10)
        if not isinstance(timeout, (int, float)) or not 0 < float(timeout) <= 120:
            raise CatalogError(f"{w}: timeout_seconds must be in (0, 120]")
        parsed.append({"name": name, "description": str(a.get("description", "")),
                       "price_cents": price, "method": method, "path": path,
                       "timeout_seconds": float(timeout)})
    return {
        "slug": slug, "name": str(doc.get("name") or slug), "description": str(doc.get("description", "")),
        "owner": str(doc.get("owner", "")), "status": status,
        "upstream_url": _url(doc.get("upstream_url"), f"{where}: upstream_url", True),
        "sandbox_url": _url(doc.get("sandbox_url"), f"{where}: sandbox_url", False),
        "provider_auth": _auth(doc.get("provider_auth"), f"{where}: provider_auth"),
        "actions": parsed,
    }


def read_catalog(path: str) -> list[dict]:
    """Parse every module definition under ``path`` (a YAML file or a directory of them)."""
    files = sorted(glob.glob(os.path.join(path, "*.yaml")) + glob.glob(os.path.join(path, "*.yml"))) \
        if os.path.isdir(path) else [path]
    if not files or not all(os.path.isfile(f) for f in files):
        raise CatalogError(f"{path}: no catalog YAML found")
    out, slugs = [], set()
    for f in files:
        with open(f) as fh:
            try:
                doc = yaml.safe_load(fh)
            except yaml.YAMLError as exc:
                raise CatalogError(f"{f}: invalid YAML: {exc}") from None
        docs = doc["modules"] if isinstance(doc, dict) and "modules" in doc else [doc]
        if not isinstance(docs, list):
            raise CatalogError(f"{f}: 'modules' must be a list")
        for i, d in enumerate(docs):
            m = parse_module(d, f if len(docs) == 1 else f"{f}[{i}]")
            if m["slug"] in slugs:
                raise CatalogError(f"{f}: slug {m['slug']} defined twice")
            slugs.add(m["slug"])
            out.append(m)
    return out


def load(path: str | None = None) -> dict:
    """Upsert the catalog at ``path`` (default CATALOG_PATH) in one unit of work.
    Returns ``{"created": [...], "updated": [...], "unchanged": [...]}``."""
    path = path or current_app.config["CATALOG_PATH"]
    modules = read_catalog(path)
    report = {"created": [], "updated": [], "unchanged": []}
    with unit_of_work():
        for spec in modules:
            m = db.session.execute(
                select(Module).options(selectinload(Module.actions)).where(Module.slug == spec["slug"])
            ).scalar_one_or_none()
            if m is not None and m.source != "catalog":
                raise InvalidRequest(f"slug {spec['slug']} belongs to an agent-built module")
            created = m is None
            if created:
                m = Module(slug=spec["slug"], source="catalog")
                db.session.add(m)
            changed = created
            for field in ("name", "description", "owner", "status", "upstream_url", "sandbox_url",
                          "provider_auth"):
                if getattr(m, field) != spec[field]:
                    setattr(m, field, spec[field])
                    changed = True
            existing = {a.name: a for a in m.actions}
            for a in spec["actions"]:
                row = existing.pop(a["name"], None)
                if row is None:
                    m.actions.append(ModuleAction(active=True, **a))
                    changed = True
                    continue
                for field, value in {**a, "active": True}.items():
                    if getattr(row, field) != value:
                        setattr(row, field, value)
                        changed = True
            for row in existing.values():
                if row.active:
                    row.active = False
                    changed = True
            report["created" if created else "updated" if changed else "unchanged"].append(spec["slug"])
    invalidate_cache()
    return report


def set_owner_account(slug: str, account_id: str) -> dict:
    """Make an account (or organisation) the owner of the catalog module ``slug``: its
    calls then accrue the owner's share to ``earnings:<account id>`` (``revenue_share``).
    An agent-built module keeps its agent as owner (400)."""
    from app.models import Account

    with unit_of_work():
        m = db.session.execute(select(Module).where(Module.slug == slug).with_for_update()).scalar_one_or_none()
        if m is None:
            raise ModuleNotFound(f"No module {slug}.")
        if m.owner_agent_id:
            raise InvalidRequest(f"{slug} is owned by agent {m.owner_agent_id}.")
        if db.session.get(Account, account_id) is None:
            raise InvalidRequest(f"No account {account_id}.")
        m.owner_account_id = account_id
    invalidate_cache()
    return {"slug": slug, "owner_account_id": account_id}
