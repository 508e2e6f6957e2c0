/*
 * reservations.c
 *	  reserve(), settle() and release(): holds against a tenant's quota
 *	  and credit grants (see holds.h for the locking rule).
 */
#include "postgres.h"
#include "fmgr.h"
#include "funcapi.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "args.h"
#include "consume.h"
#include "counter.h"
#include "decision.h"
#include "grants.h"
#include "holds.h"
#include "inflight.h"
#include "limit_lookup.h"
#include "period.h"
#include "pools.h"
#include "rate_limiter.h"
#include "reads.h"
#include "statements.h"
#include "usage_rows.h"

/* the tenant's first reservation of the meter: its calls count holds from now on */
static FmStatement mark_account_stmt = {
	"INSERT INTO flagmeter.credit_accounts AS a (tenant, meter, grants, reservations)"
	" VALUES ($1, $2, false, true)"
	" ON CONFLICT ON CONSTRAINT credit_accounts_pkey DO UPDATE SET reservations = true"
	" WHERE NOT a.reservations",
	2, {TEXTOID, TEXTOID}
};

static FmStatement keyed_reservation_stmt = {
	"SELECT r.reservation_id, r.amount, r.expires_at FROM flagmeter.reservations r"
	" WHERE r.tenant" FM_EQ "$1 AND r.idempotency_key" FM_EQ "$2",
	2, {TEXTOID, TEXTOID}
};

static FmStatement insert_reservation_stmt = {
	"INSERT INTO flagmeter.reservations"
	" (tenant, meter, amount, created_at, expires_at, idempotency_key)"
	" VALUES ($1, $2, $3, $4, $5, $6)"
	" RETURNING reservation_id",
	6, {TEXTOID, TEXTOID, INT8OID, TIMESTAMPTZOID, TIMESTAMPTZOID, TEXTOID}
};

static FmStatement lock_reservation_stmt = {
	"SELECT r.tenant, r.meter, r.amount, r.expires_at, r.settled_at IS NOT NULL,"
	" r.released_at IS NOT NULL"
	" FROM flagmeter.reservations r WHERE r.reservation_id" FM_EQ "$1 FOR UPDATE",
	1, {INT8OID}
};

static FmStatement settle_stmt = {
	"UPDATE flagmeter.reservations SET settled_at = pg_catalog.now(), actual = $2"
	" WHERE reservation_id" FM_EQ "$1",
	2, {INT8OID, INT8OID}
};

static FmStatement release_stmt = {
	"UPDATE flagmeter.reservations SET released_at = pg_catalog.now()"
	" WHERE reservation_id" FM_EQ "$1",
	1, {INT8OID}
};

/* A reservation's state, read under its row lock. */
typedef struct LockedReservation
{
	char	   *tenant;
	char	   *meter;
	TimestampTz expires_at;
	bool		settled;
	bool		released;
} LockedReservation;

/* Lock reservation id (inside SPI); 42704 when there is none. */
static void
lock_reservation(int64 id, LockedReservation *r)
{
	Datum		args[1];
	HeapTuple	row;
	TupleDesc	desc;
	bool		isnull;

	args[0] = Int64GetDatum(id);
	fm_execute(&lock_reservation_stmt, args, NULL, false, 1);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("reservation " INT64_FORMAT " does not exist", id)));
	row = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	/* copies that outlive SPI */
	r->tenant = MemoryContextStrdup(TopTransactionContext,
									TextDatumGetCString(SPI_getbinval(row, desc, 1, &isnull)));
	r->meter = MemoryContextStrdup(TopTransactionContext,
								   TextDatumGetCString(SPI_getbinval(row, desc, 2, &isnull)));
	r->expires_at = DatumGetTimestampTz(SPI_getbinval(row, desc, 4, &isnull));
	r->settled = DatumGetBool(SPI_getbinval(row, desc, 5, &isnull));
	r->released = DatumGetBool(SPI_getbinval(row, desc, 6, &isnull));
}

