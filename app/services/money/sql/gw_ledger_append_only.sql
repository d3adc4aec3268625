-- Called by the triggers on ledger_entries / ledger_transactions. What the ledger
-- promises, refused by the database itself (the triggers are created by
-- migration 0002_money_engine; the balance CHECKs live on the accounts table):
--   * the legs of every transaction sum to zero: each INSERT into ledger_entries must
--     balance per transaction (gw_post writes a transaction's legs in one statement);
--   * the ledger is append-only: no UPDATE or DELETE of entries or transactions.
CREATE OR REPLACE FUNCTION gw_ledger_append_only() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    RAISE EXCEPTION 'the ledger is append-only: % on % refused', TG_OP, TG_TABLE_NAME
          USING ERRCODE = 'GWAPP';
END
$fn$;
