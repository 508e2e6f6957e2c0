/*
 * reads.c
 *	  check() and usage(): read only, in the caller's snapshot (they are
 *	  STABLE), exact: every committed event and the caller's own.
 */
#include "postgres.h"
#include "fmgr.h"
#include "funcapi.h"

#include "access/xact.h"
#include "utils/builtins.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "args.h"
#include "counter.h"
#include "decision.h"
#include "grants.h"
#include "holds.h"
#include "limit_lookup.h"
#include "period.h"
#include "pools.h"
#include "rate_limiter.h"
#include "reads.h"
#include "usage_rows.h"

static void decide_with_limit(const char *tenant, const char *meter, const FmLimit *limit,
							  int64 amount, FmDecision *out);

/* check(tenant, meter, amount) -> decision */
PG_FUNCTION_INFO_V1(fm_check);
Datum
fm_check(PG_FUNCTION_ARGS)
{
	char	   *tenant = fm_arg_tenant(fcinfo, 0);
	char	   *meter = fm_arg_meter(fcinfo, 1);
	int64		amount;
	FmDecision	decision;
	TupleDesc	desc;
	FmLimit		limit;

	amount = fm_arg_amount(fcinfo, 2, true);
	desc = fm_decision_desc(fcinfo);
	fm_load_limit(tenant, meter, true, &limit);
	decide_with_limit(tenant, meter, &limit, amount, &decision);
	/* and whether the rate limit would let amount through now */
	fm_decision_apply_rate(tenant, meter, &limit, amount, false, &decision);
	PG_RETURN_DATUM(HeapTupleGetDatum(fm_decision_tuple(desc, &decision)));
}

void
fm_check_decision(const char *tenant, const char *meter, int64 amount,
				  FmDecision *out)
{
	FmLimit		limit;

	fm_load_limit(tenant, meter, true, &limit);
	decide_with_limit(tenant, meter, &limit, amount, out);
}

/* fm_check_decision with the limit of (tenant, meter) loaded already */
static void
decide_with_limit(const char *tenant, const char *meter, const FmLimit *limit,
				  int64 amount, FmDecision *out)
{
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	TimestampTz period_start;
	TimestampTz period_end;
	FmCounter	current;
	FmDecision	decision;

	fm_period_bounds(limit->period, limit->anchor, limit->tz, now,
					 &period_start, &period_end);
	current = fm_scan_period(tenant, meter, period_start, GetActiveSnapshot());

	if (limit->grants || limit->reserves)
	{
		int64		draw;

		fm_decide_with_grants(limit, &current, amount, now, period_end, false, false,
							  limit->grants ? fm_grants_available(tenant, meter, now, true) : 0,
							  limit->reserves ? fm_reservations_held(tenant, meter, now, true) : 0,
							  &decision, &draw);
	}
	else
		fm_decide(limit, &current, amount, now, period_end, false, &decision, NULL);
	decision.meter = meter;
	if (fm_draws_from_pool(limit))
	{
		/* and its pool's decision on the pool units (no pool draws from one) */
		FmDecision	pool;

		fm_check_decision(tenant, limit->pool, fm_pool_amount(limit, amount), &pool);
		fm_pool_fold_decision(&decision, &pool);
	}
	*out = decision;
}

/* usage(tenant, meter, at) -> quota_counter of the period containing at */
PG_FUNCTION_INFO_V1(fm_usage);
Datum
fm_usage(PG_FUNCTION_ARGS)
{
	char	   *tenant = fm_arg_tenant(fcinfo, 0);
	char	   *meter = fm_arg_meter(fcinfo, 1);
	TimestampTz at;
	FmLimit		limit;
	TimestampTz period_start;
	TimestampTz period_end;
	FmCounter	current;

	at = fm_arg_timestamp(fcinfo, 2, "at");

	fm_load_limit(tenant, meter, true, &limit);
	fm_period_bounds(limit.period, limit.anchor, limit.tz, at,
					 &period_start, &period_end);
	current = fm_scan_period(tenant, meter, period_start, GetActiveSnapshot());

	if (limit.limited)
	{
		current.flags |= FM_COUNTER_HAS_LIMIT;
		current.limit_value = limit.quota;
	}
	PG_RETURN_FMCOUNTER_P(fm_counter_copy(&current));
}
