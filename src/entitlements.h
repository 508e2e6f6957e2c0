/*
 * entitlements.h
 *	  has_feature() and feature_config() (entitlements.c).
 */
#ifndef FLAGMETER_ENTITLEMENTS_H
#define FLAGMETER_ENTITLEMENTS_H

/* from _PG_init: registers the feature cache's invalidation callback */
extern void fm_features_init(void);

#endif							/* FLAGMETER_ENTITLEMENTS_H */
