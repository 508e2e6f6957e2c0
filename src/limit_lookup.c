/*
 * limit_lookup.c
 *	  The limit in force for a tenant and meter, as flagmeter.limit_config
 *	  (the one definition of it, in SQL) gives it, read from the catalog
 *	  and cached per backend and, when preloaded, across backends
 *	  (shared_limits.c).
 */
#include "postgres.h"
#include "fmgr.h"
#include "funcapi.h"

#include "catalog/pg_type.h"
#include "access/htup_details.h"
#include "access/transam.h"
#include "access/xact.h"
#include "commands/trigger.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "mb/pg_wchar.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "args.h"
#include "bounds.h"
#include "compat.h"
#include "counter.h"
#include "limit_lookup.h"
#include "pk_scan.h"
#include "rate_limiter.h"
#include "shared_limits.h"
#include "statements.h"

/*
 * The per-backend cache of limits.
 *
 * The catalog tables (meters, plans, limits, tenants, overrides),
 * flagmeter.credit_accounts and flagmeter.settings carry a statement trigger, flagmeter.config_changed(), that sends a relcache
 * invalidation for the table: like every invalidation it reaches the other
 * backends when the change commits, and this backend at its next command.
 * Any of them empties the cache.  A call takes its first lock on
 * flagmeter.counters before it asks the cache, and taking a lock accepts
 * pending invalidations, so a call never runs on a configuration older than
 * the last change committed before that lock (recount_current_period
 * relies on this).
 *
 * What a call loads in a snapshot taken before the caches were last emptied
 * (a REPEATABLE READ transaction's, or a read-only call's statement snapshot,
 * when the invalidation is taken after it) may be older than the change
 * that emptied them: it is right for that call, and not kept.  Kept, it
 * outlived its snapshot: the next transaction of the backend ran on the
 * limit from before the change until the next change emptied the caches
 * again (spec limit_change).  So the caches remember which transactions
 * had ended when they were emptied, as a snapshot taken then saw them, and
 * keep a load only when its snapshot shows every one of them ended: then it
 * shows every change committed by then (a change commits, and leaves the
 * running transactions, before its invalidation is sent).  The comparison
 * is by transaction ids (xmax and the running ids): the count of ended
 * transactions a snapshot records (snapXactCompletionCount) is zeroed in
 * its copies, and a read-only call's active snapshot is one.
 *
 * Keys hold the names, not padded copies: a lookup's key points at the
 * caller's strings, and an entry's at copies in limit_cache_context.
 * Padded to their maximum lengths the keys were half of an entry (631 bytes
 * per tenant and meter a backend met, 6.3 MB for 10 000 tenants).
 */
typedef struct LimitCacheEntry
{
	FmTenantMeterKey key;
	FmLimit		limit;
} LimitCacheEntry;

/*
 * Past this many entries the cache starts afresh: about 0.37 kB each, so at
 * most about 7.4 MB per backend.  A backend that serves more tenants loads
 * them again, from the shared cache when flagmeter is preloaded (about a
 * microsecond each).
 */
#define LIMIT_CACHE_MAX 20000

/* the anchor of a tenant with no plan: PostgreSQL's epoch, 2000-01-01 00:00:00+00 */
#define FM_UNASSIGNED_ANCHOR ((TimestampTz) 0)

static HTAB *limit_cache = NULL;
static bool limit_cache_valid = false;

/* the table limit_cache and the names its keys point at */
static MemoryContext limit_cache_context = NULL;

/* the shared cache's generation when this backend's caches were emptied */
static uint64 limit_cache_generation = 0;

/*
 * The transactions that had ended when this backend's caches were emptied,
 * as a snapshot taken then saw them: those below emptied_xmax but the
 * emptied_xip ones (sorted, in limit_cache_context), which were running.
 * When those are not known (NULL: a parallel worker, which may not take a
 * snapshot, or a standby's snapshot, whose running ids are kept another
 * way), only a snapshot whose xmin is at emptied_xmax or past it is known
 * to show them all.
 */
static TransactionId emptied_xmax = InvalidTransactionId;
static TransactionId *emptied_xip = NULL;
static uint32 emptied_xcnt = 0;
static Oid	watched_relids[9];

/*
 * The settings the calls read, from flagmeter.current_settings: whether
 * unassigned tenants are refused, and the window of event times.  Read
 * once after the caches were last emptied (the settings table is watched
 * like the catalog tables); settings_loaded is false until then.
 */
