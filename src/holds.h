/*
 * holds.h
 *	  What a tenant's active reservations hold (holds.c): read by every
 *	  decision of a meter with reservations (consume.c, reads.c) and by
 *	  reserve() itself (reservations.c), below all three.
 *
 * A hold is made, and ends, under the period's stripe 0 lock, as consume
 * decides (reserve locks stripe 0; settle records through consume), and
 * every decision of the tenant's meter counts the holds active at its
 * transaction's start (FmLimit.reserves), so the holds it counts are the
 * latest committed; an expired hold counts for nobody, whether or not
 * maintain() has run.  Sum meters only.
 */
#ifndef FLAGMETER_HOLDS_H
#define FLAGMETER_HOLDS_H

#include "postgres.h"
#include "datatype/timestamp.h"

/*
 * What the tenant's active reservations of the meter hold at now;
 * read_only as for fm_execute.  Connects to SPI itself.
 */
extern int64 fm_reservations_held(const char *tenant, const char *meter,
								  TimestampTz now, bool read_only);

#endif							/* FLAGMETER_HOLDS_H */
