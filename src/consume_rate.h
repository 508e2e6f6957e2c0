/*
 * consume_rate.h
 *	  The tenants' rate limits in the calls that decide (consume_rate.c):
 *	  consume spends them before the quota decides, all of a call's meters
 *	  or none, and gives them back when the quota refuses or the call fails
 *	  (check and reserve use fm_decision_apply_rate of rate_limiter.h).
 *	  track never applies them: it records what happened.
 */
#ifndef FLAGMETER_CONSUME_RATE_H
#define FLAGMETER_CONSUME_RATE_H

#include "postgres.h"

#include "consume_item.h"
#include "decision.h"
#include "limit.h"

/* whether any of the n items' limits has a rate limit */
extern bool fm_items_rate_limited(const FmConsumeItem *items, int n);

/*
 * Spend the amount of each of the n items from its rate limit, all or
 * none.  False when one does not fit: nothing is spent, *refused is that
 * item and *retry_after (microseconds, -1: never) when it would.
 */
extern bool fm_items_rate_spend(const char *tenant, const FmConsumeItem *items, int n,
								int *refused, int64 *retry_after);

/* Give back what fm_items_rate_spend spent. */
extern void fm_items_rate_give_back(const char *tenant, const FmConsumeItem *items, int n);

/*
 * The decisions of a consume refused for item refused's rate: each item's
 * figures as check gives them, the refused one rate_limited (or
 * quota_exceeded, when its quota refuses too), the others
 * other_meter_refused.  SPI_palloc'd.
 */
extern FmDecision *fm_items_rate_refusal(const char *tenant, const FmConsumeItem *items, int n,
										 int refused, int64 retry_after);

#endif							/* FLAGMETER_CONSUME_RATE_H */
