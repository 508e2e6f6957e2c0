-- ---------------------------------------------------------------------------
-- Batched calls with per-event answers: what a client that groups
-- concurrent requests into one transaction calls (clients/node).  Each
-- shares its code with the single call it batches (src/track_batch.c,
-- src/consume_batch.c), so an event or an item is decided exactly as the
-- single call would decide it.  Like those calls they run their statements
-- as the owner of schema flagmeter, so EXECUTE is taken back from PUBLIC
-- here, next to them (see 80_security.sql for why).
-- ---------------------------------------------------------------------------

CREATE FUNCTION flagmeter.track_events(tenants text[], meters text[], amounts bigint[],
	occurred_at timestamptz[] DEFAULT NULL, idempotency_keys text[] DEFAULT NULL)
RETURNS boolean[]
AS 'MODULE_PATHNAME', 'fm_track_events'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.track_events(text[], text[], bigint[], timestamptz[], text[]) IS
'track_batch with one answer per event: element i is true when event i was counted, false when its idempotency key was recorded before (or earlier in the call); all or nothing on error';

CREATE FUNCTION flagmeter.consume_batch(tenants text[], meters text[], amounts bigint[],
	idempotency_keys text[] DEFAULT NULL, items integer[] DEFAULT NULL)
RETURNS TABLE (item integer, granted boolean, used bigint, quota bigint, remaining bigint,
	resets_at timestamptz, overage bigint, meter text, reason text, from_grants bigint,
	balance bigint, retry_after interval)
AS 'MODULE_PATHNAME', 'fm_consume_batch'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE ROWS 16;
COMMENT ON FUNCTION flagmeter.consume_batch(text[], text[], bigint[], text[], integer[]) IS
'many independent consumes in one call, decided in order, each exactly as consume: row i is (tenants[i], meters[i], amounts[i], idempotency_keys[i]); adjacent rows with the same items[i] form one all-or-nothing item (NULL items: every row is an item, numbered from 1); one decision per row, in argument order, with its item';

REVOKE ALL ON FUNCTION flagmeter.track_events(text[], text[], bigint[], timestamptz[], text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.consume_batch(text[], text[], bigint[], text[], integer[]) FROM PUBLIC;
