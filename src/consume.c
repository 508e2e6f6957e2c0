/*
 * consume.c
 *	  consume(): the atomic check-and-record against a limit, for one meter
 *	  or all-or-nothing across several.  A hard limit is never exceeded,
 *	  whatever the concurrency: a consume of a period decides on its
 *	  stripe 0 (usage_rows.h) once it holds that row's lock, counting the
 *	  track stripes as committed before, or, preloaded, the common one
 *	  decides against the consumes in flight without that lock
 *	  (inflight_consume.c), the two ways never on one period at once.  A retried
 *	  idempotency key returns the original decision and records nothing
 *	  (event_keys.c).
 */
#include "postgres.h"
#include "fmgr.h"
#include "funcapi.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/int.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "args.h"
#include "consume.h"
#include "consume_one.h"
#include "consume_rate.h"
#include "counter.h"
#include "decision.h"
#include "event_keys.h"
#include "holds.h"
#include "inflight.h"
#include "limit_lookup.h"
#include "notify.h"
#include "pending.h"
#include "period.h"
#include "pools.h"
#include "usage_rows.h"

/*
 * consume's read: the other stripes (tracked usage) and stripe 0 locked
 * (its latest committed value), in one statement; the first column says
 * which is which.  The tracked rows come first: the Append runs its
 * branches in order, so they are read before the lock is requested, not
 * while it is held (a hot tenant has a stripe per concurrent tracker), and
 * as the statement's snapshot shows them.
 */
static FmStatement lock_for_consume_stmt = {
	"SELECT false, o.counter FROM flagmeter.counters o"
	" WHERE o.tenant" FM_EQ "$1 AND o.meter" FM_EQ "$2 AND o.period_start" FM_EQ "$3"
	" AND" FM_IS_TRACK_STRIPE("o.stripe")
	" UNION ALL"
	" SELECT true, l.counter FROM (" FM_STRIPE0_SELECT " FOR UPDATE) l",
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

/*
 * The same for a tenant with credit grants, and its active grants read
 * too, without a lock, in the same statement: (is stripe 0, counter) rows,
 * then FM_READ_GRANTS_ROWS' columns from the third.  What a grant shows
 * may be older than stripe 0's latest version (the statement's snapshot
 * was taken before waiting for its lock): the draw is guarded, and locks
 * and decides again when a grant changed (grants.h), so that a call that
 * draws nothing writes no grant row.
 */
static FmStatement lock_for_consume_grants_stmt = {
	"SELECT false, o.counter, NULL::pg_catalog.int8, NULL::pg_catalog.int8,"
	" NULL::pg_catalog.int8, NULL::pg_catalog.int4 FROM flagmeter.counters o"
	" WHERE o.tenant" FM_EQ "$1 AND o.meter" FM_EQ "$2 AND o.period_start" FM_EQ "$3"
	" AND" FM_IS_TRACK_STRIPE("o.stripe")
	" UNION ALL"
	" SELECT true, l.counter, NULL, NULL, NULL, NULL"
	" FROM (" FM_STRIPE0_SELECT " FOR UPDATE) l"
	" UNION ALL"
	" SELECT NULL, NULL, r.* FROM (" FM_READ_GRANTS_ROWS("$4") ") r",
	4, {TEXTOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID}
};

/* consume's write: stripe 0 (locked) gets its new value, and the event */
static FmStatement record_consumed_stmt = {
	"WITH event AS ("
	"  INSERT INTO flagmeter.events"
	"   (tenant, meter, amount, occurred_at, recorded_at, idempotency_key)"
	"  VALUES ($1, $2, $5, $6, $6, $7)"
	")"
	" UPDATE flagmeter.counters SET counter = $4"
	" WHERE tenant" FM_EQ "$1 AND meter" FM_EQ "$2 AND period_start" FM_EQ "$3"
	" AND stripe" FM_EQ "0::pg_catalog.int2",
	7, {TEXTOID, TEXTOID, TIMESTAMPTZOID, FM_TYPE_COUNTER, INT8OID,
	TIMESTAMPTZOID, TEXTOID}
};

/*
 * Lock stripe 0 of the period for consume (creating it first if needed)
 * and read it and the tracked usage, in one statement; with grants not
 * NULL, read the active grants at now in it too (unlocked).
 */
static void
lock_for_consume(const char *tenant, const char *meter, TimestampTz period_start,
				 TimestampTz now, FmCounter *stripe0, FmCounter *tracked,
				 FmGrantsHeld *grants)
{
	FmStatement *stmt = grants ? &lock_for_consume_grants_stmt : &lock_for_consume_stmt;
	Datum		args[4];
	bool		found = false;
	bool		isnull;
	uint64		i;
	FmCounter	in_flight = fm_empty_counter();
	Snapshot	snapshot;

	/* consumes in flight end first, or count as tracked (inflight.h) */
	fm_usage_target(tenant, meter, period_start);
	fm_inflight_before_lock(tenant, meter, period_start, now, &in_flight);
	fm_period_args(args, tenant, meter, period_start);
	args[3] = TimestampTzGetDatum(now);
	snapshot = RegisterSnapshot(GetTransactionSnapshot());
	fm_execute_snapshot(stmt, args, NULL, false, 0, snapshot);
	for (i = 0; i < SPI_processed && !found; i++)
		found = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
										   1, &isnull)) && !isnull;
	if (!found)
	{
		fm_create_stripe0(args);
		UnregisterSnapshot(snapshot);
		snapshot = RegisterSnapshot(GetTransactionSnapshot());
		fm_execute_snapshot(stmt, args, NULL, false, 0, snapshot);
	}

	*stripe0 = fm_empty_counter();
	*tracked = in_flight;
	found = false;
	for (i = 0; i < SPI_processed; i++)
	{
		bool		is_stripe0 = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[i],
															SPI_tuptable->tupdesc, 1, &isnull));
		Datum		d;

		if (isnull)
			continue;			/* a grant's row */
		d = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2, &isnull);
		fm_counter_report(fm_counter_merge(is_stripe0 ? stripe0 : tracked,
										   DatumGetFmCounterP(d)));
		found = found || is_stripe0;
	}
	if (!found)
		elog(ERROR, "could not lock the counter of tenant \"%s\" meter \"%s\"",
			 tenant, meter);
	if (grants)
		fm_grants_from_result(tenant, meter, 3, false, grants);
	/* the tracked usage not yet in the rows, as the statement saw the rows */
	fm_pending_add_visible(tenant, meter, period_start, snapshot, tracked);
	UnregisterSnapshot(snapshot);
}

