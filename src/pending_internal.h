/*
 * pending_internal.h
 *	  The shared-memory table of pending usage, as the pending_*.c files
 *	  share it: its structs, its locks and the helpers of more than one
 *	  phase.  The rest of the engine uses pending.h only.
 *
 * Without this table, every track writes its event and adds its amount to
 * a counter stripe (stripes.c): two writes, whose floor as plain SQL is
 * 0.78-0.98 of one INSERT (docs/design.md, "One write per track").
 * Preloaded, a track of a sum or count meter without credit grants or a
 * pool writes its event only, with the period it counts in
 * (flagmeter.events.period_start not NULL: "pending"), and adds its amount
 * here, to the period's entry, under its transaction id:
 *
 *	- A reader counts the amounts of the transactions its snapshot sees
 *	  committed, and its own (pending_read.c), as a heap scan would count
 *	  their rows.  So reads stay exact and read-your-writes holds.
 *	- An amount whose transaction every snapshot sees as ended is settled:
 *	  committed, it joins the entry's settled counter, which every reader
 *	  counts; rolled back, it is dropped.  Entries keep a slot per
 *	  transaction only until then, from a pool per partition.
 *	- maintain() folds (fm_fold_pending, pending_fold.c): it takes a
 *	  boundary H below which every transaction is settled, settles every
 *	  entry of its database up to H, adds each settled counter to the
 *	  period's merged stripe (32767) and moves it into a fold of the entry
 *	  tagged with maintain's transaction id, and records H as
 *	  maintenance_state.counted_through in the same transaction.  A reader
 *	  counts a fold while its snapshot does not see that transaction
 *	  committed (it then reads the rows without the fold's amount); the fold
 *	  is dropped once every snapshot does, and merged back into settled when
 *	  maintain rolls back.  Only settled amounts are folded: every snapshot
 *	  counts them, so a reader that does not see the fold counts all of it,
 *	  one that does counts none.
 *	- The events are the durable record.  A pending event whose
 *	  (top-level) transaction id is at or above counted_through is in no
 *	  counter row.  After a restart or a failover the table is empty: the
 *	  first call in a database rebuilds its entries from those events
 *	  (pending_databases.c) before any read is answered, and until then
 *	  tracks write stripes.  A standby, and a database whose pending usage
 *	  did not fit, read those events instead (pending_read.c): slow, exact.
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
 * own stripes and its events are marked counted (pending_xact.c), as if
 * it had tracked with two writes.
 *
 * The files, one phase each, over pending_table.c:
 *
 *	pending_table.c		the table in shared memory: its partitions and
 *						locks, the slot pools, settling slots and cleaning
 *						folds, an entry found under its lock
 *	pending_databases.c	each database's record: ready, overflowed or to be
 *						rebuilt from the events after a restart
 *	pending_add.c		the add path of track, its recheck figure, the
 *						GUCs and pending_usage_stats()
 *	pending_read.c		what a read adds in its snapshot, from the table or
 *						from the events
 *	pending_fold.c		maintain()'s fold
 *	pending_xact.c		the transaction's end: prepare, commit, and
 *						pending_drop() of a transaction that deletes usage
 */
#ifndef FLAGMETER_PENDING_INTERNAL_H
#define FLAGMETER_PENDING_INTERNAL_H

#include "postgres.h"
#include "access/transam.h"
#include "access/xact.h"
#include "datatype/timestamp.h"
#include "port/atomics.h"
#include "storage/lwlock.h"
#include "utils/hsearch.h"

#include "bounds.h"
#include "counter.h"
#include "counter_core.h"

#define FM_PENDING_PARTITIONS 16
#define FM_PENDING_FOLDS 4
#define FM_PENDING_SLOTS_PER_PERIOD 4
#define FM_PENDING_DATABASES 64

typedef struct FmPendingKey
{
	Oid			database;
	TimestampTz period_start;
	char		tenant[FM_TENANT_MAX_BYTES + 1];
	char		meter[FM_NAME_MAX_BYTES + 1];
} FmPendingKey;

/* A transaction's amount on a period, until every snapshot sees it ended. */
typedef struct FmPendingSlot
{
	TransactionId xid;			/* the (sub)transaction: visibility */
	FullTransactionId top;		/* its top-level transaction: events.xid */
	int32		next;			/* next slot of the entry, or -1 */

	/*
	 * The transaction that deleted or recounted this usage (fm_pending_drop),
	 * or InvalidTransactionId: a reader that sees it committed does not count
	 * the slot.
	 */
	TransactionId gone_in;
	FmCounter	amount;
} FmPendingSlot;

/* Settled usage maintain() moved into the rows, until all see it there. */
typedef struct FmPendingFold
{
	TransactionId xid;			/* maintain's transaction */
	FmCounter	amount;
} FmPendingFold;