static bool settings_loaded = false;
static bool unassigned_refused = false;
static Interval late_events;
static Interval future_events;

/*
 * The window of event times itself: its ends depend only on the settings
 * and the transaction's start, so a batch of events computes them once.
 * window_start is the transaction start they were computed for; 0 (and
 * every reload of the settings) makes them computed again.
 */
static TimestampTz window_start = 0;
static TimestampTz window_earliest;
static TimestampTz window_latest;

/*
 * The part of a limit that comes from the plan (or from no plan): the
 * meter's aggregation and the plan's limit for it.  Cached per plan and
 * meter, beside the per-tenant cache, and emptied with it.
 */
typedef struct PlanLimitKey
{
	char		plan[FM_NAME_MAX_BYTES + 1];	/* "" for no plan */
	char		meter[FM_NAME_MAX_BYTES + 1];
} PlanLimitKey;

typedef struct PlanLimitEntry
{
	PlanLimitKey key;
	FmAggregation aggregation;
	bool		limited;		/* the plan has a limit for the meter */
	int64		quota;
	FmPeriodKind period;
	bool		hard;
	int			nthresholds;
	int			thresholds[FM_MAX_THRESHOLDS];
	char		pool[FM_NAME_MAX_BYTES + 1];	/* the meter's credit pool */
	int64		rate_num;
	int64		rate_den;
	FmRate		rate_limit;		/* the plan's rate limit, rate 0 for none */
} PlanLimitEntry;

static HTAB *plan_limit_cache = NULL;

static void
limits_relcache_callback(Datum arg, Oid relid)
{
	int			i;

	/*
	 * Only this backend's caches: the shared one was invalidated when the
	 * change committed, before its invalidations were sent (shared_limits.c).
	 */
	if (relid == InvalidOid)
	{
		limit_cache_valid = false;
		return;
	}
	for (i = 0; i < (int) lengthof(watched_relids); i++)
		if (watched_relids[i] == relid)
			limit_cache_valid = false;
}

void
fm_limit_lookup_init(void)
{
	CacheRegisterRelcacheCallback(limits_relcache_callback, (Datum) 0);
}

/* Remember which transactions have ended, now that the caches are empty. */
static void
remember_ended_transactions(void)
{
	Snapshot	now;

	emptied_xip = NULL;
	emptied_xcnt = 0;
	if (IsInParallelMode())
	{
		emptied_xmax = ReadNextTransactionId();
		return;
	}
	now = GetLatestSnapshot();
	emptied_xmax = now->xmax;
	if (now->takenDuringRecovery)
		return;
	emptied_xcnt = now->xcnt;
	/* at least one id's room: NULL would say the ids are not known */
	emptied_xip = MemoryContextAlloc(limit_cache_context,
									 Max(emptied_xcnt, 1) * sizeof(TransactionId));
	memcpy(emptied_xip, now->xip, emptied_xcnt * sizeof(TransactionId));
	qsort(emptied_xip, emptied_xcnt, sizeof(TransactionId), xidComparator);
}

/*
 * Whether a snapshot shows every transaction that had ended when the caches
 * were emptied: it was taken no earlier than the snapshot remembered then
 * (xmax), and each transaction it sees running, below that xmax, was
 * running then too.  Ids are compared modulo 2^32, as PostgreSQL does:
 * the caches are emptied long before that wraps (an anti-wraparound vacuum
 * of a watched table sends an invalidation).
 */
static bool
shows_ended_transactions(Snapshot snapshot)
{
	uint32		i;

	if (emptied_xip == NULL || snapshot->takenDuringRecovery)
		return TransactionIdFollowsOrEquals(snapshot->xmin, emptied_xmax);
	if (TransactionIdPrecedes(snapshot->xmax, emptied_xmax))
		return false;
	for (i = 0; i < snapshot->xcnt; i++)
	{
		TransactionId xid = snapshot->xip[i];

		if (TransactionIdPrecedes(xid, emptied_xmax) &&
			bsearch(&xid, emptied_xip, emptied_xcnt, sizeof(TransactionId),
					xidComparator) == NULL)
			return false;
	}
	return true;
}

