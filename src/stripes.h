/*
 * stripes.h
 *	  Which stripe of a period a track writes (stripes.c).
 */
#ifndef FLAGMETER_STRIPES_H
#define FLAGMETER_STRIPES_H

#include "postgres.h"
#include "datatype/timestamp.h"
#include "storage/lock.h"

/* flagmeter.stripes: how many shared counter rows a period may have */
extern int	fm_stripes;

/* from _PG_init: defines flagmeter.stripes */
extern void fm_stripes_init(void);

/* The stripe a READ COMMITTED track of the period writes (a shared one, or own). */
extern int16 fm_pick_stripe(const char *tenant, const char *meter,
							TimestampTz period_start);

/* This backend's own stripe, written without a tag. */
extern int16 fm_own_stripe(void);

/* The period's stripe tag k: void takes the tags of the stripes it merges. */
extern uint32 fm_period_hash(const char *tenant, const char *meter,
							 TimestampTz period_start);
extern void fm_stripe_tag(LOCKTAG *tag, uint32 period_hash, int16 stripe);

#endif							/* FLAGMETER_STRIPES_H */
