"""Schemas of self-serve sign-up."""
import marshmallow as ma

from app.blueprints.accounts.schemas import AccountSchema
from app.blueprints.contact.schemas import EMAIL_DOC, address
from app.blueprints.fields import Extended, InputSchema, derived
from app.blueprints.keys.schemas import KeyCreatedSchema


class SignupSchema(InputSchema):
    email = ma.fields.String(required=True, validate=[ma.validate.Length(min=3, max=254), address],
                             metadata=EMAIL_DOC)


class SignupConfirmSchema(InputSchema):
    token = ma.fields.String(required=True, validate=ma.validate.Length(min=1, max=200),
                             metadata={"description": "The token from the verification e-mail."})


class SignupCompletedSchema(ma.Schema):
    account = ma.fields.Nested(AccountSchema, required=True,
                               metadata={"description": "The new account (1,000 cents of promotional credit)"})
    key = derived(ma.fields.Nested(KeyCreatedSchema, required=True,
                                   metadata={"description": "Its first live key, all scopes. The secret is shown only here."}),
                  lambda result: Extended(result.key, key=result.secret))
