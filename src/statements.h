/*
 * statements.h
 *	  Prepared SPI statements, kept for the life of the backend.
 *
 * Every statement text is fully schema-qualified, type names included (pg_temp
 * is searched first for types unless named), so a caller's search_path cannot
 * change what it does, though the statements run as the owner.  Statements whose parameters have one of
 * flagmeter's own types are re-prepared when that type's OID changes (the
 * extension was dropped and created again in the same session).
 */
#ifndef FLAGMETER_STATEMENTS_H
#define FLAGMETER_STATEMENTS_H

#include "postgres.h"
#include "datatype/timestamp.h"
#include "executor/spi.h"

#define FM_STATEMENT_MAX_ARGS 20

/* "=" in statement texts, pinned to pg_catalog's operator */
#define FM_EQ " OPERATOR(pg_catalog.=) "

/* Parameter type placeholders resolved at prepare time. */
#define FM_TYPE_COUNTER			((Oid) 1)	/* flagmeter.quota_counter */
#define FM_TYPE_COUNTER_ARRAY	((Oid) 2)	/* flagmeter.quota_counter[] */

typedef struct FmStatement
{
	const char *sql;
	int			nargs;
	Oid			argtypes[FM_STATEMENT_MAX_ARGS];
	/* filled in when prepared */
	SPIPlanPtr	plan;
	Oid			prepared_for;	/* quota_counter's OID when prepared */
} FmStatement;

/* OIDs of flagmeter's schema objects, looked up on each call (cheap). */
extern Oid	fm_relation_oid(const char *relname);
extern Oid	fm_counter_type_oid(void);

/*
 * Run a statement (inside SPI_connect), as the owner of schema flagmeter;
 * returns the SPI result code.  read_only must be true in STABLE
 * callers, so the caller's snapshot is used.
 */
extern int	fm_execute(FmStatement *st, Datum *values, const char *nulls,
					   bool read_only, long count);

/*
 * The same in the latest snapshot, whatever the isolation level: for the
 * commit-time bookkeeping of notify.c, which must see what other
 * transactions committed before it took the commit lock.
 */
/* The same in snapshot (a reader that adds what else it sees in it). */
extern int	fm_execute_snapshot(FmStatement *st, Datum *values, const char *nulls,
								bool read_only, long count, Snapshot snapshot);

extern int	fm_execute_latest(FmStatement *st, Datum *values, const char *nulls,
							  long count);

/* One-dimensional array arguments of the batch statements, from n Datums. */
/* The arguments (tenant, meter, period_start) of the per-period statements. */
extern void fm_period_args(Datum *args, const char *tenant, const char *meter,
						   TimestampTz period_start);

extern Datum fm_text_array(Datum *elems, int n);
extern Datum fm_int8_array(Datum *elems, int n);
extern Datum fm_timestamptz_array(Datum *elems, int n);

#endif							/* FLAGMETER_STATEMENTS_H */
