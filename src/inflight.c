/*
 * inflight.c
 *	  Consumes in flight, in shared memory: how consumes of one hot tenant
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
 */
#include "postgres.h"
#include "fmgr.h"
#include "funcapi.h"

#include "access/htup_details.h"
#include "access/transam.h"
#include "access/xact.h"
#include "common/hashfn.h"
#include "common/int.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lmgr.h"
#include "storage/lwlock.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

#include "counter.h"
#include "inflight.h"
#include "usage_rows.h"

#define FM_INFLIGHT_PARTITIONS 16
#define FM_INFLIGHT_SLOTS 64
#define FM_INFLIGHT_PROBES 8
#define FM_INFLIGHT_ENDED 32

/* A transaction in flight on a period. */
typedef struct InflightSlot
{
	TransactionId xid;			/* the (sub)transaction that registered */
	bool		locker;			/* decides under stripe 0's lock */
	int64		amount;			/* a lock-free consume's amount */
} InflightSlot;

/* A lock-free consume whose slot was taken out (its transaction ended). */
typedef struct InflightEnded
{
	TransactionId xid;
	int64		amount;
} InflightEnded;

typedef struct InflightEntry
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
	InflightSlot slots[FM_INFLIGHT_SLOTS];

	/*
	 * The last FM_INFLIGHT_ENDED lock-free consumes taken out, the n-th at
	 * ended[n % FM_INFLIGHT_ENDED]: a consume that read the period outside
	 * the lock counts those that committed after its snapshot.
	 */
	uint64		nended;
	InflightEnded ended[FM_INFLIGHT_ENDED];
	uint64		lockers_ended;	/* locker slots taken out, ever */
} InflightEntry;

typedef struct InflightState
{
	LWLockPadded *locks;		/* one per partition */
	int			nentries;		/* a multiple of FM_INFLIGHT_PARTITIONS */
	pg_atomic_uint32 overflow_lockers;	/* lockers in flight without an
										 * entry */
	pg_atomic_uint64 overflow_started;	/* such lockers, ever */
	/* since the server started, for consumes_in_flight() */
	pg_atomic_uint64 lock_free;	/* consumes decided here */
	pg_atomic_uint64 waits;		/* waits for a consume in flight */
	pg_atomic_uint64 fell_back;	/* consumes sent to the row lock */
	pg_atomic_uint64 lockers;	/* deciders registered as lockers */
	pg_atomic_uint64 overflowed;	/* lockers that found no room */
	InflightEntry entries[FLEXIBLE_ARRAY_MEMBER];
} InflightState;

/* What this transaction registered, to take out when it ends. */
typedef struct InflightRegistration
{
	int			index;			/* of its entry; -1: an overflow locker */
	uint64		key;
	TransactionId xid;
	SubTransactionId subid;
	bool		reservation;	/* a lock-free consume's, not a locker's */
} InflightRegistration;

/* flagmeter.inflight_periods: entries of the table (0: none) */
static int	inflight_periods = 1024;

/* flagmeter.lock_free_consume */
static bool lock_free_consume = true;

static InflightState *state = NULL;

static InflightRegistration *registrations = NULL;
static int	nregistrations = 0;
static int	maxregistrations = 0;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static int
table_entries(void)
{
	return (inflight_periods + FM_INFLIGHT_PARTITIONS - 1) /
		FM_INFLIGHT_PARTITIONS * FM_INFLIGHT_PARTITIONS;
}

static Size
table_size(void)
{
	return add_size(offsetof(InflightState, entries),
					mul_size(table_entries(), sizeof(InflightEntry)));
}

static void
inflight_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(table_size());
	RequestNamedLWLockTranche("flagmeter_inflight", FM_INFLIGHT_PARTITIONS);
}

static void
inflight_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	state = ShmemInitStruct("flagmeter consumes in flight", table_size(), &found);
	if (!found)
	{
		memset(state, 0, table_size());
		state->locks = GetNamedLWLockTranche("flagmeter_inflight");
		state->nentries = table_entries();
		pg_atomic_init_u32(&state->overflow_lockers, 0);
		pg_atomic_init_u64(&state->overflow_started, 0);
		pg_atomic_init_u64(&state->lock_free, 0);
		pg_atomic_init_u64(&state->waits, 0);
		pg_atomic_init_u64(&state->fell_back, 0);
		pg_atomic_init_u64(&state->lockers, 0);
		pg_atomic_init_u64(&state->overflowed, 0);
	}
	LWLockRelease(AddinShmemInitLock);
}

