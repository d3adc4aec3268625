"""Public endpoints: contact form, newsletter (double opt-in) and product analytics.

Owns ``contact``, ``newsletter`` and ``tracking``. Every entry point commits one unit of
work; mail leaves through the outbox after the commit.
"""
