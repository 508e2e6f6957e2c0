/*
 * pending.h
 *	  Usage not yet in the counter rows, in shared memory: how track
 *	  writes one row.  The face of the pending_*.c files to the rest of the
 *	  engine; how they share the table is in pending_internal.h.
 */
#ifndef FLAGMETER_PENDING_H
#define FLAGMETER_PENDING_H

#include "postgres.h"
#include "datatype/timestamp.h"
#include "utils/snapshot.h"

#include "counter_core.h"
#include "limit.h"

/* from _PG_init: flagmeter.pending_periods and flagmeter.one_write_track (pending_add.c) */
extern void fm_pending_init(void);

/*
 * Whether a track of limit's meter may write its event only: flagmeter is
 * preloaded with a pending table, flagmeter.one_write_track is on, the
 * meter sums or counts without credit grants or a pool, and this
 * database's pending usage is in the table (rebuilt after a restart).
 */
extern bool fm_pending_track_enabled(const FmLimit *limit);

/*
 * Add delta to the period's pending usage under this transaction; false
 * when the table has no room (the caller then writes a stripe).  On true,
 * *read_due says whether the period must be read for its alerts (the
 * entry's recheck figure, as a stripe's, was reached).  new_in_period:
 * the caller knows this transaction holds no slot in the period (it added
 * nothing pending before, fm_pending_xact_has_adds, and adds to each
 * period once), so the period's slots are not searched for one of its own.
 */
extern bool fm_pending_add(const char *tenant, const char *meter,
						   TimestampTz period_start, const FmCounter *delta,
						   const FmLimit *limit, bool new_in_period, bool *read_due);

/* whether this transaction added anything pending yet */
extern bool fm_pending_xact_has_adds(void);

/* After a read for alerts found used: the next figure to read at. */
extern void fm_pending_set_recheck(const char *tenant, const char *meter,
								   TimestampTz period_start, const FmLimit *limit,
								   int64 used);

/*
 * Merge into *total the period's pending usage that snapshot sees: the
 * amounts of transactions it sees as committed (and this transaction's
 * own), and folds whose transaction it does not see committed.  Where
 * the table does not hold this database's pending usage (a standby,
 * before the rebuild), the pending events are read from the table
 * instead, in the same snapshot.
 */
extern void fm_pending_add_visible(const char *tenant, const char *meter,
								   TimestampTz period_start, Snapshot snapshot,
								   FmCounter *total);

#endif							/* FLAGMETER_PENDING_H */
