/*
 * inflight_internal.h
 *	  The table of consumes in flight, as inflight.c and inflight_consume.c
 *	  share it: its entries and slots, its locks and the registrations of
 *	  this transaction.  The rest of the engine uses inflight.h only.
 *
 *	  decide without queueing on a row lock.
 *
 * Without this, every consume of a period decides under its stripe 0's
 * row lock, held through the commit flush, so a hot tenant's consumes run
 * one commit at a time, like the plain conditional UPDATE they replace
 * (docs/design.md, "Consume in flight").  Preloaded, a consume of one sum
 * or count meter (consume.c's consume_one) decides here instead:
 *
 *	1. Under the period's partition lock (an LWLock) it takes a new
 *	   snapshot, and removes the entries of consumes that ended before it.
 *	   It lets go and reads the period's committed usage in that snapshot
 *	   (read under the lock, the read was where a hot tenant's consumes
 *	   queued), then takes the lock again and adds the consumes of other
 *	   transactions in flight now (none of them is in what the snapshot
 *	   shows: those that ended before it were removed, the rest registered
 *	   after it) and those that ended since the snapshot and committed
 *	   (each entry remembers the last FM_INFLIGHT_ENDED).  A consume that
 *	   committed just before counts once, by its rows; one that rolled back
 *	   not at all.  When more ended than the entry remembers, or a decider
 *	   under the row lock came and went in between (what it wrote only the
 *	   rows know), it reads the period again under the lock, in a snapshot
 *	   taken there.
 *	2. It decides.  Granted, it records its own amount in the period's
 *	   table entry under its transaction id, lets go of the lock, and writes
 *	   its event and a stripe as track does.  When only consumes in flight
 *	   stand between it and the quota, it waits for one of their
 *	   transactions and decides again: a consume that rolls back never causes
 *	   a refusal.
 *	3. Its entry ends with its transaction (or subtransaction, on
 *	   rollback), removed by the callbacks below; an entry whose transaction
 *	   a new snapshot no longer shows in progress is removed by the next
 *	   decider too (a prepared transaction's, after COMMIT PREPARED).
 *
 * So no two lock-free consumes decide on the same room: each decides under
 * the partition lock on everything granted before it, committed or not.
 *
 * Every other decider of a period (a consume with a key, over several
 * meters, with credit grants or reservations, reserve, settle, track
 * drawing grants) still decides under stripe 0's row lock, and registers
 * here first as a "locker" (fm_inflight_before_lock): while a locker is in
 * flight, consumes of the period take the row-lock path too, and the
 * locker waits for the lock-free consumes already in flight before it
 * reads.  The two ways of deciding never run on one period at once.
 *
 * The table is fixed: flagmeter.inflight_periods entries, spread over
 * FM_INFLIGHT_PARTITIONS locks, each entry a period (a 64-bit hash of
 * database, tenant, meter and period; two periods that collide share an
 * entry, which only counts more in flight, never less) with up to
 * FM_INFLIGHT_SLOTS transactions in flight.  When an entry or the table is
 * full, the consume falls back to the row lock; a locker that finds no
 * room is counted in overflow_lockers instead, and while any is in
 * flight, no consume decides here.  No call fails for want of room.
 *
 * Nothing here outlives the transactions in flight: after a crash or a
 * failover, committed usage is the rows, as without this table.
 *
 * The files:
 *
 *	inflight.c			the table in shared memory: its entries, slots and
 *						partition locks, what this transaction registered and
 *						its end, the lockers (fm_inflight_before_lock), and
 *						consumes_in_flight()
 *	inflight_consume.c	the lock-free consume: steps 1 and 2 above
 *						(fm_inflight_consume)
 */
#ifndef FLAGMETER_INFLIGHT_INTERNAL_H
#define FLAGMETER_INFLIGHT_INTERNAL_H

