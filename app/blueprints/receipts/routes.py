"""The public keys that verify call receipts."""
from app.blueprints.receipts.schemas import ReceiptKeysSchema
from app.blueprints.routing import endpoint
from app.extensions import Blueprint
from app.services.gateway import receipts

blp = Blueprint("receipts", __name__, url_prefix="/api/receipts",
                description="Receipt signing keys (ed25519), for offline verification.")


@endpoint(blp, "/keys", "get", public=True, ok=ReceiptKeysSchema)
def receipt_keys():
    """Every receipt key by id (`kid`): the active one and retired ones (still valid for
    the receipts they signed)."""
    return {"keys": receipts.public_keys()}