static uint64
period_key(const char *tenant, const char *meter, TimestampTz period_start)
{
	uint64		h = hash_bytes_extended((const unsigned char *) tenant, strlen(tenant),
										MyDatabaseId);

	h = hash_combine64(h, hash_bytes_extended((const unsigned char *) meter,
											  strlen(meter), 0));
	h = hash_combine64(h, hash_bytes_extended((const unsigned char *) &period_start,
											  sizeof(period_start), 0));
	return h == 0 ? 1 : h;
}

static LWLock *
partition_lock(uint64 key)
{
	return &state->locks[key % FM_INFLIGHT_PARTITIONS].lock;
}

/* Unused, and no snapshot can miss the lock-free consumes it saw. */
static bool
evictable(const InflightEntry *e)
{
	return e->nslots == 0 &&
		(!TransactionIdIsValid(e->max_xid) ||
		 GlobalVisCheckRemovableXid(NULL, e->max_xid));
}

/*
 * The index of key's entry, made (over a free or evictable one) when
 * create; -1 when there is none.  Under key's partition lock.  An entry of
 * partition p sits at an index i with i % FM_INFLIGHT_PARTITIONS == p.
 */
static int
find_entry(uint64 key, bool create)
{
	int			per_partition = state->nentries / FM_INFLIGHT_PARTITIONS;
	int			partition = key % FM_INFLIGHT_PARTITIONS;
	int			base = (key / FM_INFLIGHT_PARTITIONS) % per_partition;
	int			room = -1;
	int			k;

	for (k = 0; k < Min(FM_INFLIGHT_PROBES, per_partition); k++)
	{
		int			i = partition + FM_INFLIGHT_PARTITIONS * ((base + k) % per_partition);
		InflightEntry *e = &state->entries[i];

		if (e->key == key)
			return i;
		if (room < 0 && (e->key == 0 || evictable(e)))
			room = i;
	}
	if (!create || room < 0)
		return -1;
	state->entries[room].key = key;
	state->entries[room].incarnation++;
	state->entries[room].max_xid = InvalidTransactionId;
	state->entries[room].nslots = 0;
	state->entries[room].nended = 0;
	state->entries[room].lockers_ended = 0;
	return room;
}

/* An entry with nothing in flight and no lock-free consume to remember is free. */
static void
free_if_unused(InflightEntry *e)
{
	if (e->nslots == 0 && !TransactionIdIsValid(e->max_xid))
		e->key = 0;
}

static void
remove_slot(InflightEntry *e, int s)
{
	if (!e->slots[s].locker)
	{
		InflightEnded *ended = &e->ended[e->nended++ % FM_INFLIGHT_ENDED];

		ended->xid = e->slots[s].xid;
		ended->amount = e->slots[s].amount;
	}
	else
		e->lockers_ended++;
	e->slots[s] = e->slots[--e->nslots];
	free_if_unused(e);
}

/*
 * What the entry holds for a decider in snapshot: slots of transactions
 * the snapshot no longer shows in progress are removed (they ended before
 * it: committed ones are in the rows it reads, rolled-back ones nowhere),
 * this transaction's own are skipped (its rows are visible to it).  Of the
 * others, the lock-free consumes' amounts go into *in_flight as events
 * (when not NULL) and their transactions into xids[] (*nxids); returns
 * whether a locker is among them.
 */
static bool
scan_slots(InflightEntry *e, Snapshot snapshot, TimestampTz now, FmCounter *in_flight,
		   TransactionId *xids, int *nxids)
{
	bool		locker = false;
	int			s = 0;

	*nxids = 0;
	while (s < e->nslots)
	{
		InflightSlot *slot = &e->slots[s];

		if (TransactionIdIsCurrentTransactionId(slot->xid))
			s++;
		else if (!XidInMVCCSnapshot(slot->xid, snapshot))
			remove_slot(e, s);
		else
		{
			if (slot->locker)
				locker = true;
			else
			{
				if (in_flight)
					fm_counter_report(fm_counter_add_event(in_flight, slot->amount, now));
				xids[(*nxids)++] = slot->xid;
			}
			s++;
		}
	}
	return locker;
}

