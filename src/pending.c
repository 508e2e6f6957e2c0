/*
 * pending.c
 *	  Usage not yet in the counter rows, in shared memory: how track writes
 *	  one row instead of two.
 *
 * Without this, every track writes its event and adds its amount to a
 * counter stripe (stripes.c): two writes, whose floor as plain SQL is
 * 0.78-0.98 of one INSERT (docs/design.md, "One write per track").
 * Preloaded, a track of a sum or count meter without credit grants or a
 * pool writes its event only, with the period it counts in
 * (flagmeter.events.period_start not NULL: "pending"), and adds its amount
 * here, to the period's entry, under its transaction id:
 *
 *	- A reader counts the amounts of the transactions its snapshot sees
 *	  committed, and its own (pending_visible_in), as a heap scan would
 *	  count their rows.  So reads stay exact and read-your-writes holds.
 *	- An amount whose transaction every snapshot sees as ended is settled:
 *	  committed, it joins the entry's settled counter, which every reader
 *	  counts; rolled back, it is dropped.  Entries keep a slot per
 *	  transaction only until then, from a pool per partition.
 *	- maintain() folds (fm_pending_fold): it takes a boundary H below which
 *	  every transaction is settled, settles every entry of its database up
 *	  to H, adds each settled counter to the period's merged stripe (32767)
 *	  and moves it into a fold of the entry tagged with maintain's
 *	  transaction id, and records H as maintenance_state.counted_through in
 *	  the same transaction.  A reader counts a fold while its snapshot does
 *	  not see that transaction committed (it then reads the rows without
 *	  the fold's amount); the fold is dropped once every snapshot does, and
 *	  merged back into settled when maintain rolls back.  Only settled
 *	  amounts are folded: every snapshot counts them, so a reader that does
 *	  not see the fold counts all of it, one that does counts none.
 *	- The events are the durable record.  A pending event whose
 *	  (top-level) transaction id is at or above counted_through is in no
 *	  counter row.  After a restart or a failover the table is empty: the
 *	  first call in a database rebuilds its entries from those events
 *	  (rebuild) before any read is answered, and until then tracks write
 *	  stripes.  A standby, and a database whose pending usage did not fit,
 *	  read those events instead (pending_band_read): slow, exact.
 *
 * The boundary.  While maintain settles entries up to H, no track may
 * settle a transaction at or above it (its amount would reach the rows
 * while its event, at or above counted_through, also stays pending):
 * fold_high freezes settling at H for the pass.  Slots settle by their
 * top-level transaction id, the one events.xid records.
 *
 * No call fails for want of room: a full table or pool sends the track to
 * a stripe, its event written with period_start NULL.
 *
 * A prepared transaction outlives a restart, and a rebuild cannot see its
 * events: before it is prepared, its pending amounts go into the backend's
 * own stripes and its events are marked counted (prepare_as_rows), as if
 * it had tracked with two writes.
 */
#include "postgres.h"
#include "fmgr.h"
#include "funcapi.h"

#include "access/relation.h"
#include "access/transam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "common/int.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lmgr.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/xid8.h"

#include "bounds.h"
#include "compat.h"
#include "counter.h"
#include "pending.h"
#include "pools.h"
#include "statements.h"
#include "stripes.h"

#define FM_PENDING_PARTITIONS 16
#define FM_PENDING_FOLDS 4
#define FM_PENDING_SLOTS_PER_PERIOD 4
#define FM_PENDING_DATABASES 64
#define FM_MERGED_STRIPE 32767

/* field4 of the advisory lock a rebuild holds (stripes.c uses 0x464D) */
#define FM_REBUILD_TAG_CLASS 0x4652

typedef struct PendingKey
{
	Oid			database;
	TimestampTz period_start;
	char		tenant[FM_TENANT_MAX_BYTES + 1];
	char		meter[FM_NAME_MAX_BYTES + 1];
} PendingKey;

/* A transaction's amount on a period, until every snapshot sees it ended. */
typedef struct PendingSlot
{
	TransactionId xid;			/* the (sub)transaction: visibility */
	FullTransactionId top;		/* its top-level transaction: events.xid */
	int32		next;			/* next slot of the entry, or -1 */

	/*
	 * The transaction that deleted or recounted this usage
	 * (fm_pending_drop), or InvalidTransactionId: a reader that sees it
	 * committed does not count the slot.
	 */
	TransactionId gone_in;
	FmCounter	amount;
} PendingSlot;

/* Settled usage maintain() moved into the rows, until all see it there. */
typedef struct PendingFold
{
	TransactionId xid;			/* maintain's transaction */
	FmCounter	amount;
} PendingFold;

typedef struct PendingEntry
{
	PendingKey	key;
	FmCounter	settled;
	int32		first_slot;		/* -1: none */
	int32		nslots;
	int32		nfolds;
	PendingFold folds[FM_PENDING_FOLDS];

	/*
	 * For alerts, as a stripe's recheck_at (track_alerts.c): the used amount
	 * ever added here, and the figure of it at which a track reads the
	 * period.
	 */
	int64		added;
	int64		added_used;		/* the same in used: a sum that overflows
								 * would overflow the period's total */
	int64		recheck_at;
	int32		recheck_for;
	bool		has_recheck;
} PendingEntry;

typedef struct PendingPartition
{
	int32		free_slot;		/* head of the free list, -1: none */
	int32		nfree;
} PendingPartition;

enum
{
	DB_EMPTY = 0,				/* not rebuilt since the server started */
	DB_READY,					/* its pending usage is in the table */
	DB_OVERFLOWED				/* it did not fit: read the events */
};

typedef struct PendingDatabase
{
	Oid			database;		/* InvalidOid: free */
	Oid			counters;		/* flagmeter.counters when rebuilt: a new
								 * one is a new extension, its entries gone */
	pg_atomic_uint32 status;
} PendingDatabase;

typedef struct PendingState
{
	LWLockPadded *locks;		/* FM_PENDING_PARTITIONS, then the databases' */
	int			slots_per_partition;

	/*
	 * 0, or while maintain settles up to H: H (no slot of a transaction at
	 * or above it settles), or PG_UINT64_MAX while it takes H.
	 */
	pg_atomic_uint64 fold_high;
	/* above every top-level transaction id a track settled */
	pg_atomic_uint64 settled_below;
	/* since the server started, for pending_usage_stats() */
	pg_atomic_uint64 added;
	pg_atomic_uint64 no_room;
	pg_atomic_uint64 folded;
	pg_atomic_uint64 rebuilt;
	PendingPartition partitions[FM_PENDING_PARTITIONS];
	PendingDatabase databases[FM_PENDING_DATABASES];
	PendingSlot slots[FLEXIBLE_ARRAY_MEMBER];
} PendingState;