static int
compare_items_by_meter(const void *a, const void *b)
{
	return strcmp((*(FmConsumeItem *const *) a)->meter,
				  (*(FmConsumeItem *const *) b)->meter);
}

/* One item's decision on current, with its grants and holds when it has them. */
static void
decide_item(FmConsumeItem *item, const FmCounter *current, TimestampTz now, bool record,
			FmDecision *decision)
{
	if (item->limit.grants || item->limit.reserves)
		fm_decide_with_grants(&item->limit, current, item->amount, now, item->period_end,
							  record, item->force, item->grants.available, item->held,
							  decision, &item->draw);
	else
	{
		FmLimit		limit = item->limit;

		if (item->force)
			limit.hard = false; /* a settle: the usage happened */
		fm_decide(&limit, current, item->amount, now, item->period_end, record,
				  decision, NULL);
	}
	decision->meter = item->meter;
}

/*
 * Decide every item on currents[]: all granted, or all refused (each
 * refused decision then shows the usage unchanged).
 */
static bool
decide_all(FmConsumeItem *items, int n, const FmCounter *currents, TimestampTz now,
		   FmDecision *decisions)
{
	bool		all_granted = true;
	int			i;

	for (i = 0; i < n; i++)
	{
		decide_item(&items[i], &currents[i], now, true, &decisions[i]);
		if (!decisions[i].granted)
			all_granted = false;
	}
	if (all_granted)
		return true;
	for (i = 0; i < n; i++)
	{
		decide_item(&items[i], &currents[i], now, false, &decisions[i]);
		decisions[i].from_grants = items[i].draw = 0;
		fm_decision_refused_with_others(&decisions[i]);
	}
	return false;
}

