/*
 * consume_item.h
 *	  One meter of a consume, as the calls that decide consumes pass it
 *	  around: consume.c decides and records items, consume_rate.c spends
 *	  their rate limits, consume_batch.c and reservations.c make them.
 */
#ifndef FLAGMETER_CONSUME_ITEM_H
#define FLAGMETER_CONSUME_ITEM_H

#include "postgres.h"
#include "datatype/timestamp.h"

#include "counter_core.h"
#include "grants.h"
#include "limit.h"

/* One meter of an item; the caller sets meter and amount, zeroes the rest. */
typedef struct FmConsumeItem
{
	const char *meter;
	int64		amount;
	FmLimit		limit;
	TimestampTz period_start;
	TimestampTz period_end;
	FmCounter	tracked;		/* the other stripes, as seen before the lock */
	FmCounter	stripe0;		/* stripe 0 as locked */
	FmCounter	stripe0_after;	/* stripe 0 once the item is recorded */
	FmGrantsHeld grants;		/* locked when the item needs them */
	int64		draw;			/* what the item draws from them */
	int64		held;			/* what reservations hold (holds.h) */
	bool		force;			/* never refused: a settle records usage that
								 * happened */
	bool		counts_value;	/* consume_value's new value of a unique meter
								 * (unique_values.c); other calls may not name
								 * such a meter */
} FmConsumeItem;

#endif							/* FLAGMETER_CONSUME_ITEM_H */
