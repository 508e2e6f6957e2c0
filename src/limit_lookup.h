/*
 * limit_lookup.h
 *	  The limit in force for a tenant and meter (limit_lookup.c).
 */
#ifndef FLAGMETER_LIMIT_LOOKUP_H
#define FLAGMETER_LIMIT_LOOKUP_H

#include "postgres.h"

#include "limit.h"

/*
 * The limit of (tenant, meter), in or out of SPI.  Raises 42704 for an
 * unknown meter.  read_only as for fm_execute.  Answers come from a
 * per-backend cache that every change of the catalog tables invalidates
 * (see limit_lookup.c), so the hot path does not query the catalog.
 */
extern void fm_load_limit(const char *tenant, const char *meter,
						  bool read_only, FmLimit *limit);

/* from _PG_init: registers the cache's invalidation callback */
extern void fm_limit_lookup_init(void);

#endif							/* FLAGMETER_LIMIT_LOOKUP_H */