/*
 * Draw every item's grants, all or none: false, having drawn nothing, when
 * a grant read without its lock was spent or voided meanwhile.  A
 * decision's balance then counts what the grants drawn from said is left.
 */
static bool
draw_items(FmConsumeItem *items, int n, FmDecision *decisions)
{
	int			i,
				j;

	for (i = 0; i < n; i++)
	{
		int64		expected = items[i].grants.available - items[i].draw;

		if (items[i].draw == 0)
			continue;
		if (!fm_grants_try_draw(&items[i].grants, items[i].draw))
		{
			for (j = 0; j < i; j++)
				fm_grants_undo_draw(&items[j].grants);
			return false;
		}
		if (decisions[i].has_balance)
			decisions[i].balance = Max(decisions[i].balance +
									   (items[i].grants.available - expected), 0);
	}
	return true;
}

/*
 * Each item's stripe 0, locked in the order given (meter-name order), and
 * for a tenant with credit grants its active grants with it; then the
 * holds of reservations, which change only under stripe 0's lock.
 */
static void
lock_items(const char *tenant, FmConsumeItem **order, int n, TimestampTz now)
{
	int			i;

	for (i = 0; i < n; i++)
	{
		FmConsumeItem *item = order[i];

		item->grants.n = 0;
		item->grants.available = 0;
		item->draw = 0;
		lock_for_consume(tenant, item->meter, item->period_start, now,
						 &item->stripe0, &item->tracked,
						 item->limit.grants ? &item->grants : NULL);
		item->held = item->limit.reserves ?
			fm_reservations_held(tenant, item->meter, now, false) : 0;
	}
}

/*
 * After a refusal, which reports the balance: the items with credit
 * grants decided again on the grants as they are now (the read before may
 * predate draws of a transaction waited for).  Whether all are granted;
 * false, decisions[] as they were, when no item has grants.
 */
static bool
decide_on_grants_now(const char *tenant, FmConsumeItem *items, int n,
					 const FmCounter *currents, TimestampTz now, FmDecision *decisions)
{
	bool		reread = false;
	int			i;

	for (i = 0; i < n; i++)
		if (items[i].limit.grants)
		{
			fm_grants_read(tenant, items[i].meter, now, &items[i].grants);
			reread = true;
		}
	return reread && decide_all(items, n, currents, now, decisions);
}

/*
 * Lock every item's stripe 0 and decide on it: all granted or all refused.
 * Fills decisions[] (SPI memory) and each item's stripe 0 after recording,
 * checked for overflow before anything is written; when granted, the
 * items' grants are drawn (announced by record_items).
 *
 * Every consume of a period goes through its stripe 0, locked in
 * meter-name order so that concurrent multi-meter consumes cannot
 * deadlock; SELECT ... FOR UPDATE returns its latest committed value, so a
 * hard limit is never exceeded by consumes.  The other stripes hold
 * tracked usage, read just before the lock, as committed then: track is
 * never refused and does not serialize with consume, and reading it before
 * the lock keeps the lock held only for the decision and the write.
 * Grants are read in the same statement, unlocked, and drawn with guarded
 * writes; should one fail, the grants are locked (their latest versions)
 * and the items decided again.
 */
