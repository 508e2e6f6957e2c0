/*
 * limits.c
 *	  The limit in force for a tenant and meter (read through
 *	  flagmeter.limit_config, the one definition of it), the decision a
 *	  limit gives, and the argument checks shared by every call.
 */
#include "postgres.h"
#include "fmgr.h"

#include "catalog/pg_type.h"
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
#include "utils/timestamp.h"

#include "compat.h"
#include "counter.h"
#include "limits.h"
#include "statements.h"


static FmStatement load_limit_stmt = {
	"SELECT aggregation, quota, period, mode, thresholds, anchor, timezone"
	" FROM flagmeter.limit_config($1, $2)",
	2, {TEXTOID, TEXTOID}
};

static FmAggregation
aggregation_from_name(const char *name)
{
	if (strcmp(name, "sum") == 0)
		return FM_AGG_SUM;
	if (strcmp(name, "count") == 0)
		return FM_AGG_COUNT;
	if (strcmp(name, "max") == 0)
		return FM_AGG_MAX;
	if (strcmp(name, "latest") == 0)
		return FM_AGG_LATEST;
	elog(ERROR, "unknown aggregation \"%s\" in flagmeter.meters", name);
	return FM_AGG_SUM;			/* keep compiler quiet */
}

/*
 * The per-backend cache of limits.
 *
 * The catalog tables (meters, plans, limits, tenants, overrides) carry a
 * statement trigger, flagmeter.config_changed(), that sends a relcache
 * invalidation for the table: like every invalidation it reaches the other
 * backends when the change commits, and this backend at its next command.
 * Any of them empties the cache.  A call takes its first lock on
 * flagmeter.counters before it asks the cache, and taking a lock accepts
 * pending invalidations, so a call never runs on a configuration older than
 * the last change committed before that lock (recount_current_period
 * relies on this).
 */
typedef struct LimitCacheKey
{
	char		tenant[FM_TENANT_MAX_BYTES + 1];
	char		meter[FM_NAME_MAX_BYTES + 1];
} LimitCacheKey;

typedef struct LimitCacheEntry
{
	LimitCacheKey key;
	FmLimit		limit;
} LimitCacheEntry;

#define LIMIT_CACHE_MAX 100000

static HTAB *limit_cache = NULL;
static bool limit_cache_valid = false;
static Oid	watched_relids[5];

static void
limits_relcache_callback(Datum arg, Oid relid)
{
	int			i;

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
fm_limits_init(void)
{
	CacheRegisterRelcacheCallback(limits_relcache_callback, (Datum) 0);
}

static void
reset_limit_cache(void)
{
	static const char *const watched[] = {"meters", "plans", "limits", "tenants", "overrides"};
	HASHCTL		ctl;
	int			i;

	if (limit_cache)
		hash_destroy(limit_cache);
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(LimitCacheKey);
	ctl.entrysize = sizeof(LimitCacheEntry);
	limit_cache = hash_create("flagmeter limits", 256, &ctl, HASH_ELEM | HASH_BLOBS);
	for (i = 0; i < (int) lengthof(watched); i++)
		watched_relids[i] = fm_relation_oid(watched[i]);
	limit_cache_valid = true;
}

static void load_limit_from_catalog(const char *tenant, const char *meter,
									bool read_only, FmLimit *limit);

void
fm_load_limit(const char *tenant, const char *meter, bool read_only,
			  FmLimit *limit)
{
	LimitCacheKey key;
	LimitCacheEntry *entry;
	bool		found;

	if (!limit_cache_valid || limit_cache == NULL ||
		hash_get_num_entries(limit_cache) > LIMIT_CACHE_MAX)
		reset_limit_cache();

	memset(&key, 0, sizeof(key));
	strlcpy(key.tenant, tenant, sizeof(key.tenant));
	strlcpy(key.meter, meter, sizeof(key.meter));
	entry = hash_search(limit_cache, &key, HASH_FIND, NULL);
	if (entry == NULL)
	{
		FmLimit		loaded;

		load_limit_from_catalog(tenant, meter, read_only, &loaded);
		/* an invalidation may have arrived while loading: then do not keep it */
		if (!limit_cache_valid)
		{
			*limit = loaded;
			return;
		}
		entry = hash_search(limit_cache, &key, HASH_ENTER, &found);
		entry->limit = loaded;
	}
	*limit = entry->limit;
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
	return PointerGetDatum(NULL);
}

/* A hash of the fields the announcements of a usage level depend on. */
static int32
limit_fingerprint(const FmLimit *limit)
{
	struct
	{
		int64		quota;
		int32		aggregation;
		int32		nthresholds;
		bool		limited;
		bool		hard;
		int			thresholds[FM_MAX_THRESHOLDS];
	}			fields;

	memset(&fields, 0, sizeof(fields));		/* padding too */
	fields.quota = limit->quota;
	fields.aggregation = (int32) limit->aggregation;
	fields.nthresholds = limit->nthresholds;
	fields.limited = limit->limited;
	fields.hard = limit->hard;
	memcpy(fields.thresholds, limit->thresholds,
		   limit->nthresholds * sizeof(int));
	return (int32) hash_bytes((const unsigned char *) &fields, sizeof(fields));
}

static void
load_limit_from_catalog(const char *tenant, const char *meter, bool read_only,
						FmLimit *limit)
{
	Datum		args[2];
	HeapTuple	row;
	TupleDesc	desc;
	bool		isnull;
	Datum		d;

	args[0] = CStringGetTextDatum(tenant);
	args[1] = CStringGetTextDatum(meter);
	SPI_connect();
	fm_execute(&load_limit_stmt, args, NULL, read_only, 1);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("meter \"%s\" does not exist", meter),
				 errhint("Define it first with flagmeter.define_meter().")));

	row = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	memset(limit, 0, sizeof(*limit));

	limit->aggregation =
		aggregation_from_name(TextDatumGetCString(SPI_getbinval(row, desc, 1, &isnull)));
	d = SPI_getbinval(row, desc, 2, &isnull);
	limit->limited = !isnull;
	limit->quota = isnull ? 0 : DatumGetInt64(d);
	limit->period =
		fm_period_kind_from_name(TextDatumGetCString(SPI_getbinval(row, desc, 3, &isnull)));
	limit->hard =
		strcmp(TextDatumGetCString(SPI_getbinval(row, desc, 4, &isnull)), "hard") == 0;

	d = SPI_getbinval(row, desc, 5, &isnull);
	if (!isnull)
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
		limit->nthresholds = n;
		for (i = 0; i < n; i++)
			limit->thresholds[i] = DatumGetInt32(elems[i]);
	}

	limit->fingerprint = limit_fingerprint(limit);
	limit->anchor = DatumGetTimestampTz(SPI_getbinval(row, desc, 6, &isnull));
	limit->tz = fm_lookup_timezone(TextDatumGetCString(SPI_getbinval(row, desc, 7, &isnull)));
	SPI_finish();
}

