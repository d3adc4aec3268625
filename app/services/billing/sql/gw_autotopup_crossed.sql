-- gw_autotopup_crossed: queue ONE auto top-up run when a charge takes a balance under the
-- account's auto top-up threshold (app/services/billing/autotopup.py).
--
-- Called by the row trigger gw_accounts_autotopup (migration 0003_billing), AFTER UPDATE OF
-- the balances ON accounts, whose WHEN clause lets only a crossing reach this function:
-- the threshold is cached on the row (topup_below_micros / test_topup_below_micros, NULL
-- when off), OLD balance >= threshold and NEW balance < threshold. Every other balance
-- update (the hot path's charges) costs one comparison in the executor, no function call.
--
-- Exactly one run per crossing: concurrent charges of one account serialize on its row
-- lock, so only one UPDATE sees OLD at or over the threshold and NEW under it (READ
-- COMMITTED re-reads the newest row version); and at most one run of an account and mode
-- is open at a time (unique partial index uq_auto_topup_runs_open: ON CONFLICT DO NOTHING).
-- The run commits or rolls back with the charge. A job charges it (autotopup.run).
CREATE OR REPLACE FUNCTION gw_autotopup_crossed() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO auto_topup_runs (account_id, mode, status, balance_micros, attempts, due_at, created_at, updated_at)
    SELECT NEW.id, b.mode, 'queued', b.new_micros, 0, now(), now(), now()
      FROM (VALUES ('live', OLD.balance_micros, NEW.balance_micros, NEW.topup_below_micros),
                   ('test', OLD.test_balance_micros, NEW.test_balance_micros, NEW.test_topup_below_micros))
           AS b(mode, old_micros, new_micros, below_micros)
     WHERE b.below_micros IS NOT NULL AND b.new_micros < b.below_micros AND b.old_micros >= b.below_micros
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$fn$;
