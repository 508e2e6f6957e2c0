/*
 * track_alerts.h
 *	  The announcements of track and track_batch (track_alerts.c).
 *	  Call inside SPI.
 */
#ifndef FLAGMETER_TRACK_ALERTS_H
#define FLAGMETER_TRACK_ALERTS_H

#include "postgres.h"
#include "datatype/timestamp.h"
#include "storage/itemptr.h"

#include "counter_core.h"
#include "limit.h"

/* The row a track statement wrote (its RETURNING list). */
typedef struct FmStripeWritten
{
	int16		stripe;
	FmCounter	counter;		/* after the increment */
	bool		has_recheck;
	int64		recheck_at;
	int32		recheck_for;

	/*
	 * The version written: recheck_at is set on it, not on the row found by
	 * key, which in REPEATABLE READ may be a version that maintain() deleted
	 * after the snapshot (merge_idle_stripes) and would fail with 40001.
	 */
	ItemPointerData ctid;
} FmStripeWritten;

/* From row r of SPI_tuptable, columns first .. first + 4 (the last the ctid). */
extern FmStripeWritten fm_stripe_written(uint64 r, int first);

/* Queue the announcements a new usage level of a limited meter calls for. */
extern void fm_announce_usage_level(const char *tenant, const char *meter,
									const FmLimit *limit, TimestampTz period_start,
									const FmCounter *total);

/*
 * Whether the period must be read after a write left its stripe as
 * written (for max, this announces from the stripe itself and says no).
 */
extern bool fm_period_read_due(const char *tenant, const char *meter,
							   const FmLimit *limit, TimestampTz period_start,
							   const FmStripeWritten *written);

/*
 * The stripe's next recheck figure after a read found total over nstripes
 * track stripes; false when the stripe already has it.
 */
extern bool fm_next_recheck(const FmLimit *limit, const FmStripeWritten *written,
							const FmCounter *total, int nstripes, int64 *recheck_at);

/* track's whole step after its write: read when due, announce, set the figure */
extern void fm_announce_after_track(const char *tenant, const char *meter,
									const FmLimit *limit, TimestampTz period_start,
									const FmStripeWritten *written);

/*
 * The same after a track whose amount went to the period's pending usage
 * (pending_add.c), whose entry said the period is due for a read.
 */
extern void fm_announce_after_pending_track(const char *tenant, const char *meter,
											const FmLimit *limit, TimestampTz period_start);

#endif							/* FLAGMETER_TRACK_ALERTS_H */
