/*
 * shared_limits.c
 *	  The limit cache all backends share, when flagmeter is in
 *	  shared_preload_libraries.
 *
 * Each backend caches the limits it used (limit_lookup.c).  Over many tenants
 * that cache stays cold: with 32 backends and 10 000 tenants a backend
 * meets a tenant for the first time on most of its calls for minutes, and
 * a miss (the tenant's row and override read by primary key) was a sixth
 * of track's time.  This table holds the limits any backend loaded, so a
 * tenant is read from the catalog about once, not once per backend.
 *
 * Invalidation.  Entries carry the generation they were loaded in, and any
 * change of the configuration tables bumps the generation once, at the
 * commit of the transaction that made it (fm_shared_limits_changed, called
 * by the tables' trigger; the commit callback runs after the commit is
 * visible, and before the transaction's locks are released and its
 * invalidations sent, so a backend that takes them finds the generation
 * already bumped).  Until then, that transaction neither reads nor stores
 * shared entries: it sees its own changes, which others must not.  Such a
 * transaction cannot be prepared (its COMMIT
 * PREPARED would run no callback of ours).  A backend reads the generation
 * before it takes the snapshot it loads a limit in and stores the limit with that generation:
 * a limit loaded from a snapshot older than a change carries a generation
 * older than the bump that followed the change, and is never used.
 *
 * Read-only (check, usage, the status view) and REPEATABLE READ calls load
 * in a snapshot taken before they read the generation.  Such a snapshot may
 * miss a change whose bump that generation already counts, so its limit is
 * stored only when the snapshot provably sees every change counted: each
 * bump first records the next transaction id (changed_below), and a
 * snapshot whose xmin is at or past it saw every transaction that had an
 * id by then end, the changers among them, before it was taken.  A
 * snapshot older than that (a long transaction running across a change)
 * uses its limit in that call and shares it with no one (nor keeps it in
 * its own backend: limit_lookup.c).  Before this, check over
 * 10 000 tenants read three catalog rows on each first meeting of a tenant
 * in each backend, a fifth of its time.
 *
 * So the shared cache keeps the promise of the per-backend one
 * (limit_lookup.c): a call never runs on a configuration older than the
 * last change committed before its lock on flagmeter.counters.
 *
 * Entries are keyed by database and by the OID of a table of the extension
 * (the configuration is per database, and a dropped and re-created
 * extension starts afresh), then tenant and meter.
 *
 * The table has flagmeter.shared_limits entries.  When it is full, the
 * entries of older generations are swept, once per generation: a sweep
 * reads the whole table under the exclusive lock, and repeating it on every
 * miss of a table full of current entries (more tenants than it holds)
 * made each miss wait for all the others (a seventh to a sixteenth of the
 * rate).  After that, a limit that finds no room is not shared (counted in
 * not_stored) and its backend keeps it in its own cache.
 */
#include "postgres.h"
#include "fmgr.h"
#include "funcapi.h"

#include "access/transam.h"
#include "access/xact.h"
#include "common/hashfn.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"

#include "bounds.h"
#include "limit.h"
#include "period.h"
#include "shared_limits.h"

/* a time zone name longer than this is not shared (none of the IANA names is) */
#define FM_SHARED_TZ_NAME_MAX 64

typedef struct SharedLimitKey
{
	Oid			database;
	Oid			scope;			/* the extension's incarnation in it */
	char		tenant[FM_TENANT_MAX_BYTES + 1];
	char		meter[FM_NAME_MAX_BYTES + 1];
} SharedLimitKey;

typedef struct SharedLimitEntry
{
	SharedLimitKey key;
	uint64		generation;
	FmLimit		limit;			/* tz not set: a pointer of one backend */
	char		tz_name[FM_SHARED_TZ_NAME_MAX];
} SharedLimitEntry;

typedef struct SharedLimitsState
{
	LWLock	   *lock;			/* the table's entries */
	pg_atomic_uint64 generation;
	/* the next transaction id at the latest bump (0: none since start) */
	pg_atomic_uint64 changed_below;
	uint64		swept_generation;	/* the last generation swept; under lock */
	pg_atomic_uint64 hits;
	pg_atomic_uint64 loads;
	pg_atomic_uint64 not_stored;	/* loads that found the table full */
} SharedLimitsState;

/* flagmeter.shared_limits: entries of the table (0: no shared cache) */
static int	shared_limits_size = 20000;

/*
 * Keys hash and compare by their strings, not their padded 330 bytes (as
 * blobs they were half of a lookup).
 */
static uint32
shared_limit_key_hash(const void *key, Size keysize)
{
	const SharedLimitKey *k = key;
	uint32		h = fm_tenant_meter_hash(k->tenant, k->meter);

	h = hash_combine(h, hash_bytes_uint32(k->scope));
	return hash_combine(h, hash_bytes_uint32(k->database));
}