static bool
decide_items(const char *tenant, FmConsumeItem *items, int n, TimestampTz now,
			 FmDecision *decisions)
{
	FmConsumeItem **order = palloc(sizeof(FmConsumeItem *) * n);
	FmCounter  *currents = palloc(sizeof(FmCounter) * n);
	FmCounter	probe;
	bool		granted;
	int			i;

	for (i = 0; i < n; i++)
		order[i] = &items[i];
	qsort(order, n, sizeof(FmConsumeItem *), compare_items_by_meter);
	lock_items(tenant, order, n, now);

	for (i = 0; i < n; i++)
	{
		fm_usage_target(tenant, items[i].meter, items[i].period_start);
		currents[i] = items[i].stripe0;
		fm_counter_report(fm_counter_merge(&currents[i], &items[i].tracked));
		items[i].stripe0_after = items[i].stripe0;
		fm_counter_report(fm_counter_add_event(&items[i].stripe0_after,
											   items[i].amount, now));
		/* what decide_all adds, so that an overflow names its item */
		probe = currents[i];
		fm_counter_report(fm_counter_add_event(&probe, items[i].amount, now));
	}
	fm_usage_target_clear();
	granted = decide_all(items, n, currents, now, decisions);
	if (!granted)
		granted = decide_on_grants_now(tenant, items, n, currents, now, decisions);
	if (granted && !draw_items(items, n, decisions))
	{
		/* a grant changed since it was read: lock them, decide again */
		for (i = 0; i < n; i++)
			if (order[i]->limit.grants)
				fm_grants_lock(tenant, order[i]->meter, now, &order[i]->grants);
		granted = decide_all(items, n, currents, now, decisions);
		if (granted && !draw_items(items, n, decisions))
			elog(ERROR, "credit grants locked by this transaction could not be drawn from");
	}
	return granted;
}

/*
 * Remember the decisions under the key: the named items' as "consume",
 * the pools' added to them (items nnamed and after) as "consume_pool",
 * which a retry does not return.  When a concurrent call with the key
 * committed first, returns its decisions (which win); else NULL.
 */
static FmDecision *
remember_decisions(const char *tenant, const char *key, FmConsumeItem *items, int n,
				   int nnamed, TimestampTz now, const FmDecision *decisions,
				   int *nremembered)
{
	int			i;

	for (i = 0; i < n; i++)
	{
		if (!fm_claim_key(tenant, key, i, items[i].meter, items[i].amount, now,
						  items[i].period_start, i < nnamed ? "consume" : "consume_pool",
						  &decisions[i]))
		{
			FmDecision *remembered = fm_replayed_decisions(tenant, key, nremembered);

			if (remembered == NULL)
				elog(ERROR, "idempotency key \"%s\" of tenant \"%s\" was claimed but has no decision",
					 key, tenant);
			return remembered;
		}
	}
	return NULL;
}

/* Write granted items: stripe 0's new value and the event, then announce. */
static void
record_items(const char *tenant, const char *key, FmConsumeItem *items, int n,
			 TimestampTz now, const FmDecision *decisions)
{
	int			i;

	for (i = 0; i < n; i++)
	{
		Datum		args[7];

		args[0] = CStringGetTextDatum(tenant);
		args[1] = CStringGetTextDatum(items[i].meter);
		args[2] = TimestampTzGetDatum(items[i].period_start);
		args[3] = FmCounterPGetDatum(&items[i].stripe0_after);
		args[4] = Int64GetDatum(items[i].amount);
		args[5] = TimestampTzGetDatum(now);
		args[6] = key ? CStringGetTextDatum(key) : (Datum) 0;
		fm_execute(&record_consumed_stmt, args, key ? NULL : "      n", false, 0);
		if (items[i].draw > 0)
			fm_grants_announce_draw(&items[i].grants);
		if (items[i].limit.limited)
		{
			FmLimit		announce = fm_grants_announce_limit(&items[i].limit,
															items[i].grants.available);

			fm_queue_usage_level(tenant, items[i].meter, &announce,
								 items[i].period_start, decisions[i].used);
		}
	}
}

/* The item of meter among items[0 .. n - 1], or -1. */
static int
item_of_meter(const FmConsumeItem *items, int n, const char *meter)
{
	int			i;

	for (i = 0; i < n; i++)
		if (strcmp(items[i].meter, meter) == 0)
			return i;
	return -1;
}

/*
 * The items of a consume with the credit pools its meters draw from
 * (pools.h): the n named items, then one item per pool the call does not
 * name, whose amount is what its drawing items use of it (added to the
 * pool's own item when the call names the pool too).  Their limits and
 * periods are loaded.  Returns items itself when no item draws.
 */