/*
 * The second look of a lock-free consume that read the period outside the
 * lock in snapshot (taken under it, when the entry had ended nended
 * consumes): every slot of another transaction counts, none of them can
 * be in what the snapshot showed (the first look removed those that
 * ended before it, and the others registered after it), and of the
 * consumes taken out since, those that committed after the snapshot.
 * Amounts go into *in_flight, the slots' transactions into xids[];
 * returns whether a locker is among them.
 */
static bool
count_in_flight(const InflightEntry *e, Snapshot snapshot, uint64 nended,
				TimestampTz now, FmCounter *in_flight, TransactionId *xids, int *nxids)
{
	bool		locker = false;
	uint64		n;
	int			s;

	*nxids = 0;
	for (s = 0; s < e->nslots; s++)
	{
		const InflightSlot *slot = &e->slots[s];

		if (TransactionIdIsCurrentTransactionId(slot->xid))
			continue;
		if (slot->locker)
			locker = true;
		else
		{
			fm_counter_report(fm_counter_add_event(in_flight, slot->amount, now));
			xids[(*nxids)++] = slot->xid;
		}
	}
	for (n = nended; n < e->nended; n++)
	{
		const InflightEnded *ended = &e->ended[n % FM_INFLIGHT_ENDED];

		if (XidInMVCCSnapshot(ended->xid, snapshot) && TransactionIdDidCommit(ended->xid))
			fm_counter_report(fm_counter_add_event(in_flight, ended->amount, now));
	}
	return locker;
}

static void
add_registration(int index, uint64 key, TransactionId xid, bool reservation)
{
	if (nregistrations == maxregistrations)
	{
		maxregistrations = Max(8, maxregistrations * 2);
		registrations = registrations == NULL ?
			MemoryContextAlloc(TopMemoryContext,
							   sizeof(InflightRegistration) * maxregistrations) :
			repalloc(registrations, sizeof(InflightRegistration) * maxregistrations);
	}
	registrations[nregistrations].index = index;
	registrations[nregistrations].key = key;
	registrations[nregistrations].xid = xid;
	registrations[nregistrations].subid = GetCurrentSubTransactionId();
	registrations[nregistrations].reservation = reservation;
	nregistrations++;
}

/*
 * Whether the entry has a locker slot of this transaction that lives as long
 * as the current subtransaction at least: its own, a parent's, or a
 * committed child's (whose registration now belongs to this one).
 */
static bool
has_locker_slot(const InflightEntry *e)
{
	int			s;

	for (s = 0; s < e->nslots; s++)
		if (e->slots[s].locker && TransactionIdIsCurrentTransactionId(e->slots[s].xid))
			return true;
	return false;
}

/*
 * Whether this transaction has a registration of the kind: a lock-free
 * consume's (reservation), or a locker counted in overflow_lockers.  One
 * with lock-free consumes in flight, which another transaction may be
 * waiting for, must not wait itself.  (Waiting while registered as a
 * locker is what the row lock made others do anyway.)
 */
typedef enum RegistrationKind
{
	RESERVATION,
	OVERFLOW_LOCKER
} RegistrationKind;

static bool
has_registration(RegistrationKind kind)
{
	int			i;

	for (i = 0; i < nregistrations; i++)
		if (kind == RESERVATION ? registrations[i].reservation : registrations[i].index < 0)
			return true;
	return false;
}

/*
 * A slot in the entry (under its lock); false when it is full.  A
 * (sub)transaction keeps one reservation slot per period, its amounts
 * added up, so that many consumes in one transaction do not fill the
 * entry.
 */
static bool
add_slot(InflightEntry *e, TransactionId xid, bool locker, int64 amount)
{
	int			s;

	for (s = 0; s < e->nslots && !locker; s++)
		if (e->slots[s].xid == xid && !e->slots[s].locker &&
			!pg_add_s64_overflow(e->slots[s].amount, amount, &e->slots[s].amount))
			return true;
	if (e->nslots == FM_INFLIGHT_SLOTS)
		return false;
	e->slots[e->nslots].xid = xid;
	e->slots[e->nslots].locker = locker;
	e->slots[e->nslots].amount = amount;
	e->nslots++;
	return true;
}

