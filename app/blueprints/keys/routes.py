"""API key endpoints (SPEC endpoints 3–5)."""
from app.auth import principal
from app.blueprints.fields import Extended
from app.blueprints.keys.schemas import (KeyCreatedSchema, KeyCreateSchema, KeyListSchema,
                                         KeyRevokedSchema)
from app.blueprints.routing import endpoint
from app.extensions import Blueprint
from app.services.accounts import keys

blp = Blueprint("keys", __name__, url_prefix="/api/keys", description="API keys of the account.")


@endpoint(blp, "", "get", "keys:read", ok=KeyListSchema, name="KeysView")
def list_keys():
    """List the account's active keys (never the secret)."""
    return {"keys": keys.list_keys(principal().account_id, principal().mode)}


@endpoint(blp, "", "post", "keys:write", body=KeyCreateSchema, ok=KeyCreatedSchema, status=201,
          name="KeyCreateView")
def create_key(body):
    """Create a key. The full `key` is returned in this response only.

    Without `scopes` the key gets the scopes of the credential that creates it;
    asking for a scope the creating credential lacks is 403 `insufficient_scope`.
    """
    p = principal()
    row, secret = keys.create_key(p.account_id, body["name"], body.get("scopes"),
                                  creator_scopes=p.scopes, creator_mode=p.mode)
    return Extended(row, key=secret)


@endpoint(blp, "/<string:key_id>", "delete", "keys:write", ok=KeyRevokedSchema, errors={404: None},
          name="KeyView")
def revoke_key(key_id):
    """Revoke a key. Effective on every worker and node within 60 s (about 1 s with
    Redis). Revoking twice is harmless; another account's key id is 404."""
    row = keys.revoke_key(principal().account_id, key_id, principal().mode)
    return {"revoked": True, "id": row.id}
