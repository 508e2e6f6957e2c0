-- ---------------------------------------------------------------------------
-- The native type flagmeter.quota_counter: usage of one tenant and meter over
-- a span of time (sum, count, max, latest, optional limit).  Fixed size
-- (56 bytes), passed by reference, double-aligned, first byte a version.
-- ---------------------------------------------------------------------------

CREATE TYPE flagmeter.quota_counter;

CREATE FUNCTION flagmeter.quota_counter_in(cstring)
RETURNS flagmeter.quota_counter
AS 'MODULE_PATHNAME', 'quota_counter_in'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION flagmeter.quota_counter_out(flagmeter.quota_counter)
RETURNS cstring
AS 'MODULE_PATHNAME', 'quota_counter_out'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION flagmeter.quota_counter_recv(internal)
RETURNS flagmeter.quota_counter
AS 'MODULE_PATHNAME', 'quota_counter_recv'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION flagmeter.quota_counter_send(flagmeter.quota_counter)
RETURNS bytea
AS 'MODULE_PATHNAME', 'quota_counter_send'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE TYPE flagmeter.quota_counter (
	INTERNALLENGTH = 56,
	INPUT = flagmeter.quota_counter_in,
	OUTPUT = flagmeter.quota_counter_out,
	RECEIVE = flagmeter.quota_counter_recv,
	SEND = flagmeter.quota_counter_send,
	ALIGNMENT = double,
	STORAGE = plain
);

COMMENT ON TYPE flagmeter.quota_counter IS
'usage of one tenant and meter over a span: used (sum), events (count), max, latest amount and time, optional limit; mergeable with +';
COMMENT ON FUNCTION flagmeter.quota_counter_in(cstring) IS
'text input of quota_counter: used=N events=N max=N[ latest=N@YYYY-MM-DDTHH:MM:SS[.ffffff]Z][ limit=N]';
COMMENT ON FUNCTION flagmeter.quota_counter_out(flagmeter.quota_counter) IS
'text output of quota_counter (UTC, independent of TimeZone and DateStyle)';
COMMENT ON FUNCTION flagmeter.quota_counter_recv(internal) IS
'binary input of quota_counter, validated like the text input';
COMMENT ON FUNCTION flagmeter.quota_counter_send(flagmeter.quota_counter) IS
'binary output of quota_counter';

-- Constructors --------------------------------------------------------------

CREATE FUNCTION flagmeter.event_counter(amount bigint, occurred_at timestamptz)
RETURNS flagmeter.quota_counter
AS 'MODULE_PATHNAME', 'quota_counter_from_event'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.event_counter(bigint, timestamptz) IS
'the quota_counter of a single event';

CREATE FUNCTION flagmeter.with_limit(counter flagmeter.quota_counter, quota bigint)
RETURNS flagmeter.quota_counter
AS 'MODULE_PATHNAME', 'quota_counter_with_limit'
LANGUAGE C IMMUTABLE CALLED ON NULL INPUT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.with_limit(flagmeter.quota_counter, bigint) IS
'the counter carrying the given limit (quota > 0); a NULL quota removes the limit';

CREATE FUNCTION flagmeter.subtract_events(counter flagmeter.quota_counter, amount bigint, events bigint)
RETURNS flagmeter.quota_counter
AS 'MODULE_PATHNAME', 'quota_counter_subtract'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.subtract_events(flagmeter.quota_counter, bigint, bigint) IS
'the counter without voided events (amount = their total): used and events go down, max and latest stay; an error if it holds less';

-- Merge and equality ----------------------------------------------------------

CREATE FUNCTION flagmeter.quota_counter_merge(flagmeter.quota_counter, flagmeter.quota_counter)
RETURNS flagmeter.quota_counter
AS 'MODULE_PATHNAME', 'quota_counter_merge'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.quota_counter_merge(flagmeter.quota_counter, flagmeter.quota_counter) IS
'merge two counters: sums add, max and latest are kept, the smaller limit wins; associative and commutative';

