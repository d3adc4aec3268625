"""Canonical mailboxes: which addresses reach the same inbox (one promotional grant each).

``canonical(email)`` lower-cases the address, drops a ``+tag`` from the local part and, for
providers that ignore dots in the local part (Gmail: ``gmail.com`` and its alias
``googlemail.com``), removes the dots and folds the domain to ``gmail.com``. So
``Farm+2@example.com``, ``farm+1@example.com`` and ``farm@example.com`` are one mailbox, as
are ``f.a.r.m@googlemail.com`` and ``farm@gmail.com``. The account keeps the address it
signed up with; the canonical form is stored beside it (``accounts.mailbox``).
"""
from __future__ import annotations

import hashlib

# Domains whose mailboxes ignore dots in the local part, and the domain they fold into.
DOTLESS_DOMAINS = {"gmail.com": "gmail.com", "googlemail.com": "gmail.com"}


def canonical(email: str) -> str:
    """The canonical mailbox of a (syntactically valid) address."""
    local, _, domain = email.strip().lower().rpartition("@")
    local = local.split("+", 1)[0]
    if domain in DOTLESS_DOMAINS:
        local, domain = local.replace(".", ""), DOTLESS_DOMAINS[domain]
    return f"{local}@{domain}"


def grant_ref(mailbox: str) -> str:
    """The unique ledger ref of a mailbox's promotional grant (a hash: no address in the ledger)."""
    return "promo:mailbox:" + hashlib.sha256(mailbox.encode()).hexdigest()[:40]
