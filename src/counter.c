/*
 * counter.c
 *	  SQL interface of flagmeter.quota_counter: I/O, operators, accessors
 *	  and the aggregate support functions.
 *
 * The logic is in counter_core.c; this file converts Datums and turns core
 * result codes into errors with SQLSTATEs.  Functions here are immutable
 * and never modify a pass-by-reference argument, except the aggregate
 * transition functions, which update their state in place when called
 * from an aggregate (AggCheckCallContext).
 */
#include "postgres.h"
#include "fmgr.h"

#include "access/xact.h"
#include "libpq/pqformat.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "args.h"
#include "compat.h"
#include "counter.h"

FmCounter *
fm_counter_copy(const FmCounter *c)
{
	FmCounter  *copy = palloc(sizeof(FmCounter));

	memcpy(copy, c, sizeof(FmCounter));
	return copy;
}

/*
 * The period being added to (counter.h): valid in the statement that set
 * it, so that an error raised and caught (or a later statement) does not
 * name a period it is not about.  Names longer than the buffers are cut.
 */
static struct
{
	bool		set;
	TimestampTz xact_start;
	TimestampTz statement_start;
	TimestampTz period_start;
	char		tenant[128];
	char		meter[128];
}			usage_target;

void
fm_usage_target(const char *tenant, const char *meter, TimestampTz period_start)
{
	usage_target.set = true;
	usage_target.xact_start = GetCurrentTransactionStartTimestamp();
	usage_target.statement_start = GetCurrentStatementStartTimestamp();
	usage_target.period_start = period_start;
	strlcpy(usage_target.tenant, tenant, sizeof(usage_target.tenant));
	strlcpy(usage_target.meter, meter, sizeof(usage_target.meter));
}

void
fm_usage_target_clear(void)
{
	usage_target.set = false;
}

static bool
usage_target_valid(void)
{
	return usage_target.set &&
		usage_target.xact_start == GetCurrentTransactionStartTimestamp() &&
		usage_target.statement_start == GetCurrentStatementStartTimestamp();
}

void
fm_counter_report(FmResult r)
{
	switch (r)
	{
		case FM_OK:
			return;
		case FM_ERR_NEGATIVE_AMOUNT:
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("amount must not be negative")));
			break;
		case FM_ERR_TIMESTAMP:
			ereport(ERROR,
					(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
					 errmsg("timestamp out of range"),
					 errdetail("Events must lie between 0001-01-01 and 9999-12-31 UTC.")));
			break;
		case FM_ERR_RANGE:
			if (usage_target_valid())
				ereport(ERROR,
						(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
						 errmsg("quota_counter out of range"),
						 TIMESTAMP_IS_NOBEGIN(usage_target.period_start) ?
						 errdetail("tenant %s, meter %s, lifetime period",
								   usage_target.tenant, usage_target.meter) :
						 errdetail("tenant %s, meter %s, period starting %s",
								   usage_target.tenant, usage_target.meter,
								   timestamptz_to_str(usage_target.period_start)),
						 errhint("The usage of one period is at most 9223372036854775807; nothing was recorded.")));
			ereport(ERROR,
					(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
					 errmsg("quota_counter out of range")));
			break;
		case FM_ERR_SYNTAX:
		case FM_ERR_INCONSISTENT:
			elog(ERROR, "unexpected quota_counter result %d", (int) r);
			break;
	}
}

/* ---------------------------------------------------------------------
 * I/O
 * ---------------------------------------------------------------------
 */
