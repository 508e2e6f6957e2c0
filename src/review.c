/*
 * review.c
 *	  review_usage(): what a change of the configuration makes a tenant's
 *	  current usage reach.  Called by the catalog functions after a limit,
 *	  a plan or a period moved, so that a tenant whose usage is now at a
 *	  threshold or at a lowered hard limit is announced at the change, not
 *	  at its next call (which a hard limit would refuse without recording).
 */
#include "postgres.h"
#include "fmgr.h"

#include "access/xact.h"
#include "executor/spi.h"

#include "args.h"
#include "counter.h"
#include "grants.h"
#include "limit_lookup.h"
#include "period.h"
#include "track_alerts.h"
#include "usage_rows.h"

/*
 * review_usage(tenant, meter) -> void
 *
 * Queues the thresholds and the "blocked" that the usage of the current
 * period reaches under the limit in force, as the transaction sees it (its
 * own changes included); announced when it commits.  Thresholds already
 * announced in the period are not announced again; a tenant already
 * recorded as blocked in the period is not blocked again.
 */
PG_FUNCTION_INFO_V1(fm_review_usage);
Datum
fm_review_usage(PG_FUNCTION_ARGS)
{
	char	   *tenant = fm_arg_tenant(fcinfo, 0);
	char	   *meter = fm_arg_meter(fcinfo, 1);
	FmLimit		limit;
	TimestampTz period_start;
	TimestampTz period_end;
	FmCounter	total;

	SPI_connect();
	fm_load_limit_any(tenant, meter, false, &limit);
	if (limit.limited)
	{
		fm_period_bounds(limit.period, limit.anchor, limit.tz,
						 GetCurrentTransactionStartTimestamp(),
						 &period_start, &period_end);
		total = fm_read_period(tenant, meter, period_start);
		/* a tenant with credit grants left is not blocked (grants.h) */
		if (limit.grants)
			limit = fm_grants_announce_limit(&limit,
											 fm_grants_available(tenant, meter,
																 GetCurrentTransactionStartTimestamp(),
																 false));
		fm_announce_usage_level(tenant, meter, &limit, period_start, &total);
	}
	SPI_finish();
	PG_RETURN_VOID();
}
