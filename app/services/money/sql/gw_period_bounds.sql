-- Per-key spend limits (issue 16 item 3) and members' monthly budgets (issue 37 item 4):
-- the period rule, written once. Called by gw_spend_reserve, gw_spend_release and Python's
-- money.spend (refusal details, a member's month, key rotation).
--
-- A key with spend_limit_micros counts what it spends per spend_limit_period: day (UTC
-- midnight), week (ISO week, Monday 00:00 UTC), month (the 1st, 00:00 UTC) or total (one
-- period since 1970-01-01), in the key_spend row (key_id, period_start).
--
-- [start, end) of the period containing p_at (end NULL for total).
CREATE OR REPLACE FUNCTION gw_period_bounds(p_period varchar, p_at timestamptz,
                                            OUT period_from timestamptz, OUT period_to timestamptz)
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT s, CASE p_period WHEN 'day' THEN s + interval '1 day'
                            WHEN 'week' THEN s + interval '7 days'
                            WHEN 'month' THEN ((s AT TIME ZONE 'UTC') + interval '1 month') AT TIME ZONE 'UTC'
              END
      FROM (SELECT CASE p_period
                WHEN 'day' THEN date_trunc('day', p_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                WHEN 'week' THEN date_trunc('week', p_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                WHEN 'month' THEN date_trunc('month', p_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                ELSE timestamptz '1970-01-01 00:00:00+00' END AS s) AS b
$fn$;
