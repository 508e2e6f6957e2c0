/*
 * invalidate.c
 *	  flagmeter.invalidate(): a trigger that tells app instances which
 *	  cached rows of a table changed.
 *
 * Attach it AFTER INSERT OR UPDATE OR DELETE (OR TRUNCATE), per row or per
 * statement; arguments name the key columns, none means the primary key.
 * Per statement it reads the transition tables (REFERENCING NEW TABLE AS
 * ... OLD TABLE AS ...) when there are any, and reports "the whole table
 * changed" when there are none.  The keys are queued (notify.c) and go out
 * at commit, one notification per table per transaction.
 */
#include "postgres.h"
#include "fmgr.h"

#include "access/htup_details.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "nodes/bitmapset.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/tuplestore.h"

#include "compat.h"
#include "notify.h"

/* The key columns: the trigger's arguments, or the primary key. */
static int *
key_columns(TriggerData *trigdata, int *ncolumns)
{
	Relation	rel = trigdata->tg_relation;
	TupleDesc	desc = RelationGetDescr(rel);
	Trigger    *trigger = trigdata->tg_trigger;
	int		   *attnums;
	int			i;

	if (trigger->tgnargs > 0)
	{
		attnums = palloc(sizeof(int) * trigger->tgnargs);
		for (i = 0; i < trigger->tgnargs; i++)
		{
			attnums[i] = SPI_fnumber(desc, trigger->tgargs[i]);
			if (attnums[i] <= 0)
				ereport(ERROR,
						(errcode(ERRCODE_UNDEFINED_COLUMN),
						 errmsg("column \"%s\" of relation \"%s\" does not exist",
								trigger->tgargs[i], RelationGetRelationName(rel)),
						 errcontext("trigger \"%s\" calling flagmeter.invalidate()",
									trigger->tgname)));
		}
		*ncolumns = trigger->tgnargs;
	}
	else
	{
		Bitmapset  *pk = RelationGetIndexAttrBitmap(rel, INDEX_ATTR_BITMAP_PRIMARY_KEY);
		int			member = -1;
		int			n = 0;

		if (bms_is_empty(pk))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
					 errmsg("relation \"%s\" has no primary key", RelationGetRelationName(rel)),
					 errhint("Name the key columns as arguments of trigger \"%s\".",
							 trigger->tgname)));
		attnums = palloc(sizeof(int) * bms_num_members(pk));
		while ((member = bms_next_member(pk, member)) >= 0)
			attnums[n++] = member + FirstLowInvalidHeapAttributeNumber;
		*ncolumns = n;
	}
	return attnums;
}

/* {"col":"value",...} of one row's key (values in their text form). */
static char *
key_json(TupleDesc desc, HeapTuple tuple, const int *attnums, int ncolumns)
{
	StringInfoData buf;
	int			i;

	initStringInfo(&buf);
	appendStringInfoChar(&buf, '{');
	for (i = 0; i < ncolumns; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, attnums[i] - 1);
		bool		isnull;
		Datum		value = heap_getattr(tuple, attnums[i], desc, &isnull);

		if (i > 0)
			appendStringInfoChar(&buf, ',');
		escape_json(&buf, NameStr(att->attname));
		appendStringInfoChar(&buf, ':');
		if (isnull)
			appendStringInfoString(&buf, "null");
		else
		{
			Oid			typoutput;
			bool		typisvarlena;

			getTypeOutputInfo(att->atttypid, &typoutput, &typisvarlena);
			escape_json(&buf, OidOutputFunctionCall(typoutput, value));
		}
	}
	appendStringInfoChar(&buf, '}');
	return buf.data;
}

static void
queue_transition_table(Oid relid, const char *op, Tuplestorestate *table,
					   TupleDesc desc, const int *attnums, int ncolumns)
{
	TupleTableSlot *slot = MakeSingleTupleTableSlot(desc, &TTSOpsMinimalTuple);

	tuplestore_rescan(table);
	while (tuplestore_gettupleslot(table, true, false, slot))
	{
		bool		should_free;
		HeapTuple	tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);

		fm_queue_invalidation(relid, op, key_json(desc, tuple, attnums, ncolumns));
		if (should_free)
			heap_freetuple(tuple);
	}
	ExecDropSingleTupleTableSlot(slot);
}

PG_FUNCTION_INFO_V1(fm_invalidate);
Datum
fm_invalidate(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	Relation	rel;
	TupleDesc	desc;
	Oid			relid;
	const char *op;
	int		   *attnums;
	int			ncolumns;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("flagmeter.invalidate() must be called as a trigger")));
	if (!TRIGGER_FIRED_AFTER(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("trigger \"%s\" must be fired AFTER", trigdata->tg_trigger->tgname),
				 errhint("Create it as AFTER INSERT OR UPDATE OR DELETE, FOR EACH ROW or FOR EACH STATEMENT.")));

	rel = trigdata->tg_relation;
	desc = RelationGetDescr(rel);
	relid = RelationGetRelid(rel);

	if (TRIGGER_FIRED_BY_TRUNCATE(trigdata->tg_event))
	{
		fm_queue_invalidation(relid, "truncate", NULL);
		return PointerGetDatum(NULL);
	}
	if (TRIGGER_FIRED_BY_INSERT(trigdata->tg_event))
		op = "insert";
	else if (TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event))
		op = "update";
	else
		op = "delete";

	if (TRIGGER_FIRED_FOR_STATEMENT(trigdata->tg_event) &&
		trigdata->tg_oldtable == NULL && trigdata->tg_newtable == NULL)
	{
		/* no transition tables: no keys to name */
		fm_queue_invalidation(relid, op, NULL);
		return PointerGetDatum(NULL);
	}

	attnums = key_columns(trigdata, &ncolumns);

	if (TRIGGER_FIRED_FOR_ROW(trigdata->tg_event))
	{
		/* the new key of an insert, the old of a delete, both of an update */
		fm_queue_invalidation(relid, op,
							  key_json(desc, trigdata->tg_trigtuple, attnums, ncolumns));
		if (TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event))
			fm_queue_invalidation(relid, op,
								  key_json(desc, trigdata->tg_newtuple, attnums, ncolumns));
	}
	else
	{
		if (trigdata->tg_oldtable)
			queue_transition_table(relid, op, trigdata->tg_oldtable, desc, attnums, ncolumns);
		if (trigdata->tg_newtable)
			queue_transition_table(relid, op, trigdata->tg_newtable, desc, attnums, ncolumns);
	}
	return PointerGetDatum(NULL);
}
