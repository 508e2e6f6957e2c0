/*
 * void.c
 *	  void(): cancels what an idempotency key recorded (a correction):
 *	  usage goes down by its amount, in the caller's transaction, and a
 *	  tenant brought back under a hard limit is announced unblocked.
 *	  maintain() takes voided events out of the rollups (flagmeter.voids).
 */
#include "postgres.h"
#include "fmgr.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "storage/lmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "args.h"
#include "counter.h"
#include "limit_lookup.h"
#include "notify.h"
#include "pending.h"
#include "period.h"
#include "stripes.h"
#include "usage_rows.h"
#include "void.h"

static FmStatement lock_key_stmt = {
	"SELECT meter, amount, occurred_at, granted, voided_at IS NOT NULL,"
	" kind OPERATOR(pg_catalog.=) ANY ('{consume,consume_pool}'::pg_catalog.text[])"
	" FROM flagmeter.event_keys"
	" WHERE tenant" FM_EQ "$1 AND idempotency_key" FM_EQ "$2 ORDER BY seq FOR UPDATE",
	2, {TEXTOID, TEXTOID}
};

static FmStatement mark_voided_stmt = {
	"UPDATE flagmeter.event_keys SET voided_at = $3"
	" WHERE tenant" FM_EQ "$1 AND idempotency_key" FM_EQ "$2",
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

static FmStatement log_void_stmt = {
	"INSERT INTO flagmeter.voids"
	" (tenant, meter, amount, occurred_at, idempotency_key, voided_at)"
	" VALUES ($1, $2, $3, $4, $5, $6)",
	6, {TEXTOID, TEXTOID, INT8OID, TIMESTAMPTZOID, TEXTOID, TIMESTAMPTZOID}
};

/* a period's track stripes: (counter, stripe) */
#define TRACK_STRIPES \
	"SELECT counter, stripe FROM flagmeter.counters" \
	" WHERE tenant" FM_EQ "$1 AND meter" FM_EQ "$2 AND period_start" FM_EQ "$3" \
	" AND" FM_IS_TRACK_STRIPE("stripe")

static FmStatement track_stripes_stmt = {
	TRACK_STRIPES " ORDER BY stripe",
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

/* the ones void found (and tagged), in stripe order */
static FmStatement lock_track_stripes_stmt = {
	TRACK_STRIPES " AND stripe OPERATOR(pg_catalog.=) ANY ($4) ORDER BY stripe FOR UPDATE",
	4, {TEXTOID, TEXTOID, TIMESTAMPTZOID, INT2ARRAYOID}
};

/*
 * Only the stripes that were locked and merged: a stripe that a concurrent
 * track created after the lock is not in the merge, and must stay.
 */
static FmStatement drop_stripes_stmt = {
	"DELETE FROM flagmeter.counters"
	" WHERE tenant" FM_EQ "$1 AND meter" FM_EQ "$2 AND period_start" FM_EQ "$3"
	" AND stripe OPERATOR(pg_catalog.=) ANY ($4)"
	" AND" FM_IS_TRACK_STRIPE("stripe"),
	4, {TEXTOID, TEXTOID, TIMESTAMPTZOID, INT2ARRAYOID}
};

/* void's merge of the period's track stripes, kept in the lowest of them */
static FmStatement set_merged_stripe_stmt = {
	"UPDATE flagmeter.counters SET counter = $4, recheck_at = NULL, recheck_for = NULL"
	" WHERE tenant" FM_EQ "$1 AND meter" FM_EQ "$2 AND period_start" FM_EQ "$3"
	" AND stripe" FM_EQ "$5",
	5, {TEXTOID, TEXTOID, TIMESTAMPTZOID, FM_TYPE_COUNTER, INT2OID}
};

static FmStatement set_stripe0_stmt = {
	"INSERT INTO flagmeter.counters AS c (tenant, meter, period_start, stripe, counter)"
	" VALUES ($1, $2, $3, 0, $4)"
	" ON CONFLICT (tenant, meter, period_start, stripe) DO UPDATE"
	" SET counter = EXCLUDED.counter",
	4, {TEXTOID, TEXTOID, TIMESTAMPTZOID, FM_TYPE_COUNTER}
};

typedef struct VoidItem
{
	char	   *meter;
	int64		amount;
	TimestampTz occurred_at;
	bool		consumed;		/* recorded by consume: it went into stripe 0 */
} VoidItem;

static int
compare_void_items(const void *a, const void *b)
{
	return strcmp(((const VoidItem *) a)->meter, ((const VoidItem *) b)->meter);
}

/* The stripe column (the second) of the last statement's rows, as an int2[]. */
static ArrayType *
result_stripes(void)
{
	Datum	   *stripes = palloc(sizeof(Datum) * Max(SPI_processed, 1));
	uint64		i;

	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;

		stripes[i] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2, &isnull);
	}
	return construct_array(stripes, (int) SPI_processed, INT2OID, 2, true, TYPALIGN_SHORT);
}