/* Take out registration r's slots (or its overflow count). */
static void
end_registration(const InflightRegistration *r)
{
	LWLock	   *lock;
	InflightEntry *e;
	int			s;

	if (r->index < 0)
	{
		pg_atomic_fetch_sub_u32(&state->overflow_lockers, 1);
		return;
	}
	lock = partition_lock(r->key);
	LWLockAcquire(lock, LW_EXCLUSIVE);
	e = &state->entries[r->index];
	if (e->key == r->key)
	{
		s = 0;
		while (s < e->nslots)
		{
			if (e->slots[s].xid == r->xid)
				remove_slot(e, s);
			else
				s++;
		}
	}
	LWLockRelease(lock);
}

static void
inflight_xact_callback(XactEvent event, void *arg)
{
	int			i;

	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			/* after the commit is visible: its rows count from now on */
			for (i = 0; i < nregistrations; i++)
				end_registration(&registrations[i]);
			nregistrations = 0;
			break;
		case XACT_EVENT_PRE_PREPARE:
			for (i = 0; i < nregistrations; i++)
				if (registrations[i].index < 0)
					ereport(ERROR,
							(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
							 errmsg("cannot PREPARE a transaction that consumed while flagmeter's table of consumes in flight was full"),
							 errhint("Raise flagmeter.inflight_periods.")));
			break;
		case XACT_EVENT_PREPARE:

			/*
			 * The prepared transaction stays in progress: its slots stay, and
			 * deciders remove them once it has ended.
			 */
			nregistrations = 0;
			break;
		default:
			break;
	}
}

static void
inflight_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						  SubTransactionId parentSubid, void *arg)
{
	int			i,
				kept = 0;

	switch (event)
	{
		case SUBXACT_EVENT_ABORT_SUB:
			for (i = 0; i < nregistrations; i++)
			{
				if (registrations[i].subid >= mySubid)
					end_registration(&registrations[i]);
				else
					registrations[kept++] = registrations[i];
			}
			nregistrations = kept;
			break;
		case SUBXACT_EVENT_COMMIT_SUB:
			for (i = 0; i < nregistrations; i++)
				if (registrations[i].subid >= mySubid)
					registrations[i].subid = parentSubid;
			break;
		default:
			break;
	}
}

void
fm_inflight_init(void)
{
	DefineCustomBoolVariable("flagmeter.lock_free_consume",
							 gettext_noop("Whether a consume of one meter may decide without stripe 0's row lock."),
							 gettext_noop("Only when flagmeter is preloaded with flagmeter.inflight_periods > 0."),
							 &lock_free_consume,
							 true,
							 PGC_USERSET, 0,
							 NULL, NULL, NULL);
	if (!process_shared_preload_libraries_in_progress)
		return;
	DefineCustomIntVariable("flagmeter.inflight_periods",
							gettext_noop("Periods the table of consumes in flight holds at once (0: none)."),
							gettext_noop("Only when flagmeter is in shared_preload_libraries; "
										 "an entry takes about 1.6 kB of shared memory."),
							&inflight_periods,
							1024, 0, 1000000,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);
	if (inflight_periods == 0)
		return;
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = inflight_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = inflight_startup;
	RegisterXactCallback(inflight_xact_callback, NULL);
	RegisterSubXactCallback(inflight_subxact_callback, NULL);
}

bool
fm_inflight_consume_enabled(void)
{
	return state != NULL && lock_free_consume && !IsolationUsesXactSnapshot() &&
		!XactReadOnly;
}

/*
 * One lock-free consume's view of its period, from its first look to its
 * decision: which period and entry, the snapshot it read the period in
 * and what the entry said then, what has committed in it and what counts
 * (committed and in flight), and the transactions in flight it may wait
 * for.
 */
