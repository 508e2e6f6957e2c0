/*
 * pk_scan.c
 *	  Direct scans of a flagmeter table by (a prefix of) its primary key.
 *
 * The reads on the hot path that write nothing: check and usage merging a
 * period's counter rows, and a miss of the limit cache reading a tenant's
 * row and override.  Through SPI each cost a plan's executor start-up and
 * shut-down, more than the index probe itself (check ran at 0.7x a
 * primary-key SELECT; a limit-cache miss took 40 microseconds, a fifth of
 * track's time over 10 000 tenants).  Like flagmeter's statements, these
 * read as the extension's owner would: no privilege is asked of the
 * caller, and row security (which does not apply to the owner) is not
 * applied.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "parser/parse_relation.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"

#include "compat.h"
#include "pk_scan.h"
#include "statements.h"

void
fm_pk_scan_begin(FmPkScan *s, const char *relname, int nkeys, const Datum *keys,
				 const Oid *eqprocs, Snapshot snapshot)
{
	ScanKeyData scankeys[FM_PK_SCAN_MAX_KEYS];
	Oid			index_oid;
	int			i;

	Assert(nkeys <= FM_PK_SCAN_MAX_KEYS);
	s->rel = table_open(fm_relation_oid(relname), AccessShareLock);
	index_oid = fm_primary_key_index(s->rel);
	if (!OidIsValid(index_oid))
		elog(ERROR, "flagmeter.%s has no primary key", relname);
	s->index = index_open(index_oid, AccessShareLock);
	if (IndexRelationGetNumberOfKeyAttributes(s->index) < nkeys)
		elog(ERROR, "the primary key of flagmeter.%s has fewer than %d columns",
			 relname, nkeys);

	/*
	 * Keys compare in the index column's collation (InvalidOid for types
	 * without one): a B-tree searched in another collation could miss rows.
	 */
	for (i = 0; i < nkeys; i++)
		ScanKeyEntryInitialize(&scankeys[i], 0, i + 1, BTEqualStrategyNumber,
							   InvalidOid, s->index->rd_indcollation[i],
							   eqprocs[i], keys[i]);

	s->slot = table_slot_create(s->rel, NULL);
	s->scan = fm_index_beginscan(s->rel, s->index, snapshot, nkeys, 0);
	index_rescan(s->scan, scankeys, nkeys, NULL, 0);
}

bool
fm_pk_scan_next(FmPkScan *s)
{
	return index_getnext_slot(s->scan, ForwardScanDirection, s->slot);
}

void
fm_pk_scan_end(FmPkScan *s)
{
	index_endscan(s->scan);
	ExecDropSingleTupleTableSlot(s->slot);
	index_close(s->index, AccessShareLock);
	table_close(s->rel, AccessShareLock);
}

AttrNumber
fm_pk_scan_attnum(FmPkScan *s, const char *column)
{
	AttrNumber	attnum = attnameAttNum(s->rel, column, false);

	if (attnum == InvalidAttrNumber)
		elog(ERROR, "flagmeter.%s has no column \"%s\"",
			 RelationGetRelationName(s->rel), column);
	return attnum;
}

bool
fm_pk_fetch(const char *relname, int nkeys, const char *const *keys,
			Snapshot snapshot, int ncolumns, const char *const *columns,
			Datum *values, bool *nulls)
{
	FmPkScan	s;
	Datum		keydatums[FM_PK_SCAN_MAX_KEYS];
	Oid			eqprocs[FM_PK_SCAN_MAX_KEYS];
	bool		found;
	int			i;

	for (i = 0; i < nkeys; i++)
	{
		keydatums[i] = CStringGetTextDatum(keys[i]);
		eqprocs[i] = F_TEXTEQ;
	}
	fm_pk_scan_begin(&s, relname, nkeys, keydatums, eqprocs, snapshot);
	found = fm_pk_scan_next(&s);
	for (i = 0; found && i < ncolumns; i++)
	{
		AttrNumber	attnum = fm_pk_scan_attnum(&s, columns[i]);
		Form_pg_attribute attr = TupleDescAttr(RelationGetDescr(s.rel), attnum - 1);

		values[i] = slot_getattr(s.slot, attnum, &nulls[i]);
		/* the slot's buffer is released below: keep a copy */
		if (!nulls[i])
			values[i] = datumCopy(values[i], attr->attbyval, attr->attlen);
	}
	fm_pk_scan_end(&s);
	return found;
}