static void
reset_limit_cache(void)
{
	static const char *const watched[] = {"meters", "plans", "limits", "tenants", "overrides",
	"settings", "credit_accounts", "rate_limits", "rate_overrides"};
	HASHCTL		ctl;
	int			i;

	if (plan_limit_cache)
		hash_destroy(plan_limit_cache);
	if (limit_cache_context == NULL)
		limit_cache_context = AllocSetContextCreate(TopMemoryContext, "flagmeter limits",
													ALLOCSET_DEFAULT_SIZES);
	/* the table lives in a child of the context: this frees both */
	MemoryContextReset(limit_cache_context);
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(FmTenantMeterKey);
	ctl.entrysize = sizeof(LimitCacheEntry);
	ctl.hash = fm_tenant_meter_key_hash;
	ctl.match = fm_tenant_meter_key_match;
	ctl.hcxt = limit_cache_context;
	limit_cache = hash_create("flagmeter limits", 256, &ctl,
							  HASH_ELEM | HASH_FUNCTION | HASH_COMPARE | HASH_CONTEXT);
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(PlanLimitKey);
	ctl.entrysize = sizeof(PlanLimitEntry);
	plan_limit_cache = hash_create("flagmeter plan limits", 64, &ctl,
								   HASH_ELEM | HASH_BLOBS);
	for (i = 0; i < (int) lengthof(watched); i++)
		watched_relids[i] = fm_relation_oid(watched[i]);
	limit_cache_generation = fm_shared_limits_generation();
	remember_ended_transactions();
	settings_loaded = false;
	limit_cache_valid = true;
}

/*
 * The snapshot a limit is loaded in, as a statement would have it: the
 * caller's in read-only (STABLE) calls, else a fresh one (READ COMMITTED)
 * or the transaction's.
 */
static Snapshot
load_snapshot(bool read_only)
{
	return read_only ? GetActiveSnapshot() : GetTransactionSnapshot();
}

/*
 * Whether what is loaded now, in load_snapshot(read_only) or the snapshot
 * SPI takes the same way, may be kept in the caches: the snapshot shows
 * every change committed before the caches were last emptied (see the top
 * of the file).  A READ COMMITTED call that writes loads in a fresh one.
 */
static bool
load_may_be_kept(bool read_only)
{
	if (!limit_cache_valid)
		return false;
	if (!read_only && !IsolationUsesXactSnapshot())
		return true;
	return shows_ended_transactions(load_snapshot(read_only));
}

/*
 * Empty the caches when they are out of date.  A configuration change
 * another backend committed bumps the shared generation at once; this
 * backend's invalidation may come later (not before its next lock).  Its own
 * caches follow the shared generation, so that what it loads may be shared.
 */
static void
refresh_caches(void)
{
	if (!limit_cache_valid || limit_cache == NULL ||
		hash_get_num_entries(limit_cache) > LIMIT_CACHE_MAX ||
		limit_cache_generation != fm_shared_limits_generation())
		reset_limit_cache();
}

static void load_limit_from_catalog(const char *tenant, const char *meter,
									bool read_only, FmLimit *limit);

static FmStatement settings_stmt = {
	"SELECT unassigned_tenants OPERATOR(pg_catalog.=) 'refuse'::pg_catalog.text,"
	" late_events, future_events FROM flagmeter.current_settings",
	0, {InvalidOid}
};

/* The settings of the calls, read once and cached like the limits. */
static void
load_settings(bool read_only)
{
	bool		refused = false;
	Interval	late = {0};
	Interval	future = {0};
	bool		isnull;

	refresh_caches();
	if (settings_loaded)
		return;
	SPI_connect();
	fm_execute(&settings_stmt, NULL, NULL, read_only, 1);
	if (SPI_processed == 1)
	{
		HeapTuple	tuple = SPI_tuptable->vals[0];
		TupleDesc	desc = SPI_tuptable->tupdesc;

		refused = DatumGetBool(SPI_getbinval(tuple, desc, 1, &isnull));
		late = *DatumGetIntervalP(SPI_getbinval(tuple, desc, 2, &isnull));
		future = *DatumGetIntervalP(SPI_getbinval(tuple, desc, 3, &isnull));
	}
	SPI_finish();
	unassigned_refused = refused;
	late_events = late;
	future_events = future;
	window_start = 0;

	/*
	 * an invalidation may have arrived while reading, or the snapshot may
	 * predate the last one: then it is read again
	 */
	settings_loaded = load_may_be_kept(read_only);
}

