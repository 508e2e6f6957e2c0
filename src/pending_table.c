/*
 * pending_table.c
 *	  The table of pending usage in shared memory: its partitions and their
 *	  locks, the pools of transaction slots, and an entry's upkeep.
 *
 * What the table is for, and the rules every phase keeps, are in
 * pending_internal.h.  This file holds what all of them stand on: the
 * memory made at server start, a period's entry found (or made) under its
 * partition's lock, and the two ways an entry shrinks, settling the slots
 * of ended transactions and cleaning folds every snapshot sees.  The
 * phases themselves (add, read, fold, the transaction's end) and the
 * per-database records are in the other pending_*.c files.
 */
#include "postgres.h"

#include "access/transam.h"
#include "access/xact.h"
#include "common/hashfn.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "utils/hsearch.h"
#include "utils/snapmgr.h"

#include "limit.h"
#include "pending_internal.h"

FmPendingState *fm_pending_state = NULL;
HTAB	   *fm_pending_entries = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/*
 * Keys hash and compare by their strings, not their padded ~340 bytes:
 * track_batch looks up a period per (tenant, meter) of its call, and as
 * blobs the hashing alone was a tenth of the call.
 */
static uint32
pending_key_hash(const void *key, Size keysize)
{
	const FmPendingKey *k = key;
	uint32		h = fm_tenant_meter_hash(k->tenant, k->meter);

	h = hash_combine(h, hash_bytes_uint32(k->database));
	return hash_combine(h, hash_bytes((const unsigned char *) &k->period_start,
									  sizeof(k->period_start)));
}

static int
pending_key_match(const void *key1, const void *key2, Size keysize)
{
	const FmPendingKey *a = key1;
	const FmPendingKey *b = key2;

	if (a->database != b->database || a->period_start != b->period_start)
		return 1;
	return strcmp(a->tenant, b->tenant) != 0 || strcmp(a->meter, b->meter) != 0;
}

static int
slots_per_partition(void)
{
	return (fm_pending_periods * FM_PENDING_SLOTS_PER_PERIOD + FM_PENDING_PARTITIONS - 1) /
		FM_PENDING_PARTITIONS;
}

static Size
state_size(void)
{
	return add_size(offsetof(FmPendingState, slots),
					mul_size(mul_size(slots_per_partition(), FM_PENDING_PARTITIONS),
							 sizeof(FmPendingSlot)));
}

static void
pending_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(state_size());
	RequestAddinShmemSpace(hash_estimate_size(fm_pending_periods, sizeof(FmPendingEntry)));
	RequestNamedLWLockTranche("flagmeter_pending", FM_PENDING_PARTITIONS + 1);
}

static void
pending_startup(void)
{
	bool		found;
	HASHCTL		info;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	fm_pending_state = ShmemInitStruct("flagmeter pending usage", state_size(), &found);
	if (!found)
	{
		FmPendingState *state = fm_pending_state;
		int			per = slots_per_partition();
		int			p;
		int			i;

		memset(state, 0, state_size());
		state->locks = GetNamedLWLockTranche("flagmeter_pending");
		state->slots_per_partition = per;
		pg_atomic_init_u64(&state->fold_high, 0);
		pg_atomic_init_u64(&state->settled_below, 0);
		pg_atomic_init_u64(&state->added, 0);
		pg_atomic_init_u64(&state->no_room, 0);
		pg_atomic_init_u64(&state->folded, 0);
		pg_atomic_init_u64(&state->rebuilt, 0);
		for (i = 0; i < FM_PENDING_DATABASES; i++)
			pg_atomic_init_u32(&state->databases[i].status, FM_PENDING_DB_EMPTY);
		for (p = 0; p < FM_PENDING_PARTITIONS; p++)
		{
			state->partitions[p].free_slot = p * per;
			state->partitions[p].nfree = per;
			for (i = 0; i < per; i++)
				state->slots[p * per + i].next = i + 1 < per ? p * per + i + 1 : -1;
		}
	}
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(FmPendingKey);
	info.entrysize = sizeof(FmPendingEntry);
	info.hash = pending_key_hash;
	info.match = pending_key_match;
	info.num_partitions = FM_PENDING_PARTITIONS;
	fm_pending_entries = ShmemInitHash("flagmeter pending periods", fm_pending_periods,
									   fm_pending_periods, &info,
									   HASH_ELEM | HASH_FUNCTION | HASH_COMPARE |
									   HASH_PARTITION |
									   HASH_FIXED_SIZE);
	LWLockRelease(AddinShmemInitLock);
}

/* From _PG_init, preloaded with a table: ask for its memory and locks. */
void
fm_pending_request_shmem(void)
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = pending_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = pending_startup;
}

static void
make_key(FmPendingKey *key, const char *tenant, const char *meter, TimestampTz period_start)
{
	memset(key, 0, sizeof(*key));
	key->database = MyDatabaseId;
	key->period_start = period_start;
	strlcpy(key->tenant, tenant, sizeof(key->tenant));
	strlcpy(key->meter, meter, sizeof(key->meter));
}

/* Every partition, in order: what a pass over the whole table holds. */
void
fm_pending_lock_all(LWLockMode mode)
{
	int			p;

	for (p = 0; p < FM_PENDING_PARTITIONS; p++)
		LWLockAcquire(partition_lock(p), mode);
}

