/*
 * track.h
 *	  What other calls reuse of track (track.c).
 */
#ifndef FLAGMETER_TRACK_H
#define FLAGMETER_TRACK_H

#include "datatype/timestamp.h"

#include "limit.h"

/*
 * Count a value new in its period of a unique meter (unique_values.c):
 * one event of amount 1 at occurred_at, written and announced as track's,
 * inside the caller's SPI, under limit (the meter's, as the caller loaded
 * it).  The caller holds the counters' lock and has checked occurred_at
 * against the accepted window.
 */
extern void fm_track_new_value(const char *tenant, const char *meter,
							   TimestampTz occurred_at, const FmLimit *limit);

#endif							/* FLAGMETER_TRACK_H */