/* Whether calls for unassigned tenants are refused, cached like the limits. */
static bool
unassigned_tenants_refused(bool read_only)
{
	load_settings(read_only);
	return unassigned_refused;
}

void
fm_check_event_time(const char *tenant, const char *meter, TimestampTz occurred_at)
{
	TimestampTz now;
	TimestampTz earliest;
	TimestampTz latest;

	load_settings(false);
	now = GetCurrentTransactionStartTimestamp();
	if (window_start != now)
	{
		window_earliest = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_mi_interval,
																  TimestampTzGetDatum(now),
																  IntervalPGetDatum(&late_events)));
		window_latest = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
																TimestampTzGetDatum(now),
																IntervalPGetDatum(&future_events)));
		window_start = now;
	}
	earliest = window_earliest;
	latest = window_latest;
	if (occurred_at >= earliest && occurred_at <= latest)
		return;
	/* timestamptz_to_str answers in a static buffer: the detail copies */
	ereport(ERROR,
			(errcode(FM_ERRCODE_EVENT_TIME_OUTSIDE_WINDOW),
			 errmsg("occurred_at %s of tenant \"%.*s\", meter \"%.*s\" is outside the accepted window",
					timestamptz_to_str(occurred_at),
					pg_mbcliplen(tenant, strlen(tenant), 64), tenant,
					pg_mbcliplen(meter, strlen(meter), 64), meter),
			 errdetail("Events are accepted from %s to %s: %s before and %s after the start of the transaction "
					   "(flagmeter.current_settings.late_events and future_events).",
					   pstrdup(timestamptz_to_str(earliest)),
					   pstrdup(timestamptz_to_str(latest)),
					   DatumGetCString(DirectFunctionCall1(interval_out,
														   IntervalPGetDatum(&late_events))),
					   DatumGetCString(DirectFunctionCall1(interval_out,
														   IntervalPGetDatum(&future_events)))),
			 errhint("Check the event's time, or widen the window with "
					 "flagmeter.configure(late_events => ..., future_events => ...).")));
}

void
fm_load_limit(const char *tenant, const char *meter, bool read_only,
			  FmLimit *limit)
{
	fm_load_limit_any(tenant, meter, read_only, limit);
	if (!limit->assigned && unassigned_tenants_refused(read_only))
		ereport(ERROR,
				(errcode(FM_ERRCODE_UNASSIGNED_TENANT),
				 errmsg("tenant \"%.*s\" is not assigned a plan",
						pg_mbcliplen(tenant, strlen(tenant), 64), tenant),
				 errdetail("Calls for tenants never assigned a plan are refused "
						   "(flagmeter.current_settings.unassigned_tenants is \"refuse\")."),
				 errhint("Assign it a plan with flagmeter.assign_plan(), or check the tenant id: "
						 "ids are compared exactly, case and spaces included.")));
}

/* tenant and meter copied into limit_cache_context, in one chunk */
static const char *
names_copy(const char *tenant, const char *meter, const char **meter_copy)
{
	size_t		tenant_size = strlen(tenant) + 1;
	size_t		meter_size = strlen(meter) + 1;
	char	   *names = MemoryContextAlloc(limit_cache_context, tenant_size + meter_size);

	memcpy(names, tenant, tenant_size);
	memcpy(names + tenant_size, meter, meter_size);
	*meter_copy = names + tenant_size;
	return names;
}

void
fm_load_limit_any(const char *tenant, const char *meter, bool read_only,
				  FmLimit *limit)
{
	FmTenantMeterKey key;
	LimitCacheEntry *entry;

	refresh_caches();

	key.tenant = tenant;
	key.meter = meter;
	entry = hash_search(limit_cache, &key, HASH_FIND, NULL);
	if (entry == NULL)
	{
		FmLimit		loaded;
		bool		from_shared = fm_shared_limit_get(watched_relids[0], tenant, meter,
													  &loaded);

		if (!from_shared)
		{
			/*
			 * Shared only when loaded with this backend's plan cache of the
			 * generation read here, and in a snapshot that shows every change
			 * that generation counts: one taken after the read (READ
			 * COMMITTED, not read-only: a fresh one), or an older one that
			 * saw every changer end (shared_limits.c).  A limit loaded from
			 * any other snapshot could carry the generation of a change it
			 * does not show.
			 */
			uint64		generation = fm_shared_limits_generation();
			bool		fresh = !read_only && !IsolationUsesXactSnapshot();
			bool		shareable = generation == limit_cache_generation &&
			(fresh || fm_shared_limits_seen_by(load_snapshot(read_only)));

			load_limit_from_catalog(tenant, meter, read_only, &loaded);
			if (shareable)
				fm_shared_limit_put(watched_relids[0], tenant, meter, generation, &loaded);
		}

		/*
		 * not kept when an invalidation arrived while loading, or the
		 * snapshot predates the last one (the shared cache's generation
		 * proves a shared entry current)
		 */
		if (from_shared ? !limit_cache_valid : !load_may_be_kept(read_only))
		{
			*limit = loaded;
			return;
		}
		/* the entry's key points at copies that live as long as the table */
		key.tenant = names_copy(tenant, meter, &key.meter);
		entry = hash_search(limit_cache, &key, HASH_ENTER, NULL);
		entry->limit = loaded;
	}
	*limit = entry->limit;
}

