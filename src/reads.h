/*
 * reads.h
 *	  check()'s decision for other calls (reads.c).
 */
#ifndef FLAGMETER_READS_H
#define FLAGMETER_READS_H

#include "postgres.h"

#include "decision.h"

/*
 * The decision check(tenant, meter, amount) gives, in the active snapshot
 * (grants and holds included); nothing is recorded.
 */
extern void fm_check_decision(const char *tenant, const char *meter, int64 amount,
							  FmDecision *decision);

#endif							/* FLAGMETER_READS_H */
