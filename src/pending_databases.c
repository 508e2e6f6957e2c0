/*
 * pending_databases.c
 *	  Each database's record in the table of pending usage: whether the
 *	  table holds that database's pending usage, and its rebuild from the
 *	  events after a restart or a failover.
 *
 * The table (pending_table.c) starts empty with the server, while the
 * events of tracks written alone are the durable record
 * (pending_internal.h).  So before the table answers a read of a
 * database, or takes a track's amount, the first call in that database
 * rebuilds its entries from those events, here; until then tracks write
 * stripes (pending_add.c) and reads read the events (pending_read.c).  A
 * database whose pending usage does not fit stays "overflowed" until
 * maintain() folds the events themselves (pending_fold.c, pending_xact.c).
 */
#include "postgres.h"
#include "fmgr.h"

#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "utils/builtins.h"

#include "compat.h"
#include "counter.h"
#include "pending_internal.h"
#include "statements.h"

/* field4 of the advisory lock a rebuild holds (stripes.c uses 0x464D) */
#define FM_REBUILD_TAG_CLASS 0x4652

static LWLock *
databases_lock(void)
{
	return &fm_pending_state->locks[FM_PENDING_PARTITIONS].lock;
}

/*
 * This database's record, made when create and there is room.  A backend
 * stays in one database and records are never reused, so the record
 * found is kept for the backend's life: calls do not search for it.
 */
FmPendingDatabase *
fm_pending_find_database(bool create)
{
	static FmPendingDatabase *mine = NULL;
	FmPendingDatabase *databases = fm_pending_state->databases;
	int			i;

	if (mine != NULL)
		return mine;
	for (i = 0; i < FM_PENDING_DATABASES && mine == NULL; i++)
		if (databases[i].database == MyDatabaseId)
			mine = &databases[i];
	if (mine != NULL || !create)
		return mine;
	LWLockAcquire(databases_lock(), LW_EXCLUSIVE);
	for (i = 0; i < FM_PENDING_DATABASES && mine == NULL; i++)
		if (databases[i].database == MyDatabaseId)
			mine = &databases[i];
	for (i = 0; i < FM_PENDING_DATABASES && mine == NULL; i++)
	{
		FmPendingDatabase *d = &databases[i];

		if (d->database == InvalidOid)
		{
			pg_atomic_write_u32(&d->status, FM_PENDING_DB_EMPTY);
			pg_write_barrier();
			d->database = MyDatabaseId;
			mine = d;
		}
	}
	LWLockRelease(databases_lock());
	return mine;
}

/* Remove the database's entries (an extension dropped and created again). */
void
fm_pending_forget_database(void)
{
	HASH_SEQ_STATUS seq;
	FmPendingEntry *e;
	int			p;

	fm_pending_lock_all(LW_EXCLUSIVE);
	hash_seq_init(&seq, fm_pending_entries);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		if (e->key.database != MyDatabaseId)
			continue;
		p = entry_partition(e);
		while (e->first_slot >= 0)
		{
			int32		s = e->first_slot;

			e->first_slot = fm_pending_state->slots[s].next;
			fm_pending_give_slot(p, s);
		}
		hash_search(fm_pending_entries, &e->key, HASH_REMOVE, NULL);
	}
	fm_pending_unlock_all();
}

/* the transaction in which this backend last checked its database's record */
static LocalTransactionId checked_in = InvalidLocalTransactionId;

static uint32
database_status(FmPendingDatabase **record)
{
	FmPendingDatabase *d = fm_pending_find_database(true);
	uint32		status;

	*record = d;
	if (d == NULL)
		return FM_PENDING_DB_OVERFLOWED;	/* no record: read the events */
	if (checked_in != FM_MY_LOCAL_XID)
	{
		Oid			counters = fm_relation_oid("counters");

		checked_in = FM_MY_LOCAL_XID;
		if (d->counters != counters &&
			pg_atomic_read_u32(&d->status) != FM_PENDING_DB_EMPTY)
		{
			LWLockAcquire(databases_lock(), LW_EXCLUSIVE);
			if (d->counters != counters)
			{
				fm_pending_forget_database();
				pg_atomic_write_u32(&d->status, FM_PENDING_DB_EMPTY);
			}
			LWLockRelease(databases_lock());
		}
	}
	status = pg_atomic_read_u32(&d->status);
	pg_read_barrier();
	return status;
}

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
	FmPendingEntry *e = fm_pending_lock_entry(tenant, meter, period_start,
											  HASH_ENTER_NULL, LW_EXCLUSIVE, &p);

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
 * Install the pending events rebuild_stmt read as settled usage: the
 * database's status then, ready, or overflowed when they did not fit.
 */