/* Lock stripe 0 of the tenant's current period of the meter (inside SPI). */
static void
lock_current_stripe0(const char *tenant, const char *meter)
{
	FmLimit		limit;
	TimestampTz start;
	TimestampTz end;

	fm_load_limit_any(tenant, meter, false, &limit);
	fm_period_bounds(limit.period, limit.anchor, limit.tz,
					 GetCurrentTransactionStartTimestamp(), &start, &end);
	fm_inflight_before_lock(tenant, meter, start, GetCurrentTransactionStartTimestamp(), NULL);
	fm_lock_stripe0(tenant, meter, start);
}

static int64
arg_reservation_id(FunctionCallInfo fcinfo)
{
	if (PG_ARGISNULL(0))
		fm_null_argument("reservation_id");
	return PG_GETARG_INT64(0);
}

/* reserve's ttl as the time the hold expires, from now: positive (22023). */
static TimestampTz
reserve_expires_at(FunctionCallInfo fcinfo, TimestampTz now)
{
	TimestampTz expires_at;

	if (PG_ARGISNULL(3))
		fm_null_argument("ttl");
	expires_at = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
														 TimestampTzGetDatum(now),
														 PG_GETARG_DATUM(3)));
	if (expires_at <= now)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ttl must be positive")));
	return expires_at;
}

/*
 * The limit of a meter reserve holds units of (inside SPI): a sum meter
 * that draws from no credit pool, else 0A000.
 */
static void
load_reservable_limit(const char *tenant, const char *meter, FmLimit *limit)
{
	fm_load_limit(tenant, meter, false, limit);
	fm_refuse_unique_meter(meter, limit);
	if (limit->aggregation != FM_AGG_SUM)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("meter \"%s\" is a %s meter: reservations hold units of sum meters",
						meter, fm_aggregation_name(limit->aggregation))));
	if (fm_draws_from_pool(limit))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("meter \"%s\" draws from the credit pool \"%s\"", meter, limit->pool),
				 errhint("Reserve units of \"%s\" (the units of \"%s\" times its rate), and track \"%s\" when settled.",
						 limit->pool, meter, meter)));
}

/*
 * reserve's decision (inside SPI), as a hard-limit consume of amount would
 * decide, holds included, under the period's stripe 0 lock and the
 * grants' locks.  The tenant's account of the meter is marked first: its
 * calls count holds from then on.
 */
static void
decide_reserve(const char *tenant, const char *meter, int64 amount, TimestampTz now,
			   FmLimit *limit, FmDecision *decision)
{
	TimestampTz period_start;
	TimestampTz period_end;
	FmCounter	total;
	FmGrantsHeld grants;
	Datum		args[2];
	int64		draw;
	int64		held;

	fm_period_bounds(limit->period, limit->anchor, limit->tz, now, &period_start,
					 &period_end);
	args[0] = CStringGetTextDatum(tenant);
	args[1] = CStringGetTextDatum(meter);
	if (!limit->reserves)
	{
		fm_execute(&mark_account_stmt, args, NULL, false, 0);
		limit->reserves = true;
	}

	fm_inflight_before_lock(tenant, meter, period_start, now, NULL);
	fm_lock_stripe0(tenant, meter, period_start);
	total = fm_read_period(tenant, meter, period_start);
	held = fm_reservations_held(tenant, meter, now, false);
	grants.available = 0;
	if (limit->grants)
		fm_grants_lock(tenant, meter, now, &grants);
	fm_decide_with_grants(limit, &total, amount, now, period_end, false, false,
						  grants.available, held, decision, &draw);
}

/*
 * The reservation key already made (inside SPI): true, with its id,
 * amount and expiry, for a retry; false when the key is new.
 */
static bool
keyed_reservation(const char *tenant, const char *key, int64 *id, int64 *amount,
				  TimestampTz *expires_at)
{
	Datum		args[2];
	HeapTuple	row;
	TupleDesc	desc;
	bool		isnull;

	args[0] = CStringGetTextDatum(tenant);
	args[1] = CStringGetTextDatum(key);
	fm_execute(&keyed_reservation_stmt, args, NULL, false, 1);
	if (SPI_processed != 1)
		return false;
	row = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	*id = DatumGetInt64(SPI_getbinval(row, desc, 1, &isnull));
	*amount = DatumGetInt64(SPI_getbinval(row, desc, 2, &isnull));
	*expires_at = DatumGetTimestampTz(SPI_getbinval(row, desc, 3, &isnull));
	return true;
}

