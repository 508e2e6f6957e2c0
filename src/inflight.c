/*
 * inflight.c
 *	  The table of consumes in flight, in shared memory: its entries, slots
 *	  and partition locks, what this transaction registered there and their
 *	  end with it, the deciders under stripe 0's row lock registered as
 *	  lockers (fm_inflight_before_lock), and consumes_in_flight().
 *
 * The lock-free consume that decides on this table is inflight_consume.c;
 * both share inflight_internal.h, which tells how the two ways of deciding
 * keep apart.  The rest of the engine uses inflight.h.
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
#include "inflight_internal.h"
#include "usage_rows.h"

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

FmInflightState *fm_inflight_state = NULL;

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
	return add_size(offsetof(FmInflightState, entries),
					mul_size(table_entries(), sizeof(FmInflightEntry)));
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
	fm_inflight_state = ShmemInitStruct("flagmeter consumes in flight", table_size(), &found);
	if (!found)
	{
		memset(fm_inflight_state, 0, table_size());
		fm_inflight_state->locks = GetNamedLWLockTranche("flagmeter_inflight");
		fm_inflight_state->nentries = table_entries();
		pg_atomic_init_u32(&fm_inflight_state->overflow_lockers, 0);
		pg_atomic_init_u64(&fm_inflight_state->overflow_started, 0);
		pg_atomic_init_u64(&fm_inflight_state->lock_free, 0);
		pg_atomic_init_u64(&fm_inflight_state->waits, 0);
		pg_atomic_init_u64(&fm_inflight_state->fell_back, 0);
		pg_atomic_init_u64(&fm_inflight_state->lockers, 0);
		pg_atomic_init_u64(&fm_inflight_state->overflowed, 0);
	}
	LWLockRelease(AddinShmemInitLock);
}

uint64
fm_inflight_period_key(const char *tenant, const char *meter, TimestampTz period_start)
{
	uint64		h = hash_bytes_extended((const unsigned char *) tenant, strlen(tenant),
										MyDatabaseId);

	h = hash_combine64(h, hash_bytes_extended((const unsigned char *) meter,
											  strlen(meter), 0));
	h = hash_combine64(h, hash_bytes_extended((const unsigned char *) &period_start,
											  sizeof(period_start), 0));
	return h == 0 ? 1 : h;
}

LWLock *
fm_inflight_partition_lock(uint64 key)
{
	return &fm_inflight_state->locks[key % FM_INFLIGHT_PARTITIONS].lock;
}

/* Unused, and no snapshot can miss the lock-free consumes it saw. */
static bool
evictable(const FmInflightEntry *e)
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
int
fm_inflight_find_entry(uint64 key, bool create)
{
	int			per_partition = fm_inflight_state->nentries / FM_INFLIGHT_PARTITIONS;
	int			partition = key % FM_INFLIGHT_PARTITIONS;
	int			base = (key / FM_INFLIGHT_PARTITIONS) % per_partition;
	int			room = -1;
	int			k;

	for (k = 0; k < Min(FM_INFLIGHT_PROBES, per_partition); k++)
	{
		int			i = partition + FM_INFLIGHT_PARTITIONS * ((base + k) % per_partition);
		FmInflightEntry *e = &fm_inflight_state->entries[i];

		if (e->key == key)
			return i;
		if (room < 0 && (e->key == 0 || evictable(e)))
			room = i;
	}
	if (!create || room < 0)
		return -1;
	fm_inflight_state->entries[room].key = key;
	fm_inflight_state->entries[room].incarnation++;
	fm_inflight_state->entries[room].max_xid = InvalidTransactionId;
	fm_inflight_state->entries[room].nslots = 0;
	fm_inflight_state->entries[room].nended = 0;
	fm_inflight_state->entries[room].lockers_ended = 0;
	return room;
}

/* An entry with nothing in flight and no lock-free consume to remember is free. */
void
fm_inflight_free_if_unused(FmInflightEntry *e)
{
	if (e->nslots == 0 && !TransactionIdIsValid(e->max_xid))
		e->key = 0;
}