/*
 * limit_in_force(tenant, meter) -> the limit the calls use, as this
 * backend composed and cached it: what limit_config() defines, read the
 * way track and consume read it (the regression test catalog compares the
 * two; an operator can ask what a backend sees).
 */
PG_FUNCTION_INFO_V1(fm_limit_in_force);
Datum
fm_limit_in_force(PG_FUNCTION_ARGS)
{
	char	   *tenant = fm_arg_tenant(fcinfo, 0);
	char	   *meter = fm_arg_meter(fcinfo, 1);
	FmLimit		limit;
	TupleDesc	desc;
	Datum		values[7];
	bool		nulls[7] = {false, false, false, false, false, false, false};
	Datum	   *elems;
	int			i;

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "limit_in_force must return a record");
	desc = BlessTupleDesc(desc);
	fm_load_limit(tenant, meter, true, &limit);

	elems = palloc(sizeof(Datum) * Max(limit.nthresholds, 1));
	for (i = 0; i < limit.nthresholds; i++)
		elems[i] = Int32GetDatum(limit.thresholds[i]);
	values[0] = CStringGetTextDatum(fm_aggregation_name(limit.aggregation));
	values[1] = Int64GetDatum(limit.quota);
	nulls[1] = !limit.limited;
	values[2] = CStringGetTextDatum(fm_period_kind_name(limit.period));
	values[3] = CStringGetTextDatum(limit.hard ? "hard" : "soft");
	values[4] = PointerGetDatum(construct_array(elems, limit.nthresholds, INT4OID, 4,
												true, TYPALIGN_INT));
	values[5] = TimestampTzGetDatum(limit.anchor);
	values[6] = CStringGetTextDatum(pg_get_timezone_name(limit.tz));
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
}

/*
 * config_changed(): statement trigger of the catalog tables; see above.
 */
PG_FUNCTION_INFO_V1(fm_config_changed);
Datum
fm_config_changed(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("flagmeter.config_changed() must be called as a trigger")));
	CacheInvalidateRelcache(trigdata->tg_relation);
	fm_shared_limits_changed();
	return PointerGetDatum(NULL);
}

/*
 * the meter's aggregation, plan $1's limit for meter $2 (no row: no such
 * meter), the meter's pool with its rate as an exact fraction, and the
 * plan's rate limit for the meter
 */
static FmStatement plan_limit_stmt = {
	"SELECT m.aggregation, l.quota, l.period, l.mode, l.thresholds, m.draws,"
	" (m.rate OPERATOR(pg_catalog.*) pg_catalog.power(10::pg_catalog.numeric,"
	"   pg_catalog.scale(m.rate)))::pg_catalog.int8,"
	" pg_catalog.power(10::pg_catalog.numeric, pg_catalog.scale(m.rate))::pg_catalog.int8,"
	" r.rate, r.per, r.burst"
	" FROM flagmeter.meters m"
	" LEFT JOIN flagmeter.limits l"
	"   ON l.plan OPERATOR(pg_catalog.=) $1 AND l.meter OPERATOR(pg_catalog.=) m.meter"
	" LEFT JOIN flagmeter.rate_limits r"
	"   ON r.plan OPERATOR(pg_catalog.=) $1 AND r.meter OPERATOR(pg_catalog.=) m.meter"
	" WHERE m.meter OPERATOR(pg_catalog.=) $2",
	2, {TEXTOID, TEXTOID}
};