PG_FUNCTION_INFO_V1(quota_counter_in);
Datum
quota_counter_in(PG_FUNCTION_ARGS)
{
	char	   *str = PG_GETARG_CSTRING(0);
	FmCounter  *result = palloc(sizeof(FmCounter));
	const char *detail = NULL;
	FmResult	r;

	r = fm_counter_parse(str, result, &detail);
	if (r == FM_ERR_RANGE || r == FM_ERR_TIMESTAMP)
		fm_ereturn(fcinfo->context, (Datum) 0,
				   (errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
					errmsg("value \"%s\" is out of range for type %s",
						   str, "quota_counter"),
					detail ? errdetail_internal("%s", detail) : 0));
	else if (r != FM_OK)
		fm_ereturn(fcinfo->context, (Datum) 0,
				   (errcode(ERRCODE_INVALID_TEXT_REPRESENTATION),
					errmsg("invalid input syntax for type %s: \"%s\"",
						   "quota_counter", str),
					detail ? errdetail_internal("%s", detail) :
					errhint("The form is \"used=N events=N max=N[ latest=N@YYYY-MM-DDTHH:MM:SS[.ffffff]Z][ limit=N]\".")));

	PG_RETURN_FMCOUNTER_P(result);
}

PG_FUNCTION_INFO_V1(quota_counter_out);
Datum
quota_counter_out(PG_FUNCTION_ARGS)
{
	FmCounter  *c = PG_GETARG_FMCOUNTER_P(0);
	char	   *buf = palloc(FM_COUNTER_TEXT_MAX);

	fm_counter_format(c, buf, FM_COUNTER_TEXT_MAX);
	PG_RETURN_CSTRING(buf);
}

/* As strict as quota_counter_in: the same validator runs on every value. */
PG_FUNCTION_INFO_V1(quota_counter_recv);
Datum
quota_counter_recv(PG_FUNCTION_ARGS)
{
	StringInfo	buf = (StringInfo) PG_GETARG_POINTER(0);
	int			len = buf->len - buf->cursor;
	const unsigned char *bytes;
	FmCounter  *result = palloc(sizeof(FmCounter));
	const char *detail = NULL;
	FmResult	r;

	bytes = (const unsigned char *) pq_getmsgbytes(buf, len);
	r = fm_counter_from_wire(bytes, (size_t) len, result, &detail);
	if (r == FM_ERR_RANGE || r == FM_ERR_TIMESTAMP)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("binary value is out of range for type %s",
						"quota_counter"),
				 detail ? errdetail_internal("%s", detail) : 0));
	else if (r != FM_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TEXT_REPRESENTATION),
				 errmsg("invalid input syntax for type %s", "quota_counter"),
				 detail ? errdetail_internal("%s", detail) : 0));

	PG_RETURN_FMCOUNTER_P(result);
}

PG_FUNCTION_INFO_V1(quota_counter_send);
Datum
quota_counter_send(PG_FUNCTION_ARGS)
{
	FmCounter  *c = PG_GETARG_FMCOUNTER_P(0);
	unsigned char wire[FM_COUNTER_WIRE_SIZE];
	StringInfoData buf;

	fm_counter_to_wire(c, wire);
	pq_begintypsend(&buf);
	pq_sendbytes(&buf, (const char *) wire, FM_COUNTER_WIRE_SIZE);
	PG_RETURN_BYTEA_P(pq_endtypsend(&buf));
}

/* ---------------------------------------------------------------------
 * Constructors, merge and comparison
 * ---------------------------------------------------------------------
 */

/* event_counter(amount, occurred_at): the counter of one event */
PG_FUNCTION_INFO_V1(quota_counter_from_event);
Datum
quota_counter_from_event(PG_FUNCTION_ARGS)
{
	FmCounter  *result = palloc(sizeof(FmCounter));

	fm_check_amount(PG_GETARG_INT64(0), true);
	fm_counter_init(result);
	fm_counter_report(fm_counter_add_event(result, PG_GETARG_INT64(0),
										   PG_GETARG_TIMESTAMPTZ(1)));
	PG_RETURN_FMCOUNTER_P(result);
}

