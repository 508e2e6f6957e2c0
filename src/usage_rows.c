/*
 * usage_rows.c
 *	  The rows usage lives in, read and locked through SPI (see
 *	  usage_rows.h), and the transaction id flagmeter.events records.
 */
#include "postgres.h"
#include "fmgr.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "access/xact.h"
#include "utils/fmgroids.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/xid8.h"

#include "counter.h"
#include "pending.h"
#include "pk_scan.h"
#include "stripes.h"
#include "usage_rows.h"

static FmStatement read_period_stmt = {
	"SELECT counter, stripe FROM flagmeter.counters"
	" WHERE tenant" FM_EQ "$1 AND meter" FM_EQ "$2 AND period_start" FM_EQ "$3",
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

static FmStatement read_stripe0_stmt = {
	FM_STRIPE0_SELECT,
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

static FmStatement lock_stripe0_stmt = {
	FM_STRIPE0_SELECT " FOR UPDATE",
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

static FmStatement create_stripe0_stmt = {
	"INSERT INTO flagmeter.counters (tenant, meter, period_start, stripe, counter)"
	" VALUES ($1, $2, $3, 0, 'used=0 events=0 max=0')"
	" ON CONFLICT (tenant, meter, period_start, stripe) DO NOTHING",
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

/*
 * xid_int(xid8) -> bigint: a transaction id as flagmeter.events.xid stores
 * it.  FullTransactionIds stay far below 2^63 (the epoch would have to pass
 * 2^31); the largest xid8 maps to the largest bigint, so that "up to the
 * end" bounds keep their meaning.
 */
PG_FUNCTION_INFO_V1(fm_xid_int);
Datum
fm_xid_int(PG_FUNCTION_ARGS)
{
	uint64		xid = U64FromFullTransactionId(PG_GETARG_FULLTRANSACTIONID(0));

	PG_RETURN_INT64(xid > (uint64) PG_INT64_MAX ? PG_INT64_MAX : (int64) xid);
}

void
fm_lock_counters_for_write(void)
{
	LockRelationOid(fm_relation_oid("counters"), RowExclusiveLock);
}

FmCounter
fm_merge_result_rows(void)
{
	FmCounter	total = fm_empty_counter();
	uint64		i;

	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		Datum		d = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
									  1, &isnull);

		if (!isnull)
			fm_counter_report(fm_counter_merge(&total, DatumGetFmCounterP(d)));
	}
	return total;
}

FmCounter
fm_read_period(const char *tenant, const char *meter, TimestampTz period_start)
{
	Datum		args[3];
	Snapshot	snapshot = RegisterSnapshot(GetTransactionSnapshot());
	FmCounter	total;

	fm_period_args(args, tenant, meter, period_start);
	fm_execute_snapshot(&read_period_stmt, args, NULL, false, 0, snapshot);
	total = fm_merge_result_rows();
	fm_pending_add_visible(tenant, meter, period_start, snapshot, &total);
	UnregisterSnapshot(snapshot);
	return total;
}

FmCounter
fm_read_stripe0(Datum *args)
{
	fm_execute(&read_stripe0_stmt, args, NULL, false, 0);
	return fm_merge_result_rows();
}

void
fm_create_stripe0(Datum *args)
{
	fm_execute(&create_stripe0_stmt, args, NULL, false, 0);
}

void
fm_lock_stripe0(const char *tenant, const char *meter, TimestampTz period_start)
{
	Datum		args[3];

	fm_period_args(args, tenant, meter, period_start);
	fm_execute(&lock_stripe0_stmt, args, NULL, false, 0);
	if (SPI_processed == 0)
	{
		fm_create_stripe0(args);
		fm_execute(&lock_stripe0_stmt, args, NULL, false, 0);
		if (SPI_processed != 1)
			elog(ERROR, "could not lock the counter of tenant \"%s\" meter \"%s\"",
				 tenant, meter);
	}
}

FmCounter
fm_scan_period(const char *tenant, const char *meter, TimestampTz period_start,
			   Snapshot snapshot)
{
	/* (tenant, meter, period_start): the leading columns of the key */
	const Datum keys[3] = {CStringGetTextDatum(tenant), CStringGetTextDatum(meter),
	TimestampTzGetDatum(period_start)};
	const Oid	eqprocs[3] = {F_TEXTEQ, F_TEXTEQ, F_TIMESTAMPTZ_EQ};
	FmPkScan	s;
	AttrNumber	counter_attnum;
	FmCounter	total;

	fm_counter_init(&total);
	fm_pk_scan_begin(&s, "counters", 3, keys, eqprocs, snapshot);
	counter_attnum = fm_pk_scan_attnum(&s, "counter");
	while (fm_pk_scan_next(&s))
	{
		bool		isnull;
		Datum		d = slot_getattr(s.slot, counter_attnum, &isnull);

		if (!isnull)
			fm_counter_report(fm_counter_merge(&total, DatumGetFmCounterP(d)));
	}
	fm_pk_scan_end(&s);
	fm_pending_add_visible(tenant, meter, period_start, snapshot, &total);
	return total;
}

/*
 * track's statements; fm_pick_stripe says which stripe they write.  Each
 * returns (stripe, counter, recheck_at, recheck_for, ctid) of the row written.
 */
#define TRACK_EVENT_CTE \
	"WITH event AS (" \
	"  INSERT INTO flagmeter.events" \
	"   (tenant, meter, amount, occurred_at, recorded_at, idempotency_key)" \
	"  VALUES ($1, $2, $3, $4, $5, $6)" \
	") "
#define TRACK_STRIPE_KEY(alias) \
	" " alias ".tenant" FM_EQ "$1 AND " alias ".meter" FM_EQ "$2" \
	" AND " alias ".period_start" FM_EQ "$7"
#define ADD_TO_STRIPE \
	"INSERT INTO flagmeter.counters AS c (tenant, meter, period_start, stripe, counter)" \
	" VALUES ($1, $2, $7, $8, $9)" \
	" ON CONFLICT (tenant, meter, period_start, stripe) DO UPDATE" \
	" SET counter = c.counter OPERATOR(flagmeter.+) EXCLUDED.counter" \
	" RETURNING c.stripe, c.counter, c.recheck_at, c.recheck_for, c.ctid"
#define TRACK_ARGTYPES \
	{TEXTOID, TEXTOID, INT8OID, TIMESTAMPTZOID, TIMESTAMPTZOID, TEXTOID, \
	TIMESTAMPTZOID, INT2OID, FM_TYPE_COUNTER}

/*
 * The event and the increment of an existing stripe: no row when the
 * stripe does not exist yet.  A plain UPDATE, not an upsert: ON CONFLICT DO
 * UPDATE locks the row first, a WAL record of its own.
 */
static FmStatement track_update_stripe_stmt = {
	TRACK_EVENT_CTE
	"UPDATE flagmeter.counters c"
	" SET counter = c.counter OPERATOR(flagmeter.+) $9"
	" WHERE" TRACK_STRIPE_KEY("c") " AND c.stripe" FM_EQ "$8"
	" RETURNING c.stripe, c.counter, c.recheck_at, c.recheck_for, c.ctid",
	9, TRACK_ARGTYPES
};

/* the increment of a stripe that may not exist yet (it creates it) */
static FmStatement add_to_stripe_stmt = {
	ADD_TO_STRIPE,
	9, TRACK_ARGTYPES
};

/* the event and the increment of a stripe that may not exist yet */
static FmStatement track_add_to_stripe_stmt = {
	TRACK_EVENT_CTE ADD_TO_STRIPE,
	9, TRACK_ARGTYPES
};

/* $1 .. $5 of the statements that insert an event: it, and when it was recorded */
static void
event_args(Datum *args, const char *tenant, const char *meter, int64 amount,
		   TimestampTz occurred_at)
{
	args[0] = CStringGetTextDatum(tenant);
	args[1] = CStringGetTextDatum(meter);
	args[2] = Int64GetDatum(amount);
	args[3] = TimestampTzGetDatum(occurred_at);
	args[4] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
}

void
fm_write_event_to_stripe(const char *tenant, const char *meter, int64 amount,
						 TimestampTz occurred_at, const char *key,
						 TimestampTz period_start, const FmCounter *delta)
{
	Datum		args[9];

	event_args(args, tenant, meter, amount, occurred_at);
	args[5] = key ? CStringGetTextDatum(key) : (Datum) 0;
	args[6] = TimestampTzGetDatum(period_start);
	args[8] = FmCounterPGetDatum(delta);
	if (IsolationUsesXactSnapshot())
	{
		args[7] = Int16GetDatum(fm_own_stripe());
		fm_execute(&track_add_to_stripe_stmt, args, key ? NULL : "     n   ",
				   false, 0);
	}
	else
	{
		args[7] = Int16GetDatum(fm_pick_stripe(tenant, meter, period_start));
		fm_execute(&track_update_stripe_stmt, args, key ? NULL : "     n   ",
				   false, 0);
		if (SPI_processed == 0)
			fm_execute(&add_to_stripe_stmt, args, NULL, false, 0);
	}
	if (SPI_processed != 1)
		elog(ERROR, "track wrote " UINT64_FORMAT " counter rows of tenant \"%s\" meter \"%s\"",
			 (uint64) SPI_processed, tenant, meter);
}

/* an event written alone: no key (a keyed track writes its stripe) */
static FmStatement pending_event_stmt = {
	"INSERT INTO flagmeter.events"
	" (tenant, meter, amount, occurred_at, recorded_at, period_start)"
	" VALUES ($1, $2, $3, $4, $5, $6)",
	6, {TEXTOID, TEXTOID, INT8OID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID}
};

bool
fm_write_event_alone(const char *tenant, const char *meter, int64 amount,
					 TimestampTz occurred_at, TimestampTz period_start,
					 const FmCounter *delta, const FmLimit *limit, bool *read_due)
{
	Datum		args[6];

	if (!fm_pending_track_enabled(limit) ||
		!fm_pending_add(tenant, meter, period_start, delta, limit,
						!fm_pending_xact_has_adds(), read_due))
		return false;
	event_args(args, tenant, meter, amount, occurred_at);
	args[5] = TimestampTzGetDatum(period_start);
	fm_execute(&pending_event_stmt, args, NULL, false, 0);
	return true;
}