/*
 * A rate limit's columns (rate, per, burst) in limit form; the tables'
 * constraint keeps them valid, so fm_rate_from_args only converts.
 */
static void
rate_limit_from_columns(Datum rate, Datum per, Datum burst, FmRate *out)
{
	fm_rate_from_args(DatumGetInt64(rate), DatumGetIntervalP(per), DatumGetInt64(burst), out);
}

/* An integer[] of thresholds into limit form; errors past FM_MAX_THRESHOLDS. */
static void
thresholds_from_array(Datum d, const char *tenant, const char *meter,
					  int *thresholds, int *nthresholds)
{
	ArrayType  *arr = DatumGetArrayTypeP(d);
	Datum	   *elems;
	int			n;
	int			i;

	deconstruct_array(arr, INT4OID, 4, true, TYPALIGN_INT, &elems, NULL, &n);
	if (n > FM_MAX_THRESHOLDS)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("the limit of tenant \"%s\" for meter \"%s\" has %d thresholds", tenant, meter, n),
				 errdetail("A limit has at most %d thresholds.", FM_MAX_THRESHOLDS)));
	*nthresholds = n;
	for (i = 0; i < n; i++)
		thresholds[i] = DatumGetInt32(elems[i]);
}

static const PlanLimitEntry *
plan_limit(const char *plan, const char *tenant, const char *meter, bool read_only)
{
	PlanLimitKey key;
	PlanLimitEntry *entry;
	PlanLimitEntry loaded;
	Datum		args[2];
	char		nulls[2] = {' ', ' '};
	HeapTuple	row;
	TupleDesc	desc;
	bool		isnull;
	Datum		d;

	memset(&key, 0, sizeof(key));
	if (plan)
		strlcpy(key.plan, plan, sizeof(key.plan));
	strlcpy(key.meter, meter, sizeof(key.meter));
	entry = hash_search(plan_limit_cache, &key, HASH_FIND, NULL);
	if (entry)
		return entry;

	memset(&loaded, 0, sizeof(loaded));
	args[0] = plan ? CStringGetTextDatum(plan) : (Datum) 0;
	nulls[0] = plan ? ' ' : 'n';
	args[1] = CStringGetTextDatum(meter);
	SPI_connect();
	fm_execute(&plan_limit_stmt, args, nulls, read_only, 1);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("meter \"%s\" does not exist", meter),
				 errhint("Define it first with flagmeter.define_meter().")));
	row = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	loaded.aggregation =
		fm_aggregation_from_name(TextDatumGetCString(SPI_getbinval(row, desc, 1, &isnull)));
	d = SPI_getbinval(row, desc, 2, &isnull);
	loaded.limited = !isnull;
	if (loaded.limited)
	{
		loaded.quota = DatumGetInt64(d);
		loaded.period =
			fm_period_kind_from_name(TextDatumGetCString(SPI_getbinval(row, desc, 3, &isnull)));
		loaded.hard =
			strcmp(TextDatumGetCString(SPI_getbinval(row, desc, 4, &isnull)), "hard") == 0;
		thresholds_from_array(SPI_getbinval(row, desc, 5, &isnull), tenant, meter,
							  loaded.thresholds, &loaded.nthresholds);
	}
	d = SPI_getbinval(row, desc, 6, &isnull);
	if (!isnull)
	{
		strlcpy(loaded.pool, TextDatumGetCString(d), sizeof(loaded.pool));
		loaded.rate_num = DatumGetInt64(SPI_getbinval(row, desc, 7, &isnull));
		loaded.rate_den = DatumGetInt64(SPI_getbinval(row, desc, 8, &isnull));
	}
	d = SPI_getbinval(row, desc, 9, &isnull);
	if (!isnull)
	{
		bool		per_null;
		bool		burst_null;

		rate_limit_from_columns(d, SPI_getbinval(row, desc, 10, &per_null),
								SPI_getbinval(row, desc, 11, &burst_null), &loaded.rate_limit);
	}
	SPI_finish();

	/*
	 * not kept when an invalidation arrived while loading, or the snapshot
	 * predates the last one
	 */
	if (!load_may_be_kept(read_only))
	{
		entry = palloc(sizeof(PlanLimitEntry));
		*entry = loaded;
		return entry;
	}
	entry = hash_search(plan_limit_cache, &key, HASH_ENTER, NULL);
	loaded.key = entry->key;
	*entry = loaded;
	return entry;
}

