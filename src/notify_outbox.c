/*
 * notify_outbox.c
 *	  The quota events at pre-commit: recorded in flagmeter.outbox with
 *	  versions in commit order (thresholds and grant events once, blocked
 *	  and unblocked as flagmeter.blocked changes) and announced in one
 *	  notification on channel "flagmeter": one event, a batch, or only the
 *	  version range when it would not fit.
 *
 * The events are those notify.c queued; notify_commit.c runs this at
 * XACT_EVENT_PRE_COMMIT, before notify_invalidations.c.  The thresholds
 * recorded here are remembered by notify.c once committed.  See
 * notify_internal.h for the rules.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_database.h"
#include "catalog/pg_type.h"
#include "commands/async.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "nodes/pg_list.h"
#include "storage/lmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "counter_core.h"
#include "notify.h"
#include "notify_internal.h"
#include "statements.h"

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
					 fm_event_kind_names[e->kind], version);
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
 * Recording
 * ---------------------------------------------------------------------
 */
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
	args[1] = CStringGetTextDatum(fm_event_kind_names[e->kind]);
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

	args[0] = CStringGetTextDatum(fm_event_kind_names[e->kind]);
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
	if (FM_IS_GRANT_EVENT(e->kind))
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
 * once committed (fm_notify_remember_announced).
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
	foreach(lc, fm_queued_events)
	{
		FmQueuedEvent *p = lfirst(lc);
		int64		version = record_event(&p->event, room);

		if (p->dedupe && p->event.kind == FM_EVENT_THRESHOLD)
		{
			MemoryContext old = MemoryContextSwitchTo(TopTransactionContext);
			FmAnnouncedKey *key = palloc(sizeof(FmAnnouncedKey));

			*key = p->key;
			fm_announced_now = lappend(fm_announced_now, key);
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
						 fm_event_kind_names[rec->single->kind], rec->first_version,
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
void
fm_notify_commit_quota_events(bool room)
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
