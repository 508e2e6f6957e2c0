/*
 * consume_one.h
 *	  The common consume: one sum or count meter, without an idempotency
 *	  key, credit grants, reservations or a pool, decided in one of two
 *	  ways (consume_one.c).  consume.c sends such a call here.
 */
#ifndef FLAGMETER_CONSUME_ONE_H
#define FLAGMETER_CONSUME_ONE_H

#include "postgres.h"
#include "datatype/timestamp.h"

#include "decision.h"
#include "limit.h"

/*
 * Decide and record amount of tenant's meter under limit, in the period
 * [period_start, period_end) at now, inside SPI.  The decision is
 * SPI_palloc'd.
 */
extern FmDecision *fm_consume_one(const char *tenant, const char *meter, int64 amount,
								  const FmLimit *limit, TimestampTz period_start,
								  TimestampTz period_end, TimestampTz now);

#endif							/* FLAGMETER_CONSUME_ONE_H */