typedef struct InflightLook
{
	const char *tenant;
	const char *meter;
	TimestampTz period_start;
	TimestampTz now;
	uint64		key;
	LWLock	   *lock;
	int			index;
	Snapshot	snapshot;
	uint64		incarnation;
	uint64		nended;
	uint64		lockers_ended;
	uint64		overflow_started;
	FmCounter	committed;
	FmCounter	counted;
	TransactionId xids[FM_INFLIGHT_SLOTS];
	int			nxids;
} InflightLook;

/* Let go of the lock (and of e when unused) and send the consume to the row lock. */
static void
fall_back(LWLock *lock, InflightEntry *e, Snapshot snapshot)
{
	if (e)
		free_if_unused(e);
	if (snapshot)
		UnregisterSnapshot(snapshot);
	LWLockRelease(lock);
	pg_atomic_fetch_add_u64(&state->fell_back, 1);
}

/*
 * Under the lock, with look->index found (-1: none, or no room): a
 * snapshot taken now, and the slots of consumes that ended before it
 * removed (the others' amounts into in_flight when not NULL).  The entry;
 * NULL, fallen back to the row lock, when there is none, a locker is in
 * flight on it, or it is full.
 */
static InflightEntry *
snapshot_entry(InflightLook *look, FmCounter *in_flight)
{
	InflightEntry *e;

	if (look->index < 0)
	{
		fall_back(look->lock, NULL, NULL);
		return NULL;
	}
	e = &state->entries[look->index];
	look->snapshot = RegisterSnapshot(GetLatestSnapshot());
	if (scan_slots(e, look->snapshot, look->now, in_flight, look->xids, &look->nxids) ||
		e->nslots == FM_INFLIGHT_SLOTS)
	{
		fall_back(look->lock, e, look->snapshot);
		return NULL;
	}
	return e;
}

/*
 * First look, under the lock: the snapshot, taken there, and the slots of
 * consumes that ended before it removed.  The period is read in it with
 * the lock let go (the read was half of the time the lock was held, and
 * consumes of a hot tenant queued for it).  False when the consume falls
 * back to the row lock.
 */
static bool
first_look(InflightLook *look)
{
	InflightEntry *e;

	LWLockAcquire(look->lock, LW_EXCLUSIVE);
	look->index = pg_atomic_read_u32(&state->overflow_lockers) > 0 ? -1 :
		find_entry(look->key, true);
	e = snapshot_entry(look, NULL);
	if (e == NULL)
		return false;
	look->incarnation = e->incarnation;
	look->nended = e->nended;
	look->lockers_ended = e->lockers_ended;
	look->overflow_started = pg_atomic_read_u64(&state->overflow_started);
	LWLockRelease(look->lock);

	look->committed = fm_scan_period(look->tenant, look->meter, look->period_start,
									 look->snapshot);
	return true;
}

/*
 * The second look's way when the first one's read no longer tells what
 * committed: the period read again, under the lock, in a snapshot taken
 * now, with what is in flight in it.  The entry, the lock still held; NULL
 * when the consume fell back to the row lock.
 */
static InflightEntry *
read_again_under_lock(InflightLook *look)
{
	InflightEntry *e;

	UnregisterSnapshot(look->snapshot);
	look->index = find_entry(look->key, true);
	e = snapshot_entry(look, &look->counted);
	if (e == NULL)
		return NULL;
	look->committed = fm_scan_period(look->tenant, look->meter, look->period_start,
									 look->snapshot);
	return e;
}

/*
 * Second look: what is in flight now, and what committed since the
 * snapshot, into look->counted with the committed usage.  When the entry
 * was remade, more consumes ended than it remembers, or a decider under
 * the row lock came and went (what it wrote is known only to the rows),
 * the period is read again in a snapshot taken now, under the lock.  The
 * entry, its lock held; NULL when the consume fell back to the row lock.
 */
