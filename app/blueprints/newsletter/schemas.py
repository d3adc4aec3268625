"""Schemas of the newsletter endpoints (SPEC part 2: Email subscription) and pages."""
import marshmallow as ma

from app.blueprints.contact.schemas import EMAIL_DOC
from app.services.public.newsletter import DEFAULT_LIST, LISTS


class SubscribeSchema(ma.Schema):
    email = ma.fields.String(required=True, validate=ma.validate.Length(min=3, max=254),
                             metadata=EMAIL_DOC)
    list = ma.fields.String(validate=ma.validate.OneOf(LISTS), allow_none=True,
                            metadata={"description": f"One of {', '.join(LISTS)}; default `{DEFAULT_LIST}`."})


class UnsubscribeSchema(ma.Schema):
    email = ma.fields.String(required=True, validate=ma.validate.Length(min=3, max=254),
                             metadata=EMAIL_DOC)


class StatusSchema(ma.Schema):
    status = ma.fields.String(required=True)
    message = ma.fields.String(required=True)


class TokenQuerySchema(ma.Schema):
    class Meta:
        unknown = ma.EXCLUDE  # tracking parameters added by mail clients are ignored

    token = ma.fields.String(load_default="",
                             metadata={"description": "The token from the e-mailed link (an unknown, "
                                       "expired or used token shows a 404 page)."})


class TokenFormSchema(ma.Schema):
    class Meta:
        unknown = ma.EXCLUDE

    token = ma.fields.String(load_default="", metadata={"description": "The token from the page's form."})