static int	pending_periods = 16384;
static bool one_write_track = true;

static PendingState *state = NULL;
static HTAB *entries = NULL;

/* whether this transaction added pending amounts (no PREPARE then) */
static bool added_in_xact = false;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static int
slots_per_partition(void)
{
	return (pending_periods * FM_PENDING_SLOTS_PER_PERIOD + FM_PENDING_PARTITIONS - 1) /
		FM_PENDING_PARTITIONS;
}

static Size
state_size(void)
{
	return add_size(offsetof(PendingState, slots),
					mul_size(mul_size(slots_per_partition(), FM_PENDING_PARTITIONS),
							 sizeof(PendingSlot)));
}

static void
pending_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(state_size());
	RequestAddinShmemSpace(hash_estimate_size(pending_periods, sizeof(PendingEntry)));
	RequestNamedLWLockTranche("flagmeter_pending", FM_PENDING_PARTITIONS + 1);
}

static void
pending_startup(void)
{
	bool		found;
	HASHCTL		info;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	state = ShmemInitStruct("flagmeter pending usage", state_size(), &found);
	if (!found)
	{
		int			per = slots_per_partition();
		int			p;
		int			i;

		memset(state, 0, state_size());
		state->locks = GetNamedLWLockTranche("flagmeter_pending");
		state->slots_per_partition = per;
		pg_atomic_init_u64(&state->fold_high, 0);
		pg_atomic_init_u64(&state->settled_below, 0);
		pg_atomic_init_u64(&state->added, 0);
		pg_atomic_init_u64(&state->no_room, 0);
		pg_atomic_init_u64(&state->folded, 0);
		pg_atomic_init_u64(&state->rebuilt, 0);
		for (i = 0; i < FM_PENDING_DATABASES; i++)
			pg_atomic_init_u32(&state->databases[i].status, DB_EMPTY);
		for (p = 0; p < FM_PENDING_PARTITIONS; p++)
		{
			state->partitions[p].free_slot = p * per;
			state->partitions[p].nfree = per;
			for (i = 0; i < per; i++)
				state->slots[p * per + i].next = i + 1 < per ? p * per + i + 1 : -1;
		}
	}
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(PendingKey);
	info.entrysize = sizeof(PendingEntry);
	info.num_partitions = FM_PENDING_PARTITIONS;
	entries = ShmemInitHash("flagmeter pending periods", pending_periods, pending_periods,
							&info, HASH_ELEM | HASH_BLOBS | HASH_PARTITION | HASH_FIXED_SIZE);
	LWLockRelease(AddinShmemInitLock);
}

static void
make_key(PendingKey *key, const char *tenant, const char *meter, TimestampTz period_start)
{
	memset(key, 0, sizeof(*key));
	key->database = MyDatabaseId;
	key->period_start = period_start;
	strlcpy(key->tenant, tenant, sizeof(key->tenant));
	strlcpy(key->meter, meter, sizeof(key->meter));
}

static int
partition_of(uint32 hash)
{
	return hash % FM_PENDING_PARTITIONS;
}

static LWLock *
partition_lock(int p)
{
	return &state->locks[p].lock;
}

static LWLock *
databases_lock(void)
{
	return &state->locks[FM_PENDING_PARTITIONS].lock;
}

/* Every partition, in order: what a pass over the whole table holds. */
static void
lock_partitions(LWLockMode mode)
{
	int			p;

	for (p = 0; p < FM_PENDING_PARTITIONS; p++)
		LWLockAcquire(partition_lock(p), mode);
}

static void
unlock_partitions(void)
{
	int			p;

	for (p = FM_PENDING_PARTITIONS - 1; p >= 0; p--)
		LWLockRelease(partition_lock(p));
}

/* ---- slots ---- */

static int32
take_slot(int p)
{
	PendingPartition *part = &state->partitions[p];
	int32		s = part->free_slot;

	if (s < 0)
		return -1;
	part->free_slot = state->slots[s].next;
	part->nfree--;
	return s;
}

static void
give_slot(int p, int32 s)
{
	PendingPartition *part = &state->partitions[p];

	state->slots[s].next = part->free_slot;
	part->free_slot = s;
	part->nfree++;
}

static void
merge_into(FmCounter *into, const FmCounter *amount)
{
	fm_counter_report(fm_counter_merge(into, amount));
}

static bool
counter_empty(const FmCounter *c)
{
	return c->events == 0 && c->used == 0;
}

/*
 * Where a transaction that tagged pending usage (a fold's maintain, a
 * slot's drop) stands: still running (or ours), committed but not yet seen
 * so by every snapshot, committed and seen so by all (what it tagged may
 * go), or rolled back (what it tagged comes back).
 */
typedef enum TaggerState
{
	TAGGER_RUNNING,
	TAGGER_COMMITTED,
	TAGGER_SEEN_BY_ALL,
	TAGGER_ROLLED_BACK
} TaggerState;

static TaggerState
tagger_state(TransactionId xid)
{
	if (TransactionIdIsCurrentTransactionId(xid) || TransactionIdIsInProgress(xid))
		return TAGGER_RUNNING;
	if (!TransactionIdDidCommit(xid))
		return TAGGER_ROLLED_BACK;
	return GlobalVisCheckRemovableXid(NULL, xid) ? TAGGER_SEEN_BY_ALL : TAGGER_COMMITTED;
}

/*
 * Settle e's slots whose top-level transaction every snapshot sees as
 * ended, and that lie below below (0: no bound; see fold_high): committed,
 * into settled; rolled back, dropped.  Under the partition's lock,
 * exclusive.
 */