/*
 * void: the period's track stripes (an int2[]), having taken the stripe
 * tags of the shared ones, in stripe order, waiting for the transactions
 * tracking into them.  void then locks exactly these rows: a track while
 * the void holds the period finds their tags taken and writes another
 * stripe (one the void leaves alone) instead of waiting for its row locks.
 * The event being voided committed before, so its usage is in one of these
 * rows, in stripe 0, or in a stripe that a concurrent void merged these
 * into (void_in_counters then reads them again).
 */
static ArrayType *
take_track_stripe_tags(const char *tenant, const char *meter,
					   TimestampTz period_start)
{
	uint32		hash = fm_period_hash(tenant, meter, period_start);
	Datum		args[3];
	ArrayType  *found;
	int16	   *stripes;
	int			n,
				i;

	fm_period_args(args, tenant, meter, period_start);
	fm_execute(&track_stripes_stmt, args, NULL, false, 0);
	found = result_stripes();
	stripes = (int16 *) ARR_DATA_PTR(found);
	n = ArrayGetNItems(ARR_NDIM(found), ARR_DIMS(found));
	for (i = 0; i < n; i++)
	{
		if (stripes[i] <= fm_stripes)
		{
			LOCKTAG		tag;

			fm_stripe_tag(&tag, hash, stripes[i]);
			(void) LockAcquire(&tag, ExclusiveLock, false, false);
		}
	}
	return found;
}

/* A period a void takes an event out of: its rows as void_in_counters locked them. */
typedef struct VoidPeriod
{
	const char *tenant;
	const char *meter;
	TimestampTz period_start;
	Datum		args[5];		/* [0..2]: the three above, as statement
								 * arguments */
	ArrayType  *locked;			/* the track stripes locked, in stripe order */
	int			nlocked;
	FmCounter	tracked;		/* their merge */
	bool		stripe0_locked;
	FmCounter	stripe0;		/* once stripe0_locked */
} VoidPeriod;

/*
 * Case 1: out of the track stripes, when their merge holds the amount: the
 * merge minus the event is kept in the lowest of them, the others are
 * deleted.  *total gets the period's usage after it (stripe 0 as last
 * committed, unless it is locked already).
 */
static bool
void_from_track_stripes(VoidPeriod *p, int64 amount, FmCounter *total)
{
	int16	   *stripes;

	*total = p->tracked;
	if (p->nlocked == 0 || fm_counter_void(total, amount) != FM_OK)
		return false;
	stripes = (int16 *) ARR_DATA_PTR(p->locked);
	if (p->nlocked > 1)
	{
		Datum	   *others = palloc(sizeof(Datum) * (p->nlocked - 1));
		int			i;

		for (i = 1; i < p->nlocked; i++)
			others[i - 1] = Int16GetDatum(stripes[i]);
		p->args[3] = PointerGetDatum(construct_array(others, p->nlocked - 1, INT2OID, 2,
													 true, TYPALIGN_SHORT));
		fm_execute(&drop_stripes_stmt, p->args, NULL, false, 0);
	}
	p->args[3] = FmCounterPGetDatum(total);
	p->args[4] = Int16GetDatum(stripes[0]);
	fm_execute(&set_merged_stripe_stmt, p->args, NULL, false, 0);

	if (!p->stripe0_locked)
	{
		p->stripe0 = fm_read_stripe0(p->args);
	}
	fm_counter_report(fm_counter_merge(total, &p->stripe0));
	return true;
}