CREATE FUNCTION flagmeter.quota_counter_eq(flagmeter.quota_counter, flagmeter.quota_counter)
RETURNS boolean
AS 'MODULE_PATHNAME', 'quota_counter_eq'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.quota_counter_eq(flagmeter.quota_counter, flagmeter.quota_counter) IS
'true when every field of the two counters is equal';

CREATE FUNCTION flagmeter.quota_counter_ne(flagmeter.quota_counter, flagmeter.quota_counter)
RETURNS boolean
AS 'MODULE_PATHNAME', 'quota_counter_ne'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.quota_counter_ne(flagmeter.quota_counter, flagmeter.quota_counter) IS
'true when any field of the two counters differs';

CREATE OPERATOR flagmeter.+ (
	LEFTARG = flagmeter.quota_counter,
	RIGHTARG = flagmeter.quota_counter,
	FUNCTION = flagmeter.quota_counter_merge,
	COMMUTATOR = OPERATOR(flagmeter.+)
);
COMMENT ON OPERATOR flagmeter.+ (flagmeter.quota_counter, flagmeter.quota_counter) IS
'merge two quota counters';

CREATE OPERATOR flagmeter.= (
	LEFTARG = flagmeter.quota_counter,
	RIGHTARG = flagmeter.quota_counter,
	FUNCTION = flagmeter.quota_counter_eq,
	COMMUTATOR = OPERATOR(flagmeter.=),
	NEGATOR = OPERATOR(flagmeter.<>),
	RESTRICT = eqsel,
	JOIN = eqjoinsel
);
COMMENT ON OPERATOR flagmeter.= (flagmeter.quota_counter, flagmeter.quota_counter) IS
'quota counters are equal';

CREATE OPERATOR flagmeter.<> (
	LEFTARG = flagmeter.quota_counter,
	RIGHTARG = flagmeter.quota_counter,
	FUNCTION = flagmeter.quota_counter_ne,
	COMMUTATOR = OPERATOR(flagmeter.<>),
	NEGATOR = OPERATOR(flagmeter.=),
	RESTRICT = neqsel,
	JOIN = neqjoinsel
);
COMMENT ON OPERATOR flagmeter.<> (flagmeter.quota_counter, flagmeter.quota_counter) IS
'quota counters differ';

-- Accessors -------------------------------------------------------------------

CREATE FUNCTION flagmeter.used(flagmeter.quota_counter) RETURNS bigint
AS 'MODULE_PATHNAME', 'quota_counter_used'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.used(flagmeter.quota_counter) IS
'total usage: the sum of the amounts';

CREATE FUNCTION flagmeter.events(flagmeter.quota_counter) RETURNS bigint
AS 'MODULE_PATHNAME', 'quota_counter_events'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.events(flagmeter.quota_counter) IS
'number of events';

CREATE FUNCTION flagmeter.max_amount(flagmeter.quota_counter) RETURNS bigint
AS 'MODULE_PATHNAME', 'quota_counter_max_amount'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.max_amount(flagmeter.quota_counter) IS
'the greatest single amount; NULL when the counter has seen no event';

CREATE FUNCTION flagmeter.latest(flagmeter.quota_counter) RETURNS bigint
AS 'MODULE_PATHNAME', 'quota_counter_latest'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.latest(flagmeter.quota_counter) IS
'the amount of the latest event (greatest timestamp, then greatest amount); NULL when no event';

CREATE FUNCTION flagmeter.latest_at(flagmeter.quota_counter) RETURNS timestamptz
AS 'MODULE_PATHNAME', 'quota_counter_latest_at'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.latest_at(flagmeter.quota_counter) IS
'the time of the latest event; NULL when no event';

CREATE FUNCTION flagmeter.quota(flagmeter.quota_counter) RETURNS bigint
AS 'MODULE_PATHNAME', 'quota_counter_quota'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.quota(flagmeter.quota_counter) IS
'the limit the counter carries; NULL when unlimited';

