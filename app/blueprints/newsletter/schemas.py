"""Schemas of the newsletter endpoints (SPEC part 2: Email subscription) and pages."""
import marshmallow as ma

from app.blueprints.contact.schemas import EMAIL_DOC, address
from app.blueprints.fields import InputSchema
from app.services.public.newsletter import DEFAULT_LIST, LISTS


class SubscribeSchema(InputSchema):
    email = ma.fields.String(required=True, validate=[ma.validate.Length(min=3, max=254), address],
                             metadata=EMAIL_DOC)
    list = ma.fields.String(validate=ma.validate.OneOf(LISTS), allow_none=True,
                            metadata={"description": f"One of {', '.join(LISTS)}; default `{DEFAULT_LIST}`."})


class UnsubscribeSchema(InputSchema):
    email = ma.fields.String(required=True, validate=[ma.validate.Length(min=3, max=254), address],
                             metadata=EMAIL_DOC)


class LinkToken(ma.fields.String):
    """The token of an e-mailed link. One longer than any token issued (``MAX``, also its
    documented ``maxLength``) reads as no token, so the page answers its 404 like for any
    unknown token; control characters are still refused (400) by the input policy."""

    MAX = 200

    def _deserialize(self, value, attr, data, **kwargs):
        text = super()._deserialize(value, attr, data, **kwargs)
        return "" if len(text) > self.MAX else text


class StatusSchema(ma.Schema):
    status = ma.fields.String(required=True)
    message = ma.fields.String(required=True)


class TokenQuerySchema(InputSchema):
    class Meta:
        unknown = ma.EXCLUDE  # tracking parameters added by mail clients are ignored

    token = LinkToken(load_default="", validate=ma.validate.Length(max=LinkToken.MAX),
                             metadata={"description": "The token from the e-mailed link (an unknown, "
                                       "expired or used token shows a 404 page)."})


class TokenFormSchema(InputSchema):
    class Meta:
        unknown = ma.EXCLUDE

    token = LinkToken(load_default="", validate=ma.validate.Length(max=LinkToken.MAX), metadata={"description": "The token from the page's form."})


class OneClickFormSchema(InputSchema):
    """RFC 8058 one-click body (``List-Unsubscribe=One-Click``); optional, other fields ignored."""

    class Meta:
        unknown = ma.EXCLUDE

    list_unsubscribe = ma.fields.String(data_key="List-Unsubscribe", validate=ma.validate.OneOf(["One-Click"]))
