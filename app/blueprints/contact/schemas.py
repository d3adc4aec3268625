"""Schemas of the contact form (SPEC part 2: ContactForm)."""
import marshmallow as ma

# Exported as the OpenAPI ``pattern`` too, so clients (and fuzzers) know the rule.
no_nul = ma.validate.Regexp(r"^[^\x00]*\Z", error="must not contain NUL characters.")
single_line = ma.validate.Regexp(r"^[^\x00-\x1f\x7f]*\Z",
                                 error="must not contain control characters or line breaks.")


EMAIL_DOC = {"description": "E-mail address (at most 254 characters).", "format": "email"}


class ContactFormSchema(ma.Schema):
    email = ma.fields.String(required=True, validate=ma.validate.Length(min=3, max=254),
                             metadata=EMAIL_DOC)
    message = ma.fields.String(required=True, validate=[ma.validate.Length(min=1, max=5000), no_nul],
                               metadata={"description": "1–5,000 characters."})
    name = ma.fields.String(validate=[ma.validate.Length(max=100), single_line], allow_none=True,
                            metadata={"description": "At most 100 characters, one line."})
    website = ma.fields.String(validate=ma.validate.Length(max=500), allow_none=True, metadata={
        "description": "Honeypot: leave empty (hide it in your form). A request with a value "
                       "gets the same 202 answer but nothing is stored or sent."})


class ContactQueuedSchema(ma.Schema):
    id = ma.fields.String(required=True, metadata={"description": "Id of the stored message"})
    status = ma.fields.String(required=True, metadata={"description": "Always `queued`"})
