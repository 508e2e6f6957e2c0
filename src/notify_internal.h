/*
 * notify_internal.h
 *	  Quota events and cache invalidations, as the notify*.c files share
 *	  them: what a transaction queued, the names of the event kinds, and
 *	  the steps of the commit.  The rest of the engine uses notify.h only.
 *
 * See notify.h for the contract.  How it holds:
 *
 * - Queued items live in TopTransactionContext, each tagged with the
 *   subtransaction nesting level that queued it; a subtransaction abort
 *   drops its items, a subtransaction commit hands them to its parent.
 *
 * - The commit-time statements run in the latest snapshot, not the
 *   transaction's: under REPEATABLE READ the transaction's snapshot would
 *   not see a threshold another transaction announced meanwhile.
 *
 * - At XACT_EVENT_PRE_COMMIT (before PreCommit_Notify, so our NOTIFYs are
 *   part of this commit) quota events are written to flagmeter.outbox
 *   while holding the lock PreCommit_Notify itself takes for the commit
 *   (AccessExclusive on "database 0", held through the commit record): the
 *   outbox versions drawn under it are therefore in commit order, and a
 *   client resyncing from version V misses nothing.  Only transactions that
 *   queued a quota event take it; the hot path (track below every
 *   threshold) queues nothing.  Under the same lock the greatest version
 *   committed before is read, and every notification carries it
 *   (prev_version): an instance whose last version is lower missed
 *   something (a notification skipped under backpressure) and replays.
 *
 * - "Once per threshold per tenant, meter and period" is the outbox's
 *   partial unique index; "blocked" is a row in flagmeter.blocked.  A
 *   session remembers for a while which thresholds it saw announced, so a
 *   tenant above a threshold does not make every later call of this
 *   session try again.
 *
 * - When pg_notification_queue_usage() is above flagmeter.notify_queue_limit
 *   nothing is sent (a full queue would fail the commit): outbox rows are
 *   kept with notified = false and skipped invalidations are logged in
 *   flagmeter.notification_skips; maintain() sends one "resync" hint once
 *   the queue has drained.  An instance that received a later
 *   notification meanwhile sees the gap from its prev_version.
 *
 * The files, one phase each:
 *
 *	notify.c				what a transaction queues while it runs (the
 *							face of notify.h), what a subtransaction's end
 *							keeps of it, and the thresholds this session
 *							remembers announced
 *	notify_outbox.c			the quota events at pre-commit: recorded in the
 *							outbox in commit order and announced in one
 *							notification
 *	notify_invalidations.c	the invalidations at pre-commit: one
 *							notification per table, or logged as skipped
 *	notify_commit.c			the transaction's callbacks that run the phases,
 *							flagmeter.notify_queue_limit, fm_notify_init
 *	notify_announce.c		the SQL functions announce() and
 *							announce_feature()
 */
#ifndef FLAGMETER_NOTIFY_INTERNAL_H
#define FLAGMETER_NOTIFY_INTERNAL_H

#include "postgres.h"
#include "access/xact.h"
#include "datatype/timestamp.h"
#include "nodes/pg_list.h"

#include "bounds.h"
#include "notify.h"

/* Identity of an announcement, for deduplication. */
typedef struct FmAnnouncedKey
{
	char		tenant[FM_TENANT_MAX_BYTES + 1];
	char		meter[FM_NAME_MAX_BYTES + 1];
	TimestampTz period_start;
	int			kind;
	int			threshold;
} FmAnnouncedKey;

/* A quota event queued for the commit. */
typedef struct FmQueuedEvent
{
	FmQuotaEvent event;			/* strings in TopTransactionContext */
	int			level;
	bool		dedupe;			/* key is meaningful */
	FmAnnouncedKey key;
} FmQueuedEvent;

/* An invalidation queued for the commit. */
typedef struct FmQueuedInvalidation
{
	Oid			relid;
	const char *op;
	char	   *key_json;		/* NULL: the whole table */
	int			level;
} FmQueuedInvalidation;

/* notify.c: what the transaction queued, in TopTransactionContext */
extern List *fm_queued_events;
extern List *fm_queued_invalidations;
extern List *fm_announced_now;	/* keys to remember once committed */

/* notify.c: the names of FmQuotaEventKind, in its order */
#define FM_NUM_EVENT_KINDS		9
extern const char *const fm_event_kind_names[FM_NUM_EVENT_KINDS];

/* grant events are queued by grants.c only, never through announce() */
#define FM_IS_GRANT_EVENT(kind) ((kind) >= FM_EVENT_GRANT_LOW && (kind) <= FM_EVENT_GRANT_EXPIRED)

/* notify.c */
extern void fm_notify_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
									   SubTransactionId parentSubid, void *arg);
extern void fm_notify_forget_queued(void);
extern void fm_notify_remember_announced(void);

/* notify_outbox.c */
extern void fm_notify_commit_quota_events(bool room);

/* notify_invalidations.c */
extern void fm_notify_commit_invalidations(bool room);

#endif							/* FLAGMETER_NOTIFY_INTERNAL_H */
