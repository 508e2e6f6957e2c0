/*
 * notify.h
 *	  Quota events and cache invalidations, announced at commit.
 *
 * During a transaction, track/consume/void and the catalog functions queue
 * quota events (a threshold reached, a tenant blocked or unblocked, a limit,
 * plan or feature changed) and the invalidate trigger queues changed keys.  Nothing
 * is sent or written for them until the transaction commits: at pre-commit
 * the quota events are recorded in flagmeter.outbox with versions in commit
 * order and announced in one notification on channel "flagmeter"; the
 * invalidations go out as one notification per table.  A rolled-back
 * transaction or subtransaction drops what it queued.
 */
#ifndef FLAGMETER_NOTIFY_H
#define FLAGMETER_NOTIFY_H

#include "postgres.h"
#include "datatype/timestamp.h"

#include "bounds.h"
#include "limit.h"

#define FM_NOTIFY_CHANNEL		"flagmeter"
/* payloads stay under 1 kB (docs/design.md, "Notifications") */
#define FM_PAYLOAD_MAX_BYTES	1000

typedef enum FmQuotaEventKind
{
	FM_EVENT_THRESHOLD,			/* usage reached a threshold (once per period) */
	FM_EVENT_BLOCKED,			/* a hard limit is reached */
	FM_EVENT_UNBLOCKED,			/* usage is back under a hard limit */
	FM_EVENT_LIMIT_CHANGED,		/* a plan's limit or a tenant's override
								 * changed */
	FM_EVENT_PLAN_CHANGED,		/* a tenant moved to another plan */
	FM_EVENT_FEATURE_CHANGED,	/* a plan's row for a feature, or a tenant's
								 * override of it, changed */
	/* credit grants (grants.c), each once per grant: */
	FM_EVENT_GRANT_LOW,			/* remaining fell under its
								 * low_balance_percent */
	FM_EVENT_GRANT_EXHAUSTED,	/* nothing left */
	FM_EVENT_GRANT_EXPIRED		/* expired with units left */
} FmQuotaEventKind;

/* Fields of a quota event; NULL strings / has_* false for absent ones. */
typedef struct FmQuotaEvent
{
	FmQuotaEventKind kind;
	const char *tenant;
	const char *meter;
	const char *plan;
	bool		has_period;
	TimestampTz period_start;
	int			threshold;		/* percent, FM_EVENT_THRESHOLD only */
	bool		has_usage;
	int64		used;
	bool		has_quota;
	int64		quota;
	bool		has_resets_at;	/* blocked: when the blocked period ends */
	TimestampTz resets_at;
	/* limit_changed: the limit in force now (absent: none) */
	const char *period;			/* "month", ... */
	const char *mode;			/* "hard" or "soft" */
	int			nthresholds;	/* -1: absent */
	int			thresholds[FM_MAX_THRESHOLDS];

	/*
	 * feature_changed: the plan's row for the feature (tenant NULL) or the
	 * tenant's override of it (has_enabled false: the row is gone), now
	 */
	const char *feature;
	bool		has_enabled;
	bool		enabled;
	const char *config;			/* JSON text; NULL: none */
	int64		grant_id;		/* grant events: the grant; used is what was
								 * drawn, quota its amount, threshold the
								 * percent of grant_low */
} FmQuotaEvent;

extern void fm_notify_init(void);

/* Queue a quota event for the commit of the current transaction. */
extern void fm_queue_quota_event(const FmQuotaEvent *event);

/*
 * Queue what usage level used of the period starting at period_start means
 * under limit (which must be limited): thresholds reached, and "blocked"
 * (with the period's end) for a hard limit reached.  Cheap when nothing is
 * due: this runs on every track and consume.
 */
extern void fm_queue_usage_level(const char *tenant, const char *meter,
								 const FmLimit *limit, TimestampTz period_start,
								 int64 used);

/*
 * Queue an invalidation of table relid: op is "insert", "update", "delete"
 * or "truncate"; key_json a JSON object naming the changed row's key, or
 * NULL for "the whole table changed".
 */
extern void fm_queue_invalidation(Oid relid, const char *op, const char *key_json);

#endif							/* FLAGMETER_NOTIFY_H */
