/*
 * shared_limits.h
 *	  The limit cache all backends share when flagmeter is preloaded
 *	  (shared_limits.c).
 */
#ifndef FLAGMETER_SHARED_LIMITS_H
#define FLAGMETER_SHARED_LIMITS_H

#include "postgres.h"

#include "limit.h"
#include "utils/snapshot.h"

/* from _PG_init: sets up the shared table when preloading, else nothing */
extern void fm_shared_limits_init(void);

/* the generation to store a limit with: read it before the load's snapshot */
extern uint64 fm_shared_limits_generation(void);

/*
 * Whether a snapshot taken before the generation was read sees every change
 * that generation counts (call it after reading the generation): then a
 * limit loaded in it may be stored with that generation.
 */
extern bool fm_shared_limits_seen_by(Snapshot snapshot);

/*
 * The limit, when the table has it in the current generation; scope is the
 * OID of a table of the extension (it changes when the extension does).
 */
extern bool fm_shared_limit_get(Oid scope, const char *tenant, const char *meter,
								FmLimit *limit);
extern void fm_shared_limit_put(Oid scope, const char *tenant, const char *meter,
								uint64 generation, const FmLimit *limit);

/* this transaction changes the configuration: invalidate when it commits */
extern void fm_shared_limits_changed(void);

#endif							/* FLAGMETER_SHARED_LIMITS_H */
