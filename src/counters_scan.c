/*
 * counters_scan.c
 *	  The read-only merge of a period's counter rows, by a direct scan of
 *	  the primary key of flagmeter.counters.
 *
 * check and usage read one period and write nothing.  Through SPI that
 * read cost a plan's executor start-up and shut-down per call, more than
 * the index scan itself (check ran at 0.7x a primary-key SELECT of one
 * row).  Here it is an index scan in the caller's snapshot, as the
 * statement did.  Like flagmeter's statements it reads as the extension's
 * owner would: no privilege on the table is asked of the caller, and row
 * security policies, which do not apply to the owner, are not applied.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/relscan.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "executor/tuptable.h"
#include "parser/parse_relation.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "counter.h"
#include "counters_scan.h"
#include "statements.h"

/* key columns of flagmeter.counters' primary key, in order */
#define KEY_TENANT			1
#define KEY_METER			2
#define KEY_PERIOD_START	3

FmCounter
fm_scan_period(const char *tenant, const char *meter, TimestampTz period_start)
{
	Relation	rel;
	Relation	index;
	Oid			index_oid;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	ScanKeyData keys[3];
	AttrNumber	counter_attnum;
	FmCounter	total;

	rel = table_open(fm_relation_oid("counters"), AccessShareLock);
	index_oid = RelationGetPrimaryKeyIndex(rel);
	if (!OidIsValid(index_oid))
		elog(ERROR, "flagmeter.counters has no primary key");
	index = index_open(index_oid, AccessShareLock);
	counter_attnum = attnameAttNum(rel, "counter", false);
	if (counter_attnum == InvalidAttrNumber)
		elog(ERROR, "flagmeter.counters has no column \"counter\"");

	/*
	 * The text keys compare in the index column's collation: a B-tree
	 * search in another one could miss rows.
	 */
	ScanKeyEntryInitialize(&keys[0], 0, KEY_TENANT, BTEqualStrategyNumber,
						   InvalidOid, index->rd_indcollation[KEY_TENANT - 1],
						   F_TEXTEQ, CStringGetTextDatum(tenant));
	ScanKeyEntryInitialize(&keys[1], 0, KEY_METER, BTEqualStrategyNumber,
						   InvalidOid, index->rd_indcollation[KEY_METER - 1],
						   F_TEXTEQ, CStringGetTextDatum(meter));
	ScanKeyEntryInitialize(&keys[2], 0, KEY_PERIOD_START, BTEqualStrategyNumber,
						   InvalidOid, InvalidOid,
						   F_TIMESTAMPTZ_EQ, TimestampTzGetDatum(period_start));

	fm_counter_init(&total);
	slot = table_slot_create(rel, NULL);
	scan = index_beginscan(rel, index, GetActiveSnapshot(), 3, 0);
	index_rescan(scan, keys, 3, NULL, 0);
	while (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;
		Datum		d = slot_getattr(slot, counter_attnum, &isnull);

		if (!isnull)
			fm_counter_report(fm_counter_merge(&total, DatumGetFmCounterP(d)));
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(index, AccessShareLock);
	table_close(rel, AccessShareLock);
	return total;
}
