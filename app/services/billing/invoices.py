"""Invoices: a numbered, immutable document for every payment and every month of usage
(docs/payments.md "Invoices").

* **Issued in the unit of work that makes the money real.** A card, ACH, checkout, auto
  top-up or USDC payment gets its invoice in ``payments.credit_payment``'s unit of work (the
  conditional ``pending → succeeded`` that credits it once); an x402 payment, booked on a
  module call's hot path, and any credited payment without one, by the ``invoices-payments``
  sweep (``issue_missing``, every minute). A month's usage gets its invoice from the
  ``invoices-usage`` job once the month is over (``issue_usage_due``).
* **Gap-free numbers per seller and series** (``live``; ``test`` for play money): the
  counter row ``invoice_counters`` is locked (``SELECT … FOR UPDATE``) and incremented in
  the unit of work that inserts the invoice; a rollback takes the number back. Never a
  sequence (a rolled-back ``nextval`` leaves a gap).
* **Once**: after the counter lock (which serializes every issuer of the seller) the
  invoice is looked for again; the unique indexes on ``payment_id`` and on (account, mode,
  period) of usage are the last line (their violation rolls the whole unit back).
* **Immutable**: the table's trigger ``gw_invoices_append_only`` refuses UPDATE and DELETE.
  ``document`` holds everything printed (seller and buyer as they were at issue); the PDF
  is rendered from it (``invoice_pdf``), the same bytes for the same invoice.
"""
from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from decimal import Decimal

from flask import current_app
from sqlalchemy import bindparam, func, select, text

from app.errors import InvalidRequest, NotFound
from app.extensions import db
from app.ids import new_id
from app.models import Account, BillingDetails, Invoice, Payment
from app.models.base import utcnow
from app.services.platform.uow import end_reads, unit_of_work

CURRENCY = "USD"
PAGE_LIMIT_MAX = 100
SWEEP_DAYS = 35  # how far back the sweep looks for credited payments without an invoice
_CREDITED = ("succeeded", "partially_refunded", "refunded")


# --- billing details --------------------------------------------------------------------

DETAIL_FIELDS = ("name", "address", "country", "tax_id")


def billing_details(account_id: str) -> dict:
    row = db.session.get(BillingDetails, account_id)
    out = {f: getattr(row, f) if row else None for f in DETAIL_FIELDS}
    out["updated_at"] = row.updated_at if row else None
    return out


def set_billing_details(account_id: str, values: dict) -> dict:
    """Replace the account's billing details (absent or empty fields become null). Issued
    invoices keep the details they were issued with."""
    clean = {f: ((values.get(f) or "").strip() or None) for f in DETAIL_FIELDS}
    if clean["country"]:
        clean["country"] = clean["country"].upper()
    with unit_of_work():
        row = db.session.get(BillingDetails, account_id, with_for_update=True)
        if row is None:
            row = BillingDetails(account_id=account_id)
            db.session.add(row)
        for f, v in clean.items():
            setattr(row, f, v)
        row.updated_at = utcnow()
    return billing_details(account_id)


# --- amounts ----------------------------------------------------------------------------

def money(micros: int) -> str:
    """``25000000`` → ``"25.00"``; sub-cent amounts keep their digits (``0.000630``)."""
    value = Decimal(int(micros)) / Decimal(1_000_000)
    if int(micros) % 10_000 == 0:
        return f"{value:.2f}"
    return f"{value:.6f}".rstrip("0")


# --- issuing (in the caller's unit of work) ----------------------------------------------

def _seller() -> dict:
    cfg = current_app.config
    return {"id": cfg["INVOICE_SELLER_ID"], "name": cfg["INVOICE_SELLER_NAME"],
            "address": cfg["INVOICE_SELLER_ADDRESS"] or None, "tax_id": cfg["INVOICE_SELLER_TAX_ID"] or None,
            "email": cfg["INVOICE_SELLER_EMAIL"] or None}


