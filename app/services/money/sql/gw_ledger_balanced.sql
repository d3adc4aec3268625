-- Called by the triggers on ledger_entries / ledger_transactions. What the ledger
-- promises, refused by the database itself (the triggers are created by
-- migration 0002_money_engine; the balance CHECKs live on the accounts table):
--   * the legs of every transaction sum to zero: each INSERT into ledger_entries must
--     balance per transaction (gw_post writes a transaction's legs in one statement);
--   * the ledger is append-only: no UPDATE or DELETE of entries or transactions.
CREATE OR REPLACE FUNCTION gw_ledger_balanced() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    v_txn bigint;
    v_sum numeric;
BEGIN
    SELECT e.txn_id, sum(e.amount_micros) INTO v_txn, v_sum
      FROM gw_new_entries e GROUP BY e.txn_id HAVING sum(e.amount_micros) <> 0 LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'ledger transaction % does not balance: its legs sum to %', v_txn, v_sum
              USING ERRCODE = 'GWUNB';
    END IF;
    RETURN NULL;
END
$fn$;
