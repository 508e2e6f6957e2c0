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
 */
#include "postgres.h"
#include "fmgr.h"

#include "access/xact.h"
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

static HTAB *feature_cache = NULL;
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

/* The answer as the tables give it, in the active snapshot. */
static FeatureAnswer
read_feature(const char *tenant, const char *feature)
{
	static const char *const exists_columns[] = {"feature"};
	static const char *const plan_columns[] = {"plan"};
	static const char *const row_columns[] = {"enabled", "config"};
	Snapshot	snapshot = GetActiveSnapshot();
	const char *feature_key[1] = {feature};
	const char *tenant_key[1] = {tenant};
	const char *override_key[2] = {tenant, feature};
	const char *plan_key[2];
	Datum		values[2];
	bool		nulls[2];
	FeatureAnswer answer = {false, NULL};
	bool		found;

	if (!fm_pk_fetch("features", 1, feature_key, snapshot, 1, exists_columns,
					 values, nulls))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("feature \"%s\" does not exist", feature),
				 errhint("Define it first with flagmeter.define_feature().")));
	if (!fm_pk_fetch("tenants", 1, tenant_key, snapshot, 1, plan_columns, values, nulls))
		return answer;			/* no plan, so no override either */

	plan_key[0] = TextDatumGetCString(values[0]);
	plan_key[1] = feature;
	found = fm_pk_fetch("feature_overrides", 2, override_key, snapshot, 2, row_columns,
						values, nulls);
	if (!found)
		found = fm_pk_fetch("plan_features", 2, plan_key, snapshot, 2, row_columns,
							values, nulls);
	if (found)
	{
		answer.enabled = DatumGetBool(values[0]);
		if (answer.enabled && !nulls[1])
			answer.config = DatumGetJsonbP(values[1]);
	}
	return answer;
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

	answer = read_feature(tenant, feature);
	/* an invalidation may have arrived while reading: then it is not kept */
	if (use_cache && statement_may_store && cache_valid)
	{
		MemoryContext old = MemoryContextSwitchTo(cache_cxt);

		entry = hash_search(feature_cache, &key, HASH_ENTER, NULL);
		entry->enabled = answer.enabled;
		entry->config = answer.config == NULL ? NULL :
			DatumGetJsonbP(datumCopy(JsonbPGetDatum(answer.config), false, -1));
		MemoryContextSwitchTo(old);
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