static void
settle_slots(int p, PendingEntry *e, uint64 below)
{
	int32	   *link = &e->first_slot;

	while (*link >= 0)
	{
		PendingSlot *slot = &state->slots[*link];
		int32		s = *link;

		if (TransactionIdIsValid(slot->gone_in))
		{
			/* dropped with it once every snapshot sees that; back if it rolled back */
			TaggerState dropper = tagger_state(slot->gone_in);

			if (dropper == TAGGER_SEEN_BY_ALL)
			{
				*link = slot->next;
				e->nslots--;
				give_slot(p, s);
				continue;
			}
			if (dropper != TAGGER_ROLLED_BACK)
			{
				link = &slot->next;
				continue;
			}
			slot->gone_in = InvalidTransactionId;
		}
		if ((below == 0 || U64FromFullTransactionId(slot->top) < below) &&
			GlobalVisCheckRemovableFullXid(NULL, slot->top))
		{
			uint64		above = U64FromFullTransactionId(slot->top) + 1;
			uint64		seen = pg_atomic_read_u64(&state->settled_below);

			while (seen < above &&
				   !pg_atomic_compare_exchange_u64(&state->settled_below, &seen, above))
				;
			if (TransactionIdDidCommit(slot->xid))
				merge_into(&e->settled, &slot->amount);
			*link = slot->next;
			e->nslots--;
			give_slot(p, s);
			continue;
		}
		link = &slot->next;
	}
}

/*
 * Drop e's folds that every snapshot sees committed (the rows hold them),
 * and merge back those whose maintain rolled back.  Exclusive lock.
 */
static void
clean_folds(PendingEntry *e)
{
	int			i = 0;

	while (i < e->nfolds)
	{
		PendingFold *f = &e->folds[i];
		TaggerState folder = tagger_state(f->xid);

		if (folder == TAGGER_ROLLED_BACK)
			merge_into(&e->settled, &f->amount);
		if (folder == TAGGER_ROLLED_BACK || folder == TAGGER_SEEN_BY_ALL)
			e->folds[i] = e->folds[--e->nfolds];
		else
			i++;
	}
}

/* A new entry: nothing pending, no recheck figure yet. */
static void
entry_init(PendingEntry *e)
{
	fm_counter_init(&e->settled);
	e->first_slot = -1;
	e->nslots = 0;
	e->nfolds = 0;
	e->added = 0;
	e->added_used = 0;
	e->has_recheck = false;
}

/*
 * The period's entry with its partition's lock held in mode (*partition
 * says which, for the caller to release); found, or with HASH_ENTER_NULL
 * made.  NULL, with the lock released, when there is none (or no room).
 */
static PendingEntry *
lock_entry(const char *tenant, const char *meter, TimestampTz period_start,
		   HASHACTION action, LWLockMode mode, int *partition)
{
	PendingKey	key;
	uint32		hash;
	PendingEntry *e;
	bool		found;

	make_key(&key, tenant, meter, period_start);
	hash = get_hash_value(entries, &key);
	*partition = partition_of(hash);
	LWLockAcquire(partition_lock(*partition), mode);
	e = hash_search_with_hash_value(entries, &key, hash, action, &found);
	if (e == NULL)
		LWLockRelease(partition_lock(*partition));
	else if (!found)
		entry_init(e);
	return e;
}

static bool
entry_unused(const PendingEntry *e)
{
	return e->first_slot < 0 && e->nfolds == 0 && counter_empty(&e->settled);
}

/* ---- databases ---- */

/*
 * This database's record, made when create and there is room.  A backend
 * stays in one database and records are never reused, so the record
 * found is kept for the backend's life: calls do not search for it.
 */
static PendingDatabase *
find_database(bool create)
{
	static PendingDatabase *mine = NULL;
	int			i;

	if (mine != NULL)
		return mine;
	for (i = 0; i < FM_PENDING_DATABASES && mine == NULL; i++)
		if (state->databases[i].database == MyDatabaseId)
			mine = &state->databases[i];
	if (mine != NULL || !create)
		return mine;
	LWLockAcquire(databases_lock(), LW_EXCLUSIVE);
	for (i = 0; i < FM_PENDING_DATABASES && mine == NULL; i++)
		if (state->databases[i].database == MyDatabaseId)
			mine = &state->databases[i];
	for (i = 0; i < FM_PENDING_DATABASES && mine == NULL; i++)
	{
		PendingDatabase *d = &state->databases[i];

		if (d->database == InvalidOid)
		{
			pg_atomic_write_u32(&d->status, DB_EMPTY);
			pg_write_barrier();
			d->database = MyDatabaseId;
			mine = d;
		}
	}
	LWLockRelease(databases_lock());
	return mine;
}

/* Remove the database's entries (an extension dropped and created again). */
static void
forget_database(void)
{
	HASH_SEQ_STATUS seq;
	PendingEntry *e;
	int			p;

	lock_partitions(LW_EXCLUSIVE);
	hash_seq_init(&seq, entries);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		if (e->key.database != MyDatabaseId)
			continue;
		p = partition_of(get_hash_value(entries, &e->key));
		while (e->first_slot >= 0)
		{
			int32		s = e->first_slot;

			e->first_slot = state->slots[s].next;
			give_slot(p, s);
		}
		hash_search(entries, &e->key, HASH_REMOVE, NULL);
	}
	unlock_partitions();
}

/* the transaction in which this backend last checked its database's record */
static LocalTransactionId checked_in = InvalidLocalTransactionId;

static uint32
database_status(PendingDatabase **record)
{
	PendingDatabase *d = find_database(true);
	uint32		status;

	*record = d;
	if (d == NULL)
		return DB_OVERFLOWED;	/* no record: read the events */
	if (checked_in != FM_MY_LOCAL_XID)
	{
		Oid			counters = fm_relation_oid("counters");

		checked_in = FM_MY_LOCAL_XID;
		if (d->counters != counters && pg_atomic_read_u32(&d->status) != DB_EMPTY)
		{
			LWLockAcquire(databases_lock(), LW_EXCLUSIVE);
			if (d->counters != counters)
			{
				forget_database();
				pg_atomic_write_u32(&d->status, DB_EMPTY);
			}
			LWLockRelease(databases_lock());
		}
	}
	status = pg_atomic_read_u32(&d->status);
	pg_read_barrier();
	return status;
}

static void rebuild(PendingDatabase *d);

/*
 * This database's status, rebuilt first when it has not been since the
 * server started (never on a standby: its tracks run on the primary).
 */
static uint32
ready_status(void)
{
	PendingDatabase *d;
	uint32		status = database_status(&d);

	if (status == DB_EMPTY && !RecoveryInProgress())
	{
		rebuild(d);
		status = database_status(&d);
	}
	return status;
}

/* ---- the calls ---- */

bool
fm_pending_track_enabled(const FmLimit *limit)
{
	if (state == NULL || !one_write_track)
		return false;
	if (limit->aggregation != FM_AGG_SUM && limit->aggregation != FM_AGG_COUNT)
		return false;
	if (limit->grants || fm_draws_from_pool(limit))
		return false;
	return ready_status() == DB_READY;
}