/* a + b */
PG_FUNCTION_INFO_V1(quota_counter_merge);
Datum
quota_counter_merge(PG_FUNCTION_ARGS)
{
	FmCounter  *result = fm_counter_copy(PG_GETARG_FMCOUNTER_P(0));

	fm_counter_report(fm_counter_merge(result, PG_GETARG_FMCOUNTER_P(1)));
	PG_RETURN_FMCOUNTER_P(result);
}

/* subtract_events(c, amount, events): c without voided events */
PG_FUNCTION_INFO_V1(quota_counter_subtract);
Datum
quota_counter_subtract(PG_FUNCTION_ARGS)
{
	FmCounter  *result = fm_counter_copy(PG_GETARG_FMCOUNTER_P(0));
	FmResult	r;

	fm_check_amount(PG_GETARG_INT64(1), true);
	if (PG_GETARG_INT64(2) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("events must not be negative: " INT64_FORMAT, PG_GETARG_INT64(2))));
	r = fm_counter_subtract(result, PG_GETARG_INT64(1), PG_GETARG_INT64(2));

	if (r == FM_ERR_INCONSISTENT)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("cannot subtract more than the counter holds"),
				 errdetail("The counter has " INT64_FORMAT " events using " INT64_FORMAT ".",
						   PG_GETARG_FMCOUNTER_P(0)->events,
						   PG_GETARG_FMCOUNTER_P(0)->used)));
	fm_counter_report(r);
	PG_RETURN_FMCOUNTER_P(result);
}

PG_FUNCTION_INFO_V1(quota_counter_eq);
Datum
quota_counter_eq(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(fm_counter_equal(PG_GETARG_FMCOUNTER_P(0),
									PG_GETARG_FMCOUNTER_P(1)));
}

PG_FUNCTION_INFO_V1(quota_counter_ne);
Datum
quota_counter_ne(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(!fm_counter_equal(PG_GETARG_FMCOUNTER_P(0),
									 PG_GETARG_FMCOUNTER_P(1)));
}

/* ---------------------------------------------------------------------
 * Aggregate support
 * ---------------------------------------------------------------------
 */

/*
 * The state to update: the aggregate's own state in place, or a copy when
 * called outside an aggregate (so the caller's value is never modified).
 */
static FmCounter *
agg_state(FunctionCallInfo fcinfo)
{
	FmCounter  *state = PG_GETARG_FMCOUNTER_P(0);

	if (AggCheckCallContext(fcinfo, NULL))
		return state;
	return fm_counter_copy(state);
}

/* quota_counter_agg(amount, occurred_at) transition */
PG_FUNCTION_INFO_V1(quota_counter_add_event);
Datum
quota_counter_add_event(PG_FUNCTION_ARGS)
{
	FmCounter  *state;

	fm_check_amount(PG_GETARG_INT64(1), true);
	state = agg_state(fcinfo);
	fm_counter_report(fm_counter_add_event(state, PG_GETARG_INT64(1),
										   PG_GETARG_TIMESTAMPTZ(2)));
	PG_RETURN_FMCOUNTER_P(state);
}

/* merge_agg(quota_counter) transition, and the combine function of both */
PG_FUNCTION_INFO_V1(quota_counter_merge_trans);
Datum
quota_counter_merge_trans(PG_FUNCTION_ARGS)
{
	FmCounter  *state = agg_state(fcinfo);

	fm_counter_report(fm_counter_merge(state, PG_GETARG_FMCOUNTER_P(1)));
	PG_RETURN_FMCOUNTER_P(state);
}

/* ---------------------------------------------------------------------
 * Accessors
 * ---------------------------------------------------------------------
 */
PG_FUNCTION_INFO_V1(quota_counter_used);
Datum
quota_counter_used(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64(PG_GETARG_FMCOUNTER_P(0)->used);
}

PG_FUNCTION_INFO_V1(quota_counter_events);
Datum
quota_counter_events(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64(PG_GETARG_FMCOUNTER_P(0)->events);
}