/*
 * Case 2: out of stripe 0 alone (locked here), when it holds the amount.
 * *total gets the period's usage after it.
 */
static bool
void_from_stripe0(VoidPeriod *p, int64 amount, FmCounter *total)
{
	if (!p->stripe0_locked)
	{
		fm_lock_stripe0(p->tenant, p->meter, p->period_start);
		p->stripe0 = fm_merge_result_rows();
		p->stripe0_locked = true;
	}
	*total = p->stripe0;
	if (fm_counter_void(total, amount) != FM_OK)
		return false;
	p->args[3] = FmCounterPGetDatum(total);
	fm_execute(&set_stripe0_stmt, p->args, NULL, false, 0);
	fm_counter_report(fm_counter_merge(total, &p->tracked));
	return true;
}

/*
 * Case 3: everything merged into stripe 0 (locked by now), minus the
 * event.  False when even that cannot hold it: the period's boundaries
 * moved after the event was recorded into a period that was not
 * recounted; then only the raw event is marked voided.
 */
static bool
void_merging_all(VoidPeriod *p, int64 amount, FmCounter *total)
{
	Assert(p->stripe0_locked);
	*total = p->tracked;
	fm_counter_report(fm_counter_merge(total, &p->stripe0));
	if (fm_counter_void(total, amount) != FM_OK)
		return false;
	p->args[3] = PointerGetDatum(p->locked);
	fm_execute(&drop_stripes_stmt, p->args, NULL, false, 0);
	p->args[3] = FmCounterPGetDatum(total);
	fm_execute(&set_stripe0_stmt, p->args, NULL, false, 0);
	return true;
}

/*
 * Lock the period's track stripes that exist (their tags, then their rows,
 * in stripe order) into p, and read their merge; again when one found was
 * gone once its lock was had (see void_in_counters).
 */
static void
lock_track_stripes(VoidPeriod *p)
{
	for (;;)
	{
		ArrayType  *found = take_track_stripe_tags(p->tenant, p->meter, p->period_start);

		p->args[3] = PointerGetDatum(found);
		fm_execute(&lock_track_stripes_stmt, p->args, NULL, false, 0);
		p->tracked = fm_merge_result_rows();
		p->locked = result_stripes();
		p->nlocked = ArrayGetNItems(ARR_NDIM(p->locked), ARR_DIMS(p->locked));
		if (p->nlocked == ArrayGetNItems(ARR_NDIM(found), ARR_DIMS(found)))
			break;
	}
}

/* Queue "unblocked" for the period, whose usage is total now. */
static void
queue_unblocked(const VoidPeriod *p, const FmLimit *limit, const FmCounter *total)
{
	FmQuotaEvent event;

	memset(&event, 0, sizeof(event));
	event.nthresholds = -1;
	event.kind = FM_EVENT_UNBLOCKED;
	event.tenant = p->tenant;
	event.meter = p->meter;
	event.has_period = true;
	event.period_start = p->period_start;
	event.has_usage = true;
	event.used = fm_used_of(total, limit->aggregation);
	event.has_quota = true;
	event.quota = limit->quota;
	fm_queue_quota_event(&event);
}