bool
fm_pending_add(const char *tenant, const char *meter, TimestampTz period_start,
			   const FmCounter *delta, const FmLimit *limit, bool *read_due)
{
	int			p;
	PendingEntry *e;
	TransactionId xid = GetCurrentTransactionId();
	FullTransactionId top = GetTopFullTransactionId();
	int32		s;

	e = lock_entry(tenant, meter, period_start, HASH_ENTER_NULL, LW_EXCLUSIVE, &p);
	if (e == NULL)
	{
		pg_atomic_fetch_add_u64(&state->no_room, 1);
		return false;
	}
	{
		int64		sum;

		if (pg_add_s64_overflow(e->added_used, delta->used, &sum))
		{
			LWLockRelease(partition_lock(p));
			fm_counter_report(FM_ERR_RANGE);
		}
	}
	/* this transaction's slot, or a new one */
	for (s = e->first_slot; s >= 0; s = state->slots[s].next)
		if (state->slots[s].xid == xid)
			break;
	if (s < 0)
	{
		/*
		 * Keep a period's slots few: those of transactions every snapshot
		 * sees ended settle (while maintain takes its boundary, none).
		 */
		if (e->nslots >= FM_PENDING_SLOTS_PER_PERIOD)
		{
			uint64		high = pg_atomic_read_u64(&state->fold_high);

			if (high != PG_UINT64_MAX)
				settle_slots(p, e, high);
		}
		s = take_slot(p);
		if (s < 0)
		{
			if (entry_unused(e))
				hash_search(entries, &e->key, HASH_REMOVE, NULL);
			LWLockRelease(partition_lock(p));
			pg_atomic_fetch_add_u64(&state->no_room, 1);
			return false;
		}
		state->slots[s].xid = xid;
		state->slots[s].top = top;
		state->slots[s].gone_in = InvalidTransactionId;
		fm_counter_init(&state->slots[s].amount);
		state->slots[s].next = e->first_slot;
		e->first_slot = s;
		e->nslots++;
	}
	{
		FmCounter	sum = state->slots[s].amount;
		FmResult	r = fm_counter_merge(&sum, delta);

		if (r != FM_OK)
		{
			LWLockRelease(partition_lock(p));
			fm_counter_report(r);
		}
		state->slots[s].amount = sum;
	}
	e->added += limit->aggregation == FM_AGG_COUNT ? delta->events : delta->used;
	e->added_used += delta->used;
	*read_due = !(e->has_recheck && e->recheck_for == limit->fingerprint &&
				  e->added < e->recheck_at);
	LWLockRelease(partition_lock(p));
	added_in_xact = true;
	pg_atomic_fetch_add_u64(&state->added, 1);
	return true;
}

void
fm_pending_set_recheck(const char *tenant, const char *meter, TimestampTz period_start,
					   const FmLimit *limit, int64 used)
{
	int			p;
	PendingEntry *e;
	int64		next;

	if (state == NULL)
		return;
	next = limit->limited ?
		fm_next_usage_level(used, limit->quota, limit->hard,
							limit->thresholds, limit->nthresholds) :
		PG_INT64_MAX;
	e = lock_entry(tenant, meter, period_start, HASH_FIND, LW_EXCLUSIVE, &p);
	if (e != NULL)
	{
		/*
		 * As a stripe's figure (track_alerts.c), shared by every writer of the
		 * period: the next read comes after a flagmeter.stripes-th of the
		 * distance to the next level, so that amounts added meanwhile but not
		 * yet committed delay an announcement by at most that.
		 */
		if (next <= used)
			e->recheck_at = PG_INT64_MIN;	/* every track reads */
		else if (pg_add_s64_overflow(e->added, Max((next - used) / fm_stripes, 1),
									 &e->recheck_at))
			e->recheck_at = PG_INT64_MAX;
		e->recheck_for = limit->fingerprint;
		e->has_recheck = true;
		LWLockRelease(partition_lock(p));
	}
}

/* Whether snapshot sees (sub)transaction xid as committed, or it is ours. */
static bool
visible_in(TransactionId xid, Snapshot snapshot)
{
	if (TransactionIdIsCurrentTransactionId(xid))
		return true;
	if (XidInMVCCSnapshot(xid, snapshot))
		return false;
	return TransactionIdDidCommit(xid);
}

/*
 * The pending events of the period as snapshot sees them, with
 * counted_through read in it too: where the table does not hold them.
 */
static FmStatement band_read_stmt = {
	"SELECT flagmeter.quota_counter_agg(e.amount, e.occurred_at)"
	" FROM flagmeter.events e"
	" WHERE e.tenant" FM_EQ "$1 AND e.meter" FM_EQ "$2"
	" AND e.occurred_at OPERATOR(pg_catalog.>=) $3 AND e.period_start" FM_EQ "$3"
	" AND e.xid OPERATOR(pg_catalog.>=)"
	"  (SELECT flagmeter.xid_int(s.counted_through) FROM flagmeter.current_state s)",
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

static void
pending_band_read(const char *tenant, const char *meter, TimestampTz period_start,
				  Snapshot snapshot, FmCounter *total)
{
	Datum		args[3];
	bool		isnull;
	Datum		band;

	fm_period_args(args, tenant, meter, period_start);
	SPI_connect();
	fm_execute_snapshot(&band_read_stmt, args, NULL, true, 0, snapshot);
	/* one row: the aggregate, NULL when no event is pending */
	band = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (!isnull)
		merge_into(total, DatumGetFmCounterP(band));
	SPI_finish();
}

/* pending usage is read from the table (false: from the events) */
static bool
table_holds_database(void)
{
	return state != NULL && !RecoveryInProgress() && ready_status() == DB_READY;
}

static FmStatement any_pending_stmt = {
	"SELECT EXISTS (SELECT FROM flagmeter.events e"
	" WHERE e.period_start IS NOT NULL AND e.xid OPERATOR(pg_catalog.>=)"
	"  (SELECT flagmeter.xid_int(s.counted_through) FROM flagmeter.current_state s))",
	0, {InvalidOid}
};

/*
 * Not preloaded: whether pending events may be unfolded.  None is written
 * while flagmeter is not preloaded, so once a backend found none it never
 * looks again; while some are, it looks once a transaction (maintain()
 * folds them).
 */
static bool
events_may_be_pending(Snapshot snapshot)
{
	static bool none = false;
	static LocalTransactionId looked_in = InvalidLocalTransactionId;
	static bool found = true;

	if (none)
		return false;
	if (looked_in != FM_MY_LOCAL_XID)
	{
		bool		isnull;

		SPI_connect();
		fm_execute_snapshot(&any_pending_stmt, NULL, NULL, true, 0, snapshot);
		found = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
										   1, &isnull));
		SPI_finish();
		looked_in = FM_MY_LOCAL_XID;
		none = !found && !RecoveryInProgress();
	}
	return found;
}

