"""Schemas of the contact form (SPEC part 2: ContactForm)."""
import marshmallow as ma

from app.blueprints.fields import InputSchema, header_safe

EMAIL_DOC = {"description": "E-mail address (at most 254 characters).", "format": "email"}


class ContactFormSchema(InputSchema):
    email = ma.fields.String(required=True, validate=[ma.validate.Length(min=3, max=254), header_safe],
                             metadata=EMAIL_DOC)
    message = ma.fields.String(required=True, validate=ma.validate.Length(min=1, max=5000),
                               metadata={"description": "1–5,000 characters.", "multiline": True})
    name = ma.fields.String(validate=[ma.validate.Length(max=100), header_safe], allow_none=True,
                            metadata={"description": "At most 100 characters, one line."})
    website = ma.fields.String(validate=ma.validate.Length(max=500), allow_none=True, metadata={
        "description": "Honeypot: leave empty (hide it in your form). A request with a value "
                       "gets the same 202 answer but nothing is stored or sent."})


class ContactQueuedSchema(ma.Schema):
    id = ma.fields.String(required=True, metadata={"description": "Id of the stored message"})
    status = ma.fields.String(required=True, metadata={"description": "Always `queued`"})
