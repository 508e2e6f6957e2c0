/*
 * limits.h
 *	  The limit in force for a tenant and meter, and the decision it gives.
 */
#ifndef FLAGMETER_LIMITS_H
#define FLAGMETER_LIMITS_H

#include "postgres.h"
#include "datatype/timestamp.h"
#include "pgtime.h"

#include "counter_core.h"
#include "period.h"

/* Most alert thresholds one limit may have (flagmeter.check_thresholds). */
#define FM_MAX_THRESHOLDS 32

/* Which figure of the counter a meter's "used" is. */
typedef enum FmAggregation
{
	FM_AGG_SUM,					/* sum of amounts */
	FM_AGG_COUNT,				/* number of events */
	FM_AGG_MAX,					/* greatest amount */
	FM_AGG_LATEST				/* amount of the latest event */
} FmAggregation;

typedef struct FmLimit
{
	FmAggregation aggregation;
	bool		limited;		/* false: no quota applies */
	int64		quota;			/* when limited */
	bool		hard;			/* hard: consume refuses past the quota */
	FmPeriodKind period;
	TimestampTz anchor;
	pg_tz	   *tz;
	int			nthresholds;
	int			thresholds[FM_MAX_THRESHOLDS];	/* percentages, ascending */
	int32		fingerprint;	/* of what decides the announcements: track
								 * re-reads a period whose recheck figure was
								 * worked out for another one */
} FmLimit;

/* The decision of consume and check (the SQL type flagmeter.decision). */
typedef struct FmDecision
{
	bool		granted;
	int64		used;
	bool		limited;
	int64		quota;
	int64		remaining;
	int64		overage;
	bool		resets;			/* false for lifetime periods */
	TimestampTz resets_at;
	const char *meter;
} FmDecision;

/* Bounds checked on every call (documented in README). */
#define FM_TENANT_MAX_BYTES		256
#define FM_NAME_MAX_BYTES		63	/* meters and plans: flagmeter.check_name() */
#define FM_KEY_MAX_BYTES		256

/*
 * The limit of (tenant, meter), in or out of SPI.  Raises 42704 for an unknown
 * meter.  read_only as for fm_execute.  Answers come from a per-backend
 * cache that every change of the catalog tables invalidates (see
 * limits.c), so the hot path does not query the catalog.
 */
extern void fm_load_limit(const char *tenant, const char *meter,
						  bool read_only, FmLimit *limit);

extern void fm_limits_init(void);

extern int64 fm_used_of(const FmCounter *c, FmAggregation aggregation);

/* The name flagmeter.meters uses for an aggregation. */
extern const char *fm_aggregation_name(FmAggregation aggregation);

/*
 * The decision for recording amount on top of current (whose counter after
 * recording is returned in *after when granted is possible).
 */
extern void fm_decide(const FmLimit *limit, const FmCounter *current,
					  int64 amount, TimestampTz at, TimestampTz period_end,
					  bool record, FmDecision *decision, FmCounter *after);
/* hash of a (tenant, meter) pair, for the keys of flagmeter's caches */
extern uint32 fm_tenant_meter_hash(const char *tenant, const char *meter);

/* A decision whose usage (after recording, when granted and recorded) is used. */
extern void fm_decision_at(const FmLimit *limit, bool granted, int64 used,
						   TimestampTz period_end, FmDecision *decision);

/* Argument checks shared by every call; they raise the documented errors. */
extern char *fm_arg_tenant(FunctionCallInfo fcinfo, int argno);
extern char *fm_arg_meter(FunctionCallInfo fcinfo, int argno);
extern char *fm_arg_key(FunctionCallInfo fcinfo, int argno);
extern void fm_check_tenant(const char *tenant);
extern void fm_check_meter_name(const char *meter);
extern void fm_check_key(const char *key);
extern void fm_check_amount(int64 amount, bool zero_allowed);
extern void fm_check_timestamp(TimestampTz ts);

#endif							/* FLAGMETER_LIMITS_H */
