/*
 * notify.c
 *	  Quota events and cache invalidations, announced at commit; here, what
 *	  a transaction queues while it runs: quota events (the thresholds
 *	  and blocked state of a usage level among them) and invalidations, what
 *	  a subtransaction's end keeps of them, and the thresholds this session
 *	  remembers announced.
 *
 * Nothing here writes or sends: at pre-commit notify_commit.c hands the
 * queued quota events to notify_outbox.c and the invalidations to
 * notify_invalidations.c, then drops the queue here
 * (fm_notify_forget_queued).  See notify.h for the contract and
 * notify_internal.h for how it holds.
 */
#include "postgres.h"

#include <limits.h>

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "nodes/pg_list.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "decision.h"
#include "notify.h"
#include "notify_internal.h"
#include "period.h"
#include "statements.h"

/* How long a session trusts what it saw announced. */
#define ANNOUNCED_TTL_USECS		(30 * USECS_PER_SEC)
#define ANNOUNCED_CACHE_MAX		10000

/* Keys reported per table before "the whole table changed". */
#define MAX_KEYS_PER_TABLE		200

typedef struct AnnouncedEntry
{
	FmAnnouncedKey key;
	TimestampTz seen_at;
} AnnouncedEntry;

List	   *fm_queued_events = NIL;
List	   *fm_queued_invalidations = NIL;
List	   *fm_announced_now = NIL;
static HTAB *announced_cache = NULL;

const char *const fm_event_kind_names[FM_NUM_EVENT_KINDS] = {
	"threshold", "blocked", "unblocked", "limit_changed", "plan_changed",
	"feature_changed", "grant_low", "grant_exhausted", "grant_expired"
};

