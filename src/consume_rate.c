/*
 * consume_rate.c
 *	  The tenants' rate limits in consume, check and reserve (see
 *	  consume_rate.h).  The limit in force comes with the quota's
 *	  (FmLimit.rate_limit, from rate_overrides else rate_limits); the
 *	  limiter is rate_limiter.c, keyed by (tenant, meter).
 *
 * Why spend first and give back: the quota's decision writes (the event,
 * stripe 0, grants drawn) as it decides, and its locks are held to the
 * end of the transaction; the rate is one number in shared memory, which
 * is cheap to take back.  A unit given back was never seen as granted by
 * anyone, so giving back can only make a concurrent call refused that a
 * strictly serial order would have granted, never the reverse.
 */
#include "postgres.h"

#include "executor/spi.h"

#include "consume_rate.h"
#include "rate_limiter.h"
#include "reads.h"

bool
fm_items_rate_limited(const FmConsumeItem *items, int n)
{
	int			i;

	for (i = 0; i < n; i++)
		if (items[i].limit.rate_limit.rate > 0)
			return true;
	return false;
}

bool
fm_items_rate_spend(const char *tenant, const FmConsumeItem *items, int n,
					int *refused, int64 *retry_after)
{
	volatile int spent = 0;
	volatile bool allowed = true;

	/* a failure (53400: no room) gives back what earlier items spent */
	PG_TRY();
	{
		for (; spent < n; spent++)
		{
			FmRateKey	key;
			FmRateVerdict verdict;

			if (items[spent].limit.rate_limit.rate == 0)
				continue;
			key = fm_rate_key_of_meter(tenant, items[spent].meter);
			fm_rate_take(&key, &items[spent].limit.rate_limit, items[spent].amount, true,
						 &verdict);
			if (!verdict.allowed)
			{
				*refused = spent;
				*retry_after = verdict.retry_after;
				allowed = false;
				break;
			}
		}
	}
	PG_CATCH();
	{
		fm_items_rate_give_back(tenant, items, spent);
		PG_RE_THROW();
	}
	PG_END_TRY();
	if (!allowed)
		fm_items_rate_give_back(tenant, items, spent);
	return allowed;
}

void
fm_items_rate_give_back(const char *tenant, const FmConsumeItem *items, int n)
{
	int			i;

	for (i = 0; i < n; i++)
	{
		FmRateKey	key;

		if (items[i].limit.rate_limit.rate == 0)
			continue;
		key = fm_rate_key_of_meter(tenant, items[i].meter);
		fm_rate_give_back(&key, &items[i].limit.rate_limit, items[i].amount);
	}
}

FmDecision *
fm_items_rate_refusal(const char *tenant, const FmConsumeItem *items, int n,
					  int refused, int64 retry_after)
{
	FmDecision *decisions = SPI_palloc(sizeof(FmDecision) * n);
	int			i;

	for (i = 0; i < n; i++)
	{
		fm_check_decision(tenant, items[i].meter, items[i].amount, &decisions[i]);
		decisions[i].meter = items[i].meter;
		if (i == refused && decisions[i].granted)
			fm_decision_rate_limited(&decisions[i], retry_after);
		else
			fm_decision_refused_with_others(&decisions[i]);
	}
	return decisions;
}
