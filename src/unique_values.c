/*
 * unique_values.c
 *	  track_value(), consume_value() and forget_value(): the calls of
 *	  meters that count distinct values (aggregation 'unique': monthly
 *	  active users, seats, distinct API keys).
 *
 *	  A period's set of values is flagmeter.unique_values, one row per
 *	  value (as a 128-bit hash) under the primary key, so "is it new?" is
 *	  the insert's conflict and two writers of one new value count it once
 *	  (the second waits for the first's commit).  Its count is not read
 *	  from the set: a value new in its period is one event of amount 1,
 *	  written through track's or consume's path, so the counters, check,
 *	  the thresholds, blocked events, the outbox and the rollups treat a
 *	  unique meter as a sum meter; forgetting a value takes that event back
 *	  as void does.  flagmeter.value_sightings keeps which values were seen
 *	  on which UTC day, for usage_series (docs/design.md, "Distinct
 *	  counts").
 */
#include "postgres.h"
#include "fmgr.h"
#include "funcapi.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/cryptohash.h"
#include "common/sha2.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/date.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "args.h"
#include "consume.h"
#include "decision.h"
#include "limit_lookup.h"
#include "period.h"
#include "reads.h"
#include "statements.h"
#include "track.h"
#include "usage_rows.h"
#include "void.h"

/* A value is 1 to this many bytes (it is stored as a hash of them). */
#define FM_VALUE_MAX_BYTES 1024

/* ON CONFLICT DO NOTHING: one row when the value is new in the period */
static FmStatement add_value_stmt = {
	"INSERT INTO flagmeter.unique_values"
	" (tenant, meter, period_start, value_hash, counted_at, period_end)"
	" VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
	6, {TEXTOID, TEXTOID, TIMESTAMPTZOID, UUIDOID, TIMESTAMPTZOID, TIMESTAMPTZOID}
};

static FmStatement remove_value_stmt = {
	"DELETE FROM flagmeter.unique_values"
	" WHERE tenant" FM_EQ "$1 AND meter" FM_EQ "$2 AND period_start" FM_EQ "$3"
	" AND value_hash" FM_EQ "$4 RETURNING counted_at",
	4, {TEXTOID, TEXTOID, TIMESTAMPTZOID, UUIDOID}
};

/*
 * track_value's writes in one statement (one executor start, not two):
 * the set's row and the day's sighting, each skipped when it is there; one
 * row processed when the value is new in the period.
 */
static FmStatement add_and_sight_value_stmt = {
	"WITH sighting AS ("
	"  INSERT INTO flagmeter.value_sightings (tenant, meter, day, period_start, value_hash)"
	"  VALUES ($1, $2, $7, $3, $4) ON CONFLICT DO NOTHING"
	") "
	"INSERT INTO flagmeter.unique_values"
	" (tenant, meter, period_start, value_hash, counted_at, period_end)"
	" VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
	7, {TEXTOID, TEXTOID, TIMESTAMPTZOID, UUIDOID, TIMESTAMPTZOID, TIMESTAMPTZOID, DATEOID}
};

static FmStatement value_counted_stmt = {
	"SELECT FROM flagmeter.unique_values"
	" WHERE tenant" FM_EQ "$1 AND meter" FM_EQ "$2 AND period_start" FM_EQ "$3"
	" AND value_hash" FM_EQ "$4",
	4, {TEXTOID, TEXTOID, TIMESTAMPTZOID, UUIDOID}
};

static FmStatement sight_value_stmt = {
	"INSERT INTO flagmeter.value_sightings (tenant, meter, day, period_start, value_hash)"
	" VALUES ($1, $2, $5, $3, $4) ON CONFLICT DO NOTHING",
	5, {TEXTOID, TEXTOID, TIMESTAMPTZOID, UUIDOID, DATEOID}
};

/* One call's value, where it is counted and when. */
typedef struct ValueCall
{
	char	   *tenant;
	char	   *meter;
	pg_uuid_t	hash;
	FmLimit		limit;
	TimestampTz at;				/* occurred_at, or now */
	TimestampTz period_start;
	TimestampTz period_end;
} ValueCall;

/*
 * The first 128 bits of SHA-256 of the value's bytes: fixed width
 * whatever the value, and two distinct values of one period share a hash
 * with a chance of about n^2 / 2^129 for n values (docs/design.md).
 */
static void
hash_value(const char *value, size_t len, pg_uuid_t *out)
{
	pg_cryptohash_ctx *ctx = pg_cryptohash_create(PG_SHA256);
	uint8		digest[PG_SHA256_DIGEST_LENGTH];

	if (pg_cryptohash_init(ctx) < 0 ||
		pg_cryptohash_update(ctx, (const uint8 *) value, len) < 0 ||
		pg_cryptohash_final(ctx, digest, sizeof(digest)) < 0)
	{
		pg_cryptohash_free(ctx);
		elog(ERROR, "could not hash a value with SHA-256");
	}
	pg_cryptohash_free(ctx);
	memcpy(out->data, digest, UUID_LEN);
}