static FmConsumeItem *
with_pool_items(const char *tenant, FmConsumeItem *items, int n, TimestampTz now,
				int *nall)
{
	FmConsumeItem *all = NULL;
	int			count = n;
	int			i;

	for (i = 0; i < n; i++)
	{
		const FmLimit *limit = &items[i].limit;
		int64		amount;
		int			p;

		if (!fm_draws_from_pool(limit))
			continue;
		if (all == NULL)
		{
			/* each named item adds at most one pool */
			all = palloc0(sizeof(FmConsumeItem) * 2 * n);
			memcpy(all, items, sizeof(FmConsumeItem) * n);
		}
		amount = fm_pool_amount(limit, items[i].amount);
		p = item_of_meter(all, count, limit->pool);
		if (p < 0)
		{
			p = count++;
			all[p].meter = pstrdup(limit->pool);
			all[p].force = items[i].force;
			fm_load_limit(tenant, all[p].meter, false, &all[p].limit);
			fm_period_bounds(all[p].limit.period, all[p].limit.anchor, all[p].limit.tz,
							 now, &all[p].period_start, &all[p].period_end);
		}
		if (pg_add_s64_overflow(all[p].amount, amount, &all[p].amount))
			ereport(ERROR,
					(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
					 errmsg("value out of range: the units of pool \"%s\" in one consume",
							limit->pool)));
	}
	*nall = count;
	return all ? all : items;
}

/* The named items' decisions, each with its pool's when it draws from one. */
static void
fold_pool_decisions(const FmConsumeItem *items, int nnamed, int nall, FmDecision *decisions)
{
	int			i;

	for (i = 0; i < nnamed; i++)
		if (fm_draws_from_pool(&items[i].limit))
			fm_pool_fold_decision(&decisions[i],
								  &decisions[item_of_meter(items, nall, items[i].limit.pool)]);
}

/*
 * The quota's part of fm_consume_items: the common call on fm_consume_one's
 * path, else every item (pools' included) decided and recorded all or
 * none, and remembered under the key.  A key another call claimed first
 * returns its decisions (and sets *ndecisions to their number).  *recorded:
 * whether this call recorded its items.
 */
static FmDecision *
decide_and_record(const char *tenant, FmConsumeItem *items, int n, FmConsumeItem *all,
				  int nall, const char *key, TimestampTz now, int *ndecisions,
				  bool *recorded)
{
	FmDecision *decisions;
	FmDecision *remembered = NULL;
	bool		granted;
	int			i;

	*recorded = false;
	if (nall == 1 && key == NULL && !items[0].limit.grants && !items[0].limit.reserves &&
		!items[0].force &&
		(items[0].limit.aggregation == FM_AGG_SUM ||
		 items[0].limit.aggregation == FM_AGG_COUNT))
	{
		decisions = fm_consume_one(tenant, items[0].meter, items[0].amount,
								   &items[0].limit, items[0].period_start,
								   items[0].period_end, now);
		*recorded = decisions->granted;
		return decisions;
	}

	decisions = SPI_palloc(sizeof(FmDecision) * nall);
	granted = decide_items(tenant, all, nall, now, decisions);
	fold_pool_decisions(all, n, nall, decisions);
	if (key)
		remembered = remember_decisions(tenant, key, all, nall, n, now, decisions,
										ndecisions);
	if (remembered)
	{
		/* the first call with the key wins: this one records nothing */
		for (i = 0; i < nall; i++)
			if (all[i].draw > 0)
				fm_grants_undo_draw(&all[i].grants);
		return remembered;
	}
	if (granted)
		record_items(tenant, key, all, nall, now, decisions);
	*recorded = granted;
	return decisions;
}

/*
 * decide_and_record for items some of which have a rate limit: the rate
 * first, then the quota; what the quota refuses, or a failure, gives the
 * rate back.  A refusal for the rate records nothing, not even under the
 * key: a retry after retry_after decides again.
 */
