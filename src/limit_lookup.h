/*
 * limit_lookup.h
 *	  The limit in force for a tenant and meter (limit_lookup.c).
 */
#ifndef FLAGMETER_LIMIT_LOOKUP_H
#define FLAGMETER_LIMIT_LOOKUP_H

#include "postgres.h"
#include "datatype/timestamp.h"

#include "limit.h"

/* QT001: a call for a tenant never assigned a plan, when those are refused */
#define FM_ERRCODE_UNASSIGNED_TENANT MAKE_SQLSTATE('Q', 'T', '0', '0', '1')

/* QT002: an event time outside the accepted window (late_events, future_events) */
#define FM_ERRCODE_EVENT_TIME_OUTSIDE_WINDOW MAKE_SQLSTATE('Q', 'T', '0', '0', '2')

/*
 * The limit of (tenant, meter), in or out of SPI.  Raises 42704 for an
 * unknown meter, and FM_ERRCODE_UNASSIGNED_TENANT for a tenant that is not
 * assigned a plan when flagmeter.current_settings.unassigned_tenants is
 * "refuse".  read_only as for fm_execute.  Answers, and that setting, come
 * from a per-backend cache that every change of the configuration tables
 * invalidates (see limit_lookup.c), so the hot path does not query the
 * catalog.
 */
extern void fm_load_limit(const char *tenant, const char *meter,
						  bool read_only, FmLimit *limit);

/* The same, never refusing: for void, which corrects what was recorded. */
extern void fm_load_limit_any(const char *tenant, const char *meter,
							  bool read_only, FmLimit *limit);

/*
 * Raises FM_ERRCODE_EVENT_TIME_OUTSIDE_WINDOW when occurred_at is earlier
 * than the transaction's start minus flagmeter.current_settings.late_events
 * or later than it plus future_events.  The settings come from the same
 * cache as the limits: call it, as fm_load_limit, after the call's first
 * lock on flagmeter.counters, in or out of SPI.
 */
extern void fm_check_event_time(const char *tenant, const char *meter,
								TimestampTz occurred_at);

/* from _PG_init: registers the cache's invalidation callback */
extern void fm_limit_lookup_init(void);

#endif							/* FLAGMETER_LIMIT_LOOKUP_H */
