"""Schemas of the published receipt keys."""
import marshmallow as ma


class ReceiptKeySchema(ma.Schema):
    kid = ma.fields.String(required=True)
    alg = ma.fields.String(required=True, metadata={"description": "`ed25519`."})
    public_key = ma.fields.String(required=True, metadata={"description": "Base64 of the 32-byte ed25519 public key."})
    active = ma.fields.Boolean(required=True, metadata={"description": "Signs new receipts; retired keys stay listed."})
    created_at = ma.fields.String(required=True, allow_none=True, metadata={
        "format": "date-time", "description": "When the key was made (ISO 8601, UTC); null for a "
                                              "key given by the operator's configuration."})


class ReceiptKeysSchema(ma.Schema):
    keys = ma.fields.List(ma.fields.Nested(ReceiptKeySchema), required=True)
