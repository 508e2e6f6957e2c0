/*
 * notify.c
 *	  Quota events and cache invalidations, announced at commit.
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
 */
#include "postgres.h"

#include <limits.h>

#include "fmgr.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_database.h"
#include "catalog/pg_type.h"
#include "commands/async.h"
#include "common/int.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "nodes/pg_list.h"
#include "storage/lmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/json.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "bounds.h"
#include "compat.h"
#include "counter_core.h"
#include "decision.h"
#include "notify.h"
#include "period.h"
#include "statements.h"

/* flagmeter.notify_queue_limit */
static double fm_notify_queue_limit = 0.5;

/* How long a session trusts what it saw announced. */
#define ANNOUNCED_TTL_USECS		(30 * USECS_PER_SEC)
#define ANNOUNCED_CACHE_MAX		10000

/* Keys reported per table before "the whole table changed". */
#define MAX_KEYS_PER_TABLE		200

/* Identity of an announcement, for deduplication. */
typedef struct AnnouncedKey
{
	char		tenant[FM_TENANT_MAX_BYTES + 1];
	char		meter[FM_NAME_MAX_BYTES + 1];
	TimestampTz period_start;
	int			kind;
	int			threshold;
} AnnouncedKey;

typedef struct AnnouncedEntry
{
	AnnouncedKey key;
	TimestampTz seen_at;
} AnnouncedEntry;

typedef struct PendingEvent
{
	FmQuotaEvent event;			/* strings in TopTransactionContext */
	int			level;
	bool		dedupe;			/* key is meaningful */
	AnnouncedKey key;
} PendingEvent;

typedef struct PendingInvalidation
{
	Oid			relid;
	const char *op;
	char	   *key_json;		/* NULL: the whole table */
	int			level;
} PendingInvalidation;

static List *pending_events = NIL;
static List *pending_invalidations = NIL;
static List *announced_now = NIL;	/* keys to remember once committed */
static HTAB *announced_cache = NULL;

static const char *const kind_names[] = {
	"threshold", "blocked", "unblocked", "limit_changed", "plan_changed",
	"feature_changed", "grant_low", "grant_exhausted", "grant_expired"
};

/* grant events are queued by grants.c only, never through announce() */
#define IS_GRANT_EVENT(kind) ((kind) >= FM_EVENT_GRANT_LOW && (kind) <= FM_EVENT_GRANT_EXPIRED)

/* ---------------------------------------------------------------------
 * Statements run at pre-commit
 * ---------------------------------------------------------------------
 */

/*
 * Thresholds are looked up before they are inserted rather than inserted
 * with ON CONFLICT, so that no version is drawn for one already announced:
 * every outbox writer holds the commit lock (see above), so nobody can
 * insert between the two statements, and versions stay consecutive.
 */
static FmStatement threshold_announced_stmt = {
	"SELECT 1 FROM flagmeter.outbox"
	" WHERE tenant" FM_EQ "$1 AND meter" FM_EQ "$2 AND period_start" FM_EQ "$3"
	" AND threshold" FM_EQ "$4 AND kind" FM_EQ "'threshold'::pg_catalog.text",
	4, {TEXTOID, TEXTOID, TIMESTAMPTZOID, INT4OID}
};

static FmStatement insert_threshold_stmt = {
	"INSERT INTO flagmeter.outbox"
	" (version, kind, tenant, meter, period_start, threshold, used, quota, notified)"
	" VALUES (pg_catalog.nextval('flagmeter.outbox_version'), 'threshold',"
	"         $1, $2, $3, $4, $5, $6, $7)"
	" RETURNING version",
	7, {TEXTOID, TEXTOID, TIMESTAMPTZOID, INT4OID, INT8OID, INT8OID, BOOLOID}
};

/* The greatest version recorded before this commit's (0: none). */
static FmStatement latest_version_stmt = {
	"SELECT COALESCE(pg_catalog.max(version), 0) FROM flagmeter.outbox",
	0, {InvalidOid}
};

