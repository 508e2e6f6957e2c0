/*
 * pools.c
 *	  Credit pools: a drawing meter's units in pool units, and its
 *	  decision with its pool's (see pools.h).
 */
#include "postgres.h"

#include "common/int.h"

#include "pools.h"

int64
fm_pool_amount(const FmLimit *limit, int64 amount)
{
	/* what the call adds to the meter's usage: its amount, or one event */
	int64		units = limit->aggregation == FM_AGG_COUNT ? 1 : amount;
	int64		product;

	Assert(fm_draws_from_pool(limit) && limit->rate_den > 0 && amount >= 0);
	/* ceil(units * num / den) without leaving integers */
	if (pg_mul_s64_overflow(units, limit->rate_num, &product) ||
		pg_add_s64_overflow(product, limit->rate_den - 1, &product))
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("value out of range: " INT64_FORMAT " units of a meter drawing from pool \"%s\"",
						amount, limit->pool),
				 errdetail("The pool's units (amount times the rate) must fit in a bigint.")));
	return product / limit->rate_den;
}

void
fm_pool_fold_decision(FmDecision *decision, const FmDecision *pool)
{
	if (!pool->granted)
	{
		/* the pool refused the call, not another meter of it */
		if (decision->granted || decision->reason == FM_REASON_OTHER_METER_REFUSED)
			decision->reason = pool->reason == FM_REASON_OTHER_METER_REFUSED ?
				FM_REASON_OTHER_METER_REFUSED : FM_REASON_QUOTA_EXCEEDED;
		decision->granted = false;
	}
	else if (decision->reason == FM_REASON_UNLIMITED)
		decision->reason = pool->reason;	/* the pool is what limits it */
	/* the pool's balance, when it has a limit or grants, is what is left */
	decision->from_grants = pool->from_grants;
	if (pool->has_balance)
	{
		decision->has_balance = true;
		decision->balance = pool->balance;
	}
}
