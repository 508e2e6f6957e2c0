/*
 * consume.h
 *	  The heart of consume (consume.c), shared by consume and
 *	  consume_batch (consume_batch.c): one item is one tenant's consume of
 *	  one meter, or all-or-nothing of several, decided and recorded as
 *	  README "consume" says.
 */
#ifndef FLAGMETER_CONSUME_H
#define FLAGMETER_CONSUME_H

#include "postgres.h"
#include "datatype/timestamp.h"

#include "consume_item.h"
#include "decision.h"

/*
 * The meters of one item, as the caller named them: 1 to
 * FM_MAX_METERS_PER_CONSUME, valid names, none listed twice.  Raises the
 * documented errors (22023, 54000, 42602).
 */
extern void fm_check_consume_meters(char **meters, int n);

/*
 * Decide and record the n meters of one tenant's consume, all or none;
 * key NULL: no idempotency key.  Returns the decisions in meter order, in
 * memory that outlives SPI, and their number in *ndecisions: n, or for a
 * retried key the number of meters the first call named (its decisions
 * are returned, whatever the retry names).  Locks stripe 0 of each period
 * (in meter-name order) until the transaction ends; a later item of the
 * same transaction on the same period finds the lock already held.
 */
extern FmDecision *fm_consume_items(const char *tenant, FmConsumeItem *items, int n,
									const char *key, int *ndecisions);

/*
 * Lock stripe 0 of the current period of every (tenant, meter) given
 * (repeats allowed) and of the credit pool each meter draws from, in (tenant, meter) byte order, until the transaction
 * ends: what a caller that then decides several tenants' consumes in one
 * transaction takes first, so that two such transactions cannot deadlock
 * whatever order their items come in (single consumes lock one tenant's
 * meters in meter-name order, which this order agrees with).  Raises 42704
 * for an unknown meter.
 */
extern void fm_lock_consume_periods(char **tenants, char **meters, int n);

#endif							/* FLAGMETER_CONSUME_H */
