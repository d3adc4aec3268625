"""The public keys that verify call receipts."""
from flask.views import MethodView

from app.auth import public
from app.blueprints.receipts.schemas import ReceiptKeysSchema
from app.extensions import Blueprint
from app.services.gateway import receipts

blp = Blueprint("receipts", __name__, url_prefix="/api/receipts",
                description="Receipt signing keys (ed25519), for offline verification.")


@blp.route("/keys")
class ReceiptKeysView(MethodView):
    @public
    @blp.response(200, ReceiptKeysSchema)
    def get(self):
        """Every receipt key by id (`kid`): the active one and retired ones (still valid for
        the receipts they signed)."""
        return {"keys": receipts.public_keys()}
