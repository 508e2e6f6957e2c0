/*
 * pending_read.c
 *	  The read of pending usage inside a snapshot: what a read of a period
 *	  adds to its rows, from the table of pending usage or, where the
 *	  table does not hold the database, from the pending events.
 *
 * The amounts counted here are those pending_add.c added and
 * pending_fold.c has not yet moved into the rows as every snapshot sees
 * them; the rules of what a snapshot counts are in pending_internal.h.
 * The reads of the events as the extension's owner, has_pending_events()
 * and counted_through(), are here too: they ask the same question of the
 * events themselves.
 */
#include "postgres.h"
#include "fmgr.h"

#include "access/transam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "storage/proc.h"
#include "utils/snapmgr.h"

#include "compat.h"
#include "pending.h"
#include "pending_internal.h"
#include "statements.h"

/*
 * A period's entry as one read copies it under the shared lock, to count
 * outside it: the settled usage, the folds, and each slot's transaction,
 * dropper and amount.  The slots' arrays start in the some_* arrays and
 * grow for a hot period.
 */
typedef struct EntryCopy
{
	FmCounter	settled;
	FmPendingFold folds[FM_PENDING_FOLDS];
	int			nfolds;
	TransactionId some_xids[64];
	TransactionId some_gone[64];
	FmCounter	some_amounts[64];
	TransactionId *xids;
	TransactionId *gone;
	FmCounter  *amounts;
	int			room;
	int			nslots;
} EntryCopy;

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

/*
 * Copy the period's entry into *copy under its partition's shared lock;
 * false when it has none.  The lock is held only to copy.
 */
static bool
copy_entry(const char *tenant, const char *meter, TimestampTz period_start,
		   EntryCopy *copy)
{
	copy->xids = copy->some_xids;
	copy->gone = copy->some_gone;
	copy->amounts = copy->some_amounts;
	copy->room = lengthof(copy->some_xids);
	for (;;)
	{
		int			p;
		FmPendingEntry *e;
		int32		s;

		e = fm_pending_lock_entry(tenant, meter, period_start, HASH_FIND, LW_SHARED, &p);
		if (e == NULL)
			return false;
		if (e->nslots > copy->room)
		{
			/* a hot period: allocate outside the lock, and look again */
			copy->room = e->nslots + 64;
			LWLockRelease(partition_lock(p));
			copy->xids = palloc(sizeof(TransactionId) * copy->room);
			copy->gone = palloc(sizeof(TransactionId) * copy->room);
			copy->amounts = palloc(sizeof(FmCounter) * copy->room);
			continue;
		}
		copy->settled = e->settled;
		copy->nfolds = e->nfolds;
		memcpy(copy->folds, e->folds, sizeof(FmPendingFold) * copy->nfolds);
		copy->nslots = 0;
		for (s = e->first_slot; s >= 0; s = fm_pending_state->slots[s].next)
		{
			FmPendingSlot *slot = &fm_pending_state->slots[s];

			copy->xids[copy->nslots] = slot->xid;
			copy->gone[copy->nslots] = slot->gone_in;
			copy->amounts[copy->nslots] = slot->amount;
			copy->nslots++;
		}
		LWLockRelease(partition_lock(p));
		return true;
	}
}

void
fm_pending_add_visible(const char *tenant, const char *meter, TimestampTz period_start,
					   Snapshot snapshot, FmCounter *total)
{
	EntryCopy	copy;
	int			i;

	if (!fm_pending_table_holds_database())
	{
		if (fm_pending_state != NULL || events_may_be_pending(snapshot))
			pending_band_read(tenant, meter, period_start, snapshot, total);
		return;
	}
	if (!copy_entry(tenant, meter, period_start, &copy))
		return;

	merge_into(total, &copy.settled);
	for (i = 0; i < copy.nfolds; i++)
		if (!visible_in(copy.folds[i].xid, snapshot))
			merge_into(total, &copy.folds[i].amount);
	for (i = 0; i < copy.nslots; i++)
		if (visible_in(copy.xids[i], snapshot) &&
			!(TransactionIdIsValid(copy.gone[i]) && visible_in(copy.gone[i], snapshot)))
			merge_into(total, &copy.amounts[i]);
	if (copy.xids != copy.some_xids)
	{
		pfree(copy.xids);
		pfree(copy.gone);
		pfree(copy.amounts);
	}
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
