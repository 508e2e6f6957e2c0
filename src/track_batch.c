/*
 * track_batch.c
 *	  track_batch(): many events in one call, with the guarantees of
 *	  track.  Everything is validated before anything is written; the call
 *	  writes one statement of raw events and one increment per (tenant,
 *	  meter, period) of the batch: pending in shared memory where track
 *	  would write its event alone (pending.h: a sum or count meter, no key
 *	  in the period's events of the batch, flagmeter preloaded), else into
 *	  this backend's own stripe (a tag per period would fill the lock
 *	  table: stripes.c) in one statement; then it reads only the periods
 *	  that may have reached a level (track_alerts.c), in one statement.
 */
#include "postgres.h"
#include "fmgr.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/snapmgr.h"
#include "utils/hsearch.h"
#include "utils/timestamp.h"

#include "args.h"
#include "counter.h"
#include "event_keys.h"
#include "grants.h"
#include "limit.h"
#include "limit_lookup.h"
#include "pending.h"
#include "period.h"
#include "pools.h"
#include "stripes.h"
#include "track_alerts.h"
#include "usage_rows.h"

static FmStatement insert_events_batch_stmt = {
	"INSERT INTO flagmeter.events"
	" (tenant, meter, amount, occurred_at, recorded_at, idempotency_key, period_start)"
	" SELECT u.t, u.m, u.a, u.o, $5, u.k, u.p"
	" FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3),"
	"                pg_catalog.unnest($4), pg_catalog.unnest($6), pg_catalog.unnest($7))"
	"      AS u(t, m, a, o, k, p)",
	7, {TEXTARRAYOID, TEXTARRAYOID, INT8ARRAYOID, TIMESTAMPTZARRAYOID,
	TIMESTAMPTZOID, TEXTARRAYOID, TIMESTAMPTZARRAYOID}
};

/* the rows of many periods: (ordinal of the period in the arrays, counter, stripe) */
static FmStatement read_groups_stmt = {
	"SELECT u.i, c.counter, c.stripe"
	" FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3))"
	"      WITH ORDINALITY AS u(t, m, p, i)"
	" JOIN flagmeter.counters c"
	"   ON c.tenant" FM_EQ "u.t AND c.meter" FM_EQ "u.m AND c.period_start" FM_EQ "u.p",
	3, {TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZARRAYOID}
};

static FmStatement add_to_stripes_batch_stmt = {
	"INSERT INTO flagmeter.counters AS c (tenant, meter, period_start, stripe, counter)"
	" SELECT u.t, u.m, u.p, $4, u.q"
	" FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3),"
	"                pg_catalog.unnest($5)) AS u(t, m, p, q)"
	" ON CONFLICT (tenant, meter, period_start, stripe) DO UPDATE"
	" SET counter = c.counter OPERATOR(flagmeter.+) EXCLUDED.counter"
	" RETURNING c.tenant, c.meter, c.period_start,"
	"  c.stripe, c.counter, c.recheck_at, c.recheck_for, c.ctid",
	5, {TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZARRAYOID, INT2OID,
	FM_TYPE_COUNTER_ARRAY}
};

static FmStatement set_recheck_batch_stmt = {
	"UPDATE flagmeter.counters c SET recheck_at = u.r, recheck_for = u.f"
	" FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3),"
	"                pg_catalog.unnest($5), pg_catalog.unnest($6), pg_catalog.unnest($7))"
	"      AS u(t, m, p, r, f, v)"
	" WHERE c.tenant" FM_EQ "u.t AND c.meter" FM_EQ "u.m AND c.period_start" FM_EQ "u.p"
	" AND c.stripe" FM_EQ "$4 AND c.ctid" FM_EQ "u.v",
	7, {TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZARRAYOID, INT2OID,
	INT8ARRAYOID, INT4ARRAYOID, TIDARRAYOID}
};

/*
 * One (tenant, meter) of the call, its key pointing at the call's own
 * strings: its limit, loaded once per call, and the last period an event
 * of it fell in (the events of a call mostly share one, and a period's
 * bounds in its time zone cost more than the rest of an event's share).
 */