/* Is the tenant recorded as blocked in the period? (for queueing) */
static FmStatement is_blocked_stmt = {
	"SELECT 1 FROM flagmeter.blocked"
	" WHERE tenant" FM_EQ "$1 AND meter" FM_EQ "$2 AND period_start" FM_EQ "$3",
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

/* A grant event, once per grant and kind (the outbox's partial unique index). */
static FmStatement grant_announced_stmt = {
	"SELECT 1 FROM flagmeter.outbox WHERE grant_id" FM_EQ "$1 AND kind" FM_EQ "$2",
	2, {INT8OID, TEXTOID}
};

static FmStatement insert_grant_event_stmt = {
	"INSERT INTO flagmeter.outbox"
	" (version, kind, tenant, meter, grant_id, threshold, used, quota, notified)"
	" VALUES (pg_catalog.nextval('flagmeter.outbox_version'), $2, $3, $4, $1, $5, $6, $7, $8)"
	" RETURNING version",
	8, {INT8OID, TEXTOID, TEXTOID, TEXTOID, INT4OID, INT8OID, INT8OID, BOOLOID}
};

static FmStatement insert_event_stmt = {
	"INSERT INTO flagmeter.outbox"
	" (version, kind, tenant, meter, plan, period_start, used, quota, notified,"
	"  resets_at, period, mode, thresholds)"
	" VALUES (pg_catalog.nextval('flagmeter.outbox_version'),"
	"         $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
	" RETURNING version",
	12, {TEXTOID, TEXTOID, TEXTOID, TEXTOID, TIMESTAMPTZOID, INT8OID, INT8OID, BOOLOID,
	TIMESTAMPTZOID, TEXTOID, TEXTOID, INT4ARRAYOID}
};

/*
 * feature_changed carries its own columns; the configuration value arrives
 * as JSON text (announce_feature took it as jsonb) and is stored as jsonb.
 */
static FmStatement insert_feature_stmt = {
	"INSERT INTO flagmeter.outbox"
	" (version, kind, tenant, plan, feature, enabled, config, notified)"
	" VALUES (pg_catalog.nextval('flagmeter.outbox_version'), 'feature_changed',"
	"         $1, $2, $3, $4, $5::pg_catalog.jsonb, $6)"
	" RETURNING version",
	6, {TEXTOID, TEXTOID, TEXTOID, BOOLOID, TEXTOID, BOOLOID}
};

static FmStatement block_stmt = {
	"INSERT INTO flagmeter.blocked (tenant, meter, period_start, blocked_at, resets_at)"
	" VALUES ($1, $2, $3, pg_catalog.now(), $4)"
	" ON CONFLICT (tenant, meter, period_start) DO NOTHING",
	4, {TEXTOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID}
};

static FmStatement unblock_stmt = {
	"DELETE FROM flagmeter.blocked"
	" WHERE tenant" FM_EQ "$1 AND meter" FM_EQ "$2 AND period_start" FM_EQ "$3",
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

static FmStatement log_skip_stmt = {
	"INSERT INTO flagmeter.notification_skips (kind, detail) VALUES ($1, $2)",
	2, {TEXTOID, TEXTOID}
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
make_key(AnnouncedKey *key, const char *tenant, const char *meter,
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
queued(const AnnouncedKey *key)
{
	ListCell   *lc;

	foreach(lc, pending_events)
	{
		PendingEvent *p = lfirst(lc);

		if (p->dedupe && memcmp(&p->key, key, sizeof(AnnouncedKey)) == 0)
			return true;
	}
	return false;
}

/*
 * Announced recently as far as this session saw, or queued?  For
 * thresholds only: a threshold is announced once per period for good.
 */
static bool
already_announced(const AnnouncedKey *key)
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
queue_event(const FmQuotaEvent *event, const AnnouncedKey *key)
{
	MemoryContext old = MemoryContextSwitchTo(TopTransactionContext);
	PendingEvent *p = palloc0(sizeof(PendingEvent));

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
	pending_events = lappend(pending_events, p);
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
	AnnouncedKey key;
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
	foreach(lc, pending_invalidations)
	{
		PendingInvalidation *p = lfirst(lc);
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
	PendingInvalidation *p;
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
	p = palloc0(sizeof(PendingInvalidation));
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
	pending_invalidations = lappend(pending_invalidations, p);
	MemoryContextSwitchTo(old);
}

/* ---------------------------------------------------------------------
 * Payloads
 * ---------------------------------------------------------------------
 */
static void
append_timestamp(StringInfo buf, const char *name, TimestampTz ts)
{
	char		stamp[64];

	if (TIMESTAMP_NOT_FINITE(ts))
		snprintf(stamp, sizeof(stamp), "%s", TIMESTAMP_IS_NOBEGIN(ts) ? "-infinity" : "infinity");
	else
		fm_format_timestamp(ts, stamp, sizeof(stamp));
	appendStringInfo(buf, ",\"%s\":", name);
	escape_json(buf, stamp);
}

/* ,"name":"value" when value is not NULL (fields that do not apply are left out) */
static void
append_text_field(StringInfo buf, const char *name, const char *value)
{
	if (value == NULL)
		return;
	appendStringInfo(buf, ",\"%s\":", name);
	escape_json(buf, value);
}

/*
 * The JSON object of one announced event.  prev_version >= 0 adds it (a
 * notification of its own); the events of a batch leave it to the batch.
 */
static void
append_event_json(StringInfo buf, const FmQuotaEvent *e, int64 version,
				  int64 prev_version, bool brief)
{
	appendStringInfo(buf, "{\"kind\":\"%s\",\"version\":" INT64_FORMAT,
					 kind_names[e->kind], version);
	if (prev_version >= 0)
		appendStringInfo(buf, ",\"prev_version\":" INT64_FORMAT, prev_version);
	append_text_field(buf, "tenant", e->tenant);
	append_text_field(buf, "meter", e->meter);
	if (e->kind == FM_EVENT_FEATURE_CHANGED)
	{
		/*
		 * Whole, it is the row a client caches: the plan's (no tenant) or the
		 * tenant's override (enabled null: dropped), enabled and config
		 * always present.  Brief, it lacks them, so a client reads the outbox
		 * row instead (a large config).
		 */
		append_text_field(buf, "plan", e->plan);
		append_text_field(buf, "feature", e->feature);
		if (!brief)
			appendStringInfo(buf, ",\"enabled\":%s,\"config\":%s",
							 !e->has_enabled ? "null" : e->enabled ? "true" : "false",
							 e->config ? e->config : "null");
		appendStringInfoChar(buf, '}');
		return;
	}
	if (e->grant_id > 0)
		appendStringInfo(buf, ",\"grant_id\":" INT64_FORMAT, e->grant_id);
	if (brief)
	{
		appendStringInfoChar(buf, '}');
		return;
	}
	append_text_field(buf, "plan", e->plan);
	if (e->has_period)
		append_timestamp(buf, "period_start", e->period_start);
	if (e->kind == FM_EVENT_THRESHOLD || e->kind == FM_EVENT_GRANT_LOW)
		appendStringInfo(buf, ",\"threshold\":%d", e->threshold);
	if (e->has_resets_at)
		append_timestamp(buf, "resets_at", e->resets_at);
	if (e->has_usage)
		appendStringInfo(buf, ",\"used\":" INT64_FORMAT, e->used);
	if (e->has_quota)
		appendStringInfo(buf, ",\"quota\":" INT64_FORMAT, e->quota);
	append_text_field(buf, "period", e->period);
	append_text_field(buf, "mode", e->mode);
	if (e->nthresholds >= 0)
	{
		int			i;

		appendStringInfoString(buf, ",\"thresholds\":[");
		for (i = 0; i < e->nthresholds; i++)
			appendStringInfo(buf, "%s%d", i > 0 ? "," : "", e->thresholds[i]);
		appendStringInfoChar(buf, ']');
	}
	appendStringInfoChar(buf, '}');
}

/* ---------------------------------------------------------------------
 * Commit processing
 * ---------------------------------------------------------------------
 */
static bool
queue_has_room(void)
{
	double		usage;

	usage = DatumGetFloat8(DirectFunctionCall1(pg_notification_queue_usage, (Datum) 0));
	return usage <= fm_notify_queue_limit;
}

static void
log_skip(const char *kind, const char *detail)
{
	Datum		args[2];

	args[0] = CStringGetTextDatum(kind);
	args[1] = CStringGetTextDatum(detail);
	fm_execute(&log_skip_stmt, args, NULL, false, 0);
}

/* A text argument, or NULL: args[i] and nulls[i] for an optional string. */
static void
optional_text_arg(Datum *args, char *nulls, int i, const char *value)
{
	args[i] = value ? CStringGetTextDatum(value) : (Datum) 0;
	nulls[i] = value ? ' ' : 'n';
}

/* The version the outbox INSERT just run returned. */
static int64
returned_version(void)
{
	bool		isnull;

	return DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
									   SPI_tuptable->tupdesc, 1, &isnull));
}

/* Record a grant event (see record_event), unless the grant had it before. */
static int64
record_grant_event(const FmQuotaEvent *e, bool notified)
{
	Datum		args[8];
	char		nulls[9] = "        ";

	args[0] = Int64GetDatum(e->grant_id);
	args[1] = CStringGetTextDatum(kind_names[e->kind]);
	fm_execute_latest(&grant_announced_stmt, args, NULL, 1);
	if (SPI_processed > 0)
		return 0;
	args[2] = CStringGetTextDatum(e->tenant);
	args[3] = CStringGetTextDatum(e->meter);
	args[4] = Int32GetDatum(e->threshold);
	nulls[4] = e->kind == FM_EVENT_GRANT_LOW ? ' ' : 'n';
	args[5] = Int64GetDatum(e->used);
	args[6] = Int64GetDatum(e->quota);
	args[7] = BoolGetDatum(notified);
	fm_execute_latest(&insert_grant_event_stmt, args, nulls, 0);
	return returned_version();
}

/* Record a threshold (see record_event), unless someone announced it before. */
static int64
record_threshold_event(const FmQuotaEvent *e, bool notified)
{
	Datum		args[7];

	args[0] = CStringGetTextDatum(e->tenant);
	args[1] = CStringGetTextDatum(e->meter);
	args[2] = TimestampTzGetDatum(e->period_start);
	args[3] = Int32GetDatum(e->threshold);
	args[4] = Int64GetDatum(e->used);
	args[5] = Int64GetDatum(e->quota);
	args[6] = BoolGetDatum(notified);
	fm_execute_latest(&threshold_announced_stmt, args, NULL, 1);
	if (SPI_processed > 0)
		return 0;				/* announced before, by someone */
	fm_execute_latest(&insert_threshold_stmt, args, NULL, 0);
	return returned_version();
}

/* Record a feature change (see record_event), in its own columns. */
static int64
record_feature_event(const FmQuotaEvent *e, bool notified)
{
	Datum		args[6];
	char		nulls[7] = "      ";

	optional_text_arg(args, nulls, 0, e->tenant);
	optional_text_arg(args, nulls, 1, e->plan);
	args[2] = CStringGetTextDatum(e->feature);
	args[3] = BoolGetDatum(e->enabled);
	nulls[3] = e->has_enabled ? ' ' : 'n';
	optional_text_arg(args, nulls, 4, e->config);
	args[5] = BoolGetDatum(notified);
	fm_execute_latest(&insert_feature_stmt, args, nulls, 0);
	return returned_version();
}

/*
 * Mark the period blocked or unblocked in flagmeter.blocked, as e says;
 * false when it already was (nothing to announce).
 */
static bool
record_block_state(const FmQuotaEvent *e)
{
	Datum		args[4];
	char		nulls[5] = "    ";

	args[0] = CStringGetTextDatum(e->tenant);
	args[1] = CStringGetTextDatum(e->meter);
	args[2] = TimestampTzGetDatum(e->period_start);
	args[3] = TimestampTzGetDatum(e->resets_at);
	nulls[3] = e->has_resets_at ? ' ' : 'n';
	fm_execute_latest(e->kind == FM_EVENT_BLOCKED ? &block_stmt : &unblock_stmt,
					  args, nulls, 0);
	return SPI_processed > 0;
}

/* Record any other event in the outbox's common columns. */
static int64
record_outbox_event(const FmQuotaEvent *e, bool notified)
{
	Datum		args[12];
	char		nulls[13] = "            ";

	args[0] = CStringGetTextDatum(kind_names[e->kind]);
	optional_text_arg(args, nulls, 1, e->tenant);
	optional_text_arg(args, nulls, 2, e->meter);
	optional_text_arg(args, nulls, 3, e->plan);
	args[4] = TimestampTzGetDatum(e->period_start);
	nulls[4] = e->has_period ? ' ' : 'n';
	args[5] = Int64GetDatum(e->used);
	nulls[5] = e->has_usage ? ' ' : 'n';
	args[6] = Int64GetDatum(e->quota);
	nulls[6] = e->has_quota ? ' ' : 'n';
	args[7] = BoolGetDatum(notified);
	args[8] = TimestampTzGetDatum(e->resets_at);
	nulls[8] = e->has_resets_at ? ' ' : 'n';
	optional_text_arg(args, nulls, 9, e->period);
	optional_text_arg(args, nulls, 10, e->mode);
	if (e->nthresholds >= 0)
	{
		Datum		elems[FM_MAX_THRESHOLDS];
		int			i;

		for (i = 0; i < e->nthresholds; i++)
			elems[i] = Int32GetDatum(e->thresholds[i]);
		args[11] = PointerGetDatum(construct_array(elems, e->nthresholds, INT4OID, 4,
												   true, TYPALIGN_INT));
	}
	else
		nulls[11] = 'n';
	fm_execute_latest(&insert_event_stmt, args, nulls, 0);
	return returned_version();
}

/*
 * Record one event; its outbox version, or 0 when nothing is announced.
 * Each kind has its step: grant events and thresholds once (per grant,
 * per period), feature changes in their own columns, blocked and
 * unblocked only when flagmeter.blocked changed, the rest as they are.
 */
static int64
record_event(const FmQuotaEvent *e, bool notified)
{
	if (IS_GRANT_EVENT(e->kind))
		return record_grant_event(e, notified);
	if (e->kind == FM_EVENT_THRESHOLD)
		return record_threshold_event(e, notified);
	if (e->kind == FM_EVENT_FEATURE_CHANGED)
		return record_feature_event(e, notified);
	if ((e->kind == FM_EVENT_BLOCKED || e->kind == FM_EVENT_UNBLOCKED) &&
		!record_block_state(e))
		return 0;				/* already in that state */
	return record_outbox_event(e, notified);
}

/* What record_quota_events recorded, for the notification. */
typedef struct RecordedEvents
{
	int64		prev_version;	/* the greatest before this commit's */
	int64		first_version;
	int64		last_version;
	int			announced;		/* events given a version */
	const FmQuotaEvent *single; /* the first of them */
	StringInfoData events_json; /* all of them, comma-separated */
} RecordedEvents;

/*
 * Record the queued quota events in the outbox, in commit order, with the
 * version recorded before them; the thresholds announced are remembered
 * once committed (remember_announced).
 */
static void
record_quota_events(bool room, RecordedEvents *rec)
{
	ListCell   *lc;

	rec->first_version = 0;
	rec->last_version = 0;
	rec->announced = 0;
	rec->single = NULL;
	initStringInfo(&rec->events_json);
	/* portals are closed at pre-commit: SPI needs a snapshot of its own */
	PushActiveSnapshot(GetTransactionSnapshot());
	SPI_connect();
	fm_execute_latest(&latest_version_stmt, NULL, NULL, 1);
	rec->prev_version = returned_version();
	foreach(lc, pending_events)
	{
		PendingEvent *p = lfirst(lc);
		int64		version = record_event(&p->event, room);

		if (p->dedupe && p->event.kind == FM_EVENT_THRESHOLD)
		{
			MemoryContext old = MemoryContextSwitchTo(TopTransactionContext);
			AnnouncedKey *key = palloc(sizeof(AnnouncedKey));

			*key = p->key;
			announced_now = lappend(announced_now, key);
			MemoryContextSwitchTo(old);
		}
		if (version == 0)
			continue;
		if (rec->announced++ == 0)
		{
			rec->first_version = version;
			rec->single = &p->event;
		}
		else
			appendStringInfoChar(&rec->events_json, ',');
		rec->last_version = version;
		append_event_json(&rec->events_json, &p->event, version, -1, false);
	}
	SPI_finish();
	PopActiveSnapshot();
}

/*
 * The notification of one event: whole, else without its longer fields,
 * else only its kind and version (a resync) when it would not fit.
 */
static void
single_event_payload(StringInfo payload, const RecordedEvents *rec)
{
	append_event_json(payload, rec->single, rec->first_version, rec->prev_version, false);
	if (payload->len > FM_PAYLOAD_MAX_BYTES)
	{
		resetStringInfo(payload);
		append_event_json(payload, rec->single, rec->first_version, rec->prev_version,
						  true);
	}
	if (payload->len > FM_PAYLOAD_MAX_BYTES)
	{
		resetStringInfo(payload);
		appendStringInfo(payload, "{\"kind\":\"%s\",\"version\":" INT64_FORMAT
						 ",\"prev_version\":" INT64_FORMAT ",\"resync\":true}",
						 kind_names[rec->single->kind], rec->first_version,
						 rec->prev_version);
	}
}

/* The notification of several: a batch, else its version range (a resync). */
static void
batch_payload(StringInfo payload, const RecordedEvents *rec)
{
	appendStringInfo(payload,
					 "{\"kind\":\"batch\",\"from_version\":" INT64_FORMAT
					 ",\"to_version\":" INT64_FORMAT ",\"prev_version\":" INT64_FORMAT
					 ",\"count\":%d,\"events\":[%s]}",
					 rec->first_version, rec->last_version, rec->prev_version,
					 rec->announced, rec->events_json.data);
	if (payload->len > FM_PAYLOAD_MAX_BYTES)
	{
		resetStringInfo(payload);
		appendStringInfo(payload,
						 "{\"kind\":\"batch\",\"from_version\":" INT64_FORMAT
						 ",\"to_version\":" INT64_FORMAT ",\"prev_version\":" INT64_FORMAT
						 ",\"count\":%d,\"resync\":true}",
						 rec->first_version, rec->last_version, rec->prev_version,
						 rec->announced);
	}
}

/*
 * Quota events: record them in the outbox in commit order and announce
 * them in one notification (one event, or a batch, or only the version
 * range when the batch would not fit), with the version recorded before
 * them (prev_version; see above).
 */
static void
commit_quota_events(bool room)
{
	RecordedEvents rec;
	StringInfoData payload;

	/* the lock PreCommit_Notify takes anyway, taken earlier: see above */
	LockSharedObject(DatabaseRelationId, InvalidOid, 0, AccessExclusiveLock);
	record_quota_events(room, &rec);
	if (rec.announced == 0 || !room)
		return;

	initStringInfo(&payload);
	if (rec.announced == 1)
		single_event_payload(&payload, &rec);
	else
		batch_payload(&payload, &rec);
	Async_Notify(FM_NOTIFY_CHANNEL, payload.data);
}

/* The operations an invalidation names, in the order its payload lists them. */
static const char *const invalidation_ops[4] = {"insert", "update", "delete", "truncate"};

/*
 * What the transaction changed in table relid: seen_op[] its operations,
 * *keys the changed keys once each, or *whole when a change named none.
 */
static void
collect_table_changes(Oid relid, bool *seen_op, bool *whole, List **keys)
{
	ListCell   *lc;
	int			i;

	foreach(lc, pending_invalidations)
	{
		PendingInvalidation *p = lfirst(lc);

		if (p->relid != relid)
			continue;
		for (i = 0; i < 4; i++)
			if (strcmp(p->op, invalidation_ops[i]) == 0)
				seen_op[i] = true;
		if (p->key_json == NULL)
			*whole = true;
		else if (!*whole)
		{
			ListCell   *lc2;
			bool		dup = false;

			foreach(lc2, *keys)
			{
				if (strcmp(lfirst(lc2), p->key_json) == 0)
				{
					dup = true;
					break;
				}
			}
			if (!dup)
				*keys = lappend(*keys, p->key_json);
		}
	}
}

/*
 * The invalidation of one table: its operations and the changed keys, or
 * "all" when a change named none or the keys would not fit in a payload.
 */
static char *
table_invalidation_payload(Oid relid, const char *qualified_name)
{
	bool		seen_op[4] = {false, false, false, false};
	bool		whole = false;
	List	   *keys = NIL;
	StringInfoData head;
	StringInfoData payload;
	ListCell   *lc;
	int			i;
	bool		first;

	collect_table_changes(relid, seen_op, &whole, &keys);

	initStringInfo(&head);
	appendStringInfoString(&head, "{\"kind\":\"invalidate\",\"table\":");
	escape_json(&head, qualified_name);
	appendStringInfoString(&head, ",\"ops\":[");
	first = true;
	for (i = 0; i < 4; i++)
		if (seen_op[i])
		{
			appendStringInfo(&head, "%s\"%s\"", first ? "" : ",", invalidation_ops[i]);
			first = false;
		}
	appendStringInfoChar(&head, ']');

	initStringInfo(&payload);
	if (!whole)
	{
		appendStringInfo(&payload, "%s,\"keys\":[", head.data);
		first = true;
		foreach(lc, keys)
		{
			appendStringInfo(&payload, "%s%s", first ? "" : ",", (char *) lfirst(lc));
			first = false;
		}
		appendStringInfoString(&payload, "]}");
	}
	if (whole || payload.len > FM_PAYLOAD_MAX_BYTES)
	{
		resetStringInfo(&payload);
		appendStringInfo(&payload, "%s,\"all\":true}", head.data);
	}
	return payload.data;
}

/* One notification per invalidated table; logged as skipped without room. */
static void
commit_invalidations(bool room)
{
	List	   *tables = NIL;
	ListCell   *lc;
	bool		spi_connected = false;

	foreach(lc, pending_invalidations)
	{
		PendingInvalidation *p = lfirst(lc);

		tables = list_append_unique_oid(tables, p->relid);
	}

	foreach(lc, tables)
	{
		Oid			relid = lfirst_oid(lc);
		char	   *relname = get_rel_name(relid);
		char	   *nspname = get_namespace_name(get_rel_namespace(relid));
		const char *qualified;
		char	   *payload;

		if (relname == NULL || nspname == NULL)
			continue;			/* dropped in this transaction */
		qualified = quote_qualified_identifier(nspname, relname);
		payload = table_invalidation_payload(relid, qualified);
		if (room && strlen(payload) <= FM_PAYLOAD_MAX_BYTES)
			Async_Notify(FM_NOTIFY_CHANNEL, payload);
		else
		{
			if (!spi_connected)
			{
				PushActiveSnapshot(GetTransactionSnapshot());
				SPI_connect();
				spi_connected = true;
			}
			log_skip("invalidate", qualified);
		}
	}
	if (spi_connected)
	{
		SPI_finish();
		PopActiveSnapshot();
	}
}

static void
reset_pending(void)
{
	/* the memory belongs to TopTransactionContext, released with it */
	pending_events = NIL;
	pending_invalidations = NIL;
	table_summaries = NULL;
	announced_now = NIL;
}

static void
remember_announced(void)
{
	ListCell   *lc;
	TimestampTz now = GetCurrentTimestamp();

	if (announced_now == NIL)
		return;
	if (announced_cache == NULL ||
		hash_get_num_entries(announced_cache) > ANNOUNCED_CACHE_MAX)
	{
		HASHCTL		ctl;

		if (announced_cache)
			hash_destroy(announced_cache);
		memset(&ctl, 0, sizeof(ctl));
		ctl.keysize = sizeof(AnnouncedKey);
		ctl.entrysize = sizeof(AnnouncedEntry);
		announced_cache = hash_create("flagmeter announced", 256, &ctl,
									  HASH_ELEM | HASH_BLOBS);
	}
	foreach(lc, announced_now)
	{
		AnnouncedEntry *entry = hash_search(announced_cache, lfirst(lc),
											HASH_ENTER, NULL);

		entry->seen_at = now;
	}
}

static void
fm_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			if (pending_events != NIL || pending_invalidations != NIL)
			{
				bool		room = queue_has_room();

				if (pending_events != NIL)
					commit_quota_events(room);
				if (pending_invalidations != NIL)
					commit_invalidations(room);
			}
			break;
		case XACT_EVENT_PRE_PREPARE:
			if (pending_events != NIL || pending_invalidations != NIL)
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot PREPARE a transaction that has flagmeter notifications pending"),
						 errdetail("Quota events and invalidations are announced at commit, like NOTIFY.")));
			break;
		case XACT_EVENT_COMMIT:
			remember_announced();
			reset_pending();
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_PARALLEL_ABORT:
			reset_pending();
			break;
		default:
			break;
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

static void
fm_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
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
	if (pending_events != NIL)
		pending_events = filter_level(pending_events, level, aborted,
									  offsetof(PendingEvent, level));
	if (pending_invalidations != NIL)
	{
		pending_invalidations = filter_level(pending_invalidations, level, aborted,
											 offsetof(PendingInvalidation, level));
		rebuild_table_summaries();
	}
}