/*
 * The limit in force, as flagmeter.limit_config() defines it (the one
 * definition, in SQL; the regression test catalog compares the two over
 * every kind of configuration through flagmeter.limit_in_force()):
 * the tenant's override, field by field, else the plan's limit, else
 * unlimited; period month, mode hard and thresholds {80,100} where neither
 * says; a tenant with no plan counts in calendar months (anchor
 * 2000-01-01) in UTC.  The tenant's row and override are read by primary
 * key (pk_scan.c), the plan's part from plan_limit's cache; so is whether
 * the tenant was ever granted credits on the meter (credit_accounts).
 */
static void
load_limit_from_catalog(const char *tenant, const char *meter, bool read_only,
						FmLimit *limit)
{
	static const char *const tenant_columns[] = {"plan", "anchor", "timezone"};
	static const char *const override_columns[] = {"quota", "period", "mode", "thresholds"};
	const char *keys[2] = {tenant, meter};
	Datum		t[3];
	bool		tnull[3];
	Datum		o[4];
	bool		onull[4];
	bool		assigned;
	bool		overridden = false;
	static const char *const account_columns[] = {"grants", "reservations"};
	Datum		a[2];
	bool		anull[2];
	bool		account;
	static const char *const rate_columns[] = {"rate", "per", "burst"};
	Datum		r[3];
	bool		rnull[3];
	bool		rate_overridden = false;
	const PlanLimitEntry *pl;
	Snapshot	snapshot;

	snapshot = read_only ? load_snapshot(true) : RegisterSnapshot(load_snapshot(false));
	assigned = fm_pk_fetch("tenants", 1, keys, snapshot, 3, tenant_columns, t, tnull);
	if (assigned)
	{
		overridden = fm_pk_fetch("overrides", 2, keys, snapshot, 4, override_columns,
								 o, onull);
		rate_overridden = fm_pk_fetch("rate_overrides", 2, keys, snapshot, 3, rate_columns,
									  r, rnull);
	}
	account = fm_pk_fetch("credit_accounts", 2, keys, snapshot, 2, account_columns, a, anull);
	if (!read_only)
		UnregisterSnapshot(snapshot);

	pl = plan_limit(assigned ? TextDatumGetCString(t[0]) : NULL, tenant, meter, read_only);

	memset(limit, 0, sizeof(*limit));
	limit->assigned = assigned;
	limit->aggregation = pl->aggregation;
	/* grants are units of sum and count meters only (grant_credits says so) */
	limit->grants = account && DatumGetBool(a[0]) &&
		(pl->aggregation == FM_AGG_SUM || pl->aggregation == FM_AGG_COUNT);
	limit->reserves = account && DatumGetBool(a[1]) && pl->aggregation == FM_AGG_SUM;
	limit->limited = overridden || pl->limited;
	limit->quota = overridden ? DatumGetInt64(o[0]) : pl->quota;
	if (overridden && !onull[1])
		limit->period = fm_period_kind_from_name(TextDatumGetCString(o[1]));
	else
		limit->period = pl->limited ? pl->period : FM_PERIOD_MONTH;
	if (overridden && !onull[2])
		limit->hard = strcmp(TextDatumGetCString(o[2]), "hard") == 0;
	else
		limit->hard = pl->limited ? pl->hard : true;
	if (overridden && !onull[3])
		thresholds_from_array(o[3], tenant, meter, limit->thresholds, &limit->nthresholds);
	else if (pl->limited)
	{
		limit->nthresholds = pl->nthresholds;
		memcpy(limit->thresholds, pl->thresholds, sizeof(int) * pl->nthresholds);
	}
	else
	{
		limit->nthresholds = 2;
		limit->thresholds[0] = 80;
		limit->thresholds[1] = 100;
	}
	strlcpy(limit->pool, pl->pool, sizeof(limit->pool));
	limit->rate_num = pl->rate_num;
	limit->rate_den = pl->rate_den;
	if (rate_overridden)
		rate_limit_from_columns(r[0], r[1], r[2], &limit->rate_limit);
	else
		limit->rate_limit = pl->rate_limit;
	limit->fingerprint = fm_limit_fingerprint(limit);
	limit->anchor = assigned ? DatumGetTimestampTz(t[1]) : FM_UNASSIGNED_ANCHOR;
	limit->tz = fm_lookup_timezone(assigned ? TextDatumGetCString(t[2]) : "UTC");
}