static InflightEntry *
second_look(InflightLook *look)
{
	InflightEntry *e;

	LWLockAcquire(look->lock, LW_EXCLUSIVE);
	if (pg_atomic_read_u32(&state->overflow_lockers) > 0)
	{
		fall_back(look->lock, NULL, look->snapshot);
		return NULL;
	}
	e = &state->entries[look->index];
	look->counted = fm_empty_counter();
	if (e->key != look->key || e->incarnation != look->incarnation ||
		e->nended - look->nended > FM_INFLIGHT_ENDED ||
		e->lockers_ended != look->lockers_ended ||
		pg_atomic_read_u64(&state->overflow_started) != look->overflow_started)
	{
		e = read_again_under_lock(look);
		if (e == NULL)
			return NULL;
	}
	else if (count_in_flight(e, look->snapshot, look->nended, look->now, &look->counted,
							 look->xids, &look->nxids) ||
			 e->nslots == FM_INFLIGHT_SLOTS)
	{
		fall_back(look->lock, e, look->snapshot);
		return NULL;
	}
	UnregisterSnapshot(look->snapshot);
	fm_counter_report(fm_counter_merge(&look->counted, &look->committed));
	return e;
}

/*
 * Granted: a hard limit's consume records its amount in the entry, under
 * its transaction id, before the lock is let go; the registration takes it
 * out when the transaction ends.
 */
static FmInflightOutcome
grant(InflightLook *look, InflightEntry *e, int64 amount, bool bounded)
{
	TransactionId xid = InvalidTransactionId;

	if (bounded)
	{
		/*
		 * Only now: a refusal writes nothing, and commits without a
		 * transaction id or a flush.  Assigned before the lock is let go, so
		 * the next decider's snapshot shows it in progress.
		 */
		xid = GetCurrentTransactionId();
		add_slot(e, xid, false, amount);
		if (!TransactionIdIsValid(e->max_xid) ||
			TransactionIdFollows(xid, e->max_xid))
			e->max_xid = xid;
	}
	else
		free_if_unused(e);
	LWLockRelease(look->lock);
	if (bounded)
		add_registration(look->index, look->key, xid, true);
	pg_atomic_fetch_add_u64(&state->lock_free, 1);
	return FM_INFLIGHT_GRANTED;
}

/*
 * The steps of the file's header, 1 and 2: a first look under the lock
 * and a read of the period outside it, a second look under the lock, the
 * decision, and when only consumes in flight stand in the way, a wait for
 * one of them and the same again.
 */
FmInflightOutcome
fm_inflight_consume(const char *tenant, const char *meter, TimestampTz period_start,
					TimestampTz period_end, const FmLimit *limit, int64 amount,
					TimestampTz now, FmDecision *decision, FmCounter *after)
{
	InflightLook look;
	bool		bounded = limit->limited && limit->hard;

	look.tenant = tenant;
	look.meter = meter;
	look.period_start = period_start;
	look.now = now;
	look.key = period_key(tenant, meter, period_start);
	look.lock = partition_lock(look.key);
	for (;;)
	{
		InflightEntry *e;

		if (!first_look(&look) || (e = second_look(&look)) == NULL)
			return FM_INFLIGHT_FALL_BACK;

		fm_decide(limit, &look.committed, amount, now, period_end, true, decision, after);
		if (decision->granted)
			fm_decide(limit, &look.counted, amount, now, period_end, true, decision, after);
		else
			look.nxids = 0;		/* refused on what has committed */
		if (decision->granted)
			return grant(&look, e, amount, bounded);
		free_if_unused(e);
		LWLockRelease(look.lock);

		/*
		 * Refused on what has committed, or with consumes in flight this
		 * transaction might be waited for by: final.  Else wait for the first
		 * in flight to end, and decide again.
		 */
		if (look.nxids == 0 || has_registration(RESERVATION))
		{
			pg_atomic_fetch_add_u64(&state->lock_free, 1);
			return FM_INFLIGHT_REFUSED;
		}
		pg_atomic_fetch_add_u64(&state->waits, 1);
		XactLockTableWait(look.xids[0], NULL, NULL, XLTW_None);
	}
}

/*
 * In REPEATABLE READ, 40001 (the lock released) when a lock-free consume
 * of the period may have committed after the transaction's snapshot, as a
 * concurrent update of stripe 0 would.
 */
static void
fail_if_consume_missed(const InflightEntry *e, Snapshot xact_snapshot, LWLock *lock,
					   const char *tenant, const char *meter)
{
	if (TransactionIdIsValid(e->max_xid) &&
		!TransactionIdIsCurrentTransactionId(e->max_xid) &&
		XidInMVCCSnapshot(e->max_xid, xact_snapshot))
	{
		LWLockRelease(lock);
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access due to a concurrent consume"),
				 errdetail("A consume of tenant \"%s\" meter \"%s\" decided without a row lock after this transaction's snapshot.",
						   tenant, meter)));
	}
}