def _buyer(account_id: str) -> dict:
    acct = db.session.get(Account, account_id)
    details = db.session.get(BillingDetails, account_id)
    fallback = (acct.name if acct is not None and acct.kind == "org" else None) or (acct.email if acct else None) \
        or (f"Agent {acct.agent_id}" if acct is not None and acct.agent_id else account_id)
    return {"account_id": account_id, "kind": acct.kind if acct else None,
            "name": (details.name if details else None) or fallback,
            "email": acct.email if acct else None,
            "address": details.address if details else None,
            "country": details.country if details else None,
            "tax_id": details.tax_id if details else None}


def _next_number(seller: str, series: str, already) -> int | None:
    """Lock the seller's counter, then (under the lock) ``already()``; None if it is already
    issued (nothing was incremented), else the next number, incremented in this unit of work."""
    params = {"seller": seller, "series": series}
    db.session.execute(text("INSERT INTO invoice_counters (seller, series, last_number) "
                            "VALUES (:seller, :series, 0) ON CONFLICT DO NOTHING"), params)
    db.session.execute(text("SELECT last_number FROM invoice_counters WHERE seller = :seller "
                            "AND series = :series FOR UPDATE"), params)
    if already():
        return None
    return int(db.session.execute(text(
        "UPDATE invoice_counters SET last_number = last_number + 1 WHERE seller = :seller AND series = :series "
        "RETURNING last_number"), params).scalar_one())


CREDIT_NOTE = "credit_note"


def _series(kind: str, mode: str) -> str:
    """Invoices are numbered in ``live`` / ``test``, credit notes in ``cn_live`` / ``cn_test``."""
    live_or_test = "live" if mode == "live" else "test"
    return f"cn_{live_or_test}" if kind == CREDIT_NOTE else live_or_test


def _format_number(series: str, seq: int) -> str:
    cfg = current_app.config
    prefix = cfg["CREDIT_NOTE_NUMBER_PREFIX"] if series.startswith("cn_") else cfg["INVOICE_NUMBER_PREFIX"]
    return f"{prefix}-{seq:06d}" if series.endswith("live") else f"{prefix}-TEST-{seq:06d}"


def _issue(account_id: str, mode: str, kind: str, lines, already, *, payment_id: str | None = None,
           period: str | None = None, paid: dict, extra: dict | None = None, buyer: dict | None = None,
           credits_invoice_id: str | None = None) -> Invoice | None:
    """Number and insert a document in the caller's unit of work; None when ``already()``
    (asked under the counter lock). ``lines`` may be a callable, called under the lock."""
    seller = _seller()
    series = _series(kind, mode)
    seq = _next_number(seller["id"], series, already)
    if seq is None:
        return None
    lines = lines() if callable(lines) else lines
    now = utcnow()
    total = sum(int(line["amount_micros"]) for line in lines)
    number = _format_number(series, seq)
    for line in lines:
        line["amount"] = money(line["amount_micros"])
    document = {"number": number, "series": series, "kind": kind, "mode": mode,
                "issued_at": now.isoformat().replace("+00:00", "Z"), "currency": CURRENCY,
                "seller": seller, "buyer": buyer or _buyer(account_id), "lines": lines,
                "subtotal_micros": total, "tax_micros": 0, "total_micros": total,
                "subtotal": money(total), "tax": money(0), "total": money(total),
                "amount_due": money(0), "paid": paid, **(extra or {})}
    inv = Invoice(id=new_id("inv"), seller=seller["id"], series=series, seq=seq, number=number,
                  account_id=account_id, mode=mode, kind=kind, payment_id=payment_id, period=period,
                  credits_invoice_id=credits_invoice_id, currency=CURRENCY, total_micros=total, document=document, issued_at=now)
    db.session.add(inv)
    db.session.flush()
    return inv


def _payment_line(p: Payment) -> str:
    meta = p.meta or {}
    if p.kind == "x402":
        return f"Prepaid credit: x402 payment ({meta.get('network') or 'USDC'})"
    if p.kind == "deposit":
        return "Prepaid credit: USDC deposit" + (f" ({p.provider_id.split(':')[0]})" if p.provider_id else "")
    if p.product:
        return f"Prepaid credit: {p.product}"
    if p.kind == "checkout":
        return "Prepaid credit (hosted checkout)"
    return f"Prepaid credit: wallet funding ({'bank debit' if p.method == 'ach' else p.method})"