static FmDecision *
decide_rated(const char *tenant, FmConsumeItem *items, int n, FmConsumeItem *all,
			 int nall, const char *key, TimestampTz now, int *ndecisions)
{
	FmDecision *decisions;
	bool		recorded;
	int			refused;
	int64		retry_after;

	if (!fm_items_rate_spend(tenant, items, n, &refused, &retry_after))
		return fm_items_rate_refusal(tenant, items, n, refused, retry_after);
	PG_TRY();
	{
		decisions = decide_and_record(tenant, items, n, all, nall, key, now, ndecisions,
									  &recorded);
	}
	PG_CATCH();
	{
		fm_items_rate_give_back(tenant, items, n);
		PG_RE_THROW();
	}
	PG_END_TRY();
	if (!recorded)
		fm_items_rate_give_back(tenant, items, n);
	return decisions;
}

/*
 * The heart of consume (consume.h).  The common call (one sum or count
 * meter, no key, no credit grants or pool) takes fm_consume_one's shorter
 * path; a call whose meters draw from pools decides and records their
 * pools as items of its own, after the named ones.
 */
FmDecision *
fm_consume_items(const char *tenant, FmConsumeItem *items, int n, const char *key,
				 int *ndecisions)
{
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	FmDecision *decisions;
	FmConsumeItem *all;
	int			nall;
	bool		recorded;
	int			i;

	*ndecisions = n;

	fm_lock_counters_for_write();
	SPI_connect();

	for (i = 0; i < n; i++)
	{
		fm_load_limit(tenant, items[i].meter, false, &items[i].limit);
		if (!items[i].counts_value)
			fm_refuse_unique_meter(items[i].meter, &items[i].limit);
		fm_period_bounds(items[i].limit.period, items[i].limit.anchor,
						 items[i].limit.tz, now,
						 &items[i].period_start, &items[i].period_end);
	}

	all = with_pool_items(tenant, items, n, now, &nall);

	if (key && (decisions = fm_replayed_decisions(tenant, key, ndecisions)) != NULL)
	{
		/* a retried key: the original decision, nothing recorded or spent */
	}
	else if (!fm_items_rate_limited(items, n))
		decisions = decide_and_record(tenant, items, n, all, nall, key, now, ndecisions,
									  &recorded);
	else
		decisions = decide_rated(tenant, items, n, all, nall, key, now, ndecisions);
	SPI_finish();
	fm_usage_target_clear();
	return decisions;
}

/* (tenant, meter) pairs of fm_lock_consume_periods, in lock order */
typedef struct TenantMeter
{
	const char *tenant;
	const char *meter;
	TimestampTz period_start;	/* of the limit in force now */
} TenantMeter;

static int
compare_tenant_meters(const void *a, const void *b)
{
	const TenantMeter *x = a;
	const TenantMeter *y = b;
	int			c = strcmp(x->tenant, y->tenant);

	return c != 0 ? c : strcmp(x->meter, y->meter);
}

/* pair is (tenant, meter) and its current period; *limit the limit in force */
static void
set_pair(TenantMeter *pair, const char *tenant, const char *meter, TimestampTz now,
		 FmLimit *limit)
{
	TimestampTz end;

	pair->tenant = tenant;
	pair->meter = meter;
	fm_load_limit(tenant, meter, false, limit);
	fm_period_bounds(limit->period, limit->anchor, limit->tz, now, &pair->period_start, &end);
}

void
fm_lock_consume_periods(char **tenants, char **meters, int n)
{
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	TenantMeter *pairs = palloc(sizeof(TenantMeter) * 2 * Max(n, 1));
	int			npairs = 0;
	int			i;

	/* the named meters, and the pools they draw from (pools.h) */
	fm_lock_counters_for_write();
	for (i = 0; i < n; i++)
	{
		FmLimit		limit;
		FmLimit		pool_limit;

		set_pair(&pairs[npairs++], tenants[i], meters[i], now, &limit);
		if (fm_draws_from_pool(&limit))
			set_pair(&pairs[npairs++], tenants[i], pstrdup(limit.pool), now, &pool_limit);
	}
	qsort(pairs, npairs, sizeof(TenantMeter), compare_tenant_meters);

	SPI_connect();
	for (i = 0; i < npairs; i++)
	{
		FmCounter	stripe0,
					tracked;

		if (i > 0 && compare_tenant_meters(&pairs[i], &pairs[i - 1]) == 0)
			continue;
		lock_for_consume(pairs[i].tenant, pairs[i].meter, pairs[i].period_start, now,
						 &stripe0, &tracked, NULL);
	}
	SPI_finish();
	pfree(pairs);
}

