-- gw_finalize_calls(rows jsonb): the metered call's finalize for a group of calls in ONE
-- statement: each call still 'pending' becomes 'succeeded' (found by its primary key
-- (id, created_at); status tested with COLLATE "C", enable_seqscan off by gw_group_settings
-- as for every group statement, so the plans cannot degrade), then its Idempotency-Key record stores the response. Returns the ids
-- moved to 'succeeded' (a call the sweep refunded meanwhile is left alone).
-- plan_cache_mode = force_generic_plan: each row's UPDATE targets one partition of
-- module_calls, which a generic plan cannot know, so PostgreSQL's plan cache kept
-- building a custom plan for every row (planning each time); the generic plan, pruned
-- to the row's partition when it runs, costs the backend 6 to 13 per cent less CPU per
-- open+finalize (bench/pg_ab.py, 41 and 5 partitions; bench/DIARY.md "Generic plans").
-- Called by app/services/money/charging.py (the finalize writer); tests/support/finalize.py
-- installs a slowed copy for the fault tests.

CREATE OR REPLACE FUNCTION gw_finalize_calls(p_rows jsonb)
RETURNS SETOF varchar LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE
    b record;
    v_id varchar;
BEGIN
    PERFORM gw_group_settings(0, false);  -- enable_seqscan = off, as every group statement
    FOR b IN SELECT * FROM jsonb_to_recordset(p_rows)
                AS x(id varchar, created_at timestamptz, ok boolean, provider_status integer,
                     receipt jsonb, finished_at timestamptz, account_id varchar, idem_key varchar,
                     response_body text) LOOP
        v_id := NULL;
        UPDATE module_calls m
           SET status = 'succeeded', ok = b.ok, provider_status = b.provider_status,
               receipt = b.receipt, finished_at = b.finished_at
         WHERE m.id = b.id AND m.created_at = b.created_at AND m.status COLLATE "C" = 'pending'
        RETURNING m.id INTO v_id;
        IF v_id IS NOT NULL THEN  -- still pending (the sweep may have refunded it)
            UPDATE idempotency_records r SET status = 'done', response_body = b.response_body
             WHERE r.account_id = b.account_id AND r.key = b.idem_key AND r.call_id = b.id;
            RETURN NEXT v_id;
        END IF;
    END LOOP;
END
$fn$;
