"""Single-use token job: purge the tokens used or expired more than a day ago."""
from __future__ import annotations


def purge() -> int:
    """Delete spent single-use tokens of every purpose (scheduled hourly)."""
    from app.services.platform import tokens

    return tokens.purge()