void
fm_pending_add_visible(const char *tenant, const char *meter, TimestampTz period_start,
					   Snapshot snapshot, FmCounter *total)
{
	int			p;
	PendingEntry *e;
	FmCounter	settled;
	PendingFold folds[FM_PENDING_FOLDS];
	int			nfolds;
	TransactionId some_xids[64];
	TransactionId some_gone[64];
	FmCounter	some_amounts[64];
	TransactionId *xids = some_xids;
	TransactionId *gone = some_gone;
	FmCounter  *amounts = some_amounts;
	int			room = lengthof(some_xids);
	int			nslots;
	int			i;

	if (!table_holds_database())
	{
		if (state != NULL || events_may_be_pending(snapshot))
			pending_band_read(tenant, meter, period_start, snapshot, total);
		return;
	}

	for (;;)
	{
		int32		s;

		e = lock_entry(tenant, meter, period_start, HASH_FIND, LW_SHARED, &p);
		if (e == NULL)
			return;
		if (e->nslots > room)
		{
			/* a hot period: allocate outside the lock, and look again */
			room = e->nslots + 64;
			LWLockRelease(partition_lock(p));
			xids = palloc(sizeof(TransactionId) * room);
			gone = palloc(sizeof(TransactionId) * room);
			amounts = palloc(sizeof(FmCounter) * room);
			continue;
		}
		settled = e->settled;
		nfolds = e->nfolds;
		memcpy(folds, e->folds, sizeof(PendingFold) * nfolds);
		nslots = 0;
		for (s = e->first_slot; s >= 0; s = state->slots[s].next)
		{
			xids[nslots] = state->slots[s].xid;
			gone[nslots] = state->slots[s].gone_in;
			amounts[nslots] = state->slots[s].amount;
			nslots++;
		}
		LWLockRelease(partition_lock(p));
		break;
	}

	merge_into(total, &settled);
	for (i = 0; i < nfolds; i++)
		if (!visible_in(folds[i].xid, snapshot))
			merge_into(total, &folds[i].amount);
	for (i = 0; i < nslots; i++)
		if (visible_in(xids[i], snapshot) &&
			!(TransactionIdIsValid(gone[i]) && visible_in(gone[i], snapshot)))
			merge_into(total, &amounts[i]);
	if (xids != some_xids)
	{
		pfree(xids);
		pfree(gone);
		pfree(amounts);
	}
}

/* ---- rebuild, after a restart or a failover ---- */

static FmStatement rebuild_stmt = {
	"SELECT e.tenant, e.meter, e.period_start,"
	" flagmeter.quota_counter_agg(e.amount, e.occurred_at)"
	" FROM flagmeter.events e"
	" WHERE e.period_start IS NOT NULL AND e.xid OPERATOR(pg_catalog.>=)"
	"  (SELECT flagmeter.xid_int(s.counted_through) FROM flagmeter.current_state s)"
	" GROUP BY 1, 2, 3",
	0, {InvalidOid}
};

/* Install settled usage of a period; false when the table is full. */
static bool
install_settled(const char *tenant, const char *meter, TimestampTz period_start,
				const FmCounter *amount)
{
	int			p;
	PendingEntry *e = lock_entry(tenant, meter, period_start, HASH_ENTER_NULL,
								 LW_EXCLUSIVE, &p);

	if (e == NULL)
		return false;
	{
		FmCounter	sum = e->settled;
		FmResult	r = fm_counter_merge(&sum, amount);

		if (r != FM_OK)
		{
			LWLockRelease(partition_lock(p));
			fm_counter_report(r);
		}
		e->settled = sum;
	}
	LWLockRelease(partition_lock(p));
	return true;
}

/*
 * Read this database's pending events (those at or above counted_through,
 * every one of a transaction that ended before the server started: tracks
 * write stripes until the rebuild is done) into settled usage.  One
 * backend at a time, under an advisory lock; the others wait for it.
 */
static void
rebuild(PendingDatabase *d)
{
	LOCKTAG		tag;
	Oid			counters = fm_relation_oid("counters");

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, 0, 0, FM_REBUILD_TAG_CLASS);
	(void) LockAcquire(&tag, ExclusiveLock, false, false);
	PG_TRY();
	{
		if (pg_atomic_read_u32(&d->status) == DB_EMPTY)
		{
			uint32		status = DB_READY;
			uint64		i;

			forget_database();
			SPI_connect();
			fm_execute_latest(&rebuild_stmt, NULL, NULL, 0);
			for (i = 0; i < SPI_processed && status == DB_READY; i++)
			{
				HeapTuple	row = SPI_tuptable->vals[i];
				TupleDesc	desc = SPI_tuptable->tupdesc;
				bool		isnull;
				char	   *tenant = TextDatumGetCString(SPI_getbinval(row, desc, 1, &isnull));
				char	   *meter = TextDatumGetCString(SPI_getbinval(row, desc, 2, &isnull));
				TimestampTz period_start = DatumGetTimestampTz(SPI_getbinval(row, desc, 3, &isnull));
				FmCounter  *amount = DatumGetFmCounterP(SPI_getbinval(row, desc, 4, &isnull));

				if (!install_settled(tenant, meter, period_start, amount))
					status = DB_OVERFLOWED;
			}
			SPI_finish();
			if (status != DB_READY)
				forget_database();	/* the events are read instead */
			d->counters = counters;
			pg_write_barrier();
			pg_atomic_write_u32(&d->status, status);
			pg_atomic_fetch_add_u64(&state->rebuilt, 1);
		}
	}
	PG_FINALLY();
	{
		LockRelease(&tag, ExclusiveLock, false);
	}
	PG_END_TRY();
}

/* ---- the fold, from maintain() ---- */

