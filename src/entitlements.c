/*
 * entitlements.c
 *	  has_feature() and feature_config(): whether a tenant may use a
 *	  feature, and its configuration value, fast enough for a WHERE clause
 *	  or a row-level-security policy of the app's own tables.
 *
 * The answer is the tenant's override of the feature, else its plan's row
 * for it, else not granted (flagmeter.tenant_features is the same rule in
 * SQL, and the regression test compares the two).  An unknown feature is
 * an error (42704); a tenant with no plan and no override is not granted.
 *
 * What each snapshot sees.  Under READ COMMITTED an answer is read in the
 * statement's snapshot and kept in a per-backend cache.  The feature
 * tables, tenants and plans carry flagmeter.config_changed(), which sends
 * a relcache invalidation at commit; the first call of each statement
 * accepts pending invalidations, and any of ours empties the cache, so a
 * statement sees every change committed before it started (and its own
 * transaction's earlier changes) and no later one, for all its rows.  An
 * answer read in a statement during which an invalidation arrived is not
 * kept: its snapshot may predate the change the invalidation is for.
 * Under REPEATABLE READ and SERIALIZABLE every call reads in the
 * transaction's snapshot and the cache is not used, so the answer is the
 * snapshot's, as a query of the tables would give it.
 *
 * What a miss reads.  An answer derives from four rows: the feature's (it
 * must exist), the tenant's (its plan), the tenant's override and the
 * plan's row.  Read each time, a tenant met for the first time cost four
 * primary-key reads, and in a policy over many tenants most calls are
 * such misses.  The rows shared by many tenants are cached apart, under
 * the same rule as the answers: features and plans' rows as they are
 * read, and every override, from one scan of flagmeter.feature_overrides
 * when it holds at most OVERRIDES_SCAN_MAX rows (past that, each is read).
 * A tenant met for the first time then costs one read: its row in
 * flagmeter.tenants.
 */
#include "postgres.h"
#include "fmgr.h"

#include "access/xact.h"
#include "common/hashfn.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "args.h"
#include "compat.h"
#include "entitlements.h"
#include "limit.h"
#include "pk_scan.h"
#include "statements.h"

typedef struct FeatureCacheKey
{
	char		tenant[FM_TENANT_MAX_BYTES + 1];
	char		feature[FM_NAME_MAX_BYTES + 1];
} FeatureCacheKey;

typedef struct FeatureCacheEntry
{
	FeatureCacheKey key;
	bool		enabled;
	Jsonb	   *config;			/* NULL: none (or not granted); in cache_cxt */
} FeatureCacheEntry;

/* The answer for one tenant and feature. */
typedef struct FeatureAnswer
{
	bool		enabled;
	Jsonb	   *config;
} FeatureAnswer;

#define FEATURE_CACHE_MAX 100000

/* a feature that exists (flagmeter.features) */
typedef struct KnownFeatureEntry
{
	char		feature[FM_NAME_MAX_BYTES + 1];
} KnownFeatureEntry;

/* what a plan's row for a feature grants (not granted: no row) */
typedef struct PlanRowKey
{
	char		plan[FM_NAME_MAX_BYTES + 1];
	char		feature[FM_NAME_MAX_BYTES + 1];
} PlanRowKey;

typedef struct PlanRowEntry
{
	PlanRowKey	key;
	FeatureAnswer answer;		/* config in cache_cxt */
} PlanRowEntry;

/*
 * Every override, when there are few: keyed by a hash of the tenant's name
 * and the feature, so that an entry takes about a hundred bytes whatever
 * the name's length; the entry keeps the name to tell two tenants of one
 * hash apart (a tenant whose hash another's entry holds is read).
 */
typedef struct OverrideKey
{
	uint64		tenant_hash;
	char		feature[FM_NAME_MAX_BYTES + 1];
} OverrideKey;

typedef struct OverrideEntry
{
	OverrideKey key;
	char	   *tenant;			/* in cache_cxt */
	bool		shared_hash;	/* two tenants' overrides: read either */
	FeatureAnswer answer;		/* config in cache_cxt */
} OverrideEntry;

/* more overrides than this: each is read on its own */
#define OVERRIDES_SCAN_MAX 10000

static HTAB *feature_cache = NULL;
static HTAB *known_features = NULL;
static HTAB *plan_rows = NULL;
static HTAB *all_overrides = NULL;	/* NULL: not scanned (or too many) */
static bool overrides_scanned = false;
static MemoryContext cache_cxt = NULL;
static bool cache_valid = false;
static Oid	watched_relids[5];