/*
 * Take one voided event out of the counters of its period: its amount
 * (and one event) comes out of a merge of rows that holds it, as far as
 * possible one that leaves the other side alone.  The track stripes that
 * exist are locked first (their tags, then their rows, in stripe order),
 * stripe 0 after them when it is needed:
 *
 * 1. out of the track stripes, when they hold it: their merge minus the
 *    event is kept in the lowest of them and the others are deleted;
 * 2. out of stripe 0 alone, when it holds it;
 * 3. otherwise everything is merged into stripe 0, minus the event.
 *
 * A consumed event is tried against stripe 0 first (2, then 1; stripe 0
 * stays locked even when 1 takes the amount), a tracked one against the
 * track stripes first (1, then 2; stripe 0 is locked only if 1 cannot):
 * where it was recorded, so that both sides keep holding what their later
 * voids take out.
 *
 * Why one side only: consume reads the tracked usage in its snapshot and
 * then decides on stripe 0's latest version.  A void that moved tracked
 * usage into stripe 0 while a consume waited for stripe 0 made that
 * consume count the moved usage twice (refused with room left, reporting
 * more usage than there was; spec void_consume_race).  After 1 or 2 a
 * consume sees the period before the void, or the tracked usage before it
 * and stripe 0 after it: both add up.  3 (an event whose amount neither
 * side holds alone, after earlier merges) keeps that window.  A consume
 * that does not wait for the void (stripe 0 not locked) and reaches the
 * quota on the usage before it can leave its tenant marked blocked below
 * the quota, which the next maintain() (review_blocks) clears.
 *
 * A stripe that a concurrent track creates meanwhile is not locked, not
 * merged and not deleted.  A stripe found but gone once its lock is had
 * was merged into another by a concurrent void (or compaction) that
 * committed meanwhile: the stripes are read and locked again, since the
 * merge may sit in a stripe not found the first time.  That second pass
 * takes the tag of a lower stripe while holding higher ones, so a third
 * void waiting in between can deadlock with this one (40P01: one of them
 * is rolled back and may be retried); without it this void was lost.
 * Track stripes are locked before stripe 0: a transaction that tracked
 * (holding a stripe) and then voids would otherwise deadlock with a void
 * that holds stripe 0 and waits for that stripe.
 */
static void
void_in_counters(const char *tenant, const VoidItem *item)
{
	FmLimit		limit;
	TimestampTz period_start;
	TimestampTz period_end;
	VoidPeriod	p;
	FmCounter	total;
	bool		stripe0_first;
	bool		voided = false;

	fm_load_limit_any(tenant, item->meter, false, &limit);
	fm_period_bounds(limit.period, limit.anchor, limit.tz, item->occurred_at,
					 &period_start, &period_end);
	memset(&p, 0, sizeof(p));
	p.tenant = tenant;
	p.meter = item->meter;
	p.period_start = period_start;
	fm_period_args(p.args, tenant, item->meter, period_start);

	lock_track_stripes(&p);

	stripe0_first = item->consumed || p.nlocked == 0;
	if (stripe0_first)
		voided = void_from_stripe0(&p, item->amount, &total);
	if (!voided)
		voided = void_from_track_stripes(&p, item->amount, &total);
	if (!voided && !stripe0_first)
		voided = void_from_stripe0(&p, item->amount, &total);
	if (!voided && !void_merging_all(&p, item->amount, &total))
		return;
	{
		/* and the usage pending in shared memory (pending.h) */
		Snapshot	snapshot = RegisterSnapshot(GetTransactionSnapshot());

		fm_pending_add_visible(tenant, item->meter, period_start, snapshot, &total);
		UnregisterSnapshot(snapshot);
	}

	/* back under a hard limit: unblocked, if it was blocked */
	if (limit.limited && limit.hard &&
		fm_used_of(&total, limit.aggregation) < limit.quota)
		queue_unblocked(&p, &limit, &total);
}

/*
 * void(tenant, idempotency_key) -> boolean
 *
 * Cancels what the key recorded: true when voided now, false when it was
 * already voided or recorded nothing (a denied consume).  An unknown key
 * is an error.  The key's rows are locked first, so two concurrent voids
 * of one key void once.
 */
