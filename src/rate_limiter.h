/*
 * rate_limiter.h
 *	  Rate limits decided in shared memory (rate_limiter.c): the generic
 *	  cell rate algorithm over a table of keys, one time per key.  What
 *	  limit() (rate_limit_calls.c) and the tenants' rate limits of consume,
 *	  check and reserve (consume_rate.c) spend from.
 */
#ifndef FLAGMETER_RATE_LIMITER_H
#define FLAGMETER_RATE_LIMITER_H

#include "postgres.h"
#include "datatype/timestamp.h"

#include "decision.h"
#include "limit.h"

/* A key of the table: two 64-bit hashes of what it limits. */
typedef struct FmRateKey
{
	uint64		h1;
	uint64		h2;
} FmRateKey;

/* What the limiter answered. */
typedef struct FmRateVerdict
{
	bool		allowed;
	int64		remaining;		/* units that would be granted now, after this
								 * call */
	int64		retry_after;	/* refused: microseconds until the cost would
								 * be granted; -1 when allowed, or when the
								 * cost exceeds the burst */
	int64		reset_after;	/* microseconds until the key is back to a
								 * full burst */
} FmRateVerdict;

/* from _PG_init: the table and its GUC when preloading */
extern void fm_rate_limiter_init(void);

/*
 * The rate limit of rate units per per, bursts of burst (callers turn a
 * NULL burst into rate), validated: raises 22023 with the reason when flagmeter cannot apply it.
 */
extern void fm_rate_from_args(int64 rate, const Interval *per, int64 burst, FmRate *out);

/* whether rate, per and burst make a valid rate limit (no error) */
extern bool fm_rate_valid(int64 rate, const Interval *per, int64 burst);

/* the key of limit(key) and of a tenant's rate limit for a meter */
extern FmRateKey fm_rate_key_of_text(const char *key);
extern FmRateKey fm_rate_key_of_meter(const char *tenant, const char *meter);

/*
 * Spend cost units of key's rate (spend false, or cost 0: only look),
 * atomically for every backend.  Raises 55000 when flagmeter is not
 * preloaded, 53400 when the key's part of the table holds no room.
 */
extern void fm_rate_take(const FmRateKey *key, const FmRate *rate, int64 cost, bool spend,
						 FmRateVerdict *verdict);

/* Give back cost units that fm_rate_take spent (a refusal of the quota). */
extern void fm_rate_give_back(const FmRateKey *key, const FmRate *rate, int64 cost);

/*
 * A decision that would grant amount, refused when the rate limit would
 * not (spend false: check) or does not (spend true: the units are spent
 * when it does).  Nothing happens to a refused decision.
 */
extern void fm_decision_apply_rate(const char *tenant, const char *meter, const FmLimit *limit,
								   int64 amount, bool spend, FmDecision *decision);

/* Give back what fm_decision_apply_rate spent (spend true, granted). */
extern void fm_decision_give_back_rate(const char *tenant, const char *meter,
									   const FmLimit *limit, int64 amount);

#endif							/* FLAGMETER_RATE_LIMITER_H */