static uint32
install_rebuilt(void)
{
	uint32		status = FM_PENDING_DB_READY;
	uint64		i;

	for (i = 0; i < SPI_processed && status == FM_PENDING_DB_READY; i++)
	{
		HeapTuple	row = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		char	   *tenant = TextDatumGetCString(SPI_getbinval(row, desc, 1, &isnull));
		char	   *meter = TextDatumGetCString(SPI_getbinval(row, desc, 2, &isnull));
		TimestampTz period_start = DatumGetTimestampTz(SPI_getbinval(row, desc, 3, &isnull));
		FmCounter  *amount = DatumGetFmCounterP(SPI_getbinval(row, desc, 4, &isnull));

		if (!install_settled(tenant, meter, period_start, amount))
			status = FM_PENDING_DB_OVERFLOWED;
	}
	return status;
}

/*
 * Read this database's pending events (those at or above counted_through,
 * every one of a transaction that ended before the server started: tracks
 * write stripes until the rebuild is done) into settled usage.  One
 * backend at a time, under an advisory lock; the others wait for it.
 */
static void
rebuild(FmPendingDatabase *d)
{
	LOCKTAG		tag;
	Oid			counters = fm_relation_oid("counters");

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, 0, 0, FM_REBUILD_TAG_CLASS);
	(void) LockAcquire(&tag, ExclusiveLock, false, false);
	PG_TRY();
	{
		if (pg_atomic_read_u32(&d->status) == FM_PENDING_DB_EMPTY)
		{
			uint32		status;

			fm_pending_forget_database();
			SPI_connect();
			fm_execute_latest(&rebuild_stmt, NULL, NULL, 0);
			status = install_rebuilt();
			SPI_finish();
			if (status != FM_PENDING_DB_READY)
				fm_pending_forget_database();	/* the events are read instead */
			d->counters = counters;
			pg_write_barrier();
			pg_atomic_write_u32(&d->status, status);
			pg_atomic_fetch_add_u64(&fm_pending_state->rebuilt, 1);
		}
	}
	PG_FINALLY();
	{
		LockRelease(&tag, ExclusiveLock, false);
	}
	PG_END_TRY();
}

/*
 * This database's status, rebuilt first when it has not been since the
 * server started (never on a standby: its tracks run on the primary).
 */
uint32
fm_pending_ready_status(void)
{
	FmPendingDatabase *d;
	uint32		status = database_status(&d);

	if (status == FM_PENDING_DB_EMPTY && !RecoveryInProgress())
	{
		rebuild(d);
		status = database_status(&d);
	}
	return status;
}

/* pending usage is read from the table (false: from the events) */
bool
fm_pending_table_holds_database(void)
{
	return fm_pending_state != NULL && !RecoveryInProgress() &&
		fm_pending_ready_status() == FM_PENDING_DB_READY;
}

/*
 * pending_forget(): this database's pending usage is rebuilt from the
 * events at the next call (after_restore() renumbered them).
 */
PG_FUNCTION_INFO_V1(fm_pending_forget);
Datum
fm_pending_forget(PG_FUNCTION_ARGS)
{
	FmPendingDatabase *d;

	if (fm_pending_state == NULL || (d = fm_pending_find_database(false)) == NULL)
		PG_RETURN_VOID();
	LWLockAcquire(databases_lock(), LW_EXCLUSIVE);
	fm_pending_forget_database();
	pg_atomic_write_u32(&d->status, FM_PENDING_DB_EMPTY);
	LWLockRelease(databases_lock());
	PG_RETURN_VOID();
}
