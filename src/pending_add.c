/*
 * pending_add.c
 *	  The add path of the table of pending usage: whether a track may write
 *	  its event only, its amount added to the period's entry under its
 *	  transaction, and the recheck figure of the entry's alerts; with the
 *	  GUCs that turn it on and pending_usage_stats().
 *
 * This is where usage enters the table (pending_table.c) and what track.c
 * and consume.c call through pending.h; the amounts added here are read
 * in a snapshot by pending_read.c, folded into the rows by pending_fold.c,
 * and moved into rows before PREPARE by pending_xact.c.
 */
#include "postgres.h"
#include "fmgr.h"
#include "funcapi.h"

#include "access/htup_details.h"
#include "access/transam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "common/int.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/guc.h"

#include "decision.h"
#include "pending.h"
#include "pending_internal.h"
#include "pools.h"
#include "stripes.h"

int			fm_pending_periods = 16384;
static bool one_write_track = true;

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
							&fm_pending_periods,
							16384, 0, 10000000,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);
	if (fm_pending_periods == 0)
		return;
	fm_pending_request_shmem();
	RegisterXactCallback(fm_pending_xact_callback, NULL);
}

bool
fm_pending_track_enabled(const FmLimit *limit)
{
	if (fm_pending_state == NULL || !one_write_track)
		return false;
	if (limit->aggregation != FM_AGG_SUM && limit->aggregation != FM_AGG_COUNT)
		return false;
	if (limit->grants || fm_draws_from_pool(limit))
		return false;
	return fm_pending_ready_status() == FM_PENDING_DB_READY;
}

/*
 * The slot of (sub)transaction xid in e, or a new one (without looking when
 * the caller knows there is none: a slot is a cache miss in shared memory,
 * under the lock every writer of the period waits for); -1 when the
 * partition's pool has none left.  Under the partition's lock, exclusive.
 */
static int32
own_slot(int p, FmPendingEntry *e, TransactionId xid, FullTransactionId top,
		 bool new_in_period)
{
	FmPendingSlot *slots = fm_pending_state->slots;
	int32		s;

	if (!new_in_period)
		for (s = e->first_slot; s >= 0; s = slots[s].next)
			if (slots[s].xid == xid)
				return s;

	/*
	 * Keep a period's slots few: those of transactions every snapshot sees
	 * ended settle (while maintain takes its boundary, none).
	 */
	if (e->nslots >= FM_PENDING_SLOTS_PER_PERIOD)
	{
		uint64		high = pg_atomic_read_u64(&fm_pending_state->fold_high);

		if (high != PG_UINT64_MAX)
			fm_pending_settle_slots(p, e, high);
	}
	s = fm_pending_take_slot(p);
	if (s < 0)
		return -1;
	slots[s].xid = xid;
	slots[s].top = top;
	slots[s].gone_in = InvalidTransactionId;
	fm_counter_init(&slots[s].amount);
	slots[s].next = e->first_slot;
	e->first_slot = s;
	e->nslots++;
	return s;
}

/*
 * Merge delta into slot s; an overflow raises its error with the
 * partition's lock released, the slot unchanged.
 */
static void
add_to_slot(int p, int32 s, const FmCounter *delta)
{
	FmCounter	sum = fm_pending_state->slots[s].amount;
	FmResult	r = fm_counter_merge(&sum, delta);

	if (r != FM_OK)
	{
		LWLockRelease(partition_lock(p));
		fm_counter_report(r);
	}
	fm_pending_state->slots[s].amount = sum;
}

/*
 * The used amount e holds for transactions that did not roll back, into
 * *used; false when even that overflows.  added_used also counts what
 * rolled back, so after a huge amount was added and rolled back it would
 * refuse every later add: an overflow of it asks this (rare, reads the
 * commit log) before refusing.  Under the partition's lock.
 */
static bool
live_used(const FmPendingEntry *e, int64 *used)
{
	const FmPendingSlot *slots = fm_pending_state->slots;
	int64		sum = e->settled.used;
	int32		s;
	int			i;

	for (i = 0; i < e->nfolds; i++)
		if (pg_add_s64_overflow(sum, e->folds[i].amount.used, &sum))
			return false;
	for (s = e->first_slot; s >= 0; s = slots[s].next)
		if (!TransactionIdDidAbort(slots[s].xid) &&
			pg_add_s64_overflow(sum, slots[s].amount.used, &sum))
			return false;
	*used = sum;
	return true;
}

