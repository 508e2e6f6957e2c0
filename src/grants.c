/*
 * grants.c
 *	  Credit grants: locked, counted and drawn for consume, track and
 *	  check (see grants.h for the order and the locking rule).
 */
#include "postgres.h"
#include "fmgr.h"

#include "catalog/pg_type.h"
#include "common/int.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "counter.h"
#include "grants.h"
#include "inflight.h"
#include "notify.h"
#include "statements.h"
#include "usage_rows.h"

static FmStatement lock_grants_stmt = {
	FM_LOCK_GRANTS_ROWS("$3"),
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

static FmStatement read_grants_stmt = {
	FM_READ_GRANTS_ROWS("$3"),
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

static FmStatement available_stmt = {
	"SELECT pg_catalog.sum(c.amount OPERATOR(pg_catalog.-) c.drawn)::pg_catalog.int8"
	" FROM flagmeter.credit_grants c WHERE" FM_ACTIVE_GRANT("c", "$3"),
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

/*
 * One grant by its primary key: a call draws from one grant or two, and a
 * join with an array of them was planned (generically) as a scan of the
 * whole table.  Guarded: only while it holds what is taken and is not
 * voided (READ COMMITTED rechecks this on the row's latest version after
 * waiting for a transaction that wrote it); returns what is left.
 */
static FmStatement draw_stmt = {
	"UPDATE flagmeter.credit_grants SET drawn = drawn OPERATOR(pg_catalog.+) $2"
	" WHERE grant_id" FM_EQ "$1 AND voided_at IS NULL"
	" AND drawn OPERATOR(pg_catalog.+) $2 OPERATOR(pg_catalog.<=) amount"
	" RETURNING amount OPERATOR(pg_catalog.-) drawn",
	2, {INT8OID, INT8OID}
};

/* a draw of this call taken back (it holds the row's lock) */
static FmStatement undraw_stmt = {
	"UPDATE flagmeter.credit_grants SET drawn = drawn OPERATOR(pg_catalog.-) $2"
	" WHERE grant_id" FM_EQ "$1",
	2, {INT8OID, INT8OID}
};

static void
grant_args(Datum *args, const char *tenant, const char *meter, TimestampTz now)
{
	args[0] = CStringGetTextDatum(tenant);
	args[1] = CStringGetTextDatum(meter);
	args[2] = TimestampTzGetDatum(now);
}

/* The active grants by one of the two statements above, into held. */
static void
load_grants(FmStatement *stmt, bool locked, const char *tenant, const char *meter,
			TimestampTz now, FmGrantsHeld *held)
{
	Datum		args[3];

	grant_args(args, tenant, meter, now);
	fm_execute(stmt, args, NULL, false, 0);
	fm_grants_from_result(tenant, meter, 1, locked, held);
}

void
fm_grants_lock(const char *tenant, const char *meter, TimestampTz now,
			   FmGrantsHeld *held)
{
	load_grants(&lock_grants_stmt, true, tenant, meter, now, held);
}

void
fm_grants_read(const char *tenant, const char *meter, TimestampTz now,
			   FmGrantsHeld *held)
{
	load_grants(&read_grants_stmt, false, tenant, meter, now, held);
}

void
fm_grants_from_result(const char *tenant, const char *meter, int first,
					  bool locked, FmGrantsHeld *held)
{
	uint64		i;

	held->tenant = tenant;
	held->meter = meter;
	held->n = 0;
	held->ids = palloc(sizeof(int64) * Max(SPI_processed, 1));
	held->remaining = palloc(sizeof(int64) * Max(SPI_processed, 1));
	held->amounts = palloc(sizeof(int64) * Max(SPI_processed, 1));
	held->low_percents = palloc(sizeof(int) * Max(SPI_processed, 1));
	held->taken = palloc0(sizeof(int64) * Max(SPI_processed, 1));
	held->available = 0;
	held->locked = locked;
	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	row = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		Datum		id = SPI_getbinval(row, desc, first, &isnull);
		int			n = held->n;

		if (isnull)
			continue;
		held->ids[n] = DatumGetInt64(id);
		held->remaining[n] = DatumGetInt64(SPI_getbinval(row, desc, first + 1, &isnull));
		held->amounts[n] = DatumGetInt64(SPI_getbinval(row, desc, first + 2, &isnull));
		held->low_percents[n] = DatumGetInt32(SPI_getbinval(row, desc, first + 3, &isnull));
		if (pg_add_s64_overflow(held->available, held->remaining[n], &held->available))
			held->available = PG_INT64_MAX;
		held->n++;
	}
}

int64
fm_grants_available(const char *tenant, const char *meter, TimestampTz now,
					bool read_only)
{
	Datum		args[3];
	bool		isnull;
	Datum		d;
	int64		available = 0;

	grant_args(args, tenant, meter, now);
	SPI_connect();
	fm_execute(&available_stmt, args, NULL, read_only, 1);
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (!isnull)
		available = DatumGetInt64(d);
	SPI_finish();
	return available;
}

/* Under low_percent of amount: remaining * 100 < amount * low_percent, exactly. */
static bool
grant_low(int64 remaining, int64 amount, int low_percent)
{
	int64		r100,
				scaled;

	if (low_percent <= 0)
		return false;
	if (pg_mul_s64_overflow(remaining, 100, &r100))
		return false;
	if (pg_mul_s64_overflow(amount, low_percent, &scaled))
		return true;
	return r100 < scaled;
}

static void
queue_grant_event(const FmGrantsHeld *held, int i, FmQuotaEventKind kind, int64 remaining)
{
	FmQuotaEvent event;

	memset(&event, 0, sizeof(event));
	event.kind = kind;
	event.tenant = held->tenant;
	event.meter = held->meter;
	event.grant_id = held->ids[i];
	event.threshold = held->low_percents[i];
	event.has_usage = true;
	event.used = held->amounts[i] - remaining;
	event.has_quota = true;
	event.quota = held->amounts[i];
	event.nthresholds = -1;
	fm_queue_quota_event(&event);
}

/* What grant i crossed, from before to after this call's take. */
static void
queue_grant_events(const FmGrantsHeld *held, int i)
{
	int64		after = held->remaining[i];
	int64		before = after + held->taken[i];

	if (!grant_low(before, held->amounts[i], held->low_percents[i]) &&
		grant_low(after, held->amounts[i], held->low_percents[i]))
		queue_grant_event(held, i, FM_EVENT_GRANT_LOW, after);
	if (after == 0)
		queue_grant_event(held, i, FM_EVENT_GRANT_EXHAUSTED, after);
}

/* Sum of remaining, as held->available keeps it. */
static void
sum_available(FmGrantsHeld *held)
{
	int			i;

	held->available = 0;
	for (i = 0; i < held->n; i++)
		if (pg_add_s64_overflow(held->available, held->remaining[i], &held->available))
			held->available = PG_INT64_MAX;
}

/* held's grants by id, for writing them in the order fm_grants_lock locks them */
static int
compare_grant_ids(const void *a, const void *b, void *arg)
{
	const FmGrantsHeld *held = arg;
	int64		x = held->ids[*(const int *) a];
	int64		y = held->ids[*(const int *) b];

	return (x > y) - (x < y);
}

bool
fm_grants_try_draw(FmGrantsHeld *held, int64 amount)
{
	int		   *order = palloc(sizeof(int) * Max(held->n, 1));
	Datum		args[2];
	int			k;
	int			i;

	Assert(amount <= held->available);
	/* what each grant gives, in draw order */
	for (i = 0; i < held->n; i++)
	{
		held->taken[i] = Min(amount, held->remaining[i]);
		amount -= held->taken[i];
		order[i] = i;
	}
	if (amount > 0)
		elog(ERROR, "credit grants hold less than they were counted to");
	qsort_arg(order, held->n, sizeof(int), compare_grant_ids, held);

	for (k = 0; k < held->n; k++)
	{
		bool		isnull;

		i = order[k];
		if (held->taken[i] == 0)
			continue;
		args[0] = Int64GetDatum(held->ids[i]);
		args[1] = Int64GetDatum(held->taken[i]);
		fm_execute(&draw_stmt, args, NULL, false, 0);
		if (SPI_processed != 1)
		{
			/* spent or voided meanwhile: nothing drawn stands */
			for (; k < held->n; k++)
				held->taken[order[k]] = 0;	/* not written */
			fm_grants_undo_draw(held);
			pfree(order);
			return false;
		}
		held->remaining[i] = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
														 SPI_tuptable->tupdesc, 1, &isnull));
	}
	pfree(order);
	/* what is left, as the rows drawn from said (exact for them) */
	sum_available(held);
	return true;
}