static int
shared_limit_key_match(const void *key1, const void *key2, Size keysize)
{
	const SharedLimitKey *a = key1;
	const SharedLimitKey *b = key2;

	if (a->database != b->database || a->scope != b->scope)
		return 1;
	return strcmp(a->tenant, b->tenant) != 0 || strcmp(a->meter, b->meter) != 0;
}

static SharedLimitsState *state = NULL;
static HTAB *shared_limits = NULL;

/* this transaction changed the configuration: bump at its commit */
static bool changed_in_xact = false;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static void
shared_limits_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(add_size(MAXALIGN(sizeof(SharedLimitsState)),
									hash_estimate_size(shared_limits_size,
													   sizeof(SharedLimitEntry))));
	RequestNamedLWLockTranche("flagmeter", 1);
}

static void
shared_limits_startup(void)
{
	HASHCTL		info;
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	state = ShmemInitStruct("flagmeter shared limits state",
							sizeof(SharedLimitsState), &found);
	if (!found)
	{
		state->lock = &(GetNamedLWLockTranche("flagmeter"))->lock;
		pg_atomic_init_u64(&state->generation, 1);
		pg_atomic_init_u64(&state->changed_below, 0);
		pg_atomic_init_u64(&state->hits, 0);
		pg_atomic_init_u64(&state->loads, 0);
		pg_atomic_init_u64(&state->not_stored, 0);
		state->swept_generation = 0;
	}
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(SharedLimitKey);
	info.entrysize = sizeof(SharedLimitEntry);
	info.hash = shared_limit_key_hash;
	info.match = shared_limit_key_match;

	/*
	 * fixed size: all entries allocated here, none taken from the lock
	 * table's slack
	 */
	shared_limits = ShmemInitHash("flagmeter shared limits",
								  shared_limits_size, shared_limits_size,
								  &info, HASH_ELEM | HASH_FUNCTION | HASH_COMPARE |
								  HASH_FIXED_SIZE);
	LWLockRelease(AddinShmemInitLock);
}

/*
 * No entry stored so far is used any more.  changed_below first (the bump's
 * fetch-add is a full barrier, and readers read it after the generation):
 * a reader that sees the new generation sees at least this transaction id.
 */
static void
invalidate_shared_limits(void)
{
	uint64		next;
	uint64		below;

	if (!shared_limits)
		return;
	next = U64FromFullTransactionId(ReadNextFullTransactionId());
	below = pg_atomic_read_u64(&state->changed_below);
	while (below < next &&
		   !pg_atomic_compare_exchange_u64(&state->changed_below, &below, next))
		;
	pg_atomic_fetch_add_u64(&state->generation, 1);
}

static void
shared_limits_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			if (changed_in_xact)
				invalidate_shared_limits();
			changed_in_xact = false;
			break;
		case XACT_EVENT_PRE_PREPARE:

			/*
			 * COMMIT PREPARED may run in another backend, later, with no
			 * commit callback of ours to invalidate the shared cache.
			 */
			if (changed_in_xact)
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot PREPARE a transaction that changed flagmeter's configuration"),
						 errdetail("flagmeter is preloaded, and its shared limit cache is invalidated when such a transaction commits."),
						 errhint("Commit the configuration change in a transaction of its own, or set flagmeter.shared_limits = 0.")));
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			changed_in_xact = false;
			break;
		default:
			break;
	}
}

void
fm_shared_limits_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	DefineCustomIntVariable("flagmeter.shared_limits",
							gettext_noop("Entries of the limit cache all backends share (0: none)."),
							gettext_noop("Only when flagmeter is in shared_preload_libraries; "
										 "an entry takes about 0.6 kB of shared memory."),
							&shared_limits_size,
							20000, 0, 10000000,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);
	if (shared_limits_size == 0)
		return;
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = shared_limits_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = shared_limits_startup;
	RegisterXactCallback(shared_limits_xact_callback, NULL);
}

uint64
fm_shared_limits_generation(void)
{
	return shared_limits ? pg_atomic_read_u64(&state->generation) : 0;
}

bool
fm_shared_limits_seen_by(Snapshot snapshot)
{
	uint64		below;
	FullTransactionId next;
	uint64		xmin;

	if (!shared_limits)
		return false;

	/*
	 * after the caller's read of the generation (see
	 * invalidate_shared_limits)
	 */
	pg_read_barrier();
	below = pg_atomic_read_u64(&state->changed_below);
	if (below == 0)
		return true;

	/*
	 * the snapshot's xmin as a full id: it is at most next, and within 2^31
	 * of it
	 */
	next = ReadNextFullTransactionId();
	xmin = U64FromFullTransactionId(next) -
		(uint32) (XidFromFullTransactionId(next) - snapshot->xmin);
	return xmin >= below;
}

void
fm_shared_limits_changed(void)
{
	changed_in_xact = true;
}

static void
make_key(SharedLimitKey *key, Oid scope, const char *tenant, const char *meter)
{
	memset(key, 0, sizeof(*key));
	key->database = MyDatabaseId;
	key->scope = scope;
	strlcpy(key->tenant, tenant, sizeof(key->tenant));
	strlcpy(key->meter, meter, sizeof(key->meter));
}

