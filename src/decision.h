/*
 * decision.h
 *	  The decision of consume and check (the SQL type flagmeter.decision):
 *	  the arithmetic that gives it, the usage levels that announce
 *	  something, and its one encoding, shared by the decision tuple and by
 *	  the idempotency key's row that remembers it (event_keys.c).
 */
#ifndef FLAGMETER_DECISION_H
#define FLAGMETER_DECISION_H

#include "postgres.h"
#include "fmgr.h"
#include "access/htup.h"
#include "access/tupdesc.h"
#include "datatype/timestamp.h"

#include "counter_core.h"
#include "limit.h"

/* Why a decision is what it is (flagmeter.decision.reason; README lists them). */
typedef enum FmReason
{
	FM_REASON_OK,				/* granted within the quota */
	FM_REASON_OVER_SOFT_LIMIT,	/* granted beyond a soft quota */
	FM_REASON_UNLIMITED,		/* no limit applies */
	FM_REASON_QUOTA_EXCEEDED,	/* refused: beyond the hard quota */
	FM_REASON_OTHER_METER_REFUSED,	/* refused: another meter of the same
									 * all-or-nothing consume was */
	FM_REASON_RATE_LIMITED		/* refused: beyond the rate limit (never
								 * remembered under an idempotency key) */
} FmReason;

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
	FmReason	reason;
	const char *meter;
	int64		from_grants;	/* units of this call drawn from credit grants */
	bool		has_balance;	/* false: unlimited and never granted credits */
	int64		balance;		/* quota remaining plus active grants
								 * remaining */
	int64		retry_after;	/* microseconds until a call refused for its
								 * rate would be granted; -1: NULL */
} FmDecision;

/*
 * The decision for recording amount on top of current (whose counter after
 * recording is returned in *after when after is not NULL).  With record,
 * used and remaining describe the state after recording when granted;
 * otherwise (check, or a denial) the current state.  Overflow of the
 * counter is an error (22003), raised before anything is written.
 */
extern void fm_decide(const FmLimit *limit, const FmCounter *current,
					  int64 amount, TimestampTz at, TimestampTz period_end,
					  bool record, FmDecision *decision, FmCounter *after);

/* A decision whose usage (after recording, when granted and recorded) is used. */
extern void fm_decision_at(const FmLimit *limit, bool granted, int64 used,
						   TimestampTz period_end, FmDecision *decision);

/* A refusal of an item that was itself within its quota. */
extern void fm_decision_refused_with_others(FmDecision *decision);

/*
 * A refusal for the rate limit: the figures stay (the quota's, unchanged),
 * retry_after is in microseconds, -1 when waiting cannot help.
 */
extern void fm_decision_rate_limited(FmDecision *decision, int64 retry_after);

/*
 * Usage levels.  fm_threshold_reached: used is at least percent of quota
 * (exactly, in integers; usage * 100 overflowing counts as reached).
 * fm_next_usage_level: the least usage above used at which a new level is
 * reached (the next threshold or the hard quota); used itself when every
 * call at this level must look again (at or past a hard quota: blocked is
 * a state another session may clear), PG_INT64_MAX when nothing is left.
 */
extern bool fm_threshold_reached(int64 used, int64 quota, int percent);
extern int64 fm_next_usage_level(int64 used, int64 quota, bool hard,
								 const int *thresholds, int nthresholds);

/*
 * The encoding.  FM_DECISION_FIELDS columns, in this order, in
 * flagmeter.decision (where meter follows overage) and in
 * flagmeter.event_keys (granted, used, quota, remaining, resets_at,
 * overage, reason, from_grants, balance): NULL quota, remaining and
 * overage when unlimited, NULL resets_at for lifetime, reason as its name,
 * NULL balance when unlimited without credit grants.
 */
#define FM_DECISION_FIELDS 9

extern void fm_decision_values(const FmDecision *d, Datum *values, bool *nulls);

/* the fields from columns first .. first + 8 of row; meter is not set */
extern void fm_decision_from_row(HeapTuple row, TupleDesc desc, int first,
								 FmDecision *d);

/*
 * The columns of flagmeter.decision: the fields with meter before reason,
 * then retry_after (never remembered: a refusal for the rate is not).
 */
#define FM_DECISION_COLUMNS (FM_DECISION_FIELDS + 2)
extern void fm_decision_columns(const FmDecision *d, Datum *values, bool *nulls);

/* The blessed descriptor of flagmeter.decision, cached at the call site. */
extern TupleDesc fm_decision_desc(FunctionCallInfo fcinfo);
extern HeapTuple fm_decision_tuple(TupleDesc desc, const FmDecision *d);

#endif							/* FLAGMETER_DECISION_H */