def issue_for_payment(payment: Payment) -> Invoice | None:
    """The invoice of a credited payment, in the caller's unit of work (the one that credits
    it); None if it already has one."""
    lines = [{"description": _payment_line(payment), "quantity": 1, "unit_micros": int(payment.amount_micros),
              "amount_micros": int(payment.amount_micros)}]
    paid = {"status": "paid", "payment_id": payment.id, "method": payment.method, "processor": payment.processor,
            "paid_at": (payment.updated_at or utcnow()).isoformat().replace("+00:00", "Z")}
    return _issue(payment.account_id, payment.mode or "live", "payment", lines,
                  lambda: _exists(Invoice.payment_id == payment.id, Invoice.kind == "payment"),
                  payment_id=payment.id, paid=paid)


def _payment_invoice(payment_id: str) -> Invoice | None:
    return db.session.execute(select(Invoice).where(Invoice.payment_id == payment_id,
                                                    Invoice.kind == "payment")).scalar_one_or_none()


def _credited_micros(invoice_id: str) -> int:
    return int(db.session.execute(select(func.coalesce(func.sum(Invoice.total_micros), 0)).where(
        Invoice.credits_invoice_id == invoice_id)).scalar_one())


def issue_credit_note(payment: Payment, refunded_total_micros: int | None = None) -> Invoice | None:
    """The credit note of what of ``payment`` was refunded (``refunded_total_micros``, default
    the payment's ``refunded_micros``) and no credit note of its invoice credits yet, in the
    caller's unit of work (the refund's); None when nothing is left to credit (a replayed
    refund). The invoice itself never changes; a payment without one gets it first."""
    refunded = int(payment.refunded_micros or 0) if refunded_total_micros is None else int(refunded_total_micros)
    # None from issue_for_payment: another unit (the sweep) issued it meanwhile; read it again
    invoice = _payment_invoice(payment.id) or issue_for_payment(payment) or _payment_invoice(payment.id)
    owed = {}

    def already() -> bool:  # under the counter lock: what earlier credit notes did not credit
        owed["micros"] = refunded - _credited_micros(invoice.id)
        return owed["micros"] <= 0

    def lines() -> list[dict]:
        what = invoice.document["lines"][0]["description"] if invoice.document.get("lines") else "Prepaid credit"
        return [{"description": f"Refund of {invoice.number}: {what}", "quantity": 1,
                 "unit_micros": owed["micros"], "amount_micros": owed["micros"]}]

    paid = {"status": "refunded", "payment_id": payment.id, "method": payment.method,
            "processor": payment.processor, "refunded_at": utcnow().isoformat().replace("+00:00", "Z")}
    credits = {"invoice_id": invoice.id, "invoice_number": invoice.number,
               "invoice_total_micros": int(invoice.total_micros), "invoice_total": money(invoice.total_micros),
               "refunded_total_micros": refunded, "refunded_total": money(refunded)}
    return _issue(payment.account_id, invoice.mode, CREDIT_NOTE, lines, already, payment_id=payment.id,
                  paid=paid, extra={"credits": credits}, buyer=invoice.document.get("buyer"),
                  credits_invoice_id=invoice.id)


def _exists(*where) -> bool:
    return db.session.execute(select(Invoice.id).where(*where).limit(1)).first() is not None


def issue_missing(limit: int = 200) -> int:
    """Sweep: credited payments of the last ``SWEEP_DAYS`` days without an invoice (x402
    payments; any payment credited before invoices existed) get one, and refunds without
    their credit note (made before credit notes existed) get it, each payment in its own
    unit of work. Returns how many documents were issued."""
    ids = db.session.execute(text(
        "SELECT p.id FROM payments p WHERE p.status IN :credited AND p.created_at >= :since "
        "AND (NOT EXISTS (SELECT 1 FROM invoices i WHERE i.payment_id = p.id AND i.kind = 'payment') "
        "OR (p.refunded_micros > 0 AND p.refunded_micros > (SELECT COALESCE(SUM(c.total_micros), 0) "
        "FROM invoices i JOIN invoices c ON c.credits_invoice_id = i.id "  # both lookups indexed
        "WHERE i.payment_id = p.id AND i.kind = 'payment'))) ORDER BY p.created_at LIMIT :limit")
        .bindparams(bindparam("credited", expanding=True)),
        {"credited": list(_CREDITED), "since": utcnow() - timedelta(days=SWEEP_DAYS), "limit": limit}
    ).scalars().all()
    end_reads()
    issued = 0
    for payment_id in ids:
        with unit_of_work():
            payment = db.session.get(Payment, payment_id)
            if payment is None:
                continue
            issued += issue_for_payment(payment) is not None
            if payment.refunded_micros:
                issued += issue_credit_note(payment) is not None
    return issued


