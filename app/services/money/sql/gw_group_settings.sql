-- gw_group_settings(lock_wait_ms, async_commit): the transaction settings of a group
-- statement of the hot path, for the rest of its transaction. Called by gw_open_calls,
-- gw_finalize_calls, gw_chat_holds and gw_chat_settles first thing:
--   * lock_timeout = lock_wait_ms when above 0: a group may hold several accounts' rows,
--     so a long wait could be a deadlock (the caller then writes each row alone, with 0:
--     no limit);
--   * synchronous_commit = off when async_commit: the commit does not wait for the WAL
--     flush (an open or a hold; a later durable commit of the same process flushes it,
--     PostgreSQL flushes the WAL in order).
--   * enable_seqscan = off, always: every statement of a group (and of the functions it
--     calls, the ledger's foreign-key checks included) finds its rows by a key. A plan made
--     while a table or this month's partition looked empty (ANALYZE of a new partition, a
--     fresh deployment) would otherwise scan it whole, and a backend keeps its plans: every
--     settle and posting then grew with the table until the next ANALYZE
--     (tests/services/test_group_plans.py).
CREATE OR REPLACE FUNCTION gw_group_settings(p_lock_wait_ms integer, p_async_commit boolean)
RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM set_config('enable_seqscan', 'off', true);
    IF p_async_commit THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    IF p_lock_wait_ms > 0 THEN
        PERFORM set_config('lock_timeout', p_lock_wait_ms || 'ms', true);
    END IF;
END
$fn$;
