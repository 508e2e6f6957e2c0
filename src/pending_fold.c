/*
 * pending_fold.c
 *	  maintain()'s fold of the table of pending usage: the settled usage of
 *	  this database's entries moved into the periods' merged stripes, in
 *	  maintain's transaction, with the boundary it records as
 *	  counted_through.
 *
 * The fold is the one phase that takes from the table what pending_add.c
 * put there: what a fold moved stays counted by readers that do not see
 * maintain committed (pending_read.c) until every snapshot does
 * (pending_table.c cleans it then), and comes back if maintain rolls back.
 * Why the boundary and the folds keep reads exact is in
 * pending_internal.h.
 */
#include "postgres.h"
#include "fmgr.h"

#include "access/transam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/procarray.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/xid8.h"

#include "pending_internal.h"
#include "statements.h"

static FmStatement fold_stmt = {
	"INSERT INTO flagmeter.counters AS c (tenant, meter, period_start, stripe, counter)"
	" SELECT f.tenant, f.meter, f.period_start, 32767, f.counter"
	" FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3),"
	"                pg_catalog.unnest($4)) AS f(tenant, meter, period_start, counter)"
	" ON CONFLICT (tenant, meter, period_start, stripe) DO UPDATE"
	" SET counter = c.counter OPERATOR(flagmeter.+) excluded.counter",
	4, {TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZARRAYOID, FM_TYPE_COUNTER_ARRAY}
};

/* The periods one fold moves into their merged stripes: fold_stmt's arrays. */
typedef struct FoldBatch
{
	Datum	   *tenants;
	Datum	   *meters;
	Datum	   *starts;
	Datum	   *amounts;
	int			n;
} FoldBatch;

/* full transaction id of xid, which is not in the future */
static FullTransactionId
full_xid(TransactionId xid)
{
	FullTransactionId next = ReadNextFullTransactionId();

	return FullTransactionIdFromU64(U64FromFullTransactionId(next) -
									(uint32) (XidFromFullTransactionId(next) - xid));
}

/*
 * Freeze settling while the boundary is taken (fold_high at
 * PG_UINT64_MAX), once no other database's maintain is folding.
 */
static void
freeze_settling(void)
{
	uint64		expected = 0;

	while (!pg_atomic_compare_exchange_u64(&fm_pending_state->fold_high, &expected,
										   PG_UINT64_MAX))
	{
		/* another database's maintain is folding */
		expected = 0;
		pg_usleep(1000L);
		CHECK_FOR_INTERRUPTS();
	}
}

/*
 * With settling frozen, let every settle in progress finish (each runs
 * under a partition lock): H then lies at or above every transaction
 * settled so far, and below every running one.  Settling resumes below H.
 */
static uint64
take_boundary(void)
{
	uint64		high;
	int			p;

	for (p = 0; p < FM_PENDING_PARTITIONS; p++)
	{
		LWLockAcquire(partition_lock(p), LW_EXCLUSIVE);
		LWLockRelease(partition_lock(p));
	}
	high = Max(pg_atomic_read_u64(&fm_pending_state->settled_below),
			   U64FromFullTransactionId(full_xid(GetOldestNonRemovableTransactionId(NULL))));
	pg_atomic_write_u64(&fm_pending_state->fold_high, high);
	return high;
}

/*
 * Settle this database's entries up to high, and let those nothing is
 * pending in leave the table (until their next track); false when an
 * entry has no room for another fold.  Every partition locked.
 */
static bool
settle_for_fold(uint64 high)
{
	HASH_SEQ_STATUS seq;
	FmPendingEntry *e;
	bool		room = true;

	hash_seq_init(&seq, fm_pending_entries);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		if (e->key.database != MyDatabaseId)
			continue;
		fm_pending_clean_folds(e);
		fm_pending_settle_slots(entry_partition(e), e, high);
		if (entry_unused(e))
			hash_search(fm_pending_entries, &e->key, HASH_REMOVE, NULL);
		else if (e->nfolds == FM_PENDING_FOLDS)
			room = false;
	}
	return room;
}