# --- monthly usage --------------------------------------------------------------------------

def _month_bounds(month: str) -> tuple[datetime, datetime]:
    from app.services.money.settlement import month_bounds

    return month_bounds(month)


def _product_line(row: dict) -> dict:
    product = row["product"]
    what = f"Chat completions: {product[5:]}" if product.startswith("chat:") else f"Module calls: {product}"
    return {"description": what, "quantity": int(row["calls"]), "unit": "calls",
            "amount_micros": int(row["spend_micros"])}


def issue_usage(account_id: str, month: str) -> Invoice | None:
    """The usage invoice of ``account_id``'s live calls in ``month`` (``YYYY-MM``), once; None
    when it exists already or there was no spend. Paid from the prepaid balance (whose
    purchases have their own invoices): amount due 0."""
    from app.services.billing import usage

    start, end = _month_bounds(month)
    with unit_of_work():
        rows = [r for r in usage.by_product(account_id, start, end, mode="live") if r["spend_micros"] > 0]
        if not rows:
            return None
        paid = {"status": "paid", "method": "prepaid_balance"}
        extra = {"period": {"month": month, "start": start.isoformat().replace("+00:00", "Z"),
                            "end": end.isoformat().replace("+00:00", "Z")}}
        inv = _issue(account_id, "live", "usage", [_product_line(r) for r in rows],
                     lambda: _exists(Invoice.kind == "usage", Invoice.account_id == account_id,
                                     Invoice.mode == "live", Invoice.period == month),
                     period=month, paid=paid, extra=extra)
    return inv


def usage_accounts(month: str) -> list[str]:
    """Accounts with live spend in ``month`` and no usage invoice for it yet."""
    start, end = _month_bounds(month)
    return list(db.session.execute(text(
        "SELECT account_id FROM usage_daily WHERE mode = 'live' AND day >= :start AND day < :end "
        "AND spend_micros > 0 UNION SELECT account_id FROM usage_hourly WHERE mode = 'live' "
        "AND hour >= :start AND hour < :end AND spend_micros > 0 "
        "EXCEPT SELECT account_id FROM invoices WHERE kind = 'usage' AND mode = 'live' AND period = :month "
        "ORDER BY 1"), {"start": start, "end": end, "month": month}).scalars().all())


def calls_open_before(end: datetime) -> bool:
    """Whether a module call created before ``end`` is still ``pending`` or a chat completion
    still ``held``: its refund or release would change the usage of its month, so that
    month's usage invoice waits (the sweeps resolve both after their deadlines)."""
    from app.services.billing.usage_log import OLDEST_OPEN

    return any(t is not None and t < end for t in (db.session.execute(q).scalar() for q in OLDEST_OPEN))


def issue_usage_due(now: datetime | None = None) -> dict | None:
    """Scheduled: once the previous month is over by ``INVOICE_USAGE_GRACE_SECONDS`` (its
    usage rolled) and no call of it is still open (``calls_open_before``: a later refund
    would not be on the invoice), issue each account's usage invoice for it (a no-op for
    those issued); None while it is not yet due. Safe under retries and two schedulers:
    the counter lock and the re-check make each once."""
    from app.services.money.settlement import previous_month

    now = now or utcnow()
    month = previous_month(now)
    _, end = _month_bounds(month)
    if now < end + timedelta(seconds=int(current_app.config["INVOICE_USAGE_GRACE_SECONDS"])) \
            or calls_open_before(end):
        end_reads()
        return None
    accounts = usage_accounts(month)
    end_reads()
    issued = sum(1 for account_id in accounts if issue_usage(account_id, month) is not None)
    return {"month": month, "issued": issued}


