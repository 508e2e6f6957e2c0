/*
 * limit.h
 *	  A limit as the calls use it: the meter's aggregation and the quota,
 *	  period, mode and thresholds in force for one tenant, and its rate
 *	  limit.  Where it comes from is limit_lookup.h; what it decides is
 *	  decision.h (and rate_limiter.h for the rate).
 */
#ifndef FLAGMETER_LIMIT_H
#define FLAGMETER_LIMIT_H

#include "postgres.h"
#include "datatype/timestamp.h"
#include "pgtime.h"

#include "bounds.h"
#include "counter_core.h"
#include "period.h"

/* Which figure of the counter a meter's "used" is. */
typedef enum FmAggregation
{
	FM_AGG_SUM,					/* sum of amounts */
	FM_AGG_COUNT,				/* number of events */
	FM_AGG_MAX,					/* greatest amount */
	FM_AGG_LATEST,				/* amount of the latest event */
	FM_AGG_UNIQUE				/* distinct values (unique_values.c): each new
								 * value of a period is an event of amount 1,
								 * each forgotten one takes it back, so "used"
								 * is the sum */
} FmAggregation;

/*
 * A rate limit: at most rate units per per_usecs microseconds, in bursts of
 * at most burst units (rate_limiter.h applies it).  rate 0: none.
 */
typedef struct FmRate
{
	int64		rate;
	int64		per_usecs;
	int64		burst;
} FmRate;

typedef struct FmLimit
{
	bool		assigned;		/* the tenant is assigned a plan */
	FmAggregation aggregation;
	bool		limited;		/* false: no quota applies */
	int64		quota;			/* when limited */
	bool		hard;			/* hard: consume refuses past the quota */
	FmPeriodKind period;
	TimestampTz anchor;
	pg_tz	   *tz;
	int			nthresholds;
	int			thresholds[FM_MAX_THRESHOLDS];	/* percentages, ascending */
	bool		grants;			/* the tenant was granted credits on the meter
								 * (flagmeter.credit_accounts): its calls draw
								 * from them past the quota (grants.h) */
	bool		reserves;		/* the tenant made reservations on the meter:
								 * its decisions count their holds
								 * (reservations.c) */
	char		pool[FM_NAME_MAX_BYTES + 1];	/* the credit pool the meter
												 * draws from, "" for none
												 * (pools.h) */
	int64		rate_num;		/* pool units per unit: rate_num / rate_den */
	int64		rate_den;
	FmRate		rate_limit;		/* the tenant's rate limit for the meter
								 * (flagmeter.rate_overrides, else
								 * rate_limits); rate 0 for none */
	int32		fingerprint;	/* of what decides the announcements: track
								 * re-reads a period whose recheck figure was
								 * worked out for another one */
} FmLimit;

/* The usage a counter shows for a meter of this aggregation. */
extern int64 fm_used_of(const FmCounter *c, FmAggregation aggregation);

/*
 * Refuse a call that records amounts (track, consume, reserve and their
 * batches) on a meter that counts distinct values: 42809, with the call
 * to use instead.  Nothing is written before it.
 */
extern void fm_refuse_unique_meter(const char *meter, const FmLimit *limit);

/* The names flagmeter.meters uses for aggregations, both ways. */
extern const char *fm_aggregation_name(FmAggregation aggregation);
extern FmAggregation fm_aggregation_from_name(const char *name);

/* limit->fingerprint's value: a hash of the fields announcements depend on */
extern int32 fm_limit_fingerprint(const FmLimit *limit);

/*
 * The hash of a (tenant, meter) pair, from the strings: the caches' keys
 * pad them to hundreds of bytes, and hashed as blobs they were half of a
 * lookup.
 */
extern uint32 fm_tenant_meter_hash(const char *tenant, const char *meter);

/*
 * A (tenant, meter) key of a backend-local hash table that points at the
 * names (the caller's, or the entry's own copies) instead of padding them
 * into the key; fm_tenant_meter_key_hash and _match are its
 * hash table functions.
 */
typedef struct FmTenantMeterKey
{
	const char *tenant;
	const char *meter;
} FmTenantMeterKey;

extern uint32 fm_tenant_meter_key_hash(const void *key, Size keysize);
extern int	fm_tenant_meter_key_match(const void *key1, const void *key2, Size keysize);

#endif							/* FLAGMETER_LIMIT_H */