CREATE FUNCTION flagmeter.remaining(flagmeter.quota_counter) RETURNS bigint
AS 'MODULE_PATHNAME', 'quota_counter_remaining'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.remaining(flagmeter.quota_counter) IS
'quota minus used, never below zero; NULL when unlimited';

CREATE FUNCTION flagmeter.exceeded(flagmeter.quota_counter) RETURNS boolean
AS 'MODULE_PATHNAME', 'quota_counter_exceeded'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.exceeded(flagmeter.quota_counter) IS
'true once used >= quota; NULL when unlimited';

CREATE FUNCTION flagmeter.usage_ratio(flagmeter.quota_counter) RETURNS double precision
AS 'MODULE_PATHNAME', 'quota_counter_usage_ratio'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.usage_ratio(flagmeter.quota_counter) IS
'used / quota (1.0 at the limit); NULL when unlimited';

-- The figure of a counter that a meter's aggregation calls "used".
CREATE FUNCTION flagmeter.used_by(counter flagmeter.quota_counter, aggregation text)
RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
-- (CASE WHEN with qualified operators: CASE x WHEN would resolve = through
-- the caller's search_path)
SELECT CASE
	WHEN $2 OPERATOR(pg_catalog.=) 'count' THEN flagmeter.events($1)
	WHEN $2 OPERATOR(pg_catalog.=) 'max' THEN COALESCE(flagmeter.max_amount($1), 0)
	WHEN $2 OPERATOR(pg_catalog.=) 'latest' THEN COALESCE(flagmeter.latest($1), 0)
	ELSE flagmeter.used($1)
END
$$;
COMMENT ON FUNCTION flagmeter.used_by(flagmeter.quota_counter, text) IS
'the figure of a counter that an aggregation (sum, count, max, latest) counts as used';

-- Aggregates --------------------------------------------------------------------

CREATE FUNCTION flagmeter.quota_counter_add_event(flagmeter.quota_counter, bigint, timestamptz)
RETURNS flagmeter.quota_counter
AS 'MODULE_PATHNAME', 'quota_counter_add_event'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.quota_counter_add_event(flagmeter.quota_counter, bigint, timestamptz) IS
'transition function of quota_counter_agg: adds one event (updates the state in place inside an aggregate)';

CREATE FUNCTION flagmeter.quota_counter_merge_trans(flagmeter.quota_counter, flagmeter.quota_counter)
RETURNS flagmeter.quota_counter
AS 'MODULE_PATHNAME', 'quota_counter_merge_trans'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.quota_counter_merge_trans(flagmeter.quota_counter, flagmeter.quota_counter) IS
'transition and combine function of the counter aggregates (updates the state in place inside an aggregate)';

CREATE AGGREGATE flagmeter.quota_counter_agg(amount bigint, occurred_at timestamptz) (
	SFUNC = flagmeter.quota_counter_add_event,
	STYPE = flagmeter.quota_counter,
	COMBINEFUNC = flagmeter.quota_counter_merge_trans,
	INITCOND = 'used=0 events=0 max=0',
	PARALLEL = SAFE
);
COMMENT ON AGGREGATE flagmeter.quota_counter_agg(bigint, timestamptz) IS
'the quota_counter of a set of events (amount, occurred_at); rows with a NULL are skipped';

CREATE AGGREGATE flagmeter.merge_agg(flagmeter.quota_counter) (
	SFUNC = flagmeter.quota_counter_merge_trans,
	STYPE = flagmeter.quota_counter,
	COMBINEFUNC = flagmeter.quota_counter_merge_trans,
	INITCOND = 'used=0 events=0 max=0',
	PARALLEL = SAFE
);
COMMENT ON AGGREGATE flagmeter.merge_agg(flagmeter.quota_counter) IS
'merge a set of quota counters (rollups of rollups equal rollups of the events)';