static FmStatement fold_stmt = {
	"INSERT INTO flagmeter.counters AS c (tenant, meter, period_start, stripe, counter)"
	" SELECT f.tenant, f.meter, f.period_start, 32767, f.counter"
	" FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3),"
	"                pg_catalog.unnest($4)) AS f(tenant, meter, period_start, counter)"
	" ON CONFLICT (tenant, meter, period_start, stripe) DO UPDATE"
	" SET counter = c.counter OPERATOR(flagmeter.+) excluded.counter",
	4, {TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZARRAYOID, FM_TYPE_COUNTER_ARRAY}
};

/* full transaction id of xid, which is not in the future */
static FullTransactionId
full_xid(TransactionId xid)
{
	FullTransactionId next = ReadNextFullTransactionId();

	return FullTransactionIdFromU64(U64FromFullTransactionId(next) -
									(uint32) (XidFromFullTransactionId(next) - xid));
}

/*
 * fold_pending() -> xid8: the fold of maintain() (see the header).  Adds
 * this database's settled usage to the periods' merged stripes and
 * returns H, the new counted_through, to be recorded in the same
 * transaction; NULL when the table does not hold this database's pending
 * usage (maintain folds the events instead, fold_pending_events) or an
 * entry has no room for another fold (a snapshot older than the last
 * folds is still open: the next run folds).
 */
PG_FUNCTION_INFO_V1(fm_fold_pending);
Datum
fm_fold_pending(PG_FUNCTION_ARGS)
{
	uint64		high;
	uint64		expected = 0;
	HASH_SEQ_STATUS seq;
	PendingEntry *e;
	volatile bool room = true;
	int			p;
	Datum	   *tenants;
	Datum	   *meters;
	Datum	   *starts;
	Datum	   *amounts;
	volatile int n = 0;
	TransactionId me;

	if (!table_holds_database())
		PG_RETURN_NULL();
	me = GetCurrentTransactionId();

	/*
	 * Freeze settling while the boundary is taken, and let every settle in
	 * progress finish (each runs under a partition lock): H then lies at or
	 * above every transaction settled so far, and below every running one.
	 */
	while (!pg_atomic_compare_exchange_u64(&state->fold_high, &expected, PG_UINT64_MAX))
	{
		/* another database's maintain is folding */
		expected = 0;
		pg_usleep(1000L);
		CHECK_FOR_INTERRUPTS();
	}
	PG_TRY();
	{
		for (p = 0; p < FM_PENDING_PARTITIONS; p++)
		{
			LWLockAcquire(partition_lock(p), LW_EXCLUSIVE);
			LWLockRelease(partition_lock(p));
		}
		high = Max(pg_atomic_read_u64(&state->settled_below),
				   U64FromFullTransactionId(full_xid(GetOldestNonRemovableTransactionId(NULL))));
		pg_atomic_write_u64(&state->fold_high, high);

		/* every entry must take a fold, or none does */
		lock_partitions(LW_EXCLUSIVE);
		hash_seq_init(&seq, entries);
		while ((e = hash_seq_search(&seq)) != NULL)
		{
			if (e->key.database != MyDatabaseId)
				continue;
			clean_folds(e);
			/* a period nothing is pending in leaves the table (until its next track) */
			settle_slots(partition_of(get_hash_value(entries, &e->key)), e, high);
			if (entry_unused(e))
				hash_search(entries, &e->key, HASH_REMOVE, NULL);
			else if (e->nfolds == FM_PENDING_FOLDS)
				room = false;
		}
		tenants = palloc(sizeof(Datum) * hash_get_num_entries(entries));
		meters = palloc(sizeof(Datum) * hash_get_num_entries(entries));
		starts = palloc(sizeof(Datum) * hash_get_num_entries(entries));
		amounts = palloc(sizeof(Datum) * hash_get_num_entries(entries));
		hash_seq_init(&seq, entries);
		while ((e = hash_seq_search(&seq)) != NULL)
		{
			if (e->key.database != MyDatabaseId || !room)
				continue;
			settle_slots(partition_of(get_hash_value(entries, &e->key)), e, high);
			if (counter_empty(&e->settled))
				continue;
			tenants[n] = CStringGetTextDatum(e->key.tenant);
			meters[n] = CStringGetTextDatum(e->key.meter);
			starts[n] = TimestampTzGetDatum(e->key.period_start);
			amounts[n] = FmCounterPGetDatum(fm_counter_copy(&e->settled));
			n++;
			e->folds[e->nfolds].xid = me;
			e->folds[e->nfolds].amount = e->settled;
			e->nfolds++;
			fm_counter_init(&e->settled);
		}
		unlock_partitions();
	}
	PG_FINALLY();
	{
		pg_atomic_write_u64(&state->fold_high, 0);
	}
	PG_END_TRY();
	if (!room)
		PG_RETURN_NULL();

	if (n > 0)
	{
		Datum		args[4];

		args[0] = fm_text_array(tenants, n);
		args[1] = fm_text_array(meters, n);
		args[2] = fm_timestamptz_array(starts, n);
		args[3] = PointerGetDatum(construct_array(amounts, n, fm_counter_type_oid(),
												  FM_COUNTER_SIZE, false, TYPALIGN_DOUBLE));
		SPI_connect();
		fm_execute(&fold_stmt, args, NULL, false, 0);
		SPI_finish();
		pg_atomic_fetch_add_u64(&state->folded, n);
	}
	PG_RETURN_FULLTRANSACTIONID(FullTransactionIdFromU64(high));
}

/*
 * pending_in_memory() -> boolean: whether this database's pending usage is
 * in the table, so that maintain() folds it with fold_pending(); false
 * (not preloaded, or it did not fit after a restart) when maintain folds
 * the pending events themselves, and then calls pending_events_folded().
 */
PG_FUNCTION_INFO_V1(fm_pending_in_memory);
Datum
fm_pending_in_memory(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(table_holds_database());
}

/* at commit: the events were folded, the (empty) table now holds the database */
static bool ready_at_commit = false;

PG_FUNCTION_INFO_V1(fm_pending_events_folded);
Datum
fm_pending_events_folded(PG_FUNCTION_ARGS)
{
	ready_at_commit = state != NULL && !RecoveryInProgress();
	PG_RETURN_VOID();
}

/*
 * pending_usage_stats(): the table as this database's calls see it, and
 * what it did since the server started.
 */
