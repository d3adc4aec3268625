"""API key endpoints (SPEC endpoints 3–5)."""
from app.auth import principal
from app.blueprints.fields import Extended
from app.blueprints.orgs.routes import current_actor
from app.blueprints.keys.schemas import (KeyCreatedSchema, KeyCreateSchema, KeyListSchema, KeyRevokedSchema,
                                         KeyRotateSchema, KeySchema, KeysQuerySchema, KeyUpdateSchema)
from app.blueprints.routing import endpoint, link
from app.extensions import Blueprint
from app.services.accounts import key_controls, keys
from app.services.orgs import orgs

blp = Blueprint("keys", __name__, url_prefix="/api/keys", description="API keys of the account.")


@endpoint(blp, "", "get", "keys:read", query=KeysQuerySchema, ok=KeyListSchema, name="KeysView",
          errors={403: "`org_role_required`.", 404: "`org_id`: not an organisation of the caller."})
def list_keys(query):
    """List the account's active keys (never the secret). In an organisation (`org_id`,
    or an organisation key): owners and admins see every key of the organisation, the
    other members their own."""
    account, only = orgs.keys_of(principal(), query.get("org_id"), "keys:read")
    rows = keys.list_keys(account, principal().mode)
    return {"keys": rows if only is None else [row for row in rows if row.member_account_id == only]}


# No link to PATCH / rotate: their body's `org_id` (another organisation: 404) cannot be
# bound by a link, and a link-follower (schemathesis' ST302) reads that 404 as the new key
# missing; DELETE's `org_id` is a query parameter, left unbound.
_NEW_KEY = "$response.body#/id"


@endpoint(blp, "", "post", "keys:write", body=KeyCreateSchema, ok=KeyCreatedSchema, status=201,
          errors={409: "`key_limit_reached`: the account has 100 active keys.",
                  422: "`unprocessable`: `expires_at` is not in the future, or more than a year ahead (the "
                       "clock: a rule the schema cannot state)."}, name="KeyCreateView",
          links={"RevokeKey": link("/api/keys/{key_id}", "delete", "Revoke the key just created.", key_id=_NEW_KEY)})
def create_key(body):
    """Create a key. The full `key` is returned in this response only.

    Without `scopes` the key gets the scopes of the credential that creates it;
    asking for a scope the creating credential lacks is 403 `insufficient_scope`.
    Optional: a spend limit (`spend_limit_cents` per `spend_limit_period`, UTC) and an
    expiry (`expires_at`, future, at most a year ahead). A key with a spend limit or an
    expiry creates keys within them only: without `spend_limit_cents` / `expires_at` the
    new key gets the creating key's; more (a larger limit, a shorter period, a later
    expiry) is 403 `beyond_own_limits`. At most 100 active keys per account (409
    `key_limit_reached`). Controls: `allowed_models`, `allowed_modules`, `rpm_limit`,
    `tpm_limit` (docs/keys.md "Per-key controls").

    With `org_id` (or made by an organisation key) it is an organisation key: it spends
    the organisation's balance and acts as the creating member, within the member's role
    (403 `org_role_required`).
    """
    p = principal()
    payer, member = orgs.key_owner(p, body.get("org_id"))
    row, secret = keys.create_key(payer, body["name"], body.get("scopes"),
                                  creator_scopes=p.scopes, creator_mode=p.mode,
                                  spend_limit_cents=body.get("spend_limit_cents"),
                                  spend_limit_period=body.get("spend_limit_period"),
                                  expires_at=body.get("expires_at"), member_account_id=member,
                                  actor=current_actor() if member else None,
                                  controls={k: body[k] for k in key_controls.FIELDS if k in body},
                                  creator_key_id=p.credential_id)
    return Extended(row, key=secret)


@endpoint(blp, "/<string:key_id>", "patch", "keys:write", body=KeyUpdateSchema, ok=KeySchema,
          errors={404: None, 409: "`conflict`: `spend_limit_period` alone for a key that has no spend limit "
                                  "(send `spend_limit_cents` too); `key_retiring`: a spend-limit, `rpm_limit` or "
                                  "`tpm_limit` change on a rotated key in its overlap (its successor's limits "
                                  "apply: change them there)."}, name="KeyUpdateView")
def update_key(body, key_id):
    """Change a key's spend limit (`spend_limit_cents: null` removes it) and its controls:
    `allowed_models`, `allowed_modules` (allow-lists; null: any), `rpm_limit`, `tpm_limit`
    (per minute; null: none). Applies to the next request on every worker; what the key
    spent this period is kept (a new period starts from the current period's count). A key
    changes only keys whose scopes are within its own, and cannot set a key (itself
    included) beyond its own spend limit and controls: 403 `beyond_own_limits`. An organisation's key: with `org_id` in
    the body (or an organisation key); members other than owners and admins change only
    their own."""
    account, _ = orgs.keys_of(principal(), body.pop("org_id", None), "keys:write", key_id)
    return keys.update_key(account, key_id, body, principal().mode, creator_key_id=principal().credential_id)


@endpoint(blp, "/<string:key_id>/rotate", "post", "keys:write", body=KeyRotateSchema, ok=KeyCreatedSchema,
          status=201, errors={404: None, 409: "`key_already_rotated`: the key is already retiring; "
                                               "rotate its successor. `key_limit_reached`: the new key "
                                               "would pass 100 active keys."},
          name="KeyRotateView", body_optional=True)
def rotate_key(body, key_id):
    """Rotate a key: a new key (full `key` shown once) with the same name, scopes and spend
    limit (this period's spend carries over); the old key keeps working for
    `overlap_seconds` (default 86,400, max 604,800), then is 401 on every worker. A key
    that was already rotated is 409 `key_already_rotated` (rotate its successor; when the
    successor was revoked or has expired, the retiring key rotates again, and the new key
    gets the successor's spend limit and count: the limit the retiring key was charged
    under). The new
    key counts against the 100-key cap while the old one overlaps (409
    `key_limit_reached`; `overlap_seconds: 0` retires the old key at once). A key rotates
    only keys within its own scopes and limits (403 `beyond_own_limits`); the new key
    keeps the old key's expiry (within the rotating key's own). An organisation's key:
    with `org_id` in the body (or an organisation key); members other than owners and
    admins rotate only their own."""
    account, _ = orgs.keys_of(principal(), body.get("org_id"), "keys:write", key_id)
    row, secret = keys.rotate_key(account, key_id, body.get("overlap_seconds"),
                                  creator_scopes=principal().scopes, mode=principal().mode, actor=current_actor(),
                                  creator_key_id=principal().credential_id)
    return Extended(row, key=secret)


@endpoint(blp, "/<string:key_id>", "delete", "keys:write", query=KeysQuerySchema, ok=KeyRevokedSchema,
          errors={403: "`org_role_required`; `beyond_own_limits`: the key holds a scope the revoking "
                       "key lacks.", 404: None}, name="KeyView")
def revoke_key(query, key_id):
    """Revoke a key. Effective on every worker and node within 60 s (about 1 s with
    Redis). Revoking twice is harmless; another account's key id is 404. A key revokes
    itself and keys whose scopes are within its own (403 `beyond_own_limits` otherwise: a
    narrow key cannot lock out a wider one); the console's owner revokes any. An
    organisation's key: with `org_id` (or an organisation key); a member who is not an
    owner or admin revokes only their own."""
    account, _ = orgs.keys_of(principal(), query.get("org_id"), "keys:write", key_id)
    row = keys.revoke_key(account, key_id, principal().mode, actor=current_actor(),
                          creator_key_id=principal().credential_id)
    return {"revoked": True, "id": row.id}
