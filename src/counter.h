/*
 * counter.h
 *	  The SQL type flagmeter.quota_counter: Datum conversions and the
 *	  error reporting shared by every C entry point that builds counters.
 */
#ifndef FLAGMETER_COUNTER_H
#define FLAGMETER_COUNTER_H

#include "postgres.h"
#include "fmgr.h"
#include "datatype/timestamp.h"

#include "counter_core.h"

#define DatumGetFmCounterP(X)		((FmCounter *) DatumGetPointer(X))
#define FmCounterPGetDatum(X)		PointerGetDatum(X)
#define PG_GETARG_FMCOUNTER_P(n)	DatumGetFmCounterP(PG_GETARG_DATUM(n))
#define PG_RETURN_FMCOUNTER_P(x)	return FmCounterPGetDatum(x)

/* A palloc'd copy, for callers that must not modify their input. */
extern FmCounter *fm_counter_copy(const FmCounter *c);

/*
 * Raise the error for a failed counter operation (overflow, negative
 * amount, timestamp out of range).  Never returns when r != FM_OK.
 */
extern void fm_counter_report(FmResult r);

/*
 * The period usage is being added to, named in the detail of an overflow
 * that fm_counter_report raises until fm_usage_target_clear or the end of
 * the statement.  Set by every call that adds usage (track, track_batch,
 * track_events, consume); the names are copied.
 */
extern void fm_usage_target(const char *tenant, const char *meter,
							TimestampTz period_start);
extern void fm_usage_target_clear(void);

#endif							/* FLAGMETER_COUNTER_H */