PG_FUNCTION_INFO_V1(fm_pending_usage_stats);
Datum
fm_pending_usage_stats(PG_FUNCTION_ARGS)
{
	TupleDesc	desc;
	Datum		values[8];
	bool		nulls[8] = {false};
	const char *status = "not preloaded";
	int64		periods = 0;
	int64		slots = 0;

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	if (state != NULL)
	{
		HASH_SEQ_STATUS seq;
		PendingEntry *e;

		switch (RecoveryInProgress() ? DB_OVERFLOWED : ready_status())
		{
			case DB_READY:
				status = "in memory";
				break;
			case DB_OVERFLOWED:
				status = RecoveryInProgress() ? "read from the events (standby)" :
					"read from the events (did not fit)";
				break;
			default:
				status = "not rebuilt";
				break;
		}
		lock_partitions(LW_SHARED);
		hash_seq_init(&seq, entries);
		while ((e = hash_seq_search(&seq)) != NULL)
		{
			if (e->key.database != MyDatabaseId)
				continue;
			periods++;
			slots += e->nslots;
		}
		unlock_partitions();
	}
	values[0] = CStringGetTextDatum(status);
	values[1] = Int64GetDatum(periods);
	values[2] = Int64GetDatum(slots);
	values[3] = Int64GetDatum(state ? (int64) pg_atomic_read_u64(&state->added) : 0);
	values[4] = Int64GetDatum(state ? (int64) pg_atomic_read_u64(&state->no_room) : 0);
	values[5] = Int64GetDatum(state ? (int64) pg_atomic_read_u64(&state->folded) : 0);
	values[6] = Int64GetDatum(state ? (int64) pg_atomic_read_u64(&state->rebuilt) : 0);
	values[7] = Int64GetDatum(state ? (int64) state->slots_per_partition * FM_PENDING_PARTITIONS : 0);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
}

/*
 * What a transaction that is prepared writes instead (prepare_as_rows): its
 * amounts into the backend's own stripes, and its events marked counted
 * (period_start NULL), the one update of an event row.
 */
static FmStatement own_stripe_stmt = {
	"INSERT INTO flagmeter.counters AS c (tenant, meter, period_start, stripe, counter)"
	" VALUES ($1, $2, $3, $4, $5)"
	" ON CONFLICT (tenant, meter, period_start, stripe) DO UPDATE"
	" SET counter = c.counter OPERATOR(flagmeter.+) EXCLUDED.counter",
	5, {TEXTOID, TEXTOID, TIMESTAMPTZOID, INT2OID, FM_TYPE_COUNTER}
};

static void
add_to_own_stripe(const char *tenant, const char *meter, TimestampTz period_start,
					 const FmCounter *delta)
{
	Datum		args[5];

	fm_period_args(args, tenant, meter, period_start);
	args[3] = Int16GetDatum(fm_own_stripe());
	args[4] = FmCounterPGetDatum(delta);
	fm_execute(&own_stripe_stmt, args, NULL, false, 0);
}

static FmStatement unpend_events_stmt = {
	"UPDATE flagmeter.events SET period_start = NULL"
	" WHERE xid OPERATOR(pg_catalog.=) flagmeter.xid_int(pg_catalog.pg_current_xact_id())"
	" AND period_start IS NOT NULL",
	0, {InvalidOid}
};

static void
unpend_own_events(void)
{
	fm_execute(&unpend_events_stmt, NULL, NULL, false, 0);
}

/* One period's pending amount of this transaction, for prepare_as_rows. */
typedef struct OwnAmount
{
	PendingKey	key;
	FmCounter	amount;
} OwnAmount;

/*
 * Before PREPARE TRANSACTION: take this transaction's slots out of the
 * table and write their amounts into the backend's own stripes, and mark
 * its events counted.  Its committed subtransactions' slots count as its
 * own; those of subtransactions that rolled back are left to settle (they
 * count for no one).
 */
static void
prepare_as_rows(void)
{
	HASH_SEQ_STATUS seq;
	PendingEntry *e;
	OwnAmount  *own = NULL;
	int			nown = 0;
	int			maxown = 0;
	int			p;
	int			i;

	lock_partitions(LW_EXCLUSIVE);
	hash_seq_init(&seq, entries);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		int32	   *link = &e->first_slot;

		p = partition_of(get_hash_value(entries, &e->key));
		while (*link >= 0)
		{
			PendingSlot *slot = &state->slots[*link];
			int32		s = *link;

			if (!TransactionIdIsCurrentTransactionId(slot->xid))
			{
				link = &slot->next;
				continue;
			}
			if (nown == maxown)
			{
				maxown = Max(16, maxown * 2);
				/* TopTransactionContext: an error releases the locks and it */
				own = own ? repalloc(own, sizeof(OwnAmount) * maxown) :
					MemoryContextAlloc(TopTransactionContext, sizeof(OwnAmount) * maxown);
			}
			own[nown].key = e->key;
			own[nown].amount = slot->amount;
			nown++;
			*link = slot->next;
			e->nslots--;
			give_slot(p, s);
		}
	}
	unlock_partitions();

	/* the statement that prepares has ended: no snapshot is active */
	PushActiveSnapshot(GetTransactionSnapshot());
	SPI_connect();
	for (i = 0; i < nown; i++)
		add_to_own_stripe(own[i].key.tenant, own[i].key.meter, own[i].key.period_start,
						  &own[i].amount);
	unpend_own_events();
	SPI_finish();
	PopActiveSnapshot();
}

static void
pending_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_PREPARE:
			if (added_in_xact)
				prepare_as_rows();
			break;
		case XACT_EVENT_COMMIT:
			if (ready_at_commit)
			{
				PendingDatabase *d = find_database(false);

				if (d != NULL && pg_atomic_read_u32(&d->status) == DB_OVERFLOWED)
					pg_atomic_write_u32(&d->status, DB_READY);
			}
			added_in_xact = false;
			ready_at_commit = false;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PARALLEL_ABORT:
			added_in_xact = false;
			ready_at_commit = false;
			break;
		default:
			break;
	}
}

void
fm_pending_init(void)
{
	DefineCustomBoolVariable("flagmeter.one_write_track",
							 gettext_noop("Whether track of a sum or count meter writes its event only, "
										  "its amount pending in shared memory until maintain() folds it."),
							 gettext_noop("Only when flagmeter is preloaded with flagmeter.pending_periods > 0."),
							 &one_write_track,
							 true,
							 PGC_USERSET, 0,
							 NULL, NULL, NULL);
	if (!process_shared_preload_libraries_in_progress)
		return;
	DefineCustomIntVariable("flagmeter.pending_periods",
							gettext_noop("Periods whose pending usage shared memory holds at once (0: none)."),
							gettext_noop("Only when flagmeter is in shared_preload_libraries."),
							&pending_periods,
							16384, 0, 10000000,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);
	if (pending_periods == 0)
		return;
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = pending_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = pending_startup;
	RegisterXactCallback(pending_xact_callback, NULL);
}

