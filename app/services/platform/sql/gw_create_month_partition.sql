-- gw_create_month_partition(table, month): creates one UTC month's partition of a table
-- partitioned by RANGE (created_at) (module_calls, chat_completions, ledger_entries),
-- named <table>_pYYYY_MM, moving the rows its DEFAULT partition holds for that month.
-- Returns false when it exists already; an advisory lock lets two schedulers race.
-- Called by app/services/platform/partitions.py (ensure_ahead: the partitions-ensure job,
-- flask partitions ensure) and by the baseline migration for the first months.

CREATE OR REPLACE FUNCTION gw_create_month_partition(p_table text, p_month date)
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
    v_from timestamptz := make_timestamptz(extract(year FROM p_month)::int,
                                           extract(month FROM p_month)::int, 1, 0, 0, 0, 'UTC');
    v_to timestamptz := v_from + interval '1 month';
    v_name text := p_table || '_p' || to_char(p_month, 'YYYY_MM');
    v_default text := p_table || '_default';
BEGIN
    IF to_regclass(v_name) IS NOT NULL THEN
        RETURN false;
    END IF;
    -- two schedulers: one creates, the other finds it done
    PERFORM pg_advisory_xact_lock(hashtext('gw_create_month_partition:' || p_table));
    IF to_regclass(v_name) IS NOT NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                   v_name, p_table);
    IF to_regclass(v_default) IS NOT NULL THEN
        -- rows that landed in DEFAULT for this month move to the new partition (ATTACH
        -- refuses while DEFAULT holds rows of its range); the lock keeps new ones out
        EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE', v_default);
        EXECUTE format('WITH moved AS (DELETE FROM %I WHERE created_at >= $1 AND created_at < $2 '
                       'RETURNING *) INSERT INTO %I SELECT * FROM moved', v_default, v_name)
          USING v_from, v_to;
    END IF;
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   p_table, v_name, v_from, v_to);
    RETURN true;
END
$fn$;
