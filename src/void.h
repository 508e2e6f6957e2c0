/*
 * void.h
 *	  What other calls reuse of void (void.c).
 */
#ifndef FLAGMETER_VOID_H
#define FLAGMETER_VOID_H

#include "datatype/timestamp.h"

/*
 * Take back the event of amount 1 at occurred_at that counted a value of
 * a unique meter (unique_values.c): out of its period's counters as void
 * takes an event, and logged in flagmeter.voids under log_key for the
 * rollups.  Inside the caller's SPI, with the counters' lock held.
 */
extern void fm_void_value_event(const char *tenant, const char *meter,
								TimestampTz occurred_at, const char *log_key);

#endif							/* FLAGMETER_VOID_H */
