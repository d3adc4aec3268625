"""The money engine: every money operation, written once.

The rules live in PostgreSQL functions, one ``.sql`` file each in ``sql/`` (installed from
those files after every ``flask db upgrade``: ``app/sqlfunctions.py``); the modules here are
their only Python callers. Nothing else moves a balance or writes a ledger row.

Rules (SQL, ``sql/``):

* ``gw_post`` — a balanced posting and the cached balances it moves (the one writer);
* ``gw_period_bounds``, ``gw_spend_reserve``, ``gw_spend_release`` — per-key spend limits
  and organisation members' monthly budgets;
* ``gw_open_calls``, ``gw_finalize_calls`` — a metered call's open and finalize;
* ``gw_chat_holds``, ``gw_chat_settles`` (``gw_chat_settle`` per row) — chat completions' holds and settles;
* ``gw_ledger_balanced``, ``gw_ledger_append_only`` — the database's own guard (triggers).

Operations (Python, one public function each):

=====================================  =============================================
open a metered call (charge)           ``charging.open_pg`` (grouped ``gw_open_calls``)
finalize it                            ``charging.finalize_pg``
refund it / sweep the stale ones       ``refunds.refund`` / ``refunds.sweep_pending``
chat hold / extend / settle / release  ``holds.hold`` / ``extend`` / ``settle`` / ``release``
release stale chat holds               ``holds.release_stale_holds``
key limits, member budgets: release,   ``spend.release`` / ``spend.refusal`` /
refusal, a member's month              ``spend.budget_refusal`` / ``spend.member_spent``
outside money in (card, ACH, USDC,     ``funding.credit`` (once per outside reference:
x402 booking)                          ``outside.record``)
refund / dispute of such a credit      ``funding.take_back`` / ``funding.reinstate``
owner → agent funding                  ``funding.transfer``
a payout of settled earnings           ``funding.pay_out`` / ``keep_as_balance``
promotional grant, operator credit     ``funding.grant``
revenue-share accrual (a call's legs)  ``revenue_share.call_legs`` / ``reverse``
revenue-share monthly settlement       ``settlement.settle_month`` / ``settle_agent``
any other posting                      ``ledger.post`` (``gw_post``)
check the books                        ``ledger.check``
=====================================  =============================================

The services around them (payments and their processor events, wallets, x402 verification
and settlement with a facilitator, agent funding's idempotency, accounts) own their own
rows and call these in their unit of work; none of them writes a posting itself.

Who pays and who acted are separate arguments everywhere (``account_id`` / ``actor``) and
are recorded apart. Money: integer micros (``ledger.MICROS_PER_CENT``).
"""
