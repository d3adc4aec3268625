-- gw_rate_grant(win, starts, limits, n, least, back): the arithmetic of one rate counter
-- (app/services/platform/ratecount.py), used by gw_rate_hit's upsert. ``win`` is the
-- counter row's windows as stored, [start1, count1, start2, count2, …] (NULL: no row);
-- ``starts``/``limits`` the caller's current window starts (epoch seconds, aligned like
-- the Redis keys) and limits (-1: none), ``back`` per window the unused hits of a dropped
-- lease to give back first (only to a window that has not ended).
-- Grants g = the smallest room left under any limit, at most n; fewer than ``least`` (1 for
-- a lease, n for all-or-nothing) is a refusal: NULL, nothing is counted. n <= 0 gives back
-- (never below zero, never to a later window). Returns the new windows with g appended.
-- A window whose stored start is older than the caller's has ended: it starts at zero; one
-- that is newer (another node's clock is ahead) is where the hit counts.
-- Called by gw_rate_hit only (its upsert's VALUES, WHERE and SET).

CREATE OR REPLACE FUNCTION gw_rate_grant(p_win bigint[], p_starts bigint[], p_limits bigint[],
                                         p_n bigint, p_least bigint, p_back bigint[])
RETURNS bigint[] LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $fn$
DECLARE
    v_k int := cardinality(p_starts);
    v_starts bigint[] := p_starts;
    v_base bigint[] := p_starts;
    v_grant bigint := p_n;
    v_out bigint[] := '{}';
    v_s bigint;
    v_c bigint;
BEGIN
    FOR i IN 1 .. v_k LOOP
        v_s := p_win[2 * i - 1];
        v_c := p_win[2 * i];
        IF v_s IS NULL OR v_c IS NULL OR v_s < p_starts[i] THEN
            v_s := p_starts[i];
            v_c := 0;
        ELSIF v_s = p_starts[i] THEN
            v_c := v_c - least(greatest(coalesce(p_back[i], 0), 0), v_c);
        END IF;
        v_starts[i] := v_s;
        v_base[i] := v_c;
        IF p_n > 0 AND p_limits[i] >= 0 AND p_limits[i] - v_c < v_grant THEN
            v_grant := p_limits[i] - v_c;
        END IF;
    END LOOP;
    IF p_n > 0 AND v_grant < p_least THEN
        RETURN NULL;
    END IF;
    FOR i IN 1 .. v_k LOOP
        IF p_n > 0 OR v_starts[i] = p_starts[i] THEN
            v_out := v_out || v_starts[i] || greatest(0, v_base[i] + v_grant);
        ELSE
            v_out := v_out || v_starts[i] || v_base[i];
        END IF;
    END LOOP;
    RETURN v_out || v_grant;
END
$fn$;
