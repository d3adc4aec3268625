"""Schemas of invoices (``/api/pay/invoices``) and the billing details they name
(``/api/account/billing-details``)."""
import marshmallow as ma
from marshmallow import validate

from app.blueprints.fields import InputSchema, Pattern, QueryInteger
from app.blueprints.orgs.schemas import org_id_field


class InvoiceListQuerySchema(InputSchema):
    limit = QueryInteger(load_default=50, validate=validate.Range(min=1, max=100),
                              metadata={"description": "Page size, 1–100 (default 50)."})
    cursor = ma.fields.String(validate=[validate.Length(max=18), Pattern(r"^[0-9]+$")], metadata={
        "description": "`next_cursor` of the previous page."})
    org_id = org_id_field("its invoices")


class InvoiceQuerySchema(InputSchema):
    org_id = org_id_field("its invoice")


class InvoiceBriefSchema(ma.Schema):
    id = ma.fields.String(required=True)
    number = ma.fields.String(required=True, metadata={
        "description": "Gap-free per seller and series: `INV-000042` (live), `INV-TEST-000007` (test mode); "
                       "credit notes `CN-000003`, `CN-TEST-000001`."})
    kind = ma.fields.String(required=True, validate=validate.OneOf(["payment", "usage", "credit_note"]), metadata={
        "description": "`payment`: one payment's prepaid credit; `usage`: a calendar month's usage (UTC); "
                       "`credit_note`: a refund of an invoiced payment (listed with the invoice it credits)."})
    mode = ma.fields.String(required=True, validate=validate.OneOf(["live", "test"]))
    payment_id = ma.fields.String(required=True, allow_none=True)
    period = ma.fields.String(required=True, allow_none=True, metadata={"description": "`YYYY-MM` of a usage "
                                                                                       "invoice."})
    currency = ma.fields.String(required=True)
    total_micros = ma.fields.Integer(required=True)
    total = ma.fields.String(required=True, metadata={"description": "Decimal, e.g. `25.00`."})
    issued_at = ma.fields.DateTime(required=True)
    pdf_url = ma.fields.String(required=True, metadata={"description": "The PDF (same credential)."})


class InvoiceSummarySchema(InvoiceBriefSchema):
    credits_invoice_id = ma.fields.String(required=True, allow_none=True, metadata={
        "description": "On a credit note: the invoice it credits."})
    credit_notes = ma.fields.List(ma.fields.Nested(InvoiceBriefSchema), required=True, metadata={
        "description": "The credit notes issued for refunds of this invoice's payment, oldest first (each has "
                       "its own JSON and PDF at `/api/pay/invoices/{id}`)."})
    credited_micros = ma.fields.Integer(required=True)
    credited = ma.fields.String(required=True, metadata={"description": "What the credit notes credit, decimal."})
    net_total_micros = ma.fields.Integer(required=True)
    net_total = ma.fields.String(required=True, metadata={
        "description": "`total` less `credited`: what the customer paid and was not refunded."})


class InvoiceListSchema(ma.Schema):
    invoices = ma.fields.List(ma.fields.Nested(InvoiceSummarySchema), required=True,
                              metadata={"description": "Newest first."})
    next_cursor = ma.fields.String(required=True, allow_none=True)


class InvoiceSchema(InvoiceSummarySchema):
    document = ma.fields.Dict(required=True, metadata={"description": (
        "The invoice as issued (never changes): `number`, `issued_at`, `currency`, `seller` and `buyer` "
        "(name, address, country, tax_id, email), `lines` (description, quantity, amount_micros, amount), "
        "`subtotal`, `tax`, `total`, `amount_due` (decimals; `*_micros` integers), `paid` and, for usage, "
        "`period`.")})




class BillingDetailsRequestSchema(InputSchema):
    name = ma.fields.String(allow_none=True, validate=validate.Length(max=200),
                            metadata={"description": "Billing name (company or person)."})
    address = ma.fields.String(allow_none=True, validate=validate.Length(max=1000),
                               metadata={"description": "Postal address, lines separated by newlines.", "multiline": True})
    country = ma.fields.String(allow_none=True, validate=Pattern(r"^([A-Za-z]{2})?$"),
                               metadata={"description": "ISO 3166-1 alpha-2 code."})
    tax_id = ma.fields.String(allow_none=True, validate=validate.Length(max=64),
                              metadata={"description": "VAT / tax number printed on invoices."})
    org_id = org_id_field("its billing details")


class BillingDetailsSchema(ma.Schema):
    name = ma.fields.String(required=True, allow_none=True)
    address = ma.fields.String(required=True, allow_none=True)
    country = ma.fields.String(required=True, allow_none=True)
    tax_id = ma.fields.String(required=True, allow_none=True)
    updated_at = ma.fields.DateTime(required=True, allow_none=True)