# --- reading --------------------------------------------------------------------------------

def list_invoices(account_id: str, mode: str, limit: int = 50, cursor: str | None = None) -> dict:
    """The account's invoices of ``mode``'s series, newest first; ``next_cursor`` pages on."""
    limit = max(1, min(int(limit), PAGE_LIMIT_MAX))
    q = select(Invoice).where(Invoice.account_id == account_id, Invoice.mode == mode, Invoice.kind != CREDIT_NOTE)
    if cursor:
        if not cursor.isdigit() or len(cursor) > 18:
            raise InvalidRequest("cursor: not a cursor from a previous page.")
        q = q.where(Invoice.seq < int(cursor))
    rows = db.session.execute(q.order_by(Invoice.seq.desc()).limit(limit + 1)).scalars().all()
    more = len(rows) > limit
    rows = rows[:limit]
    notes = _credit_notes([r.id for r in rows])
    return {"invoices": [summary(r, notes.get(r.id, [])) for r in rows],
            "next_cursor": str(rows[-1].seq) if more else None}


def _credit_notes(invoice_ids: list[str]) -> dict[str, list[Invoice]]:
    """The credit notes of ``invoice_ids``, oldest first, by the invoice they credit."""
    out: dict[str, list[Invoice]] = {}
    if invoice_ids:
        for note in db.session.execute(select(Invoice).where(Invoice.credits_invoice_id.in_(invoice_ids))
                                       .order_by(Invoice.seq)).scalars():
            out.setdefault(note.credits_invoice_id, []).append(note)
    return out


def _brief(inv: Invoice) -> dict:
    return {"id": inv.id, "number": inv.number, "kind": inv.kind, "mode": inv.mode, "payment_id": inv.payment_id,
            "period": inv.period, "currency": inv.currency, "total_micros": inv.total_micros,
            "total": money(inv.total_micros), "issued_at": inv.issued_at,
            "pdf_url": f"/api/pay/invoices/{inv.id}.pdf"}


def summary(inv: Invoice, notes: list[Invoice]) -> dict:
    """An invoice with its credit notes and what it comes to after them (``net_total``: what
    the customer paid and kept); a credit note names the invoice it credits."""
    credited = sum(int(n.total_micros) for n in notes)
    return {**_brief(inv), "credits_invoice_id": inv.credits_invoice_id,
            "credit_notes": [_brief(n) for n in notes], "credited_micros": credited, "credited": money(credited),
            "net_total_micros": int(inv.total_micros) - credited, "net_total": money(int(inv.total_micros) - credited)}


def get_invoice(account_id: str, mode: str, invoice_id: str) -> Invoice:
    inv = db.session.get(Invoice, invoice_id) if invoice_id.startswith("inv_") and len(invoice_id) <= 32 else None
    if inv is None or inv.account_id != account_id or inv.mode != mode:
        raise NotFound("No such invoice.")
    return inv


def view(inv: Invoice) -> dict:
    return {**summary(inv, _credit_notes([inv.id]).get(inv.id, [])), "document": inv.document}


# --- PDF --------------------------------------------------------------------------------------

def _font_path() -> str | None:
    path = current_app.config.get("INVOICE_FONT_PATH") or "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
    return path if os.path.isfile(path) else None