void
fm_inflight_before_lock(const char *tenant, const char *meter, TimestampTz period_start,
						TimestampTz now, FmCounter *in_flight)
{
	uint64		key;
	LWLock	   *lock;
	TransactionId xid;
	TransactionId xids[FM_INFLIGHT_SLOTS];
	Snapshot	xact_snapshot = NULL;
	bool		holder = has_registration(RESERVATION);
	bool		registered = false;
	int			nxids = 0;
	int			index;
	int			i;

	if (state == NULL)
		return;
	key = period_key(tenant, meter, period_start);
	lock = partition_lock(key);
	xid = GetCurrentTransactionId();
	if (IsolationUsesXactSnapshot())
		xact_snapshot = GetTransactionSnapshot();

	LWLockAcquire(lock, LW_EXCLUSIVE);
	index = find_entry(key, true);
	if (index >= 0)
	{
		InflightEntry *e = &state->entries[index];
		Snapshot	snapshot = RegisterSnapshot(GetLatestSnapshot());

		scan_slots(e, snapshot, now, holder ? in_flight : NULL, xids, &nxids);
		UnregisterSnapshot(snapshot);
		if (xact_snapshot)
			fail_if_consume_missed(e, xact_snapshot, lock, tenant, meter);
		if (has_locker_slot(e))
			registered = true;
		else if (!add_slot(e, xid, true, 0))
			index = -1;
	}
	if (index < 0 && has_registration(OVERFLOW_LOCKER))
		registered = true;
	else if (index < 0)
	{
		pg_atomic_fetch_add_u32(&state->overflow_lockers, 1);
		pg_atomic_fetch_add_u64(&state->overflow_started, 1);
		pg_atomic_fetch_add_u64(&state->overflowed, 1);
	}
	LWLockRelease(lock);
	if (!registered)
	{
		pg_atomic_fetch_add_u64(&state->lockers, 1);
		add_registration(index, key, xid, false);
	}

	/* lock-free consumes in flight end before this reads (see the header) */
	if (!(holder && in_flight))
		for (i = 0; i < nxids; i++)
			XactLockTableWait(xids[i], NULL, NULL, XLTW_None);
}

/*
 * consumes_in_flight() -> (capacity, in_flight, lock_free, waits,
 * fell_back, lockers, overflowed): the table of consumes in flight, all
 * NULL when flagmeter is not preloaded with one.  in_flight counts the
 * transactions registered now; the rest count since the server started.
 */
PG_FUNCTION_INFO_V1(fm_consumes_in_flight);
Datum
fm_consumes_in_flight(PG_FUNCTION_ARGS)
{
	TupleDesc	desc;
	Datum		values[7];
	bool		nulls[7] = {true, true, true, true, true, true, true};

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "consumes_in_flight must return a composite type");
	if (state)
	{
		int64		in_flight = pg_atomic_read_u32(&state->overflow_lockers);
		int			p,
					i;

		for (p = 0; p < FM_INFLIGHT_PARTITIONS; p++)
		{
			LWLockAcquire(&state->locks[p].lock, LW_SHARED);
			for (i = p; i < state->nentries; i += FM_INFLIGHT_PARTITIONS)
				if (state->entries[i].key != 0)
					in_flight += state->entries[i].nslots;
			LWLockRelease(&state->locks[p].lock);
		}
		values[0] = Int32GetDatum(state->nentries);
		values[1] = Int64GetDatum(in_flight);
		values[2] = Int64GetDatum((int64) pg_atomic_read_u64(&state->lock_free));
		values[3] = Int64GetDatum((int64) pg_atomic_read_u64(&state->waits));
		values[4] = Int64GetDatum((int64) pg_atomic_read_u64(&state->fell_back));
		values[5] = Int64GetDatum((int64) pg_atomic_read_u64(&state->lockers));
		values[6] = Int64GetDatum((int64) pg_atomic_read_u64(&state->overflowed));
		memset(nulls, 0, sizeof(nulls));
	}
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}