/* Record a granted hold (inside SPI); its reservation_id. */
static int64
insert_reservation(const char *tenant, const char *meter, int64 amount,
				   TimestampTz now, TimestampTz expires_at, const char *key)
{
	Datum		args[6];
	bool		isnull;

	args[0] = CStringGetTextDatum(tenant);
	args[1] = CStringGetTextDatum(meter);
	args[2] = Int64GetDatum(amount);
	args[3] = TimestampTzGetDatum(now);
	args[4] = TimestampTzGetDatum(expires_at);
	args[5] = key ? CStringGetTextDatum(key) : (Datum) 0;
	fm_execute(&insert_reservation_stmt, args, key ? NULL : "     n", false, 1);
	return DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1,
									   &isnull));
}

/*
 * insert_reservation for a hold whose rate limit was spent: a failure
 * gives the rate back, as consume's does.
 */
static int64
insert_rated_reservation(const char *tenant, const char *meter, const FmLimit *limit,
						 int64 amount, TimestampTz now, TimestampTz expires_at,
						 const char *key)
{
	int64		id;

	PG_TRY();
	{
		id = insert_reservation(tenant, meter, amount, now, expires_at, key);
	}
	PG_CATCH();
	{
		fm_decision_give_back_rate(tenant, meter, limit, amount);
		PG_RE_THROW();
	}
	PG_END_TRY();
	return id;
}

/*
 * reserve(tenant, meter, amount, ttl, idempotency_key)
 *   -> (granted, reservation_id, reserved, expires_at, balance, retry_after)
 *
 * Decides as a hard-limit consume of amount would, holds included, under
 * the period's stripe 0 lock and the grants' locks (so a void_grant or a
 * concurrent draw cannot take what it counted), and records the hold.
 * A key already used returns its reservation; a refusal is not
 * remembered under the key.
 */
PG_FUNCTION_INFO_V1(fm_reserve);
Datum
fm_reserve(PG_FUNCTION_ARGS)
{
	char	   *tenant = fm_arg_tenant(fcinfo, 0);
	char	   *meter = fm_arg_meter(fcinfo, 1);
	int64		amount = fm_arg_amount(fcinfo, 2, false);
	char	   *key = fm_arg_key(fcinfo, 4);
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	TimestampTz expires_at = reserve_expires_at(fcinfo, now);
	FmLimit		limit;
	FmDecision	decision;
	TupleDesc	desc;
	Datum		values[6];
	bool		nulls[6] = {false, false, false, false, false, false};
	int64		id = 0;
	bool		granted;

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "reserve must return a record");
	desc = BlessTupleDesc(desc);

	fm_lock_counters_for_write();
	SPI_connect();
	load_reservable_limit(tenant, meter, &limit);
	decide_reserve(tenant, meter, amount, now, &limit, &decision);
	granted = decision.granted;
	/* a retry: the reservation the key made, already counted */
	if (key && keyed_reservation(tenant, key, &id, &amount, &expires_at))
		granted = true;
	/* a new hold spends the rate limit, once nothing else refuses it */
	if (granted && id == 0)
	{
		fm_decision_apply_rate(tenant, meter, &limit, amount, true, &decision);
		granted = decision.granted;
	}
	if (granted && id == 0)
	{
		id = insert_rated_reservation(tenant, meter, &limit, amount, now, expires_at, key);
		decision.balance = Max(decision.balance - amount, 0);
	}
	SPI_finish();

	values[0] = BoolGetDatum(granted);
	values[1] = Int64GetDatum(id);
	nulls[1] = !granted;
	values[2] = Int64GetDatum(amount);
	nulls[2] = !granted;
	values[3] = TimestampTzGetDatum(expires_at);
	nulls[3] = !granted;
	values[4] = Int64GetDatum(decision.balance);
	nulls[4] = !decision.has_balance;
	values[5] = decision.retry_after < 0 ? (Datum) 0 :
		IntervalPGetDatum(fm_interval_of_usecs(decision.retry_after));
	nulls[5] = decision.retry_after < 0;
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
}

