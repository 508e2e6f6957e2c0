-- ---------------------------------------------------------------------------
-- The answers of consume and check (decision) and of limit()
-- (rate_decision).  Here, next to the counter, because a PL/Proxy proxy
-- database (contrib/plproxy) carries these types and nothing of the
-- tables: its install script is built from this part and the counter's.
-- ---------------------------------------------------------------------------

CREATE TYPE flagmeter.decision AS (
	granted		boolean,
	used		bigint,
	quota		bigint,
	remaining	bigint,
	resets_at	timestamptz,
	overage		bigint,
	meter		text,
	reason		text,
	from_grants	bigint,
	balance		bigint,
	retry_after	interval
);
COMMENT ON TYPE flagmeter.decision IS
'answer of consume and check: granted, used and remaining after the call (unchanged when denied), quota, remaining and overage NULL when unlimited, resets_at NULL for lifetime, overage = used beyond the quota (soft limits), reason why (ok, over_soft_limit, unlimited, quota_exceeded, rate_limited, other_meter_refused), from_grants = units of this call drawn from credit grants, balance = quota remaining plus active credit grants remaining (NULL when unlimited without grants), retry_after = how long until a call refused for its rate limit would be granted (NULL otherwise, and when waiting cannot help)';

CREATE TYPE flagmeter.rate_decision AS (
	allowed		boolean,
	remaining	bigint,
	retry_after	interval,
	reset_after	interval
);
COMMENT ON TYPE flagmeter.rate_decision IS
'answer of limit(): allowed, remaining = units that could still be granted now, retry_after = how long until the refused cost would be granted (NULL when allowed, or when the cost exceeds the burst and waiting cannot help), reset_after = how long until the key is back to a full burst';
