/*
 * pools.h
 *	  Credit pools (pools.c): a meter that draws from another meter's
 *	  balance at a rate, define_meter(meter, ..., draws => pool, rate => r).
 *
 * Every unit a call adds to a drawing meter's usage (its amount on a sum
 * meter, one event on a count meter) also records r units on the pool,
 * rounded up to a whole unit per call, in the same call and
 * transaction and under the same idempotency key (event_keys.h: the
 * pool's row has kind "consume_pool" or "track_pool", so void takes both
 * out and a retry replays only what was named).  consume and check decide
 * the drawing meter's own limit and the pool's quota and grants all or
 * nothing, as a multi-meter consume; the decision of a drawing meter
 * reports its own usage, and the pool's balance and draw from grants (in
 * pool units).  One level: a pool draws from no pool, and a drawing meter
 * has no grants or reservations of its own (define_meter,
 * grant_credits and reserve refuse them).  Rates are exact fractions (FmLimit.rate_num
 * / rate_den, from a numeric), never floats.
 */
#ifndef FLAGMETER_POOLS_H
#define FLAGMETER_POOLS_H

#include "postgres.h"

#include "decision.h"
#include "limit.h"

/* The meter of limit draws from a pool (limit->pool). */
static inline bool
fm_draws_from_pool(const FmLimit *limit)
{
	return limit->pool[0] != '\0';
}

/*
 * The pool units of a call recording amount on the drawing meter: what it
 * adds to the meter's usage (amount for a sum meter, one event for a count
 * meter) times the rate, rounded up.  22003 past the bigint range.
 */
extern int64 fm_pool_amount(const FmLimit *limit, int64 amount);

/*
 * A drawing meter's decision, given its pool's for the same call: refused
 * when the pool refused (reason quota_exceeded: the pool is its quota),
 * the pool's reason when the meter itself is unlimited, the pool's
 * from_grants, and its balance when it has one (a limit
 * or grants; otherwise the meter's own stays).
 */
extern void fm_pool_fold_decision(FmDecision *decision, const FmDecision *pool);

#endif							/* FLAGMETER_POOLS_H */