static void
remove_slot(FmInflightEntry *e, int s)
{
	if (!e->slots[s].locker)
	{
		FmInflightEnded *ended = &e->ended[e->nended++ % FM_INFLIGHT_ENDED];

		ended->xid = e->slots[s].xid;
		ended->amount = e->slots[s].amount;
	}
	else
		e->lockers_ended++;
	e->slots[s] = e->slots[--e->nslots];
	fm_inflight_free_if_unused(e);
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
bool
fm_inflight_scan_slots(FmInflightEntry *e, Snapshot snapshot, TimestampTz now, FmCounter *in_flight,
					   TransactionId *xids, int *nxids)
{
	bool		locker = false;
	int			s = 0;

	*nxids = 0;
	while (s < e->nslots)
	{
		FmInflightSlot *slot = &e->slots[s];

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

void
fm_inflight_add_registration(int index, uint64 key, TransactionId xid, bool reservation)
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
has_locker_slot(const FmInflightEntry *e)
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
bool
fm_inflight_has_registration(FmInflightRegistrationKind kind)
{
	int			i;

	for (i = 0; i < nregistrations; i++)
		if (kind == FM_INFLIGHT_RESERVATION ? registrations[i].reservation : registrations[i].index < 0)
			return true;
	return false;
}

/*
 * A slot in the entry (under its lock); false when it is full.  A
 * (sub)transaction keeps one reservation slot per period, its amounts
 * added up, so that many consumes in one transaction do not fill the
 * entry.
 */
bool
fm_inflight_add_slot(FmInflightEntry *e, TransactionId xid, bool locker, int64 amount)
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
	FmInflightEntry *e;
	int			s;

	if (r->index < 0)
	{
		pg_atomic_fetch_sub_u32(&fm_inflight_state->overflow_lockers, 1);
		return;
	}
	lock = fm_inflight_partition_lock(r->key);
	LWLockAcquire(lock, LW_EXCLUSIVE);
	e = &fm_inflight_state->entries[r->index];
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
	return fm_inflight_state != NULL && lock_free_consume && !IsolationUsesXactSnapshot() &&
		!XactReadOnly;
}

/*
 * In REPEATABLE READ, 40001 (the lock released) when a lock-free consume
 * of the period may have committed after the transaction's snapshot, as a
 * concurrent update of stripe 0 would.
 */
static void
fail_if_consume_missed(const FmInflightEntry *e, Snapshot xact_snapshot, LWLock *lock,
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
	bool		holder = fm_inflight_has_registration(FM_INFLIGHT_RESERVATION);
	bool		registered = false;
	int			nxids = 0;
	int			index;
	int			i;

	if (fm_inflight_state == NULL)
		return;
	key = fm_inflight_period_key(tenant, meter, period_start);
	lock = fm_inflight_partition_lock(key);
	xid = GetCurrentTransactionId();
	if (IsolationUsesXactSnapshot())
		xact_snapshot = GetTransactionSnapshot();

	LWLockAcquire(lock, LW_EXCLUSIVE);
	index = fm_inflight_find_entry(key, true);
	if (index >= 0)
	{
		FmInflightEntry *e = &fm_inflight_state->entries[index];
		Snapshot	snapshot = RegisterSnapshot(GetLatestSnapshot());

		fm_inflight_scan_slots(e, snapshot, now, holder ? in_flight : NULL, xids, &nxids);
		UnregisterSnapshot(snapshot);
		if (xact_snapshot)
			fail_if_consume_missed(e, xact_snapshot, lock, tenant, meter);
		if (has_locker_slot(e))
			registered = true;
		else if (!fm_inflight_add_slot(e, xid, true, 0))
			index = -1;
	}
	if (index < 0 && fm_inflight_has_registration(FM_INFLIGHT_OVERFLOW_LOCKER))
		registered = true;
	else if (index < 0)
	{
		pg_atomic_fetch_add_u32(&fm_inflight_state->overflow_lockers, 1);
		pg_atomic_fetch_add_u64(&fm_inflight_state->overflow_started, 1);
		pg_atomic_fetch_add_u64(&fm_inflight_state->overflowed, 1);
	}
	LWLockRelease(lock);
	if (!registered)
	{
		pg_atomic_fetch_add_u64(&fm_inflight_state->lockers, 1);
		fm_inflight_add_registration(index, key, xid, false);
	}

	/*
	 * lock-free consumes in flight end before this reads (see
	 * inflight_internal.h)
	 */
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
	if (fm_inflight_state)
	{
		int64		in_flight = pg_atomic_read_u32(&fm_inflight_state->overflow_lockers);
		int			p,
					i;

		for (p = 0; p < FM_INFLIGHT_PARTITIONS; p++)
		{
			LWLockAcquire(&fm_inflight_state->locks[p].lock, LW_SHARED);
			for (i = p; i < fm_inflight_state->nentries; i += FM_INFLIGHT_PARTITIONS)
				if (fm_inflight_state->entries[i].key != 0)
					in_flight += fm_inflight_state->entries[i].nslots;
			LWLockRelease(&fm_inflight_state->locks[p].lock);
		}
		values[0] = Int32GetDatum(fm_inflight_state->nentries);
		values[1] = Int64GetDatum(in_flight);
		values[2] = Int64GetDatum((int64) pg_atomic_read_u64(&fm_inflight_state->lock_free));
		values[3] = Int64GetDatum((int64) pg_atomic_read_u64(&fm_inflight_state->waits));
		values[4] = Int64GetDatum((int64) pg_atomic_read_u64(&fm_inflight_state->fell_back));
		values[5] = Int64GetDatum((int64) pg_atomic_read_u64(&fm_inflight_state->lockers));
		values[6] = Int64GetDatum((int64) pg_atomic_read_u64(&fm_inflight_state->overflowed));
		memset(nulls, 0, sizeof(nulls));
	}
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}