/*
 * 55000 unless reservation id (r, locked with its period's stripe 0)
 * still holds: not settled, not released, not expired.
 */
static void
check_still_held(int64 id, const LockedReservation *r)
{
	if (r->settled)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("reservation " INT64_FORMAT " is already settled", id)));
	if (r->released)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("reservation " INT64_FORMAT " was released", id)));

	/*
	 * The clock, now that stripe 0 is held: a decision that no longer counted
	 * the hold began after expires_at, and has committed (or waits for this
	 * transaction), so a settle that finds the ttl passed must not record.
	 */
	if (r->expires_at <= GetCurrentTimestamp())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("reservation " INT64_FORMAT " has expired", id),
				 errdetail("It expired at %s.", timestamptz_to_str(r->expires_at)),
				 errhint("Its hold is gone: record the usage with flagmeter.consume() or flagmeter.track().")));
}

/*
 * settle(reservation_id, actual) -> decision
 *
 * Ends the hold and records actual as consume would, never refused (the
 * usage happened): past the quota it draws the grants, past them it is
 * overage, for hard and soft limits alike.  The reservation's row is
 * locked before the period's stripe 0 (nobody holding stripe 0 waits for
 * a reservation's row), and marked settled first, so the decision does
 * not count its own hold.  A settle that gets stripe 0 after the ttl has
 * passed fails: the hold counted for nobody any more.
 */
PG_FUNCTION_INFO_V1(fm_settle);
Datum
fm_settle(PG_FUNCTION_ARGS)
{
	int64		id = arg_reservation_id(fcinfo);
	int64		actual;
	LockedReservation r;
	Datum		args[2];
	FmDecision *decision;
	FmDecision	read;
	TupleDesc	desc;

	if (PG_ARGISNULL(1))
		fm_null_argument("actual");
	actual = PG_GETARG_INT64(1);
	if (actual < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("actual must not be negative, not " INT64_FORMAT, actual)));
	desc = fm_decision_desc(fcinfo);

	fm_lock_counters_for_write();
	SPI_connect();
	lock_reservation(id, &r);
	lock_current_stripe0(r.tenant, r.meter);
	check_still_held(id, &r);
	args[0] = Int64GetDatum(id);
	args[1] = Int64GetDatum(actual);
	fm_execute(&settle_stmt, args, NULL, false, 0);
	SPI_finish();

	if (actual > 0)
	{
		FmConsumeItem item;
		int			n;

		memset(&item, 0, sizeof(item));
		item.meter = r.meter;
		item.amount = actual;
		item.force = true;
		decision = fm_consume_items(r.tenant, &item, 1, NULL, &n);
	}
	else
	{
		/* in a snapshot that sees the hold ended */
		CommandCounterIncrement();
		PushActiveSnapshot(GetTransactionSnapshot());
		fm_check_decision(r.tenant, r.meter, 0, &read);
		PopActiveSnapshot();
		decision = &read;
	}
	PG_RETURN_DATUM(HeapTupleGetDatum(fm_decision_tuple(desc, decision)));
}

/* release(reservation_id) -> boolean: false when nothing was held any more */
PG_FUNCTION_INFO_V1(fm_release);
Datum
fm_release(PG_FUNCTION_ARGS)
{
	int64		id = arg_reservation_id(fcinfo);
	LockedReservation r;
	Datum		args[1];
	bool		held;

	fm_lock_counters_for_write();
	SPI_connect();
	lock_reservation(id, &r);
	held = !r.settled && !r.released && r.expires_at > GetCurrentTransactionStartTimestamp();
	if (held)
	{
		args[0] = Int64GetDatum(id);
		fm_execute(&release_stmt, args, NULL, false, 0);
	}
	SPI_finish();
	PG_RETURN_BOOL(held);
}
