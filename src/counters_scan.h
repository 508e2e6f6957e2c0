/*
 * counters_scan.h
 *	  The read-only merge of a period's counter rows (see counters_scan.c).
 */
#ifndef FLAGMETER_COUNTERS_SCAN_H
#define FLAGMETER_COUNTERS_SCAN_H

#include "postgres.h"
#include "datatype/timestamp.h"

#include "counter_core.h"

/*
 * The merge of the counter rows of (tenant, meter, period_start) in the
 * active snapshot; 22003 when the merge overflows.
 */
extern FmCounter fm_scan_period(const char *tenant, const char *meter,
								TimestampTz period_start);

#endif							/* FLAGMETER_COUNTERS_SCAN_H */