#include "postgres.h"
#include "access/transam.h"
#include "datatype/timestamp.h"
#include "port/atomics.h"
#include "storage/lwlock.h"
#include "utils/snapshot.h"

#include "counter_core.h"

#define FM_INFLIGHT_PARTITIONS 16
#define FM_INFLIGHT_SLOTS 64
#define FM_INFLIGHT_PROBES 8
#define FM_INFLIGHT_ENDED 32

/* A transaction in flight on a period. */
typedef struct FmInflightSlot
{
	TransactionId xid;			/* the (sub)transaction that registered */
	bool		locker;			/* decides under stripe 0's lock */
	int64		amount;			/* a lock-free consume's amount */
} FmInflightSlot;

/* A lock-free consume whose slot was taken out (its transaction ended). */
typedef struct FmInflightEnded
{
	TransactionId xid;
	int64		amount;
} FmInflightEnded;

typedef struct FmInflightEntry
{
	uint64		key;			/* 0: free */
	uint64		incarnation;	/* bumped whenever the entry is (re)made */

	/*
	 * The latest transaction of a lock-free consume of the period: a
	 * REPEATABLE READ locker whose snapshot may miss it fails (40001).  Kept
	 * until every snapshot sees it as ended.
	 */
	TransactionId max_xid;
	int			nslots;
	FmInflightSlot slots[FM_INFLIGHT_SLOTS];

	/*
	 * The last FM_INFLIGHT_ENDED lock-free consumes taken out, the n-th at
	 * ended[n % FM_INFLIGHT_ENDED]: a consume that read the period outside
	 * the lock counts those that committed after its snapshot.
	 */
	uint64		nended;
	FmInflightEnded ended[FM_INFLIGHT_ENDED];
	uint64		lockers_ended;	/* locker slots taken out, ever */
} FmInflightEntry;

typedef struct FmInflightState
{
	LWLockPadded *locks;		/* one per partition */
	int			nentries;		/* a multiple of FM_INFLIGHT_PARTITIONS */
	pg_atomic_uint32 overflow_lockers;	/* lockers in flight without an entry */
	pg_atomic_uint64 overflow_started;	/* such lockers, ever */
	/* since the server started, for consumes_in_flight() */
	pg_atomic_uint64 lock_free; /* consumes decided here */
	pg_atomic_uint64 waits;		/* waits for a consume in flight */
	pg_atomic_uint64 fell_back; /* consumes sent to the row lock */
	pg_atomic_uint64 lockers;	/* deciders registered as lockers */
	pg_atomic_uint64 overflowed;	/* lockers that found no room */
	FmInflightEntry entries[FLEXIBLE_ARRAY_MEMBER];
} FmInflightState;

/*
 * A registration of this transaction: a lock-free consume's (reservation),
 * or a locker counted in overflow_lockers.
 */
typedef enum FmInflightRegistrationKind
{
	FM_INFLIGHT_RESERVATION,
	FM_INFLIGHT_OVERFLOW_LOCKER
} FmInflightRegistrationKind;

extern FmInflightState *fm_inflight_state;

extern uint64 fm_inflight_period_key(const char *tenant, const char *meter, TimestampTz period_start);
extern LWLock *fm_inflight_partition_lock(uint64 key);
extern int	fm_inflight_find_entry(uint64 key, bool create);
extern void fm_inflight_free_if_unused(FmInflightEntry *e);
extern bool fm_inflight_scan_slots(FmInflightEntry *e, Snapshot snapshot, TimestampTz now,
								   FmCounter *in_flight, TransactionId *xids, int *nxids);
extern bool fm_inflight_add_slot(FmInflightEntry *e, TransactionId xid, bool locker, int64 amount);
extern void fm_inflight_add_registration(int index, uint64 key, TransactionId xid, bool reservation);
extern bool fm_inflight_has_registration(FmInflightRegistrationKind kind);

#endif							/* FLAGMETER_INFLIGHT_INTERNAL_H */