/* the statement the calls belong to, and whether it may fill the cache */
static LocalTransactionId statement_lxid = InvalidLocalTransactionId;
static TimestampTz statement_start = 0;
static bool statement_may_store = false;

/*
 * Keys hash and compare by their strings, not as 320-byte blobs: in a
 * policy evaluated per row the lookup is most of the call.
 */
static uint32
feature_key_hash(const void *key, Size keysize)
{
	const FeatureCacheKey *k = key;

	return fm_tenant_meter_hash(k->tenant, k->feature);
}

static int
feature_key_match(const void *key1, const void *key2, Size keysize)
{
	const FeatureCacheKey *a = key1;
	const FeatureCacheKey *b = key2;

	return strcmp(a->tenant, b->tenant) != 0 || strcmp(a->feature, b->feature) != 0;
}

static void
features_relcache_callback(Datum arg, Oid relid)
{
	int			i;
	bool		ours = (relid == InvalidOid);

	for (i = 0; !ours && i < (int) lengthof(watched_relids); i++)
		ours = (watched_relids[i] == relid);
	if (ours)
	{
		cache_valid = false;
		statement_may_store = false;
	}
}

void
fm_features_init(void)
{
	CacheRegisterRelcacheCallback(features_relcache_callback, (Datum) 0);
}

/* A hash table of cache_cxt keyed by a fixed-size blob or string. */
static HTAB *
create_cache_table(const char *name, Size keysize, Size entrysize, int flags)
{
	HASHCTL		ctl;

	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = keysize;
	ctl.entrysize = entrysize;
	ctl.hcxt = cache_cxt;
	return hash_create(name, 64, &ctl, flags | HASH_ELEM | HASH_CONTEXT);
}

static void
reset_feature_cache(void)
{
	static const char *const watched[] = {"features", "plan_features", "feature_overrides",
	"tenants", "plans"};
	HASHCTL		ctl;
	int			i;

	if (cache_cxt == NULL)
		cache_cxt = AllocSetContextCreate(CacheMemoryContext, "flagmeter features",
										  ALLOCSET_DEFAULT_SIZES);
	else
		MemoryContextReset(cache_cxt);
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(FeatureCacheKey);
	ctl.entrysize = sizeof(FeatureCacheEntry);
	ctl.hash = feature_key_hash;
	ctl.match = feature_key_match;
	ctl.hcxt = cache_cxt;
	feature_cache = hash_create("flagmeter features", 256, &ctl,
								HASH_ELEM | HASH_FUNCTION | HASH_COMPARE | HASH_CONTEXT);
	known_features = create_cache_table("flagmeter known features",
										sizeof(KnownFeatureEntry), sizeof(KnownFeatureEntry),
										HASH_STRINGS);
	plan_rows = create_cache_table("flagmeter plan features", sizeof(PlanRowKey),
								   sizeof(PlanRowEntry), HASH_BLOBS);
	all_overrides = NULL;
	overrides_scanned = false;
	for (i = 0; i < (int) lengthof(watched); i++)
		watched_relids[i] = fm_relation_oid(watched[i]);
	cache_valid = true;
}

/*
 * On the first call of a statement: accept the invalidations committed
 * before it, and say whether what it reads may be kept (see the header).
 */
static void
begin_statement(void)
{
	TimestampTz start = GetCurrentStatementStartTimestamp();

	if (start == statement_start && FM_MY_LOCAL_XID == statement_lxid)
		return;
	statement_start = start;
	statement_lxid = FM_MY_LOCAL_XID;
	statement_may_store = true;
	AcceptInvalidationMessages();	/* ours clear statement_may_store */
}

/* What a read may keep: READ COMMITTED, and no invalidation meanwhile. */
static bool
may_store(bool use_cache)
{
	return use_cache && statement_may_store && cache_valid;
}

/* A row's enabled and config columns (values[0], values[1]) as an answer. */
static FeatureAnswer
answer_of_row(const Datum *values, const bool *nulls)
{
	FeatureAnswer answer = {DatumGetBool(values[0]), NULL};

	if (answer.enabled && !nulls[1])
		answer.config = DatumGetJsonbP(values[1]);
	return answer;
}

static Jsonb *
copy_to_cache(Jsonb *config)
{
	MemoryContext old;
	Jsonb	   *copy;

	if (config == NULL)
		return NULL;
	old = MemoryContextSwitchTo(cache_cxt);
	copy = DatumGetJsonbP(datumCopy(JsonbPGetDatum(config), false, -1));
	MemoryContextSwitchTo(old);
	return copy;
}

