/*
 * pending_xact.c
 *	  The table of pending usage at a transaction's end: a transaction that
 *	  prepares moves its amounts into rows first, one that commits after
 *	  maintain folded the events makes the table hold its database, and
 *	  pending_drop() tags the usage a transaction deletes.
 *
 * The amounts pending_add.c puts in the table live under their
 * transaction ids, which pending_read.c judges in each snapshot; so a
 * transaction's end needs nothing of the table, but for the cases here: a
 * prepared transaction outlives a restart, which the table does not
 * (pending_internal.h), and the transaction that deletes or recounts
 * usage (delete_usage(), recount_current_period()) must take the pending
 * part of it with it, for whoever sees it committed.
 */
#include "postgres.h"
#include "fmgr.h"

#include "access/relation.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/procarray.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "pending_internal.h"
#include "statements.h"
#include "stripes.h"

bool		fm_pending_added_in_xact = false;
bool		fm_pending_ready_at_commit = false;

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
	FmPendingKey key;
	FmCounter	amount;
} OwnAmount;

/*
 * Take this transaction's slots out of the table: their periods and
 * amounts, in TopTransactionContext, and their number in *nown.  Its
 * committed subtransactions' slots count as its own; those of
 * subtransactions that rolled back are left to settle (they count for no
 * one).
 */
static OwnAmount *
take_own_amounts(int *nown)
{
	HASH_SEQ_STATUS seq;
	FmPendingEntry *e;
	OwnAmount  *own = NULL;
	int			maxown = 0;

	*nown = 0;
	fm_pending_lock_all(LW_EXCLUSIVE);
	hash_seq_init(&seq, fm_pending_entries);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		int32	   *link = &e->first_slot;
		int			p = entry_partition(e);

		while (*link >= 0)
		{
			FmPendingSlot *slot = &fm_pending_state->slots[*link];
			int32		s = *link;

			if (!TransactionIdIsCurrentTransactionId(slot->xid))
			{
				link = &slot->next;
				continue;
			}
			if (*nown == maxown)
			{
				maxown = Max(16, maxown * 2);
				/* TopTransactionContext: an error releases the locks and it */
				own = own ? repalloc(own, sizeof(OwnAmount) * maxown) :
					MemoryContextAlloc(TopTransactionContext, sizeof(OwnAmount) * maxown);
			}
			own[*nown].key = e->key;
			own[*nown].amount = slot->amount;
			(*nown)++;
			*link = slot->next;
			e->nslots--;
			fm_pending_give_slot(p, s);
		}
	}
	fm_pending_unlock_all();
	return own;
}

/*
 * Before PREPARE TRANSACTION: take this transaction's slots out of the
 * table and write their amounts into the backend's own stripes, and mark
 * its events counted.
 */
static void
prepare_as_rows(void)
{
	int			nown;
	OwnAmount  *own = take_own_amounts(&nown);
	int			i;

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

void
fm_pending_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_PREPARE:
			if (fm_pending_added_in_xact)
				prepare_as_rows();
			break;
		case XACT_EVENT_COMMIT:
			if (fm_pending_ready_at_commit)
			{
				FmPendingDatabase *d = fm_pending_find_database(false);

				if (d != NULL &&
					pg_atomic_read_u32(&d->status) == FM_PENDING_DB_OVERFLOWED)
					pg_atomic_write_u32(&d->status, FM_PENDING_DB_READY);
			}
			fm_pending_added_in_xact = false;
			fm_pending_ready_at_commit = false;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PARALLEL_ABORT:
			fm_pending_added_in_xact = false;
			fm_pending_ready_at_commit = false;
			break;
		default:
			break;
	}
}

/* pending_drop is only for a caller that stopped the writers, as delete_usage does. */
static void
require_writers_stopped(void)
{
	Relation	counters = relation_open(fm_relation_oid("counters"), NoLock);
	bool		writers_stopped = CheckRelationLockedByMe(counters, ShareRowExclusiveLock, true);

	relation_close(counters, NoLock);
	if (!writers_stopped)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pending_drop needs SHARE ROW EXCLUSIVE on flagmeter.counters"),
				 errhint("LOCK TABLE flagmeter.counters IN SHARE ROW EXCLUSIVE MODE first.")));
}

/*
 * Tag e's usage as gone in transaction me: its settled usage moved into a
 * fold of me, its slots of transactions me sees committed (or its own)
 * marked gone_in me.  False, e unchanged, when e has no room for another
 * fold.  Every partition locked, exclusive.
 */
static bool
drop_entry(FmPendingEntry *e, TransactionId me)
{
	int32		s;

	fm_pending_clean_folds(e);
	if (!counter_empty(&e->settled))
	{
		if (e->nfolds == FM_PENDING_FOLDS)
			return false;
		e->folds[e->nfolds].xid = me;
		e->folds[e->nfolds].amount = e->settled;
		e->nfolds++;
		fm_counter_init(&e->settled);
	}
	for (s = e->first_slot; s >= 0; s = fm_pending_state->slots[s].next)
	{
		FmPendingSlot *slot = &fm_pending_state->slots[s];

		/* an earlier drop that rolled back does not count */
		if (TransactionIdIsValid(slot->gone_in) &&
			fm_pending_tagger_state(slot->gone_in) == FM_TAGGER_ROLLED_BACK)
			slot->gone_in = InvalidTransactionId;
		if (!TransactionIdIsValid(slot->gone_in) &&
			(TransactionIdIsCurrentTransactionId(slot->xid) ||
			 (!TransactionIdIsInProgress(slot->xid) &&
			  TransactionIdDidCommit(slot->xid))))
			slot->gone_in = me;
	}
	return true;
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
	FmPendingEntry *e;
	TransactionId me;
	bool		room = true;

	require_writers_stopped();
	if (!fm_pending_table_holds_database())
		PG_RETURN_VOID();
	me = GetCurrentTransactionId();
	fm_pending_lock_all(LW_EXCLUSIVE);
	hash_seq_init(&seq, fm_pending_entries);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		if (e->key.database != MyDatabaseId ||
			(tenant && strcmp(e->key.tenant, tenant) != 0) ||
			(meter && strcmp(e->key.meter, meter) != 0) ||
			(!any_period && e->key.period_start != period_start))
			continue;
		if (!drop_entry(e, me))
		{
			room = false;
			break;
		}
	}
	fm_pending_unlock_all();
	if (!room)
		ereport(ERROR,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 errmsg("could not drop the pending usage of tenant \"%s\" meter \"%s\" now",
						tenant ? tenant : "*", meter ? meter : "*"),
				 errdetail("A transaction older than its last folds is still open."),
				 errhint("Retry once long-running transactions have ended.")));
	PG_RETURN_VOID();
}
