"""``flask catalog load``, ``flask calls sweep|purge-idempotency``, ``flask receipts
verify|rotate-key|keys``."""
from __future__ import annotations

import json
import sys

import click
from flask.cli import AppGroup

catalog_cli = AppGroup("catalog", help="Module catalog (YAML under catalog/).")
calls_cli = AppGroup("calls", help="Module call maintenance.")
receipts_cli = AppGroup("receipts", help="Receipt signing keys and verification.")


@catalog_cli.command("load")
@click.argument("path", required=False)
def catalog_load(path):
    """Upsert the catalog at PATH (file or directory; default CATALOG_PATH). Idempotent."""
    from app.errors import DomainError
    from app.services.gateway import catalog

    try:
        report = catalog.load(path)
    except (catalog.CatalogError, DomainError) as exc:
        raise click.ClickException(str(exc))
    click.echo(json.dumps(report))


@calls_cli.command("sweep")
def calls_sweep():
    """Refund calls left pending past their deadline (a process died mid-call)."""
    from app.services.gateway import calls as gateway

    click.echo(json.dumps({"refunded": gateway.sweep_pending()}))


@calls_cli.command("purge-idempotency")
def calls_purge():
    """Delete Idempotency-Key records older than 24 hours."""
    from app.services.gateway import calls as gateway

    click.echo(json.dumps({"deleted": gateway.purge_idempotency()}))


@receipts_cli.command("verify")
@click.argument("file", type=click.File("r"))
@click.option("--keys-url", default=None,
              help="Fetch the published keys from this URL (…/api/receipts/keys) instead of "
                   "this deployment's keyring.")
def receipts_verify(file, keys_url):
    """Verify a saved call response (JSON FILE, '-' for stdin); exits 1 if invalid."""
    from app.services.gateway import receipts

    try:
        response = json.load(file)
    except ValueError as exc:
        raise click.ClickException(f"not JSON: {exc}")
    if keys_url:
        from app.services.platform import http

        try:
            published = http.call("GET", keys_url, purpose="cli", timeout=10).json()["keys"]
        except (*http.ERRORS, ValueError, KeyError, TypeError) as exc:
            raise click.ClickException(f"cannot read the published keys at {keys_url}: {exc}")
    else:
        published = receipts.public_keys()
    try:
        f = receipts.verify_response(response, {k["kid"]: k["public_key"] for k in published})
    except receipts.ReceiptInvalid as exc:
        click.echo(json.dumps({"valid": False, "reason": str(exc)}))
        sys.exit(1)
    click.echo(json.dumps({"valid": True, "facts": f}))


@receipts_cli.command("rotate-key")
def receipts_rotate():
    """Start signing with a new key; the old public key stays published and verifiable."""
    from app.services.gateway import receipts

    try:
        kid = receipts.rotate_key()
    except RuntimeError as exc:
        raise click.ClickException(str(exc))
    click.echo(json.dumps({"active_kid": kid}))


@receipts_cli.command("keys")
def receipts_keys():
    """Print the published receipt keys."""
    from app.services.gateway import receipts

    click.echo(json.dumps({"keys": receipts.public_keys()}))