int64
fm_used_of(const FmCounter *c, FmAggregation aggregation)
{
	switch (aggregation)
	{
		case FM_AGG_SUM:
			return c->used;
		case FM_AGG_COUNT:
			return c->events;
		case FM_AGG_MAX:
			return c->max_amount;
		case FM_AGG_LATEST:
			return (c->flags & FM_COUNTER_HAS_LATEST) ? c->latest : 0;
	}
	return 0;					/* keep compiler quiet */
}

/*
 * The decision for amount more on top of current.  With record, used and
 * remaining describe the state after recording when granted; otherwise
 * (check, or a denial) the current state.  Overflow of the counter is an
 * error here, before anything is written.
 */
void
fm_decide(const FmLimit *limit, const FmCounter *current, int64 amount,
		  TimestampTz at, TimestampTz period_end, bool record,
		  FmDecision *decision, FmCounter *after)
{
	FmCounter	next = *current;
	int64		used_after;

	fm_counter_report(fm_counter_add_event(&next, amount, at));
	used_after = fm_used_of(&next, limit->aggregation);

	decision->granted = !limit->limited || !limit->hard ||
		used_after <= limit->quota;
	decision->used = (record && decision->granted) ?
		used_after : fm_used_of(current, limit->aggregation);
	decision->limited = limit->limited;
	decision->quota = limit->quota;
	decision->remaining = 0;
	decision->overage = 0;
	if (limit->limited)
	{
		if (decision->used < limit->quota)
			decision->remaining = limit->quota - decision->used;
		else
			decision->overage = decision->used - limit->quota;
	}
	decision->resets = limit->period != FM_PERIOD_LIFETIME;
	decision->resets_at = period_end;
	if (after)
		*after = next;
}

/* ---------------------------------------------------------------------
 * Argument checks
 * ---------------------------------------------------------------------
 */
/* How many bytes of s to quote in a message: 64, never half a character. */
static int
clip(const char *s)
{
	return pg_mbcliplen(s, strlen(s), 64);
}

void
fm_check_tenant(const char *tenant)
{
	size_t		len = strlen(tenant);

	if (len == 0 || len > FM_TENANT_MAX_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid tenant id \"%.*s\"", clip(tenant), tenant),
				 errdetail("A tenant id is 1 to %d bytes long.", FM_TENANT_MAX_BYTES)));
}

/* Longer names cannot exist (flagmeter.check_name); say so plainly. */
void
fm_check_meter_name(const char *meter)
{
	if (strlen(meter) > FM_NAME_MAX_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_NAME),
				 errmsg("meter name is too long: \"%.*s...\"", clip(meter), meter),
				 errdetail("Meter names are at most %d characters.", FM_NAME_MAX_BYTES)));
}

void
fm_check_key(const char *key)
{
	size_t		len = strlen(key);

	if (len == 0 || len > FM_KEY_MAX_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid idempotency key \"%.*s\"", clip(key), key),
				 errdetail("An idempotency key is 1 to %d bytes long.", FM_KEY_MAX_BYTES)));
}

void
fm_check_amount(int64 amount, bool zero_allowed)
{
	if (amount < 0 || (amount == 0 && !zero_allowed))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg(zero_allowed ? "amount must not be negative: " INT64_FORMAT :
						"amount must be positive: " INT64_FORMAT, amount)));
}

void
fm_check_timestamp(TimestampTz ts)
{
	if (TIMESTAMP_NOT_FINITE(ts) || ts < FM_TS_MIN || ts > FM_TS_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("timestamp out of range"),
				 errdetail("Events must lie between 0001-01-01 and 9999-12-31 UTC.")));
}

static void
null_argument(const char *what)
{
	ereport(ERROR,
			(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
			 errmsg("%s must not be NULL", what)));
}

char *
fm_arg_tenant(FunctionCallInfo fcinfo, int argno)
{
	char	   *tenant;

	if (PG_ARGISNULL(argno))
		null_argument("tenant");
	tenant = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	fm_check_tenant(tenant);
	return tenant;
}

char *
fm_arg_meter(FunctionCallInfo fcinfo, int argno)
{
	char	   *meter;

	if (PG_ARGISNULL(argno))
		null_argument("meter");
	meter = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	fm_check_meter_name(meter);
	return meter;
}

/* NULL when the argument is NULL (no key) */
char *
fm_arg_key(FunctionCallInfo fcinfo, int argno)
{
	char	   *key;

	if (PG_NARGS() <= argno || PG_ARGISNULL(argno))
		return NULL;
	key = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	fm_check_key(key);
	return key;
}
