-- gw_post: the ledger's one writer. ONE balanced posting (a ledger transaction and its
-- legs) and the cached customer balances it moves, or nothing.
--
-- Called by every money operation: Python's money.ledger.post (payments, funding,
-- x402, refunds, releases, settlements) and the engine's functions (gw_open_calls,
-- gw_chat_holds, gw_chat_settle). The rules, written here once:
--   * a posting has at least one non-zero leg and its legs sum to zero (else SQLSTATE
--     GWUNB); zero legs are dropped. The sum is checked once, by the database's own rule
--     (gw_ledger_balanced, the statement trigger on ledger_entries, which refuses any
--     unbalanced INSERT, this one's included), not again here: a second check cost ~2 %
--     of PostgreSQL's CPU per metered call (bench/pg_ab.py; bench/DIARY.md). So an
--     unbalanced posting fails when its legs are written, after the balances moved (the
--     error undoes them with the statement); with p_soft, one whose debit is uncovered is
--     refused (NULL) before that, as a balanced one would be: nothing is written either way;
--   * a customer leg (acct:<id> live, acct_test:<id> test) moves the account's cached
--     balance in the same statement, conditionally: never below zero (the CHECK on
--     accounts refuses it too). Balance rows are locked in account-id order, so two
--     postings never deadlock on each other's accounts;
--   * an uncovered debit: p_soft = false RAISEs SQLSTATE GW402 (the caller's statement or
--     transaction is undone; DETAIL = the account id); p_soft = true credits back the
--     balances it already moved and returns NULL (nothing of the posting remains, the
--     caller's transaction goes on);
--   * p_payer: the account that pays (ledger_transactions.account_id); p_actor: who acted
--     (an API key or session id; later a member) — recorded apart;
--   * p_ref is unique when set: posting it twice fails on the constraint (23505).
-- Returns the transaction id (NULL: refused, p_soft only).
CREATE OR REPLACE FUNCTION gw_post(
    p_kind varchar, p_ref varchar, p_payer varchar, p_actor varchar, p_meta jsonb,
    p_codes varchar[], p_amounts bigint[], p_now timestamptz, p_soft boolean DEFAULT false)
RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    v_txn bigint;
    v_legs integer;
    v_moved varchar[] := '{}';
    v_by bigint[] := '{}';
    v_acct varchar;
    leg record;
    i integer;
BEGIN
    IF coalesce(array_length(p_codes, 1), 0) <> coalesce(array_length(p_amounts, 1), 0) THEN
        RAISE EXCEPTION 'posting %: % codes for % amounts', p_kind,
              coalesce(array_length(p_codes, 1), 0), coalesce(array_length(p_amounts, 1), 0)
              USING ERRCODE = 'GWUNB';
    END IF;

    -- the cached balances, in account-id order (the lock order of every posting)
    FOR leg IN SELECT l.code, l.amount, split_part(l.code, ':', 1) AS kind,
                      substr(l.code, strpos(l.code, ':') + 1) AS acct
                 FROM unnest(p_codes, p_amounts) AS l(code, amount)
                WHERE l.amount <> 0 AND split_part(l.code, ':', 1) IN ('acct', 'acct_test')
                ORDER BY substr(l.code, strpos(l.code, ':') + 1) COLLATE "C", l.amount LOOP
        IF leg.kind = 'acct' THEN
            UPDATE accounts SET balance_micros = balance_micros + leg.amount
             WHERE id = leg.acct AND balance_micros + leg.amount >= 0;
        ELSE
            UPDATE accounts SET test_balance_micros = test_balance_micros + leg.amount
             WHERE id = leg.acct AND test_balance_micros + leg.amount >= 0;
        END IF;
        IF NOT FOUND THEN
            IF leg.amount > 0 THEN
                RAISE EXCEPTION 'posting %: no account %', p_kind, leg.acct USING ERRCODE = 'GWNOA';
            END IF;
            IF NOT p_soft THEN
                RAISE EXCEPTION 'insufficient funds on %', leg.acct
                      USING ERRCODE = 'GW402', DETAIL = leg.acct, HINT = (-leg.amount)::text;
            END IF;
            FOR i IN 1 .. coalesce(array_length(v_moved, 1), 0) LOOP  -- soft: undo, answer NULL
                v_acct := substr(v_moved[i], strpos(v_moved[i], ':') + 1);
                IF split_part(v_moved[i], ':', 1) = 'acct' THEN
                    UPDATE accounts SET balance_micros = balance_micros - v_by[i] WHERE id = v_acct;
                ELSE
                    UPDATE accounts SET test_balance_micros = test_balance_micros - v_by[i] WHERE id = v_acct;
                END IF;
            END LOOP;
            RETURN NULL;
        END IF;
        v_moved := v_moved || leg.code;
        v_by := v_by || leg.amount;
    END LOOP;

    INSERT INTO ledger_transactions (kind, ref, account_id, actor, meta, created_at)
    VALUES (p_kind, p_ref, p_payer, p_actor, p_meta, p_now)
    RETURNING id INTO v_txn;
    INSERT INTO ledger_entries (txn_id, ledger_account, amount_micros, created_at)
    SELECT v_txn, l.code, l.amount, p_now
      FROM unnest(p_codes, p_amounts) WITH ORDINALITY AS l(code, amount, n)
     WHERE l.amount <> 0
     ORDER BY l.n;
    GET DIAGNOSTICS v_legs = ROW_COUNT;
    IF v_legs = 0 THEN
        RAISE EXCEPTION 'posting %: no non-zero leg', p_kind USING ERRCODE = 'GWUNB';
    END IF;
    RETURN v_txn;
END
$fn$;