void
fm_notify_init(void)
{
	DefineCustomRealVariable("flagmeter.notify_queue_limit",
							 gettext_noop("Fill level of the NOTIFY queue above which flagmeter sends no notifications."),
							 gettext_noop("A full queue would fail the committing transaction; above this level "
										  "notifications are skipped (quota events stay in flagmeter.outbox) and "
										  "counted in flagmeter.stats."),
							 &fm_notify_queue_limit,
							 0.5, 0.0, 1.0,
							 PGC_SUSET, 0,
							 NULL, NULL, NULL);
	RegisterXactCallback(fm_xact_callback, NULL);
	RegisterSubXactCallback(fm_subxact_callback, NULL);
}

/* ---------------------------------------------------------------------
 * SQL: flagmeter.announce(kind, tenant, meter, plan, period_start, used,
 *                         quota, period, mode, thresholds)
 * ---------------------------------------------------------------------
 */
static char *
optional_text(FunctionCallInfo fcinfo, int argno)
{
	return PG_ARGISNULL(argno) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(argno));
}

PG_FUNCTION_INFO_V1(fm_announce);
Datum
fm_announce(PG_FUNCTION_ARGS)
{
	FmQuotaEvent event;
	char	   *kind;
	int			i;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("kind must not be NULL")));
	kind = text_to_cstring(PG_GETARG_TEXT_PP(0));
	memset(&event, 0, sizeof(event));
	for (i = 0; i < (int) lengthof(kind_names); i++)
		if (strcmp(kind, kind_names[i]) == 0)
			break;
	if (i == (int) lengthof(kind_names) || i == FM_EVENT_THRESHOLD ||
		i == FM_EVENT_FEATURE_CHANGED || IS_GRANT_EVENT(i))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid event kind \"%s\"", kind),
				 errhint("Valid kinds are \"blocked\", \"unblocked\", \"limit_changed\" and \"plan_changed\".")));
	event.kind = (FmQuotaEventKind) i;
	event.tenant = optional_text(fcinfo, 1);
	event.meter = optional_text(fcinfo, 2);
	event.plan = optional_text(fcinfo, 3);
	event.has_period = !PG_ARGISNULL(4);
	event.period_start = event.has_period ? PG_GETARG_TIMESTAMPTZ(4) : 0;
	event.has_usage = !PG_ARGISNULL(5);
	event.used = event.has_usage ? PG_GETARG_INT64(5) : 0;
	event.has_quota = !PG_ARGISNULL(6);
	event.quota = event.has_quota ? PG_GETARG_INT64(6) : 0;
	event.period = optional_text(fcinfo, 7);
	event.mode = optional_text(fcinfo, 8);
	event.nthresholds = -1;
	if (!PG_ARGISNULL(9))
	{
		Datum	   *elems;
		bool	   *elem_nulls;

		deconstruct_array(PG_GETARG_ARRAYTYPE_P(9), INT4OID, 4, true, TYPALIGN_INT,
						  &elems, &elem_nulls, &event.nthresholds);
		if (event.nthresholds > FM_MAX_THRESHOLDS)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("too many thresholds: %d", event.nthresholds)));
		for (i = 0; i < event.nthresholds; i++)
		{
			if (elem_nulls[i])
				ereport(ERROR,
						(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						 errmsg("thresholds must not contain NULLs")));
			event.thresholds[i] = DatumGetInt32(elems[i]);
		}
	}

	if ((event.kind == FM_EVENT_BLOCKED || event.kind == FM_EVENT_UNBLOCKED) &&
		(event.tenant == NULL || event.meter == NULL || !event.has_period))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s needs a tenant, a meter and a period_start", kind)));
	if (event.kind == FM_EVENT_LIMIT_CHANGED && event.meter == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("limit_changed needs a meter")));

	fm_queue_quota_event(&event);
	PG_RETURN_VOID();
}

