/*
 * track.c
 *	  track(): metering, not enforcement.  Records usage in the caller's
 *	  transaction without waiting for other writers of the tenant; never
 *	  refused by a limit, its crossings announced like consume's.
 */
#include "postgres.h"
#include "fmgr.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "args.h"
#include "counter.h"
#include "event_keys.h"
#include "grants.h"
#include "limit_lookup.h"
#include "period.h"
#include "pools.h"
#include "track.h"
#include "track_alerts.h"
#include "usage_rows.h"

/*
 * track(tenant, meter, amount, occurred_at, idempotency_key) -> boolean
 *
 * Records amount in the period containing occurred_at: a raw event row
 * and an increment of a stripe (stripes.c).  Returns
 * false, recording nothing, when the key is already recorded.  Writes no
 * row that another transaction holds (in REPEATABLE READ, unless two
 * backends share a stripe), so writers of one tenant do not queue behind
 * each other.
 */
static Datum track_call(FunctionCallInfo fcinfo, bool occurred_at_text);

PG_FUNCTION_INFO_V1(fm_track);
Datum
fm_track(PG_FUNCTION_ARGS)
{
	return track_call(fcinfo, false);
}

/*
 * The same with occurred_at as text: an untyped literal or parameter in
 * fourth place resolves to this overload, so that a key passed there by
 * mistake (track(t, m, 1, 'req-1')) gets a hint to name it.
 */
PG_FUNCTION_INFO_V1(fm_track_text);
Datum
fm_track_text(PG_FUNCTION_ARGS)
{
	return track_call(fcinfo, true);
}

/*
 * Record one event of track under the meter's limit, in SPI: claim the key
 * (row seq of kind), write the event and its stripe, draw grants past the
 * quota, announce.  False, recording nothing, when the key was recorded
 * before.
 */
static bool
record_with_limit(const char *tenant, const char *meter, int64 amount, TimestampTz occurred_at,
				  const char *key, int seq, const char *kind, const FmLimit *limit)
{
	TimestampTz period_start;
	TimestampTz period_end;
	FmCounter	delta;
	FmStripeWritten written;
	bool		read_due;

	fm_period_bounds(limit->period, limit->anchor, limit->tz, occurred_at,
					 &period_start, &period_end);
	fm_usage_target(tenant, meter, period_start);

	if (key && !fm_claim_key(tenant, key, seq, meter, amount, occurred_at,
							 period_start, kind, NULL))
		return false;

	delta = fm_empty_counter();
	fm_counter_report(fm_counter_add_event(&delta, amount, occurred_at));
	if (key == NULL &&
		fm_write_event_alone(tenant, meter, amount, occurred_at, period_start, &delta,
							 limit, &read_due))
	{
		if (read_due)
			fm_announce_after_pending_track(tenant, meter, limit, period_start);
		return true;
	}

	/*
	 * One statement (two when the stripe does not exist yet): the raw event
	 * and the stripe's increment.  A stripe whose usage would overflow raises
	 * 22003 and rolls the event back; so does the period's total when it is
	 * read.
	 */
	fm_write_event_to_stripe(tenant, meter, amount, occurred_at, key, period_start, &delta);
	written = fm_stripe_written(0, 1);
	if (limit->grants)
	{
		int64		left = fm_grants_after_track(tenant, meter, limit, period_start,
												 fm_used_of(&delta, limit->aggregation),
												 GetCurrentTransactionStartTimestamp());
		FmLimit		announce = fm_grants_announce_limit(limit, left);

		fm_announce_after_track(tenant, meter, &announce, period_start, &written);
	}
	else
		fm_announce_after_track(tenant, meter, limit, period_start, &written);
	return true;
}

/* record_with_limit of an amount call: *limit is the meter's, loaded here */
static bool
record_event(const char *tenant, const char *meter, int64 amount, TimestampTz occurred_at,
			 const char *key, int seq, const char *kind, FmLimit *limit)
{
	fm_load_limit(tenant, meter, false, limit);
	fm_refuse_unique_meter(meter, limit);
	return record_with_limit(tenant, meter, amount, occurred_at, key, seq, kind, limit);
}

static Datum
track_call(FunctionCallInfo fcinfo, bool occurred_at_text)
{
	char	   *tenant = fm_arg_tenant(fcinfo, 0);
	char	   *meter = fm_arg_meter(fcinfo, 1);
	char	   *key = fm_arg_key(fcinfo, 4);
	int64		amount;
	TimestampTz occurred_at;
	FmLimit		limit;
	bool		counted;

	amount = fm_arg_amount(fcinfo, 2, true);
	occurred_at = occurred_at_text ?
		fm_arg_timestamp_text(fcinfo, 3, "occurred_at",
							  "The fourth argument of track is occurred_at (consume's is the idempotency key). "
							  "Pass a key by name: flagmeter.track(tenant, meter, amount, idempotency_key => '...').") :
		fm_arg_timestamp(fcinfo, 3, "occurred_at");

	fm_lock_counters_for_write();
	fm_check_event_time(tenant, meter, occurred_at);
	SPI_connect();
	counted = record_event(tenant, meter, amount, occurred_at, key, 0, "track", &limit);
	if (counted && fm_draws_from_pool(&limit))
	{
		/* the pool's units, under the same key (pools.h) */
		FmLimit		pool_limit;
		char	   *pool = pstrdup(limit.pool);

		record_event(tenant, pool, fm_pool_amount(&limit, amount), occurred_at, key, 1,
					 "track_pool", &pool_limit);
	}
	SPI_finish();
	fm_usage_target_clear();
	PG_RETURN_BOOL(counted);
}

void
fm_track_new_value(const char *tenant, const char *meter, TimestampTz occurred_at,
				   const FmLimit *limit)
{
	record_with_limit(tenant, meter, 1, occurred_at, NULL, 0, "track", limit);
	fm_usage_target_clear();
}