/* 42704 unless the feature exists in snapshot. */
static void
check_feature_exists(const char *feature, Snapshot snapshot, bool use_cache)
{
	static const char *const columns[] = {"feature"};
	const char *key[1] = {feature};
	Datum		value;
	bool		isnull;

	if (use_cache && hash_search(known_features, feature, HASH_FIND, NULL))
		return;
	if (!fm_pk_fetch("features", 1, key, snapshot, 1, columns, &value, &isnull))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("feature \"%s\" does not exist", feature),
				 errhint("Define it first with flagmeter.define_feature().")));
	if (may_store(use_cache))
		hash_search(known_features, feature, HASH_ENTER, NULL);
}

static OverrideKey
override_key(const char *tenant, const char *feature)
{
	OverrideKey key;

	memset(&key, 0, sizeof(key));
	key.tenant_hash = hash_bytes_extended((const unsigned char *) tenant, strlen(tenant), 0);
	strlcpy(key.feature, feature, sizeof(key.feature));
	return key;
}

/*
 * Every override into all_overrides, by one scan in snapshot (see the
 * header); all_overrides stays NULL when there are more than
 * OVERRIDES_SCAN_MAX.
 */
static void
scan_overrides(Snapshot snapshot)
{
	FmPkScan	s;
	AttrNumber	tenant_attnum,
				feature_attnum,
				enabled_attnum,
				config_attnum;
	HTAB	   *rows = create_cache_table("flagmeter feature overrides",
										  sizeof(OverrideKey), sizeof(OverrideEntry),
										  HASH_BLOBS);
	long		nrows = 0;

	fm_pk_scan_begin(&s, "feature_overrides", 0, NULL, NULL, snapshot);
	tenant_attnum = fm_pk_scan_attnum(&s, "tenant");
	feature_attnum = fm_pk_scan_attnum(&s, "feature");
	enabled_attnum = fm_pk_scan_attnum(&s, "enabled");
	config_attnum = fm_pk_scan_attnum(&s, "config");
	while (fm_pk_scan_next(&s))
	{
		Datum		values[2];
		bool		nulls[2];
		bool		isnull;
		char	   *tenant;
		OverrideKey key;
		OverrideEntry *entry;
		bool		found;

		if (++nrows > OVERRIDES_SCAN_MAX)
		{
			elog(DEBUG1, "flagmeter: more than %d feature overrides, each is read on its own",
				 OVERRIDES_SCAN_MAX);
			hash_destroy(rows);
			rows = NULL;
			break;
		}
		tenant = TextDatumGetCString(slot_getattr(s.slot, tenant_attnum, &isnull));
		key = override_key(tenant,
						   TextDatumGetCString(slot_getattr(s.slot, feature_attnum, &isnull)));
		entry = hash_search(rows, &key, HASH_ENTER, &found);
		if (found)
		{
			entry->shared_hash = true;
			continue;
		}
		entry->tenant = MemoryContextStrdup(cache_cxt, tenant);
		entry->shared_hash = false;
		values[0] = slot_getattr(s.slot, enabled_attnum, &nulls[0]);
		values[1] = slot_getattr(s.slot, config_attnum, &nulls[1]);
		entry->answer = answer_of_row(values, nulls);
		entry->answer.config = copy_to_cache(entry->answer.config);
	}
	fm_pk_scan_end(&s);
	all_overrides = rows;
}

/* The tenant's override of the feature; false when it has none. */
static bool
read_override(const char *tenant, const char *feature, Snapshot snapshot, bool use_cache,
			  FeatureAnswer *answer)
{
	static const char *const columns[] = {"enabled", "config"};
	const char *key[2] = {tenant, feature};
	Datum		values[2];
	bool		nulls[2];

	if (!overrides_scanned && may_store(use_cache))
	{
		scan_overrides(snapshot);
		/* an invalidation during the scan empties what it kept */
		overrides_scanned = may_store(use_cache);
		if (!overrides_scanned)
			all_overrides = NULL;
	}
	if (use_cache && all_overrides)
	{
		OverrideKey cache_key = override_key(tenant, feature);
		OverrideEntry *entry = hash_search(all_overrides, &cache_key, HASH_FIND, NULL);

		if (entry == NULL)
			return false;
		if (!entry->shared_hash && strcmp(entry->tenant, tenant) == 0)
		{
			*answer = entry->answer;
			return true;
		}
	}
	if (!fm_pk_fetch("feature_overrides", 2, key, snapshot, 2, columns, values, nulls))
		return false;
	*answer = answer_of_row(values, nulls);
	return true;
}