/* The value argument: not NULL, 1 to FM_VALUE_MAX_BYTES bytes. */
static void
value_arg(FunctionCallInfo fcinfo, int argno, pg_uuid_t *hash)
{
	text	   *value;
	size_t		len;

	if (PG_ARGISNULL(argno))
		fm_null_argument("value");
	value = PG_GETARG_TEXT_PP(argno);
	len = VARSIZE_ANY_EXHDR(value);
	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("value must not be empty")));
	if (len > FM_VALUE_MAX_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("value is too long: %zu bytes", len),
				 errdetail("A value is at most %d bytes.", FM_VALUE_MAX_BYTES),
				 errhint("Pass an id rather than the record, or a hash of it.")));
	hash_value(VARDATA_ANY(value), len, hash);
}

/*
 * Read the tenant, meter and value arguments, take the counters' lock and
 * load the limit of a unique meter (42809 for another meter), with the
 * period containing at.  Inside SPI.  Nothing is written before it.
 */
static void
start_value_call(FunctionCallInfo fcinfo, ValueCall *call, TimestampTz at)
{
	call->tenant = fm_arg_tenant(fcinfo, 0);
	call->meter = fm_arg_meter(fcinfo, 1);
	value_arg(fcinfo, 2, &call->hash);
	call->at = at;

	fm_lock_counters_for_write();
	SPI_connect();
	fm_load_limit(call->tenant, call->meter, false, &call->limit);
	if (call->limit.aggregation != FM_AGG_UNIQUE)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("meter \"%s\" does not count distinct values", call->meter),
				 errdetail("It is a %s meter; values are recorded on meters of aggregation \"unique\".",
						   fm_aggregation_name(call->limit.aggregation)),
				 errhint("Record amounts with flagmeter.track or flagmeter.consume, or define a "
						 "meter with flagmeter.define_meter(meter, aggregation => 'unique').")));
	fm_period_bounds(call->limit.period, call->limit.anchor, call->limit.tz, at,
					 &call->period_start, &call->period_end);
}

/* $1 .. $4 of the statements on a value: tenant, meter, period, hash */
static void
value_args(const ValueCall *call, Datum *args)
{
	args[0] = CStringGetTextDatum(call->tenant);
	args[1] = CStringGetTextDatum(call->meter);
	args[2] = TimestampTzGetDatum(call->period_start);
	args[3] = UUIDPGetDatum(&call->hash);
}

/* The UTC day of the call's time, which a sighting is kept under. */
static DateADT
call_day(const ValueCall *call)
{
	return (DateADT) (call->at / USECS_PER_DAY - (call->at % USECS_PER_DAY < 0 ? 1 : 0));
}

/* Add the value to its period's set: true when it was not in it. */
static bool
add_value(const ValueCall *call)
{
	Datum		args[6];

	value_args(call, args);
	args[4] = TimestampTzGetDatum(call->at);
	args[5] = TimestampTzGetDatum(call->period_end);
	fm_execute(&add_value_stmt, args, NULL, false, 0);
	return SPI_processed == 1;
}

/* add_value, and the sighting of sight_value in the same statement */
static bool
add_and_sight_value(const ValueCall *call)
{
	Datum		args[7];

	value_args(call, args);
	args[4] = TimestampTzGetDatum(call->at);
	args[5] = TimestampTzGetDatum(call->period_end);
	args[6] = DateADTGetDatum(call_day(call));
	fm_execute(&add_and_sight_value_stmt, args, NULL, false, 0);
	return SPI_processed == 1;
}

/*
 * Remove the value from its period's set: true, with the time its event
 * was counted at in *counted_at, when it was in it.
 */
static bool
remove_value(const ValueCall *call, TimestampTz *counted_at)
{
	Datum		args[4];
	bool		isnull;

	value_args(call, args);
	fm_execute(&remove_value_stmt, args, NULL, false, 0);
	if (SPI_processed == 0)
		return false;
	*counted_at = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[0],
													SPI_tuptable->tupdesc, 1, &isnull));
	return true;
}

/* The value was seen at call->at: one row per UTC day and period. */
static void
sight_value(const ValueCall *call)
{
	Datum		args[5];

	value_args(call, args);
	args[4] = DateADTGetDatum(call_day(call));
	fm_execute(&sight_value_stmt, args, NULL, false, 0);
}

/* Whether the value is in its period's set, in a new snapshot. */
static bool
value_counted(const ValueCall *call)
{
	Datum		args[4];

	value_args(call, args);
	fm_execute(&value_counted_stmt, args, NULL, false, 1);
	return SPI_processed == 1;
}

