-- gw_rate_hit(key, starts, limits, until, n, least, back): count hits in a rate counter's
-- fixed windows in PostgreSQL, the store every worker and node shares when there is no
-- Redis (the embedded default). Called by app/services/platform/ratecount.py as ONE
-- statement in autocommit: one conditional upsert of the counter's row (rate_windows, an
-- UNLOGGED table: no WAL, so no commit waits for a flush; a crash empties it, which only
-- forgets the current windows). The arithmetic is gw_rate_grant's. A refusal writes
-- nothing: the row is read for the reply. Returns the count of each window the caller
-- named (as it is after this call), then the hits granted (0: refused; n <= 0: n).
-- ``until``: when the caller's longest window ends (epoch seconds); the rate-windows-purge
-- job deletes rows whose windows have all ended.

CREATE OR REPLACE FUNCTION gw_rate_hit(p_key text, p_starts bigint[], p_limits bigint[], p_until bigint,
                                       p_n bigint, p_least bigint, p_back bigint[])
RETURNS bigint[] LANGUAGE plpgsql AS $fn$
DECLARE
    v_win bigint[];
    v_grant bigint := 0;
    v_out bigint[] := '{}';
BEGIN
    INSERT INTO rate_windows AS w (key, win, until)
    VALUES (p_key, gw_rate_grant(NULL, p_starts, p_limits, p_n, p_least, p_back), p_until)
    ON CONFLICT (key) DO UPDATE
       SET win = gw_rate_grant(w.win, p_starts, p_limits, p_n, p_least, p_back),
           until = greatest(w.until, EXCLUDED.until)
     WHERE gw_rate_grant(w.win, p_starts, p_limits, p_n, p_least, p_back) IS NOT NULL
    RETURNING w.win INTO v_win;
    IF v_win IS NULL THEN
        SELECT r.win INTO v_win FROM rate_windows r WHERE r.key = p_key;
    ELSE
        v_grant := v_win[cardinality(v_win)];
    END IF;
    FOR i IN 1 .. cardinality(p_starts) LOOP
        v_out := v_out || CASE WHEN v_win[2 * i - 1] >= p_starts[i] THEN v_win[2 * i] ELSE 0 END;
    END LOOP;
    RETURN v_out || v_grant;
END
$fn$;