/* What the plan's row for the feature grants; not granted when it has none. */
static FeatureAnswer
read_plan_row(const char *plan, const char *feature, Snapshot snapshot, bool use_cache)
{
	static const char *const columns[] = {"enabled", "config"};
	const char *key[2] = {plan, feature};
	PlanRowKey	cache_key;
	PlanRowEntry *entry;
	Datum		values[2];
	bool		nulls[2];
	FeatureAnswer answer = {false, NULL};

	memset(&cache_key, 0, sizeof(cache_key));
	strlcpy(cache_key.plan, plan, sizeof(cache_key.plan));
	strlcpy(cache_key.feature, feature, sizeof(cache_key.feature));
	if (use_cache)
	{
		entry = hash_search(plan_rows, &cache_key, HASH_FIND, NULL);
		if (entry)
			return entry->answer;
	}
	if (fm_pk_fetch("plan_features", 2, key, snapshot, 2, columns, values, nulls))
		answer = answer_of_row(values, nulls);
	if (may_store(use_cache))
	{
		entry = hash_search(plan_rows, &cache_key, HASH_ENTER, NULL);
		entry->answer.enabled = answer.enabled;
		entry->answer.config = copy_to_cache(answer.config);
	}
	return answer;
}

/*
 * The answer as the tables give it in the active snapshot, read through
 * the row caches when use_cache (see the header).
 */
static FeatureAnswer
read_feature(const char *tenant, const char *feature, bool use_cache)
{
	static const char *const plan_columns[] = {"plan"};
	Snapshot	snapshot = GetActiveSnapshot();
	const char *tenant_key[1] = {tenant};
	Datum		plan_datum;
	bool		plan_null;
	FeatureAnswer answer = {false, NULL};
	char	   *plan;

	check_feature_exists(feature, snapshot, use_cache);
	if (!fm_pk_fetch("tenants", 1, tenant_key, snapshot, 1, plan_columns, &plan_datum,
					 &plan_null))
		return answer;			/* no plan, so no override either */
	plan = TextDatumGetCString(plan_datum);
	if (read_override(tenant, feature, snapshot, use_cache, &answer))
		return answer;
	return read_plan_row(plan, feature, snapshot, use_cache);
}

static FeatureAnswer
lookup_feature(const char *tenant, const char *feature)
{
	FeatureCacheKey key;
	FeatureCacheEntry *entry;
	FeatureAnswer answer;
	bool		use_cache;

	begin_statement();
	use_cache = !IsolationUsesXactSnapshot();
	if (use_cache)
	{
		if (!cache_valid || feature_cache == NULL ||
			hash_get_num_entries(feature_cache) > FEATURE_CACHE_MAX)
			reset_feature_cache();
		strlcpy(key.tenant, tenant, sizeof(key.tenant));
		strlcpy(key.feature, feature, sizeof(key.feature));
		entry = hash_search(feature_cache, &key, HASH_FIND, NULL);
		if (entry)
		{
			answer.enabled = entry->enabled;
			answer.config = entry->config;
			return answer;
		}
	}

	answer = read_feature(tenant, feature, use_cache);
	/* an invalidation may have arrived while reading: then it is not kept */
	if (may_store(use_cache))
	{
		entry = hash_search(feature_cache, &key, HASH_ENTER, NULL);
		entry->enabled = answer.enabled;
		entry->config = copy_to_cache(answer.config);
	}
	return answer;
}

/* The (tenant, feature) arguments, checked as every call checks them. */
static void
feature_args(FunctionCallInfo fcinfo, char **tenant, char **feature)
{
	*tenant = fm_arg_tenant(fcinfo, 0);
	*feature = text_to_cstring(PG_GETARG_TEXT_PP(1));
	fm_check_feature_name(*feature);
}

/* has_feature(tenant, feature) -> boolean */
PG_FUNCTION_INFO_V1(fm_has_feature);
Datum
fm_has_feature(PG_FUNCTION_ARGS)
{
	char	   *tenant;
	char	   *feature;

	feature_args(fcinfo, &tenant, &feature);
	PG_RETURN_BOOL(lookup_feature(tenant, feature).enabled);
}

/* feature_config(tenant, feature) -> jsonb, NULL when none or not granted */
PG_FUNCTION_INFO_V1(fm_feature_config);
Datum
fm_feature_config(PG_FUNCTION_ARGS)
{
	char	   *tenant;
	char	   *feature;
	FeatureAnswer answer;

	feature_args(fcinfo, &tenant, &feature);
	answer = lookup_feature(tenant, feature);
	if (answer.config == NULL)
		PG_RETURN_NULL();
	/* a copy: the cache may be emptied while the caller still holds it */
	PG_RETURN_DATUM(datumCopy(JsonbPGetDatum(answer.config), false, -1));
}