def invoice_pdf(inv: Invoice) -> bytes:
    """The invoice as a PDF (fpdf2), rendered from its stored document: the same bytes every
    time (creation date = issue date). A Unicode TrueType font (``INVOICE_FONT_PATH``, default
    DejaVu Sans when installed) prints any name; without one, the core Helvetica font and
    characters outside Latin-1 shown as ``?``."""
    from fpdf import FPDF, FontFace

    doc = inv.document
    pdf = FPDF(format="A4")
    pdf.set_creation_date(inv.issued_at.astimezone(timezone.utc))
    pdf.set_title(f"Invoice {doc['number']}")
    pdf.set_author(doc["seller"]["name"])
    font = _font_path()
    bold = font and font.replace(".ttf", "-Bold.ttf")
    if font:
        pdf.add_font("inv", "", font)
        if os.path.isfile(bold):
            pdf.add_font("inv", "B", bold)
        family, clean = "inv", (lambda s: s)
    else:
        family, clean = "helvetica", (lambda s: s.encode("latin-1", "replace").decode("latin-1"))
    pdf.add_page()
    w = pdf.epw

    def write(size: int, value: str, *, align: str = "L", width: float = 0, ln: bool = True, h: float = 6):
        pdf.set_font(family, size=size)
        pdf.multi_cell(width or w, h, clean(value or ""), align=align,
                       new_x="LMARGIN" if ln else "RIGHT", new_y="NEXT" if ln else "TOP")

    title = ("CREDIT NOTE" if inv.kind == CREDIT_NOTE else "INVOICE") + \
        (" (TEST MODE — play money)" if inv.mode != "live" else "")
    write(20, title, h=10)
    write(10, f"Number: {doc['number']}    Issued: {doc['issued_at'][:10]}    Currency: {doc['currency']}")
    if doc.get("credits"):
        write(10, f"Credits invoice {doc['credits']['invoice_number']} ({doc['credits']['invoice_total']} "
                  f"{doc['currency']}); refunded in all: {doc['credits']['refunded_total']} {doc['currency']}")
    if doc.get("period"):
        write(10, f"Usage period: {doc['period']['month']} ({doc['period']['start'][:10]} to "
                  f"{doc['period']['end'][:10]}, end exclusive)")
    pdf.ln(4)
    y = pdf.get_y()
    half = w / 2 - 4
    for i, (label, party) in enumerate((("From", doc["seller"]), ("Bill to", doc["buyer"]))):
        pdf.set_xy(pdf.l_margin + i * (half + 8), y)
        parts = [party.get("name"), party.get("address"), party.get("country"),
                 f"Tax ID: {party['tax_id']}" if party.get("tax_id") else None,
                 party.get("email") if party.get("email") != party.get("name") else None,  # the name fell back to it
                 f"Account: {party['account_id']}" if party.get("account_id") else None]
        pdf.set_font(family, size=11)
        pdf.multi_cell(half, 6, clean(label), new_x="LEFT", new_y="NEXT")
        pdf.set_font(family, size=10)
        pdf.multi_cell(half, 5, clean("\n".join(p for p in parts if p)), new_x="LEFT", new_y="NEXT")
    pdf.set_y(max(pdf.get_y(), y + 40))
    pdf.ln(4)
    heading = FontFace(emphasis="BOLD" if not font or os.path.isfile(bold) else None)
    with pdf.table(col_widths=(60, 15, 25), text_align=("LEFT", "RIGHT", "RIGHT"), headings_style=heading) as table:
        pdf.set_font(family, size=10)
        table.row([clean("Description"), clean("Qty"), clean(f"Amount ({doc['currency']})")])
        for line in doc["lines"]:
            table.row([clean(line["description"]), str(line.get("quantity", 1)), line["amount"]])
    pdf.ln(4)
    totals = (("Subtotal", "subtotal"), ("Tax", "tax"), ("Total credited", "total")) if inv.kind == CREDIT_NOTE \
        else (("Subtotal", "subtotal"), ("Tax", "tax"), ("Total", "total"), ("Amount due", "amount_due"))
    for label, key in totals:
        write(12 if key == "total" else 10, f"{label}: {doc[key]} {doc['currency']}", align="R")
    pdf.ln(4)
    paid = doc.get("paid") or {}
    if paid.get("status") == "refunded":
        write(9, f"Refunded {paid.get('refunded_at', '')[:10]} to the {paid.get('method')} of payment "
                 f"{paid.get('payment_id')} ({paid.get('processor')}); the prepaid credit it bought was taken back.")
    elif paid.get("method") == "prepaid_balance":
        write(9, "Paid from the prepaid balance; the purchases of that balance have their own invoices.")
    else:
        write(9, f"Paid {paid.get('paid_at', '')[:10]} by {paid.get('method')} ({paid.get('processor')}), "
                 f"payment {paid.get('payment_id')}. Prepaid credit for the metered API.")
    return bytes(pdf.output())
