/*
 * pk_scan.h
 *	  Direct scans of a flagmeter table by (a prefix of) its primary key
 *	  (pk_scan.c).
 */
#ifndef FLAGMETER_PK_SCAN_H
#define FLAGMETER_PK_SCAN_H

#include "postgres.h"
#include "access/genam.h"
#include "executor/tuptable.h"
#include "utils/relcache.h"
#include "utils/snapshot.h"

#define FM_PK_SCAN_MAX_KEYS 4

typedef struct FmPkScan
{
	Relation	rel;
	Relation	index;
	IndexScanDesc scan;
	TupleTableSlot *slot;		/* the current row, after fm_pk_scan_next */
} FmPkScan;

/*
 * Start a scan of flagmeter.<relname> for the rows whose first nkeys
 * primary-key columns equal keys, compared with the equality functions
 * eqprocs (F_TEXTEQ, F_TIMESTAMPTZ_EQ, ...), in snapshot.
 */
extern void fm_pk_scan_begin(FmPkScan *s, const char *relname, int nkeys,
							 const Datum *keys, const Oid *eqprocs, Snapshot snapshot);
extern bool fm_pk_scan_next(FmPkScan *s);
extern void fm_pk_scan_end(FmPkScan *s);

/* The attribute number of a column the code relies on; an error if missing. */
extern AttrNumber fm_pk_scan_attnum(FmPkScan *s, const char *column);

/*
 * The row of flagmeter.<relname> whose (text) primary key equals
 * keys[0 .. nkeys-1], in snapshot: false when there is none; otherwise the
 * named columns' values (copied into the current memory context) and
 * nulls.
 */
extern bool fm_pk_fetch(const char *relname, int nkeys, const char *const *keys,
						Snapshot snapshot, int ncolumns, const char *const *columns,
						Datum *values, bool *nulls);

#endif							/* FLAGMETER_PK_SCAN_H */