void
fm_grants_undo_draw(FmGrantsHeld *held)
{
	Datum		args[2];
	int			i;

	for (i = 0; i < held->n; i++)
	{
		if (held->taken[i] == 0)
			continue;
		args[0] = Int64GetDatum(held->ids[i]);
		args[1] = Int64GetDatum(held->taken[i]);
		fm_execute(&undraw_stmt, args, NULL, false, 0);
		if (SPI_processed != 1)
			elog(ERROR, "credit grant " INT64_FORMAT " could not be given back", held->ids[i]);
		held->remaining[i] += held->taken[i];
		held->taken[i] = 0;
	}
	sum_available(held);
}

void
fm_grants_announce_draw(const FmGrantsHeld *held)
{
	int			i;

	for (i = 0; i < held->n; i++)
		if (held->taken[i] > 0)
			queue_grant_events(held, i);
}

void
fm_grants_draw(FmGrantsHeld *held, int64 amount)
{
	Assert(held->locked);
	if (!fm_grants_try_draw(held, amount))
		elog(ERROR, "credit grants locked by this transaction could not be drawn from");
	fm_grants_announce_draw(held);
}

int64
fm_grants_needed(const FmLimit *limit, int64 used_before, int64 used_after)
{
	int64		quota = limit->limited ? limit->quota : 0;
	int64		from = Max(quota, used_before);

	return used_after > from ? used_after - from : 0;
}

