/*
 * notify_invalidations.c
 *	  The invalidations at pre-commit: one notification per table the
 *	  transaction changed, naming its operations and changed keys (or "all"),
 *	  or, when the NOTIFY queue has no room, a row in
 *	  flagmeter.notification_skips.
 *
 * The invalidations are those notify.c queued; notify_commit.c runs this at
 * XACT_EVENT_PRE_COMMIT, after notify_outbox.c.  See notify_internal.h for
 * the rules.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "commands/async.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "nodes/pg_list.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"

#include "notify.h"
#include "notify_internal.h"
#include "statements.h"

static FmStatement log_skip_stmt = {
	"INSERT INTO flagmeter.notification_skips (kind, detail) VALUES ($1, $2)",
	2, {TEXTOID, TEXTOID}
};

static void
log_skip(const char *kind, const char *detail)
{
	Datum		args[2];

	args[0] = CStringGetTextDatum(kind);
	args[1] = CStringGetTextDatum(detail);
	fm_execute(&log_skip_stmt, args, NULL, false, 0);
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

	foreach(lc, fm_queued_invalidations)
	{
		FmQueuedInvalidation *p = lfirst(lc);

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
void
fm_notify_commit_invalidations(bool room)
{
	List	   *tables = NIL;
	ListCell   *lc;
	bool		spi_connected = false;

	foreach(lc, fm_queued_invalidations)
	{
		FmQueuedInvalidation *p = lfirst(lc);

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