/*
 * Move every entry's settled usage into a fold tagged with maintain's
 * transaction me, and into batch for the rows.  Every partition locked.
 */
static void
move_into_folds(uint64 high, TransactionId me, FoldBatch *batch)
{
	HASH_SEQ_STATUS seq;
	FmPendingEntry *e;
	long		nentries = hash_get_num_entries(fm_pending_entries);

	batch->tenants = palloc(sizeof(Datum) * nentries);
	batch->meters = palloc(sizeof(Datum) * nentries);
	batch->starts = palloc(sizeof(Datum) * nentries);
	batch->amounts = palloc(sizeof(Datum) * nentries);
	hash_seq_init(&seq, fm_pending_entries);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		if (e->key.database != MyDatabaseId)
			continue;
		fm_pending_settle_slots(entry_partition(e), e, high);
		if (counter_empty(&e->settled))
			continue;
		batch->tenants[batch->n] = CStringGetTextDatum(e->key.tenant);
		batch->meters[batch->n] = CStringGetTextDatum(e->key.meter);
		batch->starts[batch->n] = TimestampTzGetDatum(e->key.period_start);
		batch->amounts[batch->n] = FmCounterPGetDatum(fm_counter_copy(&e->settled));
		batch->n++;
		e->folds[e->nfolds].xid = me;
		e->folds[e->nfolds].amount = e->settled;
		e->nfolds++;
		fm_counter_init(&e->settled);
	}
}

/* Add the batch's usage to the periods' merged stripes. */
static void
write_folds(const FoldBatch *batch)
{
	Datum		args[4];
	int			n = batch->n;

	args[0] = fm_text_array(batch->tenants, n);
	args[1] = fm_text_array(batch->meters, n);
	args[2] = fm_timestamptz_array(batch->starts, n);
	args[3] = PointerGetDatum(construct_array(batch->amounts, n, fm_counter_type_oid(),
											  FM_COUNTER_SIZE, false, TYPALIGN_DOUBLE));
	SPI_connect();
	fm_execute(&fold_stmt, args, NULL, false, 0);
	SPI_finish();
	pg_atomic_fetch_add_u64(&fm_pending_state->folded, n);
}

/*
 * fold_pending() -> xid8: the fold of maintain() (see pending_internal.h).
 * Adds this database's settled usage to the periods' merged stripes and
 * returns H, the new counted_through, to be recorded in the same
 * transaction; NULL when the table does not hold this database's pending
 * usage (maintain folds the events instead, fold_pending_events) or an
 * entry has no room for another fold (a snapshot older than the last
 * folds is still open: the next run folds).
 *
 * Its steps: freeze settling, take the boundary H, settle every entry up
 * to it (every entry must take a fold, or none does), move the settled
 * usage into folds, thaw settling, and write the folds into the rows.
 */
PG_FUNCTION_INFO_V1(fm_fold_pending);
Datum
fm_fold_pending(PG_FUNCTION_ARGS)
{
	uint64		high;
	volatile bool room = true;
	FoldBatch	batch;
	TransactionId me;

	if (!fm_pending_table_holds_database())
		PG_RETURN_NULL();
	me = GetCurrentTransactionId();
	batch.n = 0;

	freeze_settling();
	PG_TRY();
	{
		high = take_boundary();
		fm_pending_lock_all(LW_EXCLUSIVE);
		room = settle_for_fold(high);
		if (room)
			move_into_folds(high, me, &batch);
		fm_pending_unlock_all();
	}
	PG_FINALLY();
	{
		pg_atomic_write_u64(&fm_pending_state->fold_high, 0);
	}
	PG_END_TRY();
	if (!room)
		PG_RETURN_NULL();

	if (batch.n > 0)
		write_folds(&batch);
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
	PG_RETURN_BOOL(fm_pending_table_holds_database());
}

/* at commit: the events were folded, the (empty) table now holds the database */
PG_FUNCTION_INFO_V1(fm_pending_events_folded);
Datum
fm_pending_events_folded(PG_FUNCTION_ARGS)
{
	fm_pending_ready_at_commit = fm_pending_state != NULL && !RecoveryInProgress();
	PG_RETURN_VOID();
}