void
fm_check_consume_meters(char **meters, int n)
{
	int			i,
				j;

	if (n == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("meters must not be empty")));
	if (n > FM_MAX_METERS_PER_CONSUME)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("too many meters in one consume: %d", n),
				 errdetail("One consume names at most %d meters.", FM_MAX_METERS_PER_CONSUME)));
	for (i = 0; i < n; i++)
	{
		fm_check_meter_name(meters[i]);
		for (j = 0; j < i; j++)
			if (strcmp(meters[i], meters[j]) == 0)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("meter \"%s\" is listed twice", meters[i]),
						 errhint("Add the amounts up into one element.")));
	}
}

/* consume(tenant, meter, amount, idempotency_key) -> decision */
static Datum consume_call(FunctionCallInfo fcinfo, bool amount_text);

PG_FUNCTION_INFO_V1(fm_consume);
Datum
fm_consume(PG_FUNCTION_ARGS)
{
	return consume_call(fcinfo, false);
}

/*
 * The same with the amount as text: an untyped NULL or driver parameter in
 * third place matches both consume(text, text, bigint, text) and
 * consume(text, text[], bigint[], text), which PostgreSQL cannot choose
 * between; with this overload it resolves here, and a NULL gets 22004.
 */
PG_FUNCTION_INFO_V1(fm_consume_text);
Datum
fm_consume_text(PG_FUNCTION_ARGS)
{
	return consume_call(fcinfo, true);
}

static Datum
consume_call(FunctionCallInfo fcinfo, bool amount_text)
{
	char	   *tenant = fm_arg_tenant(fcinfo, 0);
	FmConsumeItem item;
	char	   *key = fm_arg_key(fcinfo, 3);
	FmDecision *decision;
	TupleDesc	desc;
	int			ndecisions;

	memset(&item, 0, sizeof(item));
	item.meter = fm_arg_meter(fcinfo, 1);
	item.amount = amount_text ? fm_arg_amount_text(fcinfo, 2, false) :
		fm_arg_amount(fcinfo, 2, false);

	desc = fm_decision_desc(fcinfo);

	decision = fm_consume_items(tenant, &item, 1, key, &ndecisions);
	PG_RETURN_DATUM(HeapTupleGetDatum(fm_decision_tuple(desc, &decision[0])));
}

/* consume(tenant, meters[], amounts[], idempotency_key) -> setof decision */
PG_FUNCTION_INFO_V1(fm_consume_multi);
Datum
fm_consume_multi(PG_FUNCTION_ARGS)
{
	char	   *tenant = fm_arg_tenant(fcinfo, 0);
	char	   *key = fm_arg_key(fcinfo, 3);
	char	  **meters;
	int64	   *amounts;
	FmConsumeItem *items;
	FmDecision *decisions;
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int			n,
				ndecisions,
				i;

	if (PG_ARGISNULL(1))
		fm_null_argument("meters");
	if (PG_ARGISNULL(2))
		fm_null_argument("amounts");
	meters = fm_arg_text_array(fcinfo, 1, "meters", &n, false);
	fm_check_consume_meters(meters, n);
	amounts = fm_arg_amount_array(fcinfo, 2, n, false);
	items = palloc0(sizeof(FmConsumeItem) * n);
	for (i = 0; i < n; i++)
	{
		items[i].meter = meters[i];
		items[i].amount = amounts[i];
	}

	decisions = fm_consume_items(tenant, items, n, key, &ndecisions);

	InitMaterializedSRF(fcinfo, 0);
	for (i = 0; i < ndecisions; i++)
		tuplestore_puttuple(rsinfo->setResult,
							fm_decision_tuple(rsinfo->setDesc, &decisions[i]));
	return (Datum) 0;
}
