"""``flask chat …``: inspect the chat model catalog and release stale holds."""
from __future__ import annotations

import json
import sys

import click
from flask import current_app
from flask.cli import AppGroup

chat_cli = AppGroup("chat", help="Chat completions: model catalog and holds.")


@chat_cli.command("models")
@click.option("--all", "show_all", is_flag=True, help="Include models with no enabled provider.")
def models(show_all):
    """Validate catalog/models*.yaml (CHAT_CATALOG) and list the models and their providers."""
    from app.services.chat.catalog import CatalogError, reload

    try:
        cat = reload()
    except CatalogError as exc:
        click.echo(f"catalog error: {exc}", err=True)
        sys.exit(1)
    for m in cat.models.values():
        offers = m.enabled_offers()
        if not offers and not show_all:
            continue
        click.echo(json.dumps({
            "id": m.id, "context_window": m.context_window, "capabilities": sorted(m.capabilities),
            "providers": [{"provider": o.provider.id, "enabled": o.provider.enabled,
                           "upstream_model": o.upstream_model,
                           "input_usd_per_mtok": str(o.input_price),
                           "output_usd_per_mtok": str(o.output_price)} for o in m.offers]}))


@chat_cli.command("release-stale-holds")
@click.option("--older-than", type=click.FloatRange(min=0), default=None,
              help="Seconds (default CHAT_HOLD_TTL_SECONDS).")
def release_stale(older_than):
    """Release chat holds whose request never finished (also run by the scheduler)."""
    from app.services.money.holds import release_stale_holds

    ttl = older_than if older_than is not None else float(current_app.config["CHAT_HOLD_TTL_SECONDS"])
    click.echo(json.dumps({"released": release_stale_holds(ttl)}))


@chat_cli.command("reseal-keys")
def reseal_keys():
    """Seal every stored provider key (bring your own key) under the current
    BYOK_ENCRYPTION_KEY, reading them under BYOK_PREVIOUS_KEYS where needed; prints the
    counts as JSON (docs/operations.md "Rotating the BYOK encryption key"). Exits 1 when
    some keys decrypt under none of the configured keys (left unchanged, ids listed)."""
    from app.services.chat.byok import reseal

    out = reseal()
    click.echo(json.dumps(out))
    if out["unreadable"]:
        sys.exit(1)