PG_FUNCTION_INFO_V1(fm_void);
Datum
fm_void(PG_FUNCTION_ARGS)
{
	char	   *tenant = fm_arg_tenant(fcinfo, 0);
	char	   *key;
	Datum		args[3];
	VoidItem   *items;
	int			n,
				i;
	bool		already_voided;
	bool		granted;

	if (PG_ARGISNULL(1))
		fm_null_argument("idempotency_key");
	key = fm_arg_key(fcinfo, 1);

	fm_lock_counters_for_write();
	SPI_connect();

	args[0] = CStringGetTextDatum(tenant);
	args[1] = CStringGetTextDatum(key);
	fm_execute(&lock_key_stmt, args, NULL, false, 0);
	n = (int) SPI_processed;
	if (n == 0)
		ereport(ERROR,
				(errcode(ERRCODE_NO_DATA_FOUND),
				 errmsg("idempotency key \"%s\" of tenant \"%s\" does not exist",
						key, tenant),
				 errhint("Only events recorded with an idempotency key can be voided.")));

	items = palloc(sizeof(VoidItem) * n);
	granted = true;
	already_voided = false;
	for (i = 0; i < n; i++)
	{
		HeapTuple	row = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;

		items[i].meter = TextDatumGetCString(SPI_getbinval(row, desc, 1, &isnull));
		items[i].amount = DatumGetInt64(SPI_getbinval(row, desc, 2, &isnull));
		items[i].occurred_at = DatumGetTimestampTz(SPI_getbinval(row, desc, 3, &isnull));
		granted = granted && DatumGetBool(SPI_getbinval(row, desc, 4, &isnull));
		already_voided = already_voided || DatumGetBool(SPI_getbinval(row, desc, 5, &isnull));
		items[i].consumed = DatumGetBool(SPI_getbinval(row, desc, 6, &isnull));
	}
	if (!granted || already_voided)
	{
		SPI_finish();
		PG_RETURN_BOOL(false);
	}

	args[2] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	fm_execute(&mark_voided_stmt, args, NULL, false, 0);

	qsort(items, n, sizeof(VoidItem), compare_void_items);
	for (i = 0; i < n; i++)
	{
		Datum		vargs[6];

		void_in_counters(tenant, &items[i]);

		/* maintain() takes the event out of the rollups */
		vargs[0] = CStringGetTextDatum(tenant);
		vargs[1] = CStringGetTextDatum(items[i].meter);
		vargs[2] = Int64GetDatum(items[i].amount);
		vargs[3] = TimestampTzGetDatum(items[i].occurred_at);
		vargs[4] = CStringGetTextDatum(key);
		vargs[5] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
		fm_execute(&log_void_stmt, vargs, NULL, false, 0);
	}

	SPI_finish();
	PG_RETURN_BOOL(true);
}

/*
 * A forgotten value (unique_values.c): its event of amount 1 at
 * occurred_at comes out of its period's counters as a voided event's
 * does, and is logged in flagmeter.voids (under log_key) so that
 * maintain() takes it out of the rollups.  Inside the caller's SPI, with
 * the counters' lock held.
 */
void
fm_void_value_event(const char *tenant, const char *meter, TimestampTz occurred_at,
					const char *log_key)
{
	VoidItem	item;
	Datum		vargs[6];

	item.meter = pstrdup(meter);
	item.amount = 1;
	item.occurred_at = occurred_at;
	item.consumed = false;
	void_in_counters(tenant, &item);

	vargs[0] = CStringGetTextDatum(tenant);
	vargs[1] = CStringGetTextDatum(meter);
	vargs[2] = Int64GetDatum(1);
	vargs[3] = TimestampTzGetDatum(occurred_at);
	vargs[4] = CStringGetTextDatum(log_key);
	vargs[5] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	fm_execute(&log_void_stmt, vargs, NULL, false, 0);
}