bool
fm_pending_xact_has_adds(void)
{
	return fm_pending_added_in_xact;
}

bool
fm_pending_add(const char *tenant, const char *meter, TimestampTz period_start,
			   const FmCounter *delta, const FmLimit *limit, bool new_in_period,
			   bool *read_due)
{
	int			p;
	FmPendingEntry *e;
	TransactionId xid = GetCurrentTransactionId();
	FullTransactionId top = GetTopFullTransactionId();
	int64		sum;
	int32		s;

	e = fm_pending_lock_entry(tenant, meter, period_start, HASH_ENTER_NULL,
							  LW_EXCLUSIVE, &p);
	if (e == NULL)
	{
		pg_atomic_fetch_add_u64(&fm_pending_state->no_room, 1);
		return false;
	}
	if (pg_add_s64_overflow(e->added_used, delta->used, &sum))
	{
		int64		live = 0;

		if (!live_used(e, &live) || pg_add_s64_overflow(live, delta->used, &sum))
		{
			LWLockRelease(partition_lock(p));
			fm_counter_report(FM_ERR_RANGE);
		}
		e->added_used = live;
	}
	s = own_slot(p, e, xid, top, new_in_period);
	if (s < 0)
	{
		if (entry_unused(e))
			hash_search(fm_pending_entries, &e->key, HASH_REMOVE, NULL);
		LWLockRelease(partition_lock(p));
		pg_atomic_fetch_add_u64(&fm_pending_state->no_room, 1);
		return false;
	}
	add_to_slot(p, s, delta);
	e->added += limit->aggregation == FM_AGG_COUNT ? delta->events : delta->used;
	e->added_used += delta->used;
	*read_due = !(e->has_recheck && e->recheck_for == limit->fingerprint &&
				  e->added < e->recheck_at);
	LWLockRelease(partition_lock(p));
	fm_pending_added_in_xact = true;
	pg_atomic_fetch_add_u64(&fm_pending_state->added, 1);
	return true;
}

void
fm_pending_set_recheck(const char *tenant, const char *meter, TimestampTz period_start,
					   const FmLimit *limit, int64 used)
{
	int			p;
	FmPendingEntry *e;
	int64		next;

	if (fm_pending_state == NULL)
		return;
	next = limit->limited ?
		fm_next_usage_level(used, limit->quota, limit->hard,
							limit->thresholds, limit->nthresholds) :
		PG_INT64_MAX;
	e = fm_pending_lock_entry(tenant, meter, period_start, HASH_FIND, LW_EXCLUSIVE, &p);
	if (e != NULL)
	{
		/*
		 * As a stripe's figure (track_alerts.c), shared by every writer of
		 * the period: the next read comes after a flagmeter.stripes-th of the
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

/* What pending_usage_stats() says of where this database's pending usage is. */
static const char *
status_name(void)
{
	switch (RecoveryInProgress() ? FM_PENDING_DB_OVERFLOWED : fm_pending_ready_status())
	{
		case FM_PENDING_DB_READY:
			return "in memory";
		case FM_PENDING_DB_OVERFLOWED:
			return RecoveryInProgress() ? "read from the events (standby)" :
				"read from the events (did not fit)";
		default:
			return "not rebuilt";
	}
}

/*
 * pending_usage_stats(): the table as this database's calls see it, and
 * what it did since the server started.
 */
PG_FUNCTION_INFO_V1(fm_pending_usage_stats);
Datum
fm_pending_usage_stats(PG_FUNCTION_ARGS)
{
	FmPendingState *state = fm_pending_state;
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
		FmPendingEntry *e;

		status = status_name();
		fm_pending_lock_all(LW_SHARED);
		hash_seq_init(&seq, fm_pending_entries);
		while ((e = hash_seq_search(&seq)) != NULL)
		{
			if (e->key.database != MyDatabaseId)
				continue;
			periods++;
			slots += e->nslots;
		}
		fm_pending_unlock_all();
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