typedef struct BatchLimitEntry
{
	FmTenantMeterKey key;
	FmLimit		limit;
	bool		has_period;
	TimestampTz period_start;
	TimestampTz period_end;
} BatchLimitEntry;

/*
 * One (tenant, meter, period): its (tenant, meter) as the limits' entry,
 * which stays where dynahash put it for the table's life.
 */
typedef struct BatchGroupKey
{
	const BatchLimitEntry *tenant_meter;
	TimestampTz period_start;
} BatchGroupKey;

typedef struct BatchGroupEntry
{
	BatchGroupKey key;
	int			first;			/* an event of the group, for its names */
	FmCounter	delta;
	const FmLimit *limit;
	bool		keyed;			/* an event of the group has a key */
	bool		pending;		/* its increment is pending (pending.h) */
	bool		read_due;		/* pending: the entry's recheck figure was
								 * reached */
	FmStripeWritten written;	/* the group's stripe after the increment */
	FmLimit		announce;		/* limit's copy for announcements past the
								 * quota with credit grants left (grants.h) */
} BatchGroupEntry;

/* The events of one call and what the call works out for them. */
typedef struct TrackBatch
{
	int			n;				/* events: the named ones, then their pools' */
	int			nnamed;			/* events the call named */
	char	  **tenants;
	char	  **meters;
	int64	   *amounts;
	TimestampTz *occurred;
	char	  **keys;			/* NULL: no keys at all; an element NULL: none */
	TimestampTz now;
	TimestampTz *period_starts;
	BatchLimitEntry **event_limits; /* each event's (tenant, meter) */
	bool		any_pool;		/* a meter of the call draws from a pool */
	bool	   *counted;		/* false: the key was recorded before */
	int			ncounted;
	HTAB	   *limits;			/* BatchLimitEntry by (tenant, meter) */
	HTAB	   *groups;			/* BatchGroupEntry by (tenant, meter, period) */
} TrackBatch;

/* Periods as statement arguments: parallel Datum arrays. */
typedef struct PeriodList
{
	int			n;
	BatchGroupEntry **groups;
	Datum	   *tenants;
	Datum	   *meters;
	Datum	   *starts;
} PeriodList;

static HTAB *
batch_limits_hash(void)
{
	HASHCTL		ctl;

	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(FmTenantMeterKey);
	ctl.entrysize = sizeof(BatchLimitEntry);
	ctl.hash = fm_tenant_meter_key_hash;
	ctl.match = fm_tenant_meter_key_match;
	ctl.hcxt = CurrentMemoryContext;
	return hash_create("flagmeter batch limits", 64, &ctl,
					   HASH_ELEM | HASH_FUNCTION | HASH_COMPARE | HASH_CONTEXT);
}