PG_FUNCTION_INFO_V1(quota_counter_max_amount);
Datum
quota_counter_max_amount(PG_FUNCTION_ARGS)
{
	FmCounter  *c = PG_GETARG_FMCOUNTER_P(0);

	if (!(c->flags & FM_COUNTER_HAS_LATEST))
		PG_RETURN_NULL();
	PG_RETURN_INT64(c->max_amount);
}

PG_FUNCTION_INFO_V1(quota_counter_latest);
Datum
quota_counter_latest(PG_FUNCTION_ARGS)
{
	FmCounter  *c = PG_GETARG_FMCOUNTER_P(0);

	if (!(c->flags & FM_COUNTER_HAS_LATEST))
		PG_RETURN_NULL();
	PG_RETURN_INT64(c->latest);
}

PG_FUNCTION_INFO_V1(quota_counter_latest_at);
Datum
quota_counter_latest_at(PG_FUNCTION_ARGS)
{
	FmCounter  *c = PG_GETARG_FMCOUNTER_P(0);

	if (!(c->flags & FM_COUNTER_HAS_LATEST))
		PG_RETURN_NULL();
	PG_RETURN_TIMESTAMPTZ(c->latest_at);
}

PG_FUNCTION_INFO_V1(quota_counter_quota);
Datum
quota_counter_quota(PG_FUNCTION_ARGS)
{
	FmCounter  *c = PG_GETARG_FMCOUNTER_P(0);

	if (!(c->flags & FM_COUNTER_HAS_LIMIT))
		PG_RETURN_NULL();
	PG_RETURN_INT64(c->limit_value);
}

/* quota - used, never below zero; NULL when unlimited */
PG_FUNCTION_INFO_V1(quota_counter_remaining);
Datum
quota_counter_remaining(PG_FUNCTION_ARGS)
{
	FmCounter  *c = PG_GETARG_FMCOUNTER_P(0);

	if (!(c->flags & FM_COUNTER_HAS_LIMIT))
		PG_RETURN_NULL();
	/* both are non-negative, so the difference cannot overflow */
	PG_RETURN_INT64(c->used >= c->limit_value ? 0 : c->limit_value - c->used);
}

/* used >= quota; NULL when unlimited */
PG_FUNCTION_INFO_V1(quota_counter_exceeded);
Datum
quota_counter_exceeded(PG_FUNCTION_ARGS)
{
	FmCounter  *c = PG_GETARG_FMCOUNTER_P(0);

	if (!(c->flags & FM_COUNTER_HAS_LIMIT))
		PG_RETURN_NULL();
	PG_RETURN_BOOL(c->used >= c->limit_value);
}

/* used / quota as a fraction (1.0 = at the limit); NULL when unlimited */
PG_FUNCTION_INFO_V1(quota_counter_usage_ratio);
Datum
quota_counter_usage_ratio(PG_FUNCTION_ARGS)
{
	FmCounter  *c = PG_GETARG_FMCOUNTER_P(0);

	if (!(c->flags & FM_COUNTER_HAS_LIMIT))
		PG_RETURN_NULL();
	PG_RETURN_FLOAT8((double) c->used / (double) c->limit_value);
}

/* with_limit(c, quota): c carrying the given limit; NULL quota removes it */
PG_FUNCTION_INFO_V1(quota_counter_with_limit);
Datum
quota_counter_with_limit(PG_FUNCTION_ARGS)
{
	FmCounter  *result;

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	result = fm_counter_copy(PG_GETARG_FMCOUNTER_P(0));
	if (PG_ARGISNULL(1))
	{
		result->flags &= ~FM_COUNTER_HAS_LIMIT;
		result->limit_value = 0;
	}
	else
	{
		int64		quota = PG_GETARG_INT64(1);

		if (quota <= 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("quota must be positive: " INT64_FORMAT, quota)));
		result->flags |= FM_COUNTER_HAS_LIMIT;
		result->limit_value = quota;
	}
	PG_RETURN_FMCOUNTER_P(result);
}
