/*
 * limit.c
 *	  What a limit computes by itself: the usage a counter shows under the
 *	  meter's aggregation, the aggregation names, the fingerprint, and the
 *	  hash that keys the limit caches.
 */
#include "postgres.h"

#include "common/hashfn.h"

#include "limit.h"

int64
fm_used_of(const FmCounter *c, FmAggregation aggregation)
{
	switch (aggregation)
	{
		case FM_AGG_SUM:
		case FM_AGG_UNIQUE:
			return c->used;
		case FM_AGG_COUNT:
			return c->events;
		case FM_AGG_MAX:
			return c->max_amount;
		case FM_AGG_LATEST:
			return (c->flags & FM_COUNTER_HAS_LATEST) ? c->latest : 0;
	}
	return 0;					/* keep compiler quiet */
}

const char *
fm_aggregation_name(FmAggregation aggregation)
{
	switch (aggregation)
	{
		case FM_AGG_SUM:
			return "sum";
		case FM_AGG_COUNT:
			return "count";
		case FM_AGG_MAX:
			return "max";
		case FM_AGG_LATEST:
			return "latest";
		case FM_AGG_UNIQUE:
			return "unique";
	}
	return "sum";				/* keep compiler quiet */
}

void
fm_refuse_unique_meter(const char *meter, const FmLimit *limit)
{
	if (limit->aggregation == FM_AGG_UNIQUE)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("meter \"%s\" counts distinct values, not amounts", meter),
				 errdetail("Its usage in a period is the number of distinct values recorded in it."),
				 errhint("Record a value with flagmeter.track_value(tenant, meter, value) "
						 "or flagmeter.consume_value(tenant, meter, value).")));
}

/* flagmeter.meters' CHECK constraint admits only these names */
FmAggregation
fm_aggregation_from_name(const char *name)
{
	if (strcmp(name, "sum") == 0)
		return FM_AGG_SUM;
	if (strcmp(name, "count") == 0)
		return FM_AGG_COUNT;
	if (strcmp(name, "max") == 0)
		return FM_AGG_MAX;
	if (strcmp(name, "latest") == 0)
		return FM_AGG_LATEST;
	if (strcmp(name, "unique") == 0)
		return FM_AGG_UNIQUE;
	elog(ERROR, "unknown aggregation \"%s\" in flagmeter.meters", name);
	return FM_AGG_SUM;			/* keep compiler quiet */
}

int32
fm_limit_fingerprint(const FmLimit *limit)
{
	struct
	{
		int64		quota;
		int32		aggregation;
		int32		nthresholds;
		bool		limited;
		bool		hard;
		int			thresholds[FM_MAX_THRESHOLDS];
	}			fields;

	memset(&fields, 0, sizeof(fields)); /* padding too */
	fields.quota = limit->quota;
	fields.aggregation = (int32) limit->aggregation;
	fields.nthresholds = limit->nthresholds;
	fields.limited = limit->limited;
	fields.hard = limit->hard;
	memcpy(fields.thresholds, limit->thresholds,
		   limit->nthresholds * sizeof(int));
	return (int32) hash_bytes((const unsigned char *) &fields, sizeof(fields));
}

uint32
fm_tenant_meter_hash(const char *tenant, const char *meter)
{
	return hash_combine(hash_bytes((const unsigned char *) tenant, strlen(tenant)),
						hash_bytes((const unsigned char *) meter, strlen(meter)));
}

uint32
fm_tenant_meter_key_hash(const void *key, Size keysize)
{
	const FmTenantMeterKey *k = key;

	return fm_tenant_meter_hash(k->tenant, k->meter);
}

int
fm_tenant_meter_key_match(const void *key1, const void *key2, Size keysize)
{
	const FmTenantMeterKey *a = key1;
	const FmTenantMeterKey *b = key2;

	return strcmp(a->tenant, b->tenant) != 0 || strcmp(a->meter, b->meter) != 0;
}
