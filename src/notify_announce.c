/*
 * notify_announce.c
 *	  The SQL functions that queue a quota event for the commit of the
 *	  calling transaction: announce() and announce_feature().
 *
 * They queue through notify.c, as the engine does; see notify.h for the
 * contract and notify_internal.h for how it holds.
 */
#include "postgres.h"

#include "fmgr.h"

#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/timestamp.h"

#include "bounds.h"
#include "notify.h"
#include "notify_internal.h"

/* ---------------------------------------------------------------------
 * SQL: flagmeter.announce(kind, tenant, meter, plan, period_start, used,
 *                         quota, period, mode, thresholds)
 * ---------------------------------------------------------------------
 */
static char *
optional_text(FunctionCallInfo fcinfo, int argno)
{
	return PG_ARGISNULL(argno) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(argno));
}

PG_FUNCTION_INFO_V1(fm_announce);
Datum
fm_announce(PG_FUNCTION_ARGS)
{
	FmQuotaEvent event;
	char	   *kind;
	int			i;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("kind must not be NULL")));
	kind = text_to_cstring(PG_GETARG_TEXT_PP(0));
	memset(&event, 0, sizeof(event));
	for (i = 0; i < (int) lengthof(fm_event_kind_names); i++)
		if (strcmp(kind, fm_event_kind_names[i]) == 0)
			break;
	if (i == (int) lengthof(fm_event_kind_names) || i == FM_EVENT_THRESHOLD ||
		i == FM_EVENT_FEATURE_CHANGED || FM_IS_GRANT_EVENT(i))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid event kind \"%s\"", kind),
				 errhint("Valid kinds are \"blocked\", \"unblocked\", \"limit_changed\" and \"plan_changed\".")));
	event.kind = (FmQuotaEventKind) i;
	event.tenant = optional_text(fcinfo, 1);
	event.meter = optional_text(fcinfo, 2);
	event.plan = optional_text(fcinfo, 3);
	event.has_period = !PG_ARGISNULL(4);
	event.period_start = event.has_period ? PG_GETARG_TIMESTAMPTZ(4) : 0;
	event.has_usage = !PG_ARGISNULL(5);
	event.used = event.has_usage ? PG_GETARG_INT64(5) : 0;
	event.has_quota = !PG_ARGISNULL(6);
	event.quota = event.has_quota ? PG_GETARG_INT64(6) : 0;
	event.period = optional_text(fcinfo, 7);
	event.mode = optional_text(fcinfo, 8);
	event.nthresholds = -1;
	if (!PG_ARGISNULL(9))
	{
		Datum	   *elems;
		bool	   *elem_nulls;

		deconstruct_array(PG_GETARG_ARRAYTYPE_P(9), INT4OID, 4, true, TYPALIGN_INT,
						  &elems, &elem_nulls, &event.nthresholds);
		if (event.nthresholds > FM_MAX_THRESHOLDS)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("too many thresholds: %d", event.nthresholds)));
		for (i = 0; i < event.nthresholds; i++)
		{
			if (elem_nulls[i])
				ereport(ERROR,
						(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						 errmsg("thresholds must not contain NULLs")));
			event.thresholds[i] = DatumGetInt32(elems[i]);
		}
	}

	if ((event.kind == FM_EVENT_BLOCKED || event.kind == FM_EVENT_UNBLOCKED) &&
		(event.tenant == NULL || event.meter == NULL || !event.has_period))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s needs a tenant, a meter and a period_start", kind)));
	if (event.kind == FM_EVENT_LIMIT_CHANGED && event.meter == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("limit_changed needs a meter")));

	fm_queue_quota_event(&event);
	PG_RETURN_VOID();
}

/* ---------------------------------------------------------------------
 * SQL: flagmeter.announce_feature(tenant, plan, feature, enabled, config)
 *
 * feature_changed has fields of its own, so it has a function of its own
 * rather than more arguments of announce.  It announces rows, not answers:
 * the plan's row for the feature (tenant NULL), or the tenant's override,
 * enabled NULL when the row is gone.  An answer derived from several rows could be
 * overtaken by a concurrent change of another of them committed in
 * between; rows are written under their own row locks, so their events in
 * commit order replay to the committed state.
 * ---------------------------------------------------------------------
 */
PG_FUNCTION_INFO_V1(fm_announce_feature);
Datum
fm_announce_feature(PG_FUNCTION_ARGS)
{
	FmQuotaEvent event;

	memset(&event, 0, sizeof(event));
	event.kind = FM_EVENT_FEATURE_CHANGED;
	event.nthresholds = -1;
	event.tenant = optional_text(fcinfo, 0);
	event.plan = optional_text(fcinfo, 1);
	event.feature = optional_text(fcinfo, 2);
	if (event.feature == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("feature_changed needs a feature")));
	if ((event.tenant == NULL) == (event.plan == NULL))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("feature_changed needs a tenant or a plan, not both")));
	event.has_enabled = !PG_ARGISNULL(3);
	event.enabled = event.has_enabled && PG_GETARG_BOOL(3);
	/* jsonb's text form is JSON: it goes into the payload as it is */
	if (!PG_ARGISNULL(4))
		event.config = DatumGetCString(DirectFunctionCall1(jsonb_out, PG_GETARG_DATUM(4)));

	fm_queue_quota_event(&event);
	PG_RETURN_VOID();
}
