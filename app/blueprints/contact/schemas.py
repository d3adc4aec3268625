"""Schemas of the contact form (SPEC part 2: ContactForm)."""
import marshmallow as ma

from app.blueprints.fields import NOT_BLANK, SPACE, InputSchema, Pattern, header_safe
from app.services.accounts.accounts import EMAIL_CORE

# No ``format: email``: the pattern below is the exact rule, and white space around the address
# (trimmed) is allowed, which ``format: email`` is not (a fuzzer then reads a trimmed address
# as one the service should have refused).
EMAIL_DOC = {"description": "E-mail address (at most 254 characters; white space around it is trimmed)."}
# The shape of an address the service mails (``accounts.normalize_email``: white space around it
# trimmed, one @, a dotted domain, no RFC 2047 "=?"), published as the field's pattern: ``format:
# email`` alone admits a dotless domain, a quoted local part or an address literal, which would
# be schema-valid and refused. Also one line and header-safe (what ``header_safe`` checks).
ADDRESS_PATTERN = rf"^(?![\s\S]*=\?)[{SPACE}]*{EMAIL_CORE}[{SPACE}]*$"
address = Pattern(ADDRESS_PATTERN, error="not a valid e-mail address.")


class ContactFormSchema(InputSchema):
    email = ma.fields.String(required=True, validate=[ma.validate.Length(min=3, max=254), address],
                             metadata=EMAIL_DOC)
    message = ma.fields.String(required=True, validate=[ma.validate.Length(min=1, max=5000),
                                                        Pattern(NOT_BLANK, error="must not be blank.")],
                               metadata={"description": "1–5,000 characters, not blank.", "multiline": True})
    name = ma.fields.String(validate=[ma.validate.Length(max=100), header_safe], allow_none=True,
                            metadata={"description": "At most 100 characters, one line."})
    website = ma.fields.String(validate=ma.validate.Length(max=500), allow_none=True, metadata={
        "description": "Honeypot: leave empty (hide it in your form). A request with a value "
                       "gets the same 202 answer but nothing is stored or sent."})


class ContactQueuedSchema(ma.Schema):
    id = ma.fields.String(required=True, metadata={"description": "Id of the stored message"})
    status = ma.fields.String(required=True, metadata={"description": "Always `queued`"})
