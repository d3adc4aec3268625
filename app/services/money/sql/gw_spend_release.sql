-- Per-key spend limits (issue 16 item 3) and members' monthly budgets (issue 37 item 4):
-- the period rule and the counters of key_spend and member_spend, written once. Called by
-- gw_open_calls, gw_chat_holds, gw_chat_settle and Python's money.spend (refunds, chat
-- releases, refusal details, key rotation).
--
-- Give p_micros back to what gw_spend_reserve counted (never below zero; nothing when it
-- counted nothing): the key's counter of the period the reservation was taken in
-- (p_reserved_from; NULL: not counted), and the member's counter (p_member in the
-- organisation p_org; NULL: not counted) of the month of p_at, the reservation's time
-- (the call's or completion's created_at).
CREATE OR REPLACE FUNCTION gw_spend_release(p_key varchar, p_micros bigint, p_reserved_from timestamptz,
                                            p_org varchar, p_member varchar, p_at timestamptz)
RETURNS void
LANGUAGE sql AS $fn$
    UPDATE key_spend s SET spent_micros = greatest(s.spent_micros - p_micros, 0)
     WHERE s.key_id = p_key AND s.period_start = p_reserved_from AND p_micros > 0;
    UPDATE member_spend s SET spent_micros = greatest(s.spent_micros - p_micros, 0)
     WHERE s.org_id = p_org AND s.member_id = p_member AND p_micros > 0
       AND s.period_start = (gw_period_bounds('month', p_at)).period_from;
$fn$;