typedef struct FmPendingEntry
{
	FmPendingKey key;
	FmCounter	settled;
	int32		first_slot;		/* -1: none */
	int32		nslots;
	int32		nfolds;
	FmPendingFold folds[FM_PENDING_FOLDS];

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
} FmPendingEntry;

typedef struct FmPendingPartition
{
	int32		free_slot;		/* head of the free list, -1: none */
	int32		nfree;
} FmPendingPartition;

/* A database's record's status */
enum
{
	FM_PENDING_DB_EMPTY = 0,	/* not rebuilt since the server started */
	FM_PENDING_DB_READY,		/* its pending usage is in the table */
	FM_PENDING_DB_OVERFLOWED	/* it did not fit: read the events */
};

typedef struct FmPendingDatabase
{
	Oid			database;		/* InvalidOid: free */
	Oid			counters;		/* flagmeter.counters when rebuilt: a new one
								 * is a new extension, its entries gone */
	pg_atomic_uint32 status;
} FmPendingDatabase;

typedef struct FmPendingState
{
	LWLockPadded *locks;		/* FM_PENDING_PARTITIONS, then the databases' */
	int			slots_per_partition;

	/*
	 * 0, or while maintain settles up to H: H (no slot of a transaction at or
	 * above it settles), or PG_UINT64_MAX while it takes H.
	 */
	pg_atomic_uint64 fold_high;
	/* above every top-level transaction id a track settled */
	pg_atomic_uint64 settled_below;
	/* since the server started, for pending_usage_stats() */
	pg_atomic_uint64 added;
	pg_atomic_uint64 no_room;
	pg_atomic_uint64 folded;
	pg_atomic_uint64 rebuilt;
	FmPendingPartition partitions[FM_PENDING_PARTITIONS];
	FmPendingDatabase databases[FM_PENDING_DATABASES];
	FmPendingSlot slots[FLEXIBLE_ARRAY_MEMBER];
} FmPendingState;

/*
 * Where a transaction that tagged pending usage (a fold's maintain, a
 * slot's drop) stands: still running (or ours), committed but not yet seen
 * so by every snapshot, committed and seen so by all (what it tagged may
 * go), or rolled back (what it tagged comes back).
 */
typedef enum FmTaggerState
{
	FM_TAGGER_RUNNING,
	FM_TAGGER_COMMITTED,
	FM_TAGGER_SEEN_BY_ALL,
	FM_TAGGER_ROLLED_BACK
} FmTaggerState;

/* the table (pending_table.c); NULL when not preloaded with one */
extern FmPendingState *fm_pending_state;
extern HTAB *fm_pending_entries;

/* flagmeter.pending_periods (pending_add.c) */
extern int	fm_pending_periods;

/*
 * This transaction's marks, cleared at its end (pending_xact.c): it added
 * pending amounts (so PREPARE moves them into rows), or maintain folded
 * the events themselves (so at commit the table holds the database).
 */
extern bool fm_pending_added_in_xact;
extern bool fm_pending_ready_at_commit;

static inline int
partition_of(uint32 hash)
{
	return hash % FM_PENDING_PARTITIONS;
}

/* the partition of an entry of the table */
static inline int
entry_partition(const FmPendingEntry *e)
{
	return partition_of(get_hash_value(fm_pending_entries, &e->key));
}

static inline LWLock *
partition_lock(int p)
{
	return &fm_pending_state->locks[p].lock;
}

static inline void
merge_into(FmCounter *into, const FmCounter *amount)
{
	fm_counter_report(fm_counter_merge(into, amount));
}

static inline bool
counter_empty(const FmCounter *c)
{
	return c->events == 0 && c->used == 0;
}

static inline bool
entry_unused(const FmPendingEntry *e)
{
	return e->first_slot < 0 && e->nfolds == 0 && counter_empty(&e->settled);
}

/* pending_table.c */
extern void fm_pending_request_shmem(void);
extern void fm_pending_lock_all(LWLockMode mode);
extern void fm_pending_unlock_all(void);
extern int32 fm_pending_take_slot(int p);
extern void fm_pending_give_slot(int p, int32 s);
extern FmTaggerState fm_pending_tagger_state(TransactionId xid);
extern void fm_pending_settle_slots(int p, FmPendingEntry *e, uint64 below);
extern void fm_pending_clean_folds(FmPendingEntry *e);
extern FmPendingEntry *fm_pending_lock_entry(const char *tenant, const char *meter,
											 TimestampTz period_start,
											 HASHACTION action, LWLockMode mode,
											 int *partition);

/* pending_databases.c */
extern FmPendingDatabase *fm_pending_find_database(bool create);
extern void fm_pending_forget_database(void);
extern uint32 fm_pending_ready_status(void);
extern bool fm_pending_table_holds_database(void);

/* pending_xact.c */
extern void fm_pending_xact_callback(XactEvent event, void *arg);

#endif							/* FLAGMETER_PENDING_INTERNAL_H */