void
fm_decide_with_grants(const FmLimit *limit, const FmCounter *current,
					  int64 amount, TimestampTz at, TimestampTz period_end,
					  bool record, bool force, int64 available, int64 held,
					  FmDecision *decision, int64 *draw)
{
	FmCounter	next = *current;
	int64		used_before = fm_used_of(current, limit->aggregation);
	int64		used_after;
	int64		need;
	int64		quota_left;
	int64		room;
	bool		hard = !force && (!limit->limited || limit->hard);
	bool		granted;

	fm_counter_report(fm_counter_add_event(&next, amount, at));
	used_after = fm_used_of(&next, limit->aggregation);
	if (!limit->limited && !limit->grants)
	{
		/* unlimited, with holds only: nothing to decide or draw */
		*draw = 0;
		fm_decision_at(limit, true, record ? used_after : used_before, period_end, decision);
		return;
	}
	need = fm_grants_needed(limit, used_before, used_after);

	/* the room: the quota left and the grants, less what others hold */
	room = limit->limited && used_before < limit->quota ? limit->quota - used_before : 0;
	if (pg_add_s64_overflow(room, available, &room))
		room = PG_INT64_MAX;
	room -= held;
	granted = !hard || used_after - used_before <= room;
	*draw = granted ? Min(need, available) : 0;

	fm_decision_at(limit, granted, (record && granted) ? used_after : used_before,
				   period_end, decision);
	if (granted && limit->limited)
		decision->reason = (*draw == need) ? FM_REASON_OK : FM_REASON_OVER_SOFT_LIMIT;
	else if (granted)
		decision->reason = FM_REASON_OK;
	else
		decision->reason = FM_REASON_QUOTA_EXCEEDED;

	/* the balance: the quota left and what the grants hold, after the call */
	quota_left = limit->limited ? decision->remaining : 0;
	decision->from_grants = *draw;
	decision->has_balance = true;
	if (pg_add_s64_overflow(quota_left,
							available - ((record && granted) ? *draw : 0) - held,
							&decision->balance))
		decision->balance = PG_INT64_MAX;
	if (decision->balance < 0)
		decision->balance = 0;
}