/* Is the tenant recorded as blocked in the period? (for queueing) */
static FmStatement is_blocked_stmt = {
	"SELECT 1 FROM flagmeter.blocked"
	" WHERE tenant" FM_EQ "$1 AND meter" FM_EQ "$2 AND period_start" FM_EQ "$3",
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

/* ---------------------------------------------------------------------
 * Queueing
 * ---------------------------------------------------------------------
 */
static char *
txn_strdup(const char *s)
{
	return s ? MemoryContextStrdup(TopTransactionContext, s) : NULL;
}

static void
make_key(FmAnnouncedKey *key, const char *tenant, const char *meter,
		 TimestampTz period_start, FmQuotaEventKind kind, int threshold)
{
	memset(key, 0, sizeof(*key));
	strlcpy(key->tenant, tenant, sizeof(key->tenant));
	strlcpy(key->meter, meter, sizeof(key->meter));
	key->period_start = period_start;
	key->kind = (int) kind;
	key->threshold = threshold;
}

/* Queued in this transaction already? */
static bool
queued(const FmAnnouncedKey *key)
{
	ListCell   *lc;

	foreach(lc, fm_queued_events)
	{
		FmQueuedEvent *p = lfirst(lc);

		if (p->dedupe && memcmp(&p->key, key, sizeof(FmAnnouncedKey)) == 0)
			return true;
	}
	return false;
}

/*
 * Announced recently as far as this session saw, or queued?  For
 * thresholds only: a threshold is announced once per period for good.
 */
static bool
already_announced(const FmAnnouncedKey *key)
{
	if (announced_cache)
	{
		AnnouncedEntry *entry = hash_search(announced_cache, key, HASH_FIND, NULL);

		if (entry && GetCurrentTimestamp() - entry->seen_at < ANNOUNCED_TTL_USECS)
			return true;
	}
	return queued(key);
}

static void
queue_event(const FmQuotaEvent *event, const FmAnnouncedKey *key)
{
	MemoryContext old = MemoryContextSwitchTo(TopTransactionContext);
	FmQueuedEvent *p = palloc0(sizeof(FmQueuedEvent));

	p->event = *event;
	p->event.tenant = txn_strdup(event->tenant);
	p->event.meter = txn_strdup(event->meter);
	p->event.plan = txn_strdup(event->plan);
	p->event.period = txn_strdup(event->period);
	p->event.mode = txn_strdup(event->mode);
	p->event.feature = txn_strdup(event->feature);
	p->event.config = txn_strdup(event->config);
	p->level = GetCurrentTransactionNestLevel();
	if (key)
	{
		p->dedupe = true;
		p->key = *key;
	}
	fm_queued_events = lappend(fm_queued_events, p);
	MemoryContextSwitchTo(old);
}

void
fm_queue_quota_event(const FmQuotaEvent *event)
{
	queue_event(event, NULL);
}

void
fm_queue_usage_level(const char *tenant, const char *meter, const FmLimit *limit,
					 TimestampTz period_start, int64 used)
{
	FmQuotaEvent event;
	FmAnnouncedKey key;
	int			i;

	memset(&event, 0, sizeof(event));
	event.tenant = tenant;
	event.meter = meter;
	event.has_period = true;
	event.period_start = period_start;
	event.has_usage = true;
	event.used = used;
	event.has_quota = true;
	event.quota = limit->quota;
	event.nthresholds = -1;

	for (i = 0; i < limit->nthresholds; i++)
	{
		if (!fm_threshold_reached(used, limit->quota, limit->thresholds[i]))
			break;				/* ascending: the rest are higher */
		make_key(&key, tenant, meter, period_start, FM_EVENT_THRESHOLD,
				 limit->thresholds[i]);
		if (already_announced(&key))
			continue;
		event.kind = FM_EVENT_THRESHOLD;
		event.threshold = limit->thresholds[i];
		queue_event(&event, &key);
	}

	/*
	 * Blocked is a state, not a one-off: a tenant unblocked (by a void or a
	 * limit change, possibly in another session) can be blocked again, so the
	 * blocked table is asked rather than this session's memory.  Only calls
	 * at or above a hard limit pay for the lookup.
	 */
	if (limit->hard && used >= limit->quota)
	{
		Datum		args[3];

		args[0] = CStringGetTextDatum(tenant);
		args[1] = CStringGetTextDatum(meter);
		args[2] = TimestampTzGetDatum(period_start);
		fm_execute(&is_blocked_stmt, args, NULL, false, 1);
		make_key(&key, tenant, meter, period_start, FM_EVENT_BLOCKED, 0);
		if (SPI_processed == 0 && !queued(&key))
		{
			event.kind = FM_EVENT_BLOCKED;
			event.threshold = 0;
			/* when the block ends by itself (lifetime periods never end) */
			if (limit->period != FM_PERIOD_LIFETIME)
			{
				TimestampTz start;

				fm_period_bounds(limit->period, limit->anchor, limit->tz, period_start,
								 &start, &event.resets_at);
				event.has_resets_at = true;
			}
			queue_event(&event, &key);
		}
	}
}

/*
 * Per table, what is queued: how many keys, whether "the whole table" is,
 * with which operations, and the outermost level any of it came from.
 * Kept beside the list so that queueing a row costs O(1).
 */
typedef struct TableSummary
{
	Oid			relid;
	int			nkeys;
	bool		whole;
	int			whole_ops;		/* bit per operation queued with whole */
	int			min_level;
} TableSummary;

static HTAB *table_summaries = NULL;	/* in TopTransactionContext */

static int
op_bit(const char *op)
{
	switch (op[0])
	{
		case 'i':
			return 1;
		case 'u':
			return 2;
		case 'd':
			return 4;
		default:
			return 8;			/* truncate */
	}
}

static TableSummary *
table_summary(Oid relid)
{
	TableSummary *summary;
	bool		found;

	if (table_summaries == NULL)
	{
		HASHCTL		ctl;

		memset(&ctl, 0, sizeof(ctl));
		ctl.keysize = sizeof(Oid);
		ctl.entrysize = sizeof(TableSummary);
		ctl.hcxt = TopTransactionContext;
		table_summaries = hash_create("flagmeter invalidations", 16, &ctl,
									  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	summary = hash_search(table_summaries, &relid, HASH_ENTER, &found);
	if (!found)
	{
		summary->nkeys = 0;
		summary->whole = false;
		summary->whole_ops = 0;
		summary->min_level = INT_MAX;
	}
	return summary;
}

/* After a subtransaction ended: summaries from what is left. */
static void
rebuild_table_summaries(void)
{
	ListCell   *lc;

	if (table_summaries)
		hash_destroy(table_summaries);
	table_summaries = NULL;
	foreach(lc, fm_queued_invalidations)
	{
		FmQueuedInvalidation *p = lfirst(lc);
		TableSummary *summary = table_summary(p->relid);

		summary->min_level = Min(summary->min_level, p->level);
		if (p->key_json)
			summary->nkeys++;
		else
		{
			summary->whole = true;
			summary->whole_ops |= op_bit(p->op);
		}
	}
}

void
fm_queue_invalidation(Oid relid, const char *op, const char *key_json)
{
	MemoryContext old;
	FmQueuedInvalidation *p;
	TableSummary *summary = table_summary(relid);
	int			level = GetCurrentTransactionNestLevel();

	if (summary->whole)
	{
		/* the whole table goes out anyway: only a new operation matters */
		if (summary->whole_ops & op_bit(op))
			return;
		key_json = NULL;
	}

	old = MemoryContextSwitchTo(TopTransactionContext);
	p = palloc0(sizeof(FmQueuedInvalidation));
	p->relid = relid;
	p->op = op;
	p->level = level;
	if (key_json != NULL && summary->nkeys < MAX_KEYS_PER_TABLE)
	{
		p->key_json = pstrdup(key_json);
		summary->nkeys++;
	}
	else
	{
		/*
		 * The whole table, at the outermost level any of its keys came from,
		 * so no abort of an inner subtransaction drops what an outer one
		 * changed.
		 */
		if (summary->min_level < level)
			p->level = summary->min_level;
		summary->whole = true;
		summary->whole_ops |= op_bit(op);
	}
	summary->min_level = Min(summary->min_level, p->level);
	fm_queued_invalidations = lappend(fm_queued_invalidations, p);
	MemoryContextSwitchTo(old);
}

void
fm_notify_forget_queued(void)
{
	/* the memory belongs to TopTransactionContext, released with it */
	fm_queued_events = NIL;
	fm_queued_invalidations = NIL;
	table_summaries = NULL;
	fm_announced_now = NIL;
}

void
fm_notify_remember_announced(void)
{
	ListCell   *lc;
	TimestampTz now = GetCurrentTimestamp();

	if (fm_announced_now == NIL)
		return;
	if (announced_cache == NULL ||
		hash_get_num_entries(announced_cache) > ANNOUNCED_CACHE_MAX)
	{
		HASHCTL		ctl;

		if (announced_cache)
			hash_destroy(announced_cache);
		memset(&ctl, 0, sizeof(ctl));
		ctl.keysize = sizeof(FmAnnouncedKey);
		ctl.entrysize = sizeof(AnnouncedEntry);
		announced_cache = hash_create("flagmeter announced", 256, &ctl,
									  HASH_ELEM | HASH_BLOBS);
	}
	foreach(lc, fm_announced_now)
	{
		AnnouncedEntry *entry = hash_search(announced_cache, lfirst(lc),
											HASH_ENTER, NULL);

		entry->seen_at = now;
	}
}

/* Drop what an aborted subtransaction queued; pass the rest upwards. */
static List *
filter_level(List *list, int level, bool aborted, size_t level_offset)
{
	List	   *kept = NIL;
	ListCell   *lc;
	MemoryContext old = MemoryContextSwitchTo(TopTransactionContext);

	foreach(lc, list)
	{
		int		   *item_level = (int *) ((char *) lfirst(lc) + level_offset);

		if (*item_level >= level)
		{
			if (aborted)
				continue;
			*item_level = level - 1;
		}
		kept = lappend(kept, lfirst(lc));
	}
	MemoryContextSwitchTo(old);
	return kept;
}

void
fm_notify_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						   SubTransactionId parentSubid, void *arg)
{
	int			level = GetCurrentTransactionNestLevel();
	bool		aborted;

	if (event == SUBXACT_EVENT_ABORT_SUB)
		aborted = true;
	else if (event == SUBXACT_EVENT_COMMIT_SUB)
		aborted = false;
	else
		return;
	if (fm_queued_events != NIL)
		fm_queued_events = filter_level(fm_queued_events, level, aborted,
										offsetof(FmQueuedEvent, level));
	if (fm_queued_invalidations != NIL)
	{
		fm_queued_invalidations = filter_level(fm_queued_invalidations, level, aborted,
											   offsetof(FmQueuedInvalidation, level));
		rebuild_table_summaries();
	}
}
