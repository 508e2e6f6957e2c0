/*
 * inflight.h
 *	  Consumes in flight, in shared memory: how a hot tenant's consume
 *	  decides without stripe 0's row lock (inflight.c).
 */
#ifndef FLAGMETER_INFLIGHT_H
#define FLAGMETER_INFLIGHT_H

#include "postgres.h"
#include "datatype/timestamp.h"

#include "counter_core.h"
#include "decision.h"
#include "limit.h"

/* from _PG_init: flagmeter.inflight_periods and flagmeter.lock_free_consume */
extern void fm_inflight_init(void);

/* How a lock-free consume came out. */
typedef enum FmInflightOutcome
{
	FM_INFLIGHT_GRANTED,		/* reserved: write the event as track does */
	FM_INFLIGHT_REFUSED,		/* decided: refused, nothing to write */
	FM_INFLIGHT_FALL_BACK		/* not here: decide under stripe 0's lock */
} FmInflightOutcome;

/*
 * Whether a consume of one sum or count meter may try
 * fm_inflight_consume: flagmeter is preloaded with a table of consumes in
 * flight, flagmeter.lock_free_consume is on, and the transaction is READ
 * COMMITTED.
 */
extern bool fm_inflight_consume_enabled(void);

/*
 * Decide amount of a sum or count meter against the period's committed
 * usage, read in a snapshot taken now, plus the consumes of other
 * transactions in flight on the period; granted, reserve it until this
 * transaction ends.  *decision is the decision (as fm_decide makes it),
 * *after the usage it counted with this call's amount.  Waits for one
 * consume in flight and decides again when only consumes in flight stand
 * between this one and the quota (unless this transaction has consumes in
 * flight itself, which the other might be waiting for).  FALL_BACK when
 * a consume holding stripe 0's lock is in flight or the table is full.
 */
extern FmInflightOutcome fm_inflight_consume(const char *tenant, const char *meter,
											 TimestampTz period_start,
											 TimestampTz period_end,
											 const FmLimit *limit, int64 amount,
											 TimestampTz now, FmDecision *decision,
											 FmCounter *after);

/*
 * What every other decider of a period calls before it locks the
 * period's stripe 0: it is registered until its transaction ends (no
 * consume decides without the lock meanwhile), and the lock-free consumes
 * in flight are waited for, so that the rows it then reads count them.
 * A transaction that has consumes in flight itself does not wait (two
 * such could wait for each other): with in_flight not NULL, their amounts
 * are added to it as events; otherwise it waits all the same.  In
 * REPEATABLE READ, raises 40001 when a lock-free consume of the period
 * may have committed after the transaction's snapshot, as a concurrent
 * update of stripe 0 would.
 */
extern void fm_inflight_before_lock(const char *tenant, const char *meter,
									TimestampTz period_start, TimestampTz now,
									FmCounter *in_flight);

#endif							/* FLAGMETER_INFLIGHT_H */
