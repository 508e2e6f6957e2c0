/*
 * inflight_consume.c
 *	  The lock-free consume: a consume of one sum or count meter decided on
 *	  the table of consumes in flight, without stripe 0's row lock (steps 1
 *	  and 2 of inflight_internal.h): a first look under the partition lock,
 *	  the period read outside it, a second look, the decision, and a wait
 *	  for a consume in flight when only such consumes stand in the way.
 *
 * consume.c calls it (fm_inflight_consume, inflight.h) when
 * fm_inflight_consume_enabled(); the table, its locks and this
 * transaction's registrations are inflight.c's.
 */
#include "postgres.h"

#include "access/transam.h"
#include "access/xact.h"
#include "port/atomics.h"
#include "storage/lmgr.h"
#include "storage/lwlock.h"
#include "utils/snapmgr.h"

#include "counter.h"
#include "inflight.h"
#include "inflight_internal.h"
#include "usage_rows.h"

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
count_in_flight(const FmInflightEntry *e, Snapshot snapshot, uint64 nended,
				TimestampTz now, FmCounter *in_flight, TransactionId *xids, int *nxids)
{
	bool		locker = false;
	uint64		n;
	int			s;

	*nxids = 0;
	for (s = 0; s < e->nslots; s++)
	{
		const FmInflightSlot *slot = &e->slots[s];

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
		const FmInflightEnded *ended = &e->ended[n % FM_INFLIGHT_ENDED];

		if (XidInMVCCSnapshot(ended->xid, snapshot) && TransactionIdDidCommit(ended->xid))
			fm_counter_report(fm_counter_add_event(in_flight, ended->amount, now));
	}
	return locker;
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
fall_back(LWLock *lock, FmInflightEntry *e, Snapshot snapshot)
{
	if (e)
		fm_inflight_free_if_unused(e);
	if (snapshot)
		UnregisterSnapshot(snapshot);
	LWLockRelease(lock);
	pg_atomic_fetch_add_u64(&fm_inflight_state->fell_back, 1);
}

/*
 * Under the lock, with look->index found (-1: none, or no room): a
 * snapshot taken now, and the slots of consumes that ended before it
 * removed (the others' amounts into in_flight when not NULL).  The entry;
 * NULL, fallen back to the row lock, when there is none, a locker is in
 * flight on it, or it is full.
 */
static FmInflightEntry *
snapshot_entry(InflightLook *look, FmCounter *in_flight)
{
	FmInflightEntry *e;

	if (look->index < 0)
	{
		fall_back(look->lock, NULL, NULL);
		return NULL;
	}
	e = &fm_inflight_state->entries[look->index];
	look->snapshot = RegisterSnapshot(GetLatestSnapshot());
	if (fm_inflight_scan_slots(e, look->snapshot, look->now, in_flight, look->xids, &look->nxids) ||
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
	FmInflightEntry *e;

	LWLockAcquire(look->lock, LW_EXCLUSIVE);
	look->index = pg_atomic_read_u32(&fm_inflight_state->overflow_lockers) > 0 ? -1 :
		fm_inflight_find_entry(look->key, true);
	e = snapshot_entry(look, NULL);
	if (e == NULL)
		return false;
	look->incarnation = e->incarnation;
	look->nended = e->nended;
	look->lockers_ended = e->lockers_ended;
	look->overflow_started = pg_atomic_read_u64(&fm_inflight_state->overflow_started);
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
static FmInflightEntry *
read_again_under_lock(InflightLook *look)
{
	FmInflightEntry *e;

	UnregisterSnapshot(look->snapshot);
	look->index = fm_inflight_find_entry(look->key, true);
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
static FmInflightEntry *
second_look(InflightLook *look)
{
	FmInflightEntry *e;

	LWLockAcquire(look->lock, LW_EXCLUSIVE);
	if (pg_atomic_read_u32(&fm_inflight_state->overflow_lockers) > 0)
	{
		fall_back(look->lock, NULL, look->snapshot);
		return NULL;
	}
	e = &fm_inflight_state->entries[look->index];
	look->counted = fm_empty_counter();
	if (e->key != look->key || e->incarnation != look->incarnation ||
		e->nended - look->nended > FM_INFLIGHT_ENDED ||
		e->lockers_ended != look->lockers_ended ||
		pg_atomic_read_u64(&fm_inflight_state->overflow_started) != look->overflow_started)
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
grant(InflightLook *look, FmInflightEntry *e, int64 amount, bool bounded)
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
		fm_inflight_add_slot(e, xid, false, amount);
		if (!TransactionIdIsValid(e->max_xid) ||
			TransactionIdFollows(xid, e->max_xid))
			e->max_xid = xid;
	}
	else
		fm_inflight_free_if_unused(e);
	LWLockRelease(look->lock);
	if (bounded)
		fm_inflight_add_registration(look->index, look->key, xid, true);
	pg_atomic_fetch_add_u64(&fm_inflight_state->lock_free, 1);
	return FM_INFLIGHT_GRANTED;
}

/*
 * The steps of inflight_internal.h, 1 and 2: a first look under the lock
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
	look.key = fm_inflight_period_key(tenant, meter, period_start);
	look.lock = fm_inflight_partition_lock(look.key);
	for (;;)
	{
		FmInflightEntry *e;

		if (!first_look(&look) || (e = second_look(&look)) == NULL)
			return FM_INFLIGHT_FALL_BACK;

		fm_decide(limit, &look.committed, amount, now, period_end, true, decision, after);
		if (decision->granted)
			fm_decide(limit, &look.counted, amount, now, period_end, true, decision, after);
		else
			look.nxids = 0;		/* refused on what has committed */
		if (decision->granted)
			return grant(&look, e, amount, bounded);
		fm_inflight_free_if_unused(e);
		LWLockRelease(look.lock);

		/*
		 * Refused on what has committed, or with consumes in flight this
		 * transaction might be waited for by: final.  Else wait for the first
		 * in flight to end, and decide again.
		 */
		if (look.nxids == 0 || fm_inflight_has_registration(FM_INFLIGHT_RESERVATION))
		{
			pg_atomic_fetch_add_u64(&fm_inflight_state->lock_free, 1);
			return FM_INFLIGHT_REFUSED;
		}
		pg_atomic_fetch_add_u64(&fm_inflight_state->waits, 1);
		XactLockTableWait(look.xids[0], NULL, NULL, XLTW_None);
	}
}