/* ---------------------------------------------------------------------
 * SQL: flagmeter.announce_feature(tenant, plan, feature, enabled, config)
 *
 * feature_changed has fields of its own, so it has a function of its own
 * rather than more arguments of announce.  It announces rows, not answers:
 * the plan's row for the feature (tenant NULL), or the tenant's override,
 * enabled NULL when the row is gone.  An answer derived from several rows could be
 * overtaken by a concurrent change of another of them committed in
 * between; rows are written under their own row locks, so their events in
 * commit order replay to the committed state.
 * ---------------------------------------------------------------------
 */
PG_FUNCTION_INFO_V1(fm_announce_feature);
Datum
fm_announce_feature(PG_FUNCTION_ARGS)
{
	FmQuotaEvent event;

	memset(&event, 0, sizeof(event));
	event.kind = FM_EVENT_FEATURE_CHANGED;
	event.nthresholds = -1;
	event.tenant = optional_text(fcinfo, 0);
	event.plan = optional_text(fcinfo, 1);
	event.feature = optional_text(fcinfo, 2);
	if (event.feature == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("feature_changed needs a feature")));
	if ((event.tenant == NULL) == (event.plan == NULL))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("feature_changed needs a tenant or a plan, not both")));
	event.has_enabled = !PG_ARGISNULL(3);
	event.enabled = event.has_enabled && PG_GETARG_BOOL(3);
	/* jsonb's text form is JSON: it goes into the payload as it is */
	if (!PG_ARGISNULL(4))
		event.config = DatumGetCString(DirectFunctionCall1(jsonb_out, PG_GETARG_DATUM(4)));

	fm_queue_quota_event(&event);
	PG_RETURN_VOID();
}