/*
 * pending_forget(): this database's pending usage is rebuilt from the
 * events at the next call (after_restore() renumbered them).
 */
PG_FUNCTION_INFO_V1(fm_pending_forget);
Datum
fm_pending_forget(PG_FUNCTION_ARGS)
{
	PendingDatabase *d;

	if (state == NULL || (d = find_database(false)) == NULL)
		PG_RETURN_VOID();
	LWLockAcquire(databases_lock(), LW_EXCLUSIVE);
	forget_database();
	pg_atomic_write_u32(&d->status, DB_EMPTY);
	LWLockRelease(databases_lock());
	PG_RETURN_VOID();
}

/*
 * pending_drop(tenant, meter, period_start): the pending usage of this
 * database's periods of tenant (NULL: every tenant), meter (NULL: every
 * meter) and period_start (NULL: every period) is gone for whoever sees
 * this transaction committed, as the rows delete_usage() deletes or
 * recount_current_period() rebuilds.  The caller holds SHARE ROW
 * EXCLUSIVE on flagmeter.counters: no track is in flight.
 */
PG_FUNCTION_INFO_V1(fm_pending_drop);
Datum
fm_pending_drop(PG_FUNCTION_ARGS)
{
	char	   *tenant = PG_ARGISNULL(0) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(0));
	char	   *meter = PG_ARGISNULL(1) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(1));
	bool		any_period = PG_ARGISNULL(2);
	TimestampTz period_start = any_period ? 0 : PG_GETARG_TIMESTAMPTZ(2);
	HASH_SEQ_STATUS seq;
	PendingEntry *e;
	TransactionId me;
	bool		room = true;

	Relation	counters = relation_open(fm_relation_oid("counters"), NoLock);
	bool		writers_stopped = CheckRelationLockedByMe(counters, ShareRowExclusiveLock, true);

	relation_close(counters, NoLock);
	/* only for a caller that stopped the writers, as delete_usage does */
	if (!writers_stopped)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pending_drop needs SHARE ROW EXCLUSIVE on flagmeter.counters"),
				 errhint("LOCK TABLE flagmeter.counters IN SHARE ROW EXCLUSIVE MODE first.")));
	if (!table_holds_database())
		PG_RETURN_VOID();
	me = GetCurrentTransactionId();
	lock_partitions(LW_EXCLUSIVE);
	hash_seq_init(&seq, entries);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		int32		s;

		if (e->key.database != MyDatabaseId ||
			(tenant && strcmp(e->key.tenant, tenant) != 0) ||
			(meter && strcmp(e->key.meter, meter) != 0) ||
			(!any_period && e->key.period_start != period_start))
			continue;
		clean_folds(e);
		if (!counter_empty(&e->settled))
		{
			if (e->nfolds == FM_PENDING_FOLDS)
			{
				room = false;
				break;
			}
			e->folds[e->nfolds].xid = me;
			e->folds[e->nfolds].amount = e->settled;
			e->nfolds++;
			fm_counter_init(&e->settled);
		}
		for (s = e->first_slot; s >= 0; s = state->slots[s].next)
		{
			PendingSlot *slot = &state->slots[s];

			/* an earlier drop that rolled back does not count */
			if (TransactionIdIsValid(slot->gone_in) &&
				tagger_state(slot->gone_in) == TAGGER_ROLLED_BACK)
				slot->gone_in = InvalidTransactionId;
			if (!TransactionIdIsValid(slot->gone_in) &&
				(TransactionIdIsCurrentTransactionId(slot->xid) ||
				 (!TransactionIdIsInProgress(slot->xid) &&
				  TransactionIdDidCommit(slot->xid))))
				slot->gone_in = me;
		}
	}
	unlock_partitions();
	if (!room)
		ereport(ERROR,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 errmsg("could not drop the pending usage of tenant \"%s\" meter \"%s\" now",
						tenant ? tenant : "*", meter ? meter : "*"),
				 errdetail("A transaction older than its last folds is still open."),
				 errhint("Retry once long-running transactions have ended.")));
	PG_RETURN_VOID();
}

static FmStatement has_pending_stmt = {
	"SELECT EXISTS (SELECT FROM flagmeter.events e"
	" WHERE (e.tenant" FM_EQ "$1 OR $1 IS NULL) AND (e.meter" FM_EQ "$2 OR $2 IS NULL)"
	" AND e.period_start IS NOT NULL AND e.xid OPERATOR(pg_catalog.>=)"
	"  (SELECT flagmeter.xid_int(s.counted_through) FROM flagmeter.current_state s))",
	2, {TEXTOID, TEXTOID}
};

/*
 * has_pending_events(tenant, meter) -> boolean: whether the tenant's (NULL:
 * any) usage of meter (NULL: any) has events written alone that no counter
 * row holds yet (read as the owner, as flagmeter's statements are).
 */
PG_FUNCTION_INFO_V1(fm_has_pending_events);
Datum
fm_has_pending_events(PG_FUNCTION_ARGS)
{
	Datum		args[2];
	char		nulls[3] = "  ";
	bool		isnull;
	bool		found;

	args[0] = PG_ARGISNULL(0) ? (Datum) 0 : PG_GETARG_DATUM(0);
	args[1] = PG_ARGISNULL(1) ? (Datum) 0 : PG_GETARG_DATUM(1);
	nulls[0] = PG_ARGISNULL(0) ? 'n' : ' ';
	nulls[1] = PG_ARGISNULL(1) ? 'n' : ' ';
	SPI_connect();
	fm_execute(&has_pending_stmt, args, nulls, true, 0);
	found = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1,
									   &isnull));
	SPI_finish();
	PG_RETURN_BOOL(found);
}

static FmStatement counted_through_stmt = {
	"SELECT s.counted_through FROM flagmeter.current_state s",
	0, {InvalidOid}
};

/* counted_through() -> xid8, read as the owner */
PG_FUNCTION_INFO_V1(fm_counted_through);
Datum
fm_counted_through(PG_FUNCTION_ARGS)
{
	bool		isnull;
	Datum		d;

	SPI_connect();
	fm_execute(&counted_through_stmt, NULL, NULL, true, 0);
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	SPI_finish();
	PG_RETURN_DATUM(d);
}