FmLimit
fm_grants_announce_limit(const FmLimit *limit, int64 grants_left)
{
	FmLimit		announce = *limit;

	if (grants_left > 0 && announce.hard)
	{
		announce.hard = false;
		/* recheck figures worked out for it are not the hard limit's */
		announce.fingerprint = fm_limit_fingerprint(&announce);
	}
	return announce;
}

/* the grants expired with units left and no grant_expired announced yet */
static FmStatement expired_grants_stmt = {
	"SELECT c.grant_id, c.tenant, c.meter, c.amount, c.drawn"
	" FROM flagmeter.credit_grants c"
	" WHERE c.voided_at IS NULL AND c.expires_at OPERATOR(pg_catalog.<=) $1"
	" AND c.drawn OPERATOR(pg_catalog.<) c.amount"
	" AND NOT EXISTS (SELECT FROM flagmeter.outbox o WHERE o.grant_id" FM_EQ "c.grant_id"
	"                 AND o.kind" FM_EQ "'grant_expired'::pg_catalog.text)"
	" ORDER BY c.grant_id",
	1, {TIMESTAMPTZOID}
};

/*
 * announce_expired_grants() -> integer: queues grant_expired for every grant
 * that expired with units left and was not announced yet (maintain() calls
 * it; an expired grant is never drawn whether or not this ran).  Returns
 * how many it queued.
 */
PG_FUNCTION_INFO_V1(fm_announce_expired_grants);
Datum
fm_announce_expired_grants(PG_FUNCTION_ARGS)
{
	Datum		args[1];
	uint64		i;
	uint64		n;

	args[0] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	SPI_connect();
	fm_execute(&expired_grants_stmt, args, NULL, false, 0);
	n = SPI_processed;
	for (i = 0; i < n; i++)
	{
		HeapTuple	row = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		FmQuotaEvent event;

		memset(&event, 0, sizeof(event));
		event.kind = FM_EVENT_GRANT_EXPIRED;
		event.grant_id = DatumGetInt64(SPI_getbinval(row, desc, 1, &isnull));
		event.tenant = TextDatumGetCString(SPI_getbinval(row, desc, 2, &isnull));
		event.meter = TextDatumGetCString(SPI_getbinval(row, desc, 3, &isnull));
		event.has_quota = true;
		event.quota = DatumGetInt64(SPI_getbinval(row, desc, 4, &isnull));
		event.has_usage = true;
		event.used = DatumGetInt64(SPI_getbinval(row, desc, 5, &isnull));
		event.nthresholds = -1;
		fm_queue_quota_event(&event);
	}
	SPI_finish();
	PG_RETURN_INT32((int32) n);
}

int64
fm_grants_after_track(const char *tenant, const char *meter, const FmLimit *limit,
					  TimestampTz period_start, int64 used_delta, TimestampTz now)
{
	FmCounter	total = fm_read_period(tenant, meter, period_start);
	int64		used_after = fm_used_of(&total, limit->aggregation);
	int64		quota = limit->limited ? limit->quota : 0;
	FmGrantsHeld held;
	int64		need;

	if (used_after < quota)
		return -1;

	/*
	 * Past the quota: stripe 0 then the grants, as consume locks them, and
	 * the period again in a snapshot taken once they are held (READ
	 * COMMITTED), so that a consume or track that drew before is counted.
	 */
	fm_inflight_before_lock(tenant, meter, period_start, now, NULL);
	fm_lock_stripe0(tenant, meter, period_start);
	fm_grants_lock(tenant, meter, now, &held);
	total = fm_read_period(tenant, meter, period_start);
	used_after = fm_used_of(&total, limit->aggregation);
	need = fm_grants_needed(limit, used_after - used_delta, used_after);
	fm_grants_draw(&held, Min(need, held.available));
	return held.available;
}
