"""Provider keys: bring your own key for the chat host (docs/chat.md "Bring your own key")."""
from app.auth import principal
from app.blueprints.providerkeys.schemas import (ByokSettingsSchema, ByokSettingsUpdateSchema,
                                                 ProviderKeyCreateSchema, ProviderKeyDeletedSchema,
                                                 ProviderKeyListSchema, ProviderKeySchema)
from app.blueprints.routing import endpoint
from app.extensions import Blueprint
from app.services.chat import byok

blp = Blueprint("provider_keys", __name__, url_prefix="/api/provider-keys", description=(
    "Bring your own key: the account's own chat-provider keys. Completions they serve are charged the "
    "platform fee (`CHAT_BYOK_FEE_PERCENT`, default 5 % of the model price) instead of the price."))

_LIVE = "`forbidden`: provider keys are managed with a live key (they serve live completions only)."


@endpoint(blp, "", "get", "keys:read", ok=ProviderKeyListSchema, errors={403: _LIVE}, name="ProviderKeysView")
def list_provider_keys():
    """List the account's provider keys (prefix only) and its BYOK settings."""
    return byok.list_keys(principal().account_id, principal().mode)


@endpoint(blp, "", "post", "keys:write", body=ProviderKeyCreateSchema, ok=ProviderKeySchema, status=201,
          errors={403: _LIVE, 404: "`not_found`: `provider` is not a provider of the chat catalog.",
                  409: "`provider_key_exists`: the account has a key for this provider; delete it first.",
                  422: "`provider_key_invalid`: the provider refused the key (401/403 to its check call); "
                       "nothing stored.",
                  502: "`provider_error`: the provider could not be reached to check the key; nothing stored."},
          name="ProviderKeyCreateView")
def add_provider_key(body):
    """Add a provider key. It is checked with one cheap call to the provider (its model
    list) before anything is stored, then kept encrypted; only `prefix` is shown again.
    From then on this account's live completions use it for that provider's models."""
    return byok.add_key(principal().account_id, principal().mode, body["provider"], body["api_key"])


@endpoint(blp, "/settings", "patch", "keys:write", body=ByokSettingsUpdateSchema, ok=ByokSettingsSchema,
          errors={403: _LIVE}, name="ProviderKeySettingsView")
def update_settings(body):
    """Change the BYOK settings: `byok_only` (only own keys) and `byok_fallback` (own keys
    failing, fail over to the platform's keys at the model price)."""
    return byok.update_settings(principal().account_id, principal().mode, body)


@endpoint(blp, "/<id:key_id>", "delete", "keys:write", ok=ProviderKeyDeletedSchema,
          errors={403: _LIVE, 404: None}, name="ProviderKeyView")
def delete_provider_key(key_id):
    """Delete a provider key (erased; completions use the platform's keys again)."""
    row = byok.delete_key(principal().account_id, principal().mode, key_id)
    return {"deleted": True, "id": row.id}