static HTAB *
batch_groups_hash(void)
{
	HASHCTL		ctl;

	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(BatchGroupKey);
	ctl.entrysize = sizeof(BatchGroupEntry);
	ctl.hcxt = CurrentMemoryContext;
	return hash_create("flagmeter batch groups", 64, &ctl,
					   HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}

/* The entry of (tenant, meter), its limit loaded when new. */
static BatchLimitEntry *
batch_limit(TrackBatch *b, const char *tenant, const char *meter)
{
	FmTenantMeterKey key = {tenant, meter};
	BatchLimitEntry *entry;
	bool		found;

	entry = hash_search(b->limits, &key, HASH_ENTER, &found);
	if (!found)
	{
		fm_load_limit(tenant, meter, false, &entry->limit);
		entry->has_period = false;
		b->any_pool |= fm_draws_from_pool(&entry->limit);
	}
	return entry;
}

/* The start of the period of entry's limit that holds at. */
static TimestampTz
batch_period_start(BatchLimitEntry *entry, TimestampTz at)
{
	if (!entry->has_period || at < entry->period_start || at >= entry->period_end)
	{
		fm_period_bounds(entry->limit.period, entry->limit.anchor, entry->limit.tz, at,
						 &entry->period_start, &entry->period_end);
		entry->has_period = true;
	}
	return entry->period_start;
}

/* args[0..2]: the (tenant, meter, period_start) arrays of the periods. */
static void
period_list_args(Datum *args, const PeriodList *periods)
{
	args[0] = fm_text_array(periods->tenants, periods->n);
	args[1] = fm_text_array(periods->meters, periods->n);
	args[2] = fm_timestamptz_array(periods->starts, periods->n);
}

static PeriodList
period_list_alloc(int n)
{
	PeriodList	l;

	l.n = 0;
	l.groups = palloc(sizeof(BatchGroupEntry *) * Max(n, 1));
	l.tenants = palloc(sizeof(Datum) * Max(n, 1));
	l.meters = palloc(sizeof(Datum) * Max(n, 1));
	l.starts = palloc(sizeof(Datum) * Max(n, 1));
	return l;
}

static void
period_list_add(PeriodList *l, BatchGroupEntry *group, Datum tenant, Datum meter)
{
	l->groups[l->n] = group;
	l->tenants[l->n] = tenant;
	l->meters[l->n] = meter;
	l->starts[l->n] = TimestampTzGetDatum(group->key.period_start);
	l->n++;
}

/*
 * The arguments (tenants[], meters[], amounts[], occurred_at[], keys[]),
 * every one checked: nothing is written before all of them are.
 */
static void
batch_from_args(FunctionCallInfo fcinfo, TrackBatch *b)
{
	int			i;

	memset(b, 0, sizeof(*b));
	b->now = GetCurrentTransactionStartTimestamp();
	b->n = fm_arg_batch_rows(fcinfo, &b->tenants, &b->meters, &b->amounts, true);
	b->nnamed = b->n;
	b->occurred = fm_arg_timestamp_array(fcinfo, 3, "occurred_at", b->n, b->now);
	b->keys = fm_arg_key_array(fcinfo, 4, b->n);
	for (i = 0; i < b->n; i++)
	{
		fm_check_tenant(b->tenants[i]);
		fm_check_meter_name(b->meters[i]);
		fm_check_timestamp(b->occurred[i]);
		if (b->keys && b->keys[i])
			fm_check_key(b->keys[i]);
	}
}

/* The limit of each distinct (tenant, meter), and each event's period. */
static void
load_limits_and_periods(TrackBatch *b)
{
	int			i;

	/* every event's time first: nothing is written when one is outside */
	for (i = 0; i < b->n; i++)
		fm_check_event_time(b->tenants[i], b->meters[i], b->occurred[i]);
	b->limits = batch_limits_hash();
	b->period_starts = palloc(sizeof(TimestampTz) * b->n);
	b->event_limits = palloc(sizeof(BatchLimitEntry *) * b->n);
	for (i = 0; i < b->n; i++)
	{
		BatchLimitEntry *entry = batch_limit(b, b->tenants[i], b->meters[i]);

		fm_refuse_unique_meter(b->meters[i], &entry->limit);
		b->event_limits[i] = entry;
		b->period_starts[i] = batch_period_start(entry, b->occurred[i]);
	}
}

/* Claim keys one by one: a repeat within the batch is a duplicate too. */
static void
claim_batch_keys(TrackBatch *b)
{
	int			i;

	for (i = 0; i < b->n; i++)
		b->counted[i] = !(b->keys && b->keys[i]) ||
			fm_claim_key(b->tenants[i], b->keys[i], 0, b->meters[i], b->amounts[i],
						 b->occurred[i], b->period_starts[i], "track", NULL);
}

/*
 * The credit pools' events (pools.h): for each counted event of a meter
 * that draws from a pool, an event of the pool's units at the same time
 * and under the same key (its row "track_pool", seq 1), after the named
 * events in the batch's arrays (repalloc keeps them in the caller's
 * memory).
 */
static void
add_pool_events(TrackBatch *b)
{
	int			extra = 0;
	int			total;
	int			i;

	if (!b->any_pool)
		return;
	for (i = 0; i < b->nnamed; i++)
		if (b->counted[i] && fm_draws_from_pool(&b->event_limits[i]->limit))
			extra++;
	if (extra == 0)
		return;
	total = b->nnamed + extra;
	b->tenants = repalloc(b->tenants, sizeof(char *) * total);
	b->meters = repalloc(b->meters, sizeof(char *) * total);
	b->amounts = repalloc(b->amounts, sizeof(int64) * total);
	b->occurred = repalloc(b->occurred, sizeof(TimestampTz) * total);
	if (b->keys)
		b->keys = repalloc(b->keys, sizeof(char *) * total);
	b->period_starts = repalloc(b->period_starts, sizeof(TimestampTz) * total);
	b->event_limits = repalloc(b->event_limits, sizeof(BatchLimitEntry *) * total);
	b->counted = repalloc(b->counted, sizeof(bool) * total);
	for (i = 0; i < b->nnamed; i++)
	{
		const FmLimit *limit = &b->event_limits[i]->limit;
		BatchLimitEntry *pool_entry;
		int			j;

		if (!b->counted[i] || !fm_draws_from_pool(limit))
			continue;
		j = b->n++;
		b->tenants[j] = b->tenants[i];
		b->meters[j] = pstrdup(limit->pool);
		b->amounts[j] = fm_pool_amount(limit, b->amounts[i]);
		b->occurred[j] = b->occurred[i];
		if (b->keys)
			b->keys[j] = b->keys[i];
		pool_entry = batch_limit(b, b->tenants[j], b->meters[j]);
		b->event_limits[j] = pool_entry;
		b->period_starts[j] = batch_period_start(pool_entry, b->occurred[j]);
		b->counted[j] = true;
		if (b->keys && b->keys[j] &&
			!fm_claim_key(b->tenants[j], b->keys[j], 1, b->meters[j], b->amounts[j],
						  b->occurred[j], b->period_starts[j], "track_pool", NULL))
			elog(ERROR, "idempotency key \"%s\" of tenant \"%s\" has a pool row already",
				 b->keys[j], b->tenants[j]);
	}
}

/*
 * Each counted event's group, the group's increment, and whether the group
 * has a keyed event: event_groups[i] for event i (NULL: not counted).
 */
static BatchGroupEntry **
group_counted_events(TrackBatch *b)
{
	BatchGroupEntry **event_groups = palloc0(sizeof(BatchGroupEntry *) * b->n);
	int			i;

	b->groups = batch_groups_hash();
	b->ncounted = 0;
	for (i = 0; i < b->n; i++)
	{
		BatchGroupKey gkey;
		BatchGroupEntry *group;
		bool		found;

		if (!b->counted[i])
			continue;
		b->ncounted++;
		gkey.tenant_meter = b->event_limits[i];
		gkey.period_start = b->period_starts[i];
		group = hash_search(b->groups, &gkey, HASH_ENTER, &found);
		if (!found)
		{
			group->first = i;
			group->delta = fm_empty_counter();
			group->limit = &b->event_limits[i]->limit;
			group->keyed = false;
			group->pending = false;
			group->read_due = false;
		}
		group->keyed |= b->keys && b->keys[i];
		fm_usage_target(b->tenants[i], b->meters[i], b->period_starts[i]);
		fm_counter_report(fm_counter_add_event(&group->delta, b->amounts[i],
											   b->occurred[i]));
		event_groups[i] = group;
	}
	return event_groups;
}

/*
 * Add to shared memory the increment of each group that track would write
 * as events alone (fm_write_event_alone): no keyed event in it (void takes
 * a keyed event out of the rows that hold it) and a meter the pending path
 * takes; a group that finds no room there goes to the stripe.  Before the
 * events are written, as track does: their rows say which are pending.
 */
static void
add_pending_groups(TrackBatch *b)
{
	HASH_SEQ_STATUS scan;
	BatchGroupEntry *group;

	/* each group is a period of its own: none of them has a slot of ours */
	bool		new_in_periods = !fm_pending_xact_has_adds();

	hash_seq_init(&scan, b->groups);
	while ((group = hash_seq_search(&scan)) != NULL)
	{
		if (group->keyed || !fm_pending_track_enabled(group->limit))
			continue;
		fm_usage_target(b->tenants[group->first], b->meters[group->first],
						group->key.period_start);
		group->pending = fm_pending_add(b->tenants[group->first], b->meters[group->first],
										group->key.period_start, &group->delta,
										group->limit, new_in_periods, &group->read_due);
	}
}

/*
 * Insert the raw rows of the counted events in one statement, an event of
 * a pending group with its period_start (pending.h), the others without.
 */
static void
insert_counted_events(TrackBatch *b, BatchGroupEntry **event_groups)
{
	Datum	   *tenants = palloc(sizeof(Datum) * b->n);
	Datum	   *meters = palloc(sizeof(Datum) * b->n);
	Datum	   *amounts = palloc(sizeof(Datum) * b->n);
	Datum	   *occurred = palloc(sizeof(Datum) * b->n);
	Datum	   *keys = palloc(sizeof(Datum) * b->n);
	bool	   *key_nulls = palloc(sizeof(bool) * b->n);
	Datum	   *starts = palloc(sizeof(Datum) * b->n);
	bool	   *start_nulls = palloc(sizeof(bool) * b->n);
	int			dims[1];
	int			lbs[1] = {1};
	Datum		args[7];
	int			i;
	int			e = 0;

	for (i = 0; i < b->n; i++)
	{
		if (event_groups[i] == NULL)
			continue;
		tenants[e] = CStringGetTextDatum(b->tenants[i]);
		meters[e] = CStringGetTextDatum(b->meters[i]);
		amounts[e] = Int64GetDatum(b->amounts[i]);
		occurred[e] = TimestampTzGetDatum(b->occurred[i]);
		key_nulls[e] = !(b->keys && b->keys[i]);
		keys[e] = key_nulls[e] ? (Datum) 0 : CStringGetTextDatum(b->keys[i]);
		start_nulls[e] = !event_groups[i]->pending;
		starts[e] = start_nulls[e] ? (Datum) 0 : TimestampTzGetDatum(b->period_starts[i]);
		e++;
	}
	dims[0] = e;
	args[0] = fm_text_array(tenants, e);
	args[1] = fm_text_array(meters, e);
	args[2] = fm_int8_array(amounts, e);
	args[3] = fm_timestamptz_array(occurred, e);
	args[4] = TimestampTzGetDatum(b->now);
	args[5] = PointerGetDatum(construct_md_array(keys, key_nulls, 1, dims, lbs,
												 TEXTOID, -1, false, TYPALIGN_INT));
	args[6] = PointerGetDatum(construct_md_array(starts, start_nulls, 1, dims, lbs,
												 TIMESTAMPTZOID, sizeof(TimestampTz),
												 FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	fm_execute(&insert_events_batch_stmt, args, NULL, false, 0);
}

/*
 * Add each group's increment to its period's row in this backend's own
 * stripe, in one statement; each group gets the row as written.  Returns
 * the groups as periods.
 */
static PeriodList
add_group_increments(TrackBatch *b)
{
	int			ngroups = (int) hash_get_num_entries(b->groups);
	PeriodList	periods = period_list_alloc(ngroups);
	Datum	   *counters = palloc(sizeof(Datum) * ngroups);
	Datum		args[5];
	HASH_SEQ_STATUS scan;
	BatchGroupEntry *group;
	uint64		r;

	hash_seq_init(&scan, b->groups);
	while ((group = hash_seq_search(&scan)) != NULL)
	{
		if (group->pending)
			continue;
		counters[periods.n] = FmCounterPGetDatum(fm_counter_copy(&group->delta));
		period_list_add(&periods, group, CStringGetTextDatum(b->tenants[group->first]),
						CStringGetTextDatum(b->meters[group->first]));
	}
	ngroups = periods.n;
	if (ngroups == 0)
		return periods;
	/* an overflow in the statement names its period when there is one */
	if (ngroups == 1)
		fm_usage_target(b->tenants[periods.groups[0]->first],
						b->meters[periods.groups[0]->first],
						periods.groups[0]->key.period_start);
	else
		fm_usage_target_clear();
	period_list_args(args, &periods);
	args[3] = Int16GetDatum(fm_own_stripe());
	args[4] = PointerGetDatum(construct_array(counters, ngroups, fm_counter_type_oid(),
											  FM_COUNTER_SIZE, false, TYPALIGN_DOUBLE));
	fm_execute(&add_to_stripes_batch_stmt, args, NULL, false, 0);
	if (SPI_processed != (uint64) ngroups)
		elog(ERROR, "track_batch wrote " UINT64_FORMAT " counter rows for %d periods",
			 (uint64) SPI_processed, ngroups);
	for (r = 0; r < SPI_processed; r++)
	{
		FmTenantMeterKey lkey;
		BatchGroupKey gkey;
		bool		isnull;
		HeapTuple	row = SPI_tuptable->vals[r];
		TupleDesc	desc = SPI_tuptable->tupdesc;

		lkey.tenant = TextDatumGetCString(SPI_getbinval(row, desc, 1, &isnull));
		lkey.meter = TextDatumGetCString(SPI_getbinval(row, desc, 2, &isnull));
		gkey.tenant_meter = hash_search(b->limits, &lkey, HASH_FIND, NULL);
		if (gkey.tenant_meter == NULL)
			elog(ERROR, "track_batch wrote a counter row it has no period for");
		gkey.period_start = DatumGetTimestampTz(SPI_getbinval(row, desc, 3, &isnull));
		group = hash_search(b->groups, &gkey, HASH_FIND, NULL);
		if (group == NULL)
			elog(ERROR, "track_batch wrote a counter row it has no period for");
		group->written = fm_stripe_written(r, 4);
	}
	return periods;
}

static int
compare_groups(const void *a, const void *b)
{
	const BatchGroupEntry *x = *(BatchGroupEntry *const *) a;
	const BatchGroupEntry *y = *(BatchGroupEntry *const *) b;
	int			c = strcmp(x->key.tenant_meter->key.tenant, y->key.tenant_meter->key.tenant);

	if (c == 0)
		c = strcmp(x->key.tenant_meter->key.meter, y->key.tenant_meter->key.meter);

	if (c != 0)
		return c;
	return x->key.period_start < y->key.period_start ? -1 :
		x->key.period_start > y->key.period_start ? 1 : 0;
}

/*
 * Draw from the credit grants of the groups past their quota, as track
 * does, in (tenant, meter) order: each locks its stripe 0 and then its
 * grants, as every caller does (grants.h).
 */
static void
draw_batch_grants(TrackBatch *b, const PeriodList *written)
{
	BatchGroupEntry **order = palloc(sizeof(BatchGroupEntry *) * Max(written->n, 1));
	int			n = 0;
	int			g;

	for (g = 0; g < written->n; g++)
		if (written->groups[g]->limit->grants)
			order[n++] = written->groups[g];
	qsort(order, n, sizeof(BatchGroupEntry *), compare_groups);
	for (g = 0; g < n; g++)
	{
		BatchGroupEntry *group = order[g];
		int64		left = fm_grants_after_track(b->tenants[group->first],
												 b->meters[group->first], group->limit,
												 group->key.period_start,
												 fm_used_of(&group->delta, group->limit->aggregation),
												 b->now);

		group->announce = fm_grants_announce_limit(group->limit, left);
		group->limit = &group->announce;
	}
}

/*
 * The periods due for a read, as track decides it: those written whose
 * stripe is due, and the pending ones whose entry's figure was reached.
 */
static PeriodList
due_periods(const TrackBatch *b, const PeriodList *written)
{
	PeriodList	due = period_list_alloc((int) hash_get_num_entries(b->groups));
	HASH_SEQ_STATUS scan;
	BatchGroupEntry *group;
	int			g;

	for (g = 0; g < written->n; g++)
	{
		group = written->groups[g];
		if (fm_period_read_due(b->tenants[group->first], b->meters[group->first],
							   group->limit, group->key.period_start, &group->written))
			period_list_add(&due, group, written->tenants[g], written->meters[g]);
	}
	hash_seq_init(&scan, b->groups);
	while ((group = hash_seq_search(&scan)) != NULL)
		if (group->pending && group->read_due)
			period_list_add(&due, group, CStringGetTextDatum(b->tenants[group->first]),
							CStringGetTextDatum(b->meters[group->first]));
	return due;
}

/*
 * Read the due periods in one statement: totals[] their usage, with what
 * other calls left pending in shared memory (pending.h), nstripes[] how
 * many track stripes each has.
 */
static void
read_period_totals(const TrackBatch *b, const PeriodList *due, FmCounter *totals,
				   int *nstripes)
{
	Datum		args[7];
	Snapshot	snapshot;
	uint64		r;
	int			g;

	period_list_args(args, due);
	snapshot = RegisterSnapshot(GetTransactionSnapshot());
	fm_execute_snapshot(&read_groups_stmt, args, NULL, false, 0, snapshot);
	for (g = 0; g < due->n; g++)
		totals[g] = fm_empty_counter();
	for (r = 0; r < SPI_processed; r++)
	{
		HeapTuple	row = SPI_tuptable->vals[r];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		int64		ordinal = DatumGetInt64(SPI_getbinval(row, desc, 1, &isnull));

		fm_usage_target(b->tenants[due->groups[ordinal - 1]->first],
						b->meters[due->groups[ordinal - 1]->first],
						due->groups[ordinal - 1]->key.period_start);
		fm_counter_report(fm_counter_merge(&totals[ordinal - 1],
										   DatumGetFmCounterP(SPI_getbinval(row, desc, 2, &isnull))));
		if (DatumGetInt16(SPI_getbinval(row, desc, 3, &isnull)) != 0)
			nstripes[ordinal - 1]++;
	}
	for (g = 0; g < due->n; g++)
	{
		fm_usage_target(b->tenants[due->groups[g]->first], b->meters[due->groups[g]->first],
						due->groups[g]->key.period_start);
		fm_pending_add_visible(b->tenants[due->groups[g]->first], b->meters[due->groups[g]->first],
							   due->groups[g]->key.period_start, snapshot, &totals[g]);
	}
	UnregisterSnapshot(snapshot);
}

/*
 * Queue what each due period reached, and write the new recheck figures
 * of their stripes in one statement (a pending period's goes to its entry).
 */
static void
queue_and_recheck(const TrackBatch *b, const PeriodList *due, const FmCounter *totals,
				  const int *nstripes)
{
	PeriodList	recheck = period_list_alloc(due->n);
	Datum	   *r_at = palloc(sizeof(Datum) * due->n);
	Datum	   *r_for = palloc(sizeof(Datum) * due->n);
	Datum	   *r_ctid = palloc(sizeof(Datum) * due->n);
	Datum		args[7];
	int			g;

	for (g = 0; g < due->n; g++)
	{
		BatchGroupEntry *group = due->groups[g];
		int64		recheck_at;

		fm_announce_usage_level(b->tenants[group->first], b->meters[group->first],
								group->limit, group->key.period_start, &totals[g]);
		if (group->pending)
		{
			/* the entry's next figure, as fm_announce_after_pending_track */
			fm_pending_set_recheck(b->tenants[group->first], b->meters[group->first],
								   group->key.period_start, group->limit,
								   fm_used_of(&totals[g], group->limit->aggregation));
			continue;
		}
		if (group->limit->aggregation == FM_AGG_LATEST ||
			!fm_next_recheck(group->limit, &group->written, &totals[g], nstripes[g],
							 &recheck_at))
			continue;
		r_at[recheck.n] = Int64GetDatum(recheck_at);
		r_for[recheck.n] = Int32GetDatum(group->limit->fingerprint);
		r_ctid[recheck.n] = PointerGetDatum(&group->written.ctid);
		period_list_add(&recheck, group, due->tenants[g], due->meters[g]);
	}
	if (recheck.n == 0)
		return;
	period_list_args(args, &recheck);
	args[3] = Int16GetDatum(fm_own_stripe());
	args[4] = fm_int8_array(r_at, recheck.n);
	args[5] = PointerGetDatum(construct_array(r_for, recheck.n, INT4OID, 4, true, TYPALIGN_INT));
	args[6] = PointerGetDatum(construct_array(r_ctid, recheck.n, TIDOID, sizeof(ItemPointerData),
											  false, TYPALIGN_SHORT));
	fm_execute(&set_recheck_batch_stmt, args, NULL, false, 0);
}

/*
 * Read the periods that may have reached something (as track decides it)
 * in one statement, queue what each reached, and write the stripes' new
 * recheck figures in another: track's fm_announce_after_track for many
 * periods.
 */
static void
read_due_periods(TrackBatch *b, const PeriodList *written)
{
	PeriodList	due = due_periods(b, written);
	FmCounter  *totals;
	int		   *nstripes;

	if (due.n == 0)
		return;
	totals = palloc(sizeof(FmCounter) * due.n);
	nstripes = palloc0(sizeof(int) * due.n);
	read_period_totals(b, &due, totals, nstripes);
	queue_and_recheck(b, &due, totals, nstripes);
}

/* Record the batch's events: b->counted says which were counted. */
static void
track_events(TrackBatch *b)
{
	BatchGroupEntry **event_groups;

	/* in the caller's memory: the answers outlive SPI */
	b->counted = palloc(sizeof(bool) * b->n);
	fm_lock_counters_for_write();
	SPI_connect();
	load_limits_and_periods(b);
	claim_batch_keys(b);
	add_pool_events(b);
	event_groups = group_counted_events(b);
	if (b->ncounted > 0)
	{
		PeriodList	written;

		add_pending_groups(b);
		insert_counted_events(b, event_groups);
		written = add_group_increments(b);

		draw_batch_grants(b, &written);
		read_due_periods(b, &written);
	}
	SPI_finish();
	fm_usage_target_clear();
}

/*
 * track_batch(tenants[], meters[], amounts[], occurred_at[], keys[]) -> bigint
 *
 * Keyed events already recorded (or repeated within the batch) are
 * skipped; the result is how many events were counted.
 */
PG_FUNCTION_INFO_V1(fm_track_batch);
Datum
fm_track_batch(PG_FUNCTION_ARGS)
{
	TrackBatch	b;
	int64		counted = 0;
	int			i;

	batch_from_args(fcinfo, &b);
	if (b.n == 0)
		PG_RETURN_INT64(0);
	track_events(&b);
	for (i = 0; i < b.nnamed; i++)
		counted += b.counted[i] ? 1 : 0;
	PG_RETURN_INT64(counted);
}

/*
 * track_events(tenants[], meters[], amounts[], occurred_at[], keys[]) -> boolean[]
 *
 * track_batch with one answer per event, as track gives it: element i is
 * false when event i's key was recorded before (or earlier in the call).
 * What a client that groups concurrent track calls into one transaction
 * needs to answer each of its callers.
 */
PG_FUNCTION_INFO_V1(fm_track_events);
Datum
fm_track_events(PG_FUNCTION_ARGS)
{
	TrackBatch	b;
	Datum	   *counted;
	int			i;

	batch_from_args(fcinfo, &b);
	if (b.n > 0)
		track_events(&b);
	counted = palloc(sizeof(Datum) * Max(b.nnamed, 1));
	for (i = 0; i < b.nnamed; i++)
		counted[i] = BoolGetDatum(b.counted[i]);
	PG_RETURN_ARRAYTYPE_P(construct_array(counted, b.nnamed, BOOLOID, 1, true, TYPALIGN_CHAR));
}
