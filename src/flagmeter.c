/*
 * flagmeter.c
 *	  Module entry point.  Each part of flagmeter that needs start-up work
 *	  has its own init function; _PG_init only calls them.
 */
#include "postgres.h"
#include "fmgr.h"

#include "utils/guc.h"

#include "compat.h"
#include "entitlements.h"
#include "inflight.h"
#include "pending.h"
#include "limit_lookup.h"
#include "notify.h"
#include "rate_limiter.h"
#include "shared_limits.h"
#include "stripes.h"

FM_MODULE_MAGIC;

void		_PG_init(void);

void
_PG_init(void)
{
	fm_stripes_init();
	fm_limit_lookup_init();
	fm_features_init();
	fm_shared_limits_init();
	fm_inflight_init();
	fm_pending_init();
	fm_notify_init();
	fm_rate_limiter_init();
	MarkGUCPrefixReserved("flagmeter");
}