/*
 * The time zone of a name an entry holds (validated when the entry was
 * loaded), remembering the last one: most tenants share a few zones, and
 * pg_tzset() folds and hashes the name each time.
 */
static pg_tz *
timezone_of(const char *name)
{
	static char last_name[FM_SHARED_TZ_NAME_MAX];
	static pg_tz *last_tz = NULL;

	if (last_tz == NULL || strcmp(name, last_name) != 0)
	{
		last_tz = fm_lookup_timezone(name);
		strlcpy(last_name, name, sizeof(last_name));
	}
	return last_tz;
}

bool
fm_shared_limit_get(Oid scope, const char *tenant, const char *meter, FmLimit *limit)
{
	SharedLimitKey key;
	SharedLimitEntry *entry;
	char		tz_name[FM_SHARED_TZ_NAME_MAX];
	bool		found = false;

	/* a transaction that changed the configuration reads its own changes */
	if (!shared_limits || changed_in_xact)
		return false;
	make_key(&key, scope, tenant, meter);
	LWLockAcquire(state->lock, LW_SHARED);
	entry = hash_search(shared_limits, &key, HASH_FIND, NULL);
	if (entry && entry->generation == pg_atomic_read_u64(&state->generation))
	{
		*limit = entry->limit;
		memcpy(tz_name, entry->tz_name, sizeof(tz_name));
		found = true;
	}
	LWLockRelease(state->lock);
	if (!found)
		return false;
	limit->tz = timezone_of(tz_name);
	pg_atomic_fetch_add_u64(&state->hits, 1);
	return true;
}

/* Remove the entries of older generations; with the lock held exclusively. */
static void
sweep_old_generations(uint64 generation)
{
	HASH_SEQ_STATUS scan;
	SharedLimitEntry *entry;

	hash_seq_init(&scan, shared_limits);
	while ((entry = hash_seq_search(&scan)) != NULL)
	{
		if (entry->generation != generation)
			(void) hash_search(shared_limits, &entry->key, HASH_REMOVE, NULL);
	}
}

void
fm_shared_limit_put(Oid scope, const char *tenant, const char *meter,
					uint64 generation, const FmLimit *limit)
{
	SharedLimitKey key;
	SharedLimitEntry *entry;
	const char *tz_name = pg_get_timezone_name(limit->tz);

	/* ... which no other backend may see before it commits */
	if (!shared_limits || changed_in_xact || strlen(tz_name) >= FM_SHARED_TZ_NAME_MAX)
		return;
	pg_atomic_fetch_add_u64(&state->loads, 1);
	make_key(&key, scope, tenant, meter);
	LWLockAcquire(state->lock, LW_EXCLUSIVE);

	/*
	 * under the lock: a bump after this check makes the entry stale, never
	 * wrong
	 */
	if (generation == pg_atomic_read_u64(&state->generation))
	{
		entry = hash_search(shared_limits, &key, HASH_ENTER_NULL, NULL);
		if (entry == NULL && state->swept_generation != generation)
		{
			sweep_old_generations(generation);
			state->swept_generation = generation;
			entry = hash_search(shared_limits, &key, HASH_ENTER_NULL, NULL);
		}
		if (entry == NULL)
			pg_atomic_fetch_add_u64(&state->not_stored, 1);
		else
		{
			entry->generation = generation;
			entry->limit = *limit;
			entry->limit.tz = NULL;
			strlcpy(entry->tz_name, tz_name, sizeof(entry->tz_name));
		}
	}
	LWLockRelease(state->lock);
}

/*
 * shared_limit_cache() -> (capacity, entries, generation, hits, loads,
 * not_stored): the shared limit cache, all NULL when flagmeter is not
 * preloaded.  hits, loads and not_stored count since the server started:
 * limits found in the cache, limits read from the catalog to be shared
 * (by track and consume in READ COMMITTED, whose own cache and this one
 * missed: see limit_lookup.c), and those of the loads that found the cache full.
 */
PG_FUNCTION_INFO_V1(fm_shared_limit_cache);
Datum
fm_shared_limit_cache(PG_FUNCTION_ARGS)
{
	TupleDesc	desc;
	Datum		values[6];
	bool		nulls[6] = {true, true, true, true, true, true};

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "shared_limit_cache must return a composite type");
	if (shared_limits)
	{
		LWLockAcquire(state->lock, LW_SHARED);
		values[1] = Int64GetDatum((int64) hash_get_num_entries(shared_limits));
		LWLockRelease(state->lock);
		values[0] = Int32GetDatum(shared_limits_size);
		values[2] = Int64GetDatum((int64) pg_atomic_read_u64(&state->generation));
		values[3] = Int64GetDatum((int64) pg_atomic_read_u64(&state->hits));
		values[4] = Int64GetDatum((int64) pg_atomic_read_u64(&state->loads));
		values[5] = Int64GetDatum((int64) pg_atomic_read_u64(&state->not_stored));
		memset(nulls, 0, sizeof(nulls));
	}
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}