void
fm_pending_unlock_all(void)
{
	int			p;

	for (p = FM_PENDING_PARTITIONS - 1; p >= 0; p--)
		LWLockRelease(partition_lock(p));
}

/* ---- slots ---- */

/* A slot from partition p's pool, or -1 when it is empty. */
int32
fm_pending_take_slot(int p)
{
	FmPendingPartition *part = &fm_pending_state->partitions[p];
	int32		s = part->free_slot;

	if (s < 0)
		return -1;
	part->free_slot = fm_pending_state->slots[s].next;
	part->nfree--;
	return s;
}

void
fm_pending_give_slot(int p, int32 s)
{
	FmPendingPartition *part = &fm_pending_state->partitions[p];

	fm_pending_state->slots[s].next = part->free_slot;
	part->free_slot = s;
	part->nfree++;
}

FmTaggerState
fm_pending_tagger_state(TransactionId xid)
{
	if (TransactionIdIsCurrentTransactionId(xid) || TransactionIdIsInProgress(xid))
		return FM_TAGGER_RUNNING;
	if (!TransactionIdDidCommit(xid))
		return FM_TAGGER_ROLLED_BACK;
	return GlobalVisCheckRemovableXid(NULL, xid) ? FM_TAGGER_SEEN_BY_ALL : FM_TAGGER_COMMITTED;
}

/*
 * Settle e's slots whose top-level transaction every snapshot sees as
 * ended, and that lie below below (0: no bound; see fold_high): committed,
 * into settled; rolled back, dropped.  Under the partition's lock,
 * exclusive.
 */
void
fm_pending_settle_slots(int p, FmPendingEntry *e, uint64 below)
{
	int32	   *link = &e->first_slot;

	while (*link >= 0)
	{
		FmPendingSlot *slot = &fm_pending_state->slots[*link];
		int32		s = *link;

		if (TransactionIdIsValid(slot->gone_in))
		{
			/*
			 * dropped with it once every snapshot sees that; back if it
			 * rolled back
			 */
			FmTaggerState dropper = fm_pending_tagger_state(slot->gone_in);

			if (dropper == FM_TAGGER_SEEN_BY_ALL)
			{
				*link = slot->next;
				e->nslots--;
				fm_pending_give_slot(p, s);
				continue;
			}
			if (dropper != FM_TAGGER_ROLLED_BACK)
			{
				link = &slot->next;
				continue;
			}
			slot->gone_in = InvalidTransactionId;
		}
		if ((below == 0 || U64FromFullTransactionId(slot->top) < below) &&
			GlobalVisCheckRemovableFullXid(NULL, slot->top))
		{
			uint64		above = U64FromFullTransactionId(slot->top) + 1;
			uint64		seen = pg_atomic_read_u64(&fm_pending_state->settled_below);

			while (seen < above &&
				   !pg_atomic_compare_exchange_u64(&fm_pending_state->settled_below,
												   &seen, above))
				;
			if (TransactionIdDidCommit(slot->xid))
				merge_into(&e->settled, &slot->amount);
			*link = slot->next;
			e->nslots--;
			fm_pending_give_slot(p, s);
			continue;
		}
		link = &slot->next;
	}
}

/*
 * Drop e's folds that every snapshot sees committed (the rows hold them),
 * and merge back those whose maintain rolled back.  Exclusive lock.
 */
void
fm_pending_clean_folds(FmPendingEntry *e)
{
	int			i = 0;

	while (i < e->nfolds)
	{
		FmPendingFold *f = &e->folds[i];
		FmTaggerState folder = fm_pending_tagger_state(f->xid);

		if (folder == FM_TAGGER_ROLLED_BACK)
			merge_into(&e->settled, &f->amount);
		if (folder == FM_TAGGER_ROLLED_BACK || folder == FM_TAGGER_SEEN_BY_ALL)
			e->folds[i] = e->folds[--e->nfolds];
		else
			i++;
	}
}

/* A new entry: nothing pending, no recheck figure yet. */
static void
entry_init(FmPendingEntry *e)
{
	fm_counter_init(&e->settled);
	e->first_slot = -1;
	e->nslots = 0;
	e->nfolds = 0;
	e->added = 0;
	e->added_used = 0;
	e->has_recheck = false;
}

/*
 * The period's entry with its partition's lock held in mode (*partition
 * says which, for the caller to release); found, or with HASH_ENTER_NULL
 * made.  NULL, with the lock released, when there is none (or no room).
 */
FmPendingEntry *
fm_pending_lock_entry(const char *tenant, const char *meter, TimestampTz period_start,
					  HASHACTION action, LWLockMode mode, int *partition)
{
	FmPendingKey key;
	uint32		hash;
	FmPendingEntry *e;
	bool		found;

	make_key(&key, tenant, meter, period_start);
	hash = get_hash_value(fm_pending_entries, &key);
	*partition = partition_of(hash);
	LWLockAcquire(partition_lock(*partition), mode);
	e = hash_search_with_hash_value(fm_pending_entries, &key, hash, action, &found);
	if (e == NULL)
		LWLockRelease(partition_lock(*partition));
	else if (!found)
		entry_init(e);
	return e;
}