/*
 * consume_value's decision for a value counted already: granted, with
 * what check says of no more usage.  A new snapshot (READ COMMITTED) sees
 * the transaction that counted the value when this call waited for its
 * insert, and the values counted by earlier calls of the same statement.
 * Past a hard quota lowered since the value was counted, check refuses no
 * more usage; the value keeps working all the same.
 */
static void
counted_decision(const ValueCall *call, FmDecision *decision)
{
	PushActiveSnapshot(GetTransactionSnapshot());
	fm_check_decision(call->tenant, call->meter, 0, decision);
	PopActiveSnapshot();
	if (!decision->granted)
	{
		decision->granted = true;
		decision->reason = FM_REASON_OK;
		decision->retry_after = -1;
	}
}

/*
 * track_value(tenant, meter, value, occurred_at) -> boolean
 *
 * Records that value was seen at occurred_at: true when it was new in its
 * period (the meter's usage went up by one), false when it was counted
 * already.  Never refused by the limit, as track is not.
 */
PG_FUNCTION_INFO_V1(fm_track_value);
Datum
fm_track_value(PG_FUNCTION_ARGS)
{
	ValueCall	call;
	bool		added;

	start_value_call(fcinfo, &call, fm_arg_timestamp(fcinfo, 3, "occurred_at"));
	fm_check_event_time(call.tenant, call.meter, call.at);
	added = add_and_sight_value(&call);
	if (added)
		fm_track_new_value(call.tenant, call.meter, call.at, &call.limit);
	SPI_finish();
	PG_RETURN_BOOL(added);
}

/*
 * consume_value(tenant, meter, value) -> decision
 *
 * Granted when the value is counted in the current period already (its
 * usage unchanged, even past a quota lowered since), or when one more value
 * fits the limit and the rate limit (then it is counted, as consume
 * records one unit); refused otherwise, recording nothing.  A new value is
 * decided on the period's stripe 0, locked before the value is added to
 * the set: concurrent calls with new values decide one at a time, so the
 * count never passes a hard quota, and a transaction that holds stripe 0
 * and adds a value another call is deciding on does not deadlock with it
 * (that call waits for stripe 0 before it adds the value).
 */
PG_FUNCTION_INFO_V1(fm_consume_value);
Datum
fm_consume_value(PG_FUNCTION_ARGS)
{
	ValueCall	call;
	TupleDesc	desc = fm_decision_desc(fcinfo);
	FmDecision *decision;

	start_value_call(fcinfo, &call, GetCurrentTransactionStartTimestamp());
	decision = SPI_palloc(sizeof(FmDecision));	/* outlives SPI */
	if (value_counted(&call))
		counted_decision(&call, decision);
	else
	{
		fm_lock_consume_periods(&call.tenant, &call.meter, 1);
		if (!add_value(&call))
			counted_decision(&call, decision);	/* added meanwhile */
		else
		{
			FmConsumeItem item;
			int			ndecisions;

			memset(&item, 0, sizeof(item));
			item.meter = call.meter;
			item.amount = 1;
			item.counts_value = true;
			/* in this SPI connection's memory, gone at SPI_finish: copied */
			*decision = *fm_consume_items(call.tenant, &item, 1, NULL, &ndecisions);
			if (!decision->granted)
			{
				TimestampTz counted_at;

				/* the row this call inserted, still locked by it */
				remove_value(&call, &counted_at);
			}
		}
	}
	if (decision->granted)
		sight_value(&call);
	SPI_finish();
	PG_RETURN_DATUM(HeapTupleGetDatum(fm_decision_tuple(desc, decision)));
}

/*
 * forget_value(tenant, meter, value) -> boolean
 *
 * Frees value in the current period (a seat given up): true when it was
 * counted there, and the usage goes down by one as a void takes an event
 * back; false when it was not.  Earlier periods keep their counts.
 */
PG_FUNCTION_INFO_V1(fm_forget_value);
Datum
fm_forget_value(PG_FUNCTION_ARGS)
{
	ValueCall	call;
	TimestampTz counted_at;
	bool		removed;

	start_value_call(fcinfo, &call, GetCurrentTransactionStartTimestamp());
	removed = remove_value(&call, &counted_at);
	if (removed)
	{
		char		log_key[UUID_LEN * 2 + 7];
		int			i;

		strcpy(log_key, "value:");
		for (i = 0; i < UUID_LEN; i++)
			sprintf(log_key + 6 + 2 * i, "%02x", call.hash.data[i]);
		fm_void_value_event(call.tenant, call.meter, counted_at, log_key);
	}
	SPI_finish();
	PG_RETURN_BOOL(removed);
}
