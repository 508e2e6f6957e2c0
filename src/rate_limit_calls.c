/*
 * rate_limit_calls.c
 *	  limit() and limit_batch(), the ad-hoc limiter for any key, and the
 *	  validation of a rate limit that the catalog's functions and
 *	  constraints call (rate_limit_valid, check_rate_limit).  The limiter
 *	  itself is rate_limiter.c.
 */
#include "postgres.h"
#include "fmgr.h"
#include "funcapi.h"

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "args.h"
#include "period.h"
#include "rate_limiter.h"

#define RATE_DECISION_COLUMNS 4

/* allowed, remaining, retry_after, reset_after: rate_decision's columns */
static void
verdict_columns(const FmRateVerdict *v, Datum *values, bool *nulls)
{
	values[0] = BoolGetDatum(v->allowed);
	values[1] = Int64GetDatum(v->remaining);
	values[2] = v->retry_after < 0 ? (Datum) 0 :
		IntervalPGetDatum(fm_interval_of_usecs(v->retry_after));
	values[3] = IntervalPGetDatum(fm_interval_of_usecs(v->reset_after));
	nulls[0] = nulls[1] = nulls[3] = false;
	nulls[2] = v->retry_after < 0;
}

/*
 * The blessed descriptor of flagmeter.rate_decision, kept for the call site
 * (fn_extra): looking the type up is a good part of a call otherwise.
 */
static TupleDesc
rate_decision_desc(FunctionCallInfo fcinfo)
{
	TupleDesc	desc = (TupleDesc) fcinfo->flinfo->fn_extra;

	if (desc == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);

		if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
			elog(ERROR, "limit() must return flagmeter.rate_decision");
		desc = BlessTupleDesc(CreateTupleDescCopy(desc));
		MemoryContextSwitchTo(old);
		fcinfo->flinfo->fn_extra = desc;
	}
	return desc;
}

static void
check_cost(int64 cost)
{
	if (cost < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("cost must not be negative: " INT64_FORMAT, cost)));
}

static void
check_limit_key(const char *key)
{
	size_t		len = strlen(key);

	if (len == 0 || len > FM_KEY_MAX_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid rate limit key \"%.*s\"", (int) Min(len, 64), key),
				 errdetail("A rate limit key is 1 to %d bytes long.", FM_KEY_MAX_BYTES)));
}

/* limit(key, rate, per, burst, cost) -> rate_decision */
PG_FUNCTION_INFO_V1(fm_limit);
Datum
fm_limit(PG_FUNCTION_ARGS)
{
	static const char *const names[] = {"key", "rate", "per"};
	char	   *key;
	FmRate		rate;
	FmRateKey	rkey;
	int64		cost;
	FmRateVerdict verdict;
	TupleDesc	desc;
	Datum		values[RATE_DECISION_COLUMNS];
	bool		nulls[RATE_DECISION_COLUMNS];
	int			i;

	for (i = 0; i < (int) lengthof(names); i++)
		if (PG_ARGISNULL(i))
			fm_null_argument(names[i]);
	if (PG_ARGISNULL(4))
		fm_null_argument("cost");
	key = text_to_cstring(PG_GETARG_TEXT_PP(0));
	check_limit_key(key);
	fm_rate_from_args(PG_GETARG_INT64(1), PG_GETARG_INTERVAL_P(2),
					  PG_ARGISNULL(3) ? PG_GETARG_INT64(1) : PG_GETARG_INT64(3), &rate);
	cost = PG_GETARG_INT64(4);
	check_cost(cost);

	rkey = fm_rate_key_of_text(key);
	fm_rate_take(&rkey, &rate, cost, true, &verdict);

	desc = rate_decision_desc(fcinfo);
	verdict_columns(&verdict, values, nulls);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
}

/*
 * An optional bigint array of expected elements: out[i] is its element;
 * given[i] is false where the array or the element is NULL.
 */
static int64 *
optional_int8_array(FunctionCallInfo fcinfo, int argno, const char *what, int expected,
					bool **given)
{
	int64	   *out = palloc0(sizeof(int64) * Max(expected, 1));
	Datum	   *elems;
	bool	   *isnull;
	int			n;
	int			i;

	*given = palloc0(sizeof(bool) * Max(expected, 1));
	if (PG_ARGISNULL(argno))
		return out;
	fm_arg_array_elements(fcinfo, argno, what, INT8OID, &elems, &isnull, &n);
	fm_check_array_length(what, n, expected);
	for (i = 0; i < n; i++)
	{
		(*given)[i] = !isnull[i];
		out[i] = isnull[i] ? 0 : DatumGetInt64(elems[i]);
	}
	return out;
}

/* A required array of expected elements (expected -1: any), without NULLs. */
static Datum *
required_array(FunctionCallInfo fcinfo, int argno, const char *what, Oid elemtype,
			   int *n, int expected)
{
	Datum	   *elems;
	bool	   *isnull;
	int			i;

	if (PG_ARGISNULL(argno))
		fm_null_argument(what);
	fm_arg_array_elements(fcinfo, argno, what, elemtype, &elems, &isnull, n);
	if (expected >= 0)
		fm_check_array_length(what, *n, expected);
	for (i = 0; i < *n; i++)
		if (isnull[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s must not contain NULLs", what)));
	return elems;
}

/*
 * limit_batch(keys[], rates[], pers[], bursts[], costs[])
 *   -> TABLE (item, allowed, remaining, retry_after, reset_after)
 *
 * limit() for each element, in order; every element is checked before the
 * first key is spent, so that bad input spends nothing.
 */
PG_FUNCTION_INFO_V1(fm_limit_batch);
Datum
fm_limit_batch(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Datum	   *keys;
	Datum	   *rates;
	Datum	   *pers;
	int64	   *bursts;
	int64	   *costs;
	bool	   *burst_given;
	bool	   *cost_given;
	FmRate	   *limits;
	FmRateKey  *rkeys;
	int			n,
				m,
				i;

	keys = required_array(fcinfo, 0, "keys", TEXTOID, &n, -1);
	rates = required_array(fcinfo, 1, "rates", INT8OID, &m, n);
	pers = required_array(fcinfo, 2, "pers", INTERVALOID, &m, n);
	bursts = optional_int8_array(fcinfo, 3, "bursts", n, &burst_given);
	costs = optional_int8_array(fcinfo, 4, "costs", n, &cost_given);

	limits = palloc(sizeof(FmRate) * Max(n, 1));
	rkeys = palloc(sizeof(FmRateKey) * Max(n, 1));
	for (i = 0; i < n; i++)
	{
		char	   *key = TextDatumGetCString(keys[i]);
		int64		rate = DatumGetInt64(rates[i]);

		check_limit_key(key);
		fm_rate_from_args(rate, DatumGetIntervalP(pers[i]),
						  burst_given[i] ? bursts[i] : rate, &limits[i]);
		if (!cost_given[i])
			costs[i] = 1;
		check_cost(costs[i]);
		rkeys[i] = fm_rate_key_of_text(key);
	}

	InitMaterializedSRF(fcinfo, 0);
	for (i = 0; i < n; i++)
	{
		FmRateVerdict verdict;
		Datum		values[RATE_DECISION_COLUMNS + 1];
		bool		nulls[RATE_DECISION_COLUMNS + 1];

		fm_rate_take(&rkeys[i], &limits[i], costs[i], true, &verdict);
		values[0] = Int32GetDatum(i + 1);
		nulls[0] = false;
		verdict_columns(&verdict, values + 1, nulls + 1);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/* rate_limit_valid(rate, per, burst) -> boolean: the tables' constraint */
PG_FUNCTION_INFO_V1(fm_rate_limit_valid);
Datum
fm_rate_limit_valid(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(fm_rate_valid(PG_GETARG_INT64(0), PG_GETARG_INTERVAL_P(1),
								 PG_GETARG_INT64(2)));
}

/* check_rate_limit(rate, per, burst): raises why the limit is not valid */
PG_FUNCTION_INFO_V1(fm_check_rate_limit);
Datum
fm_check_rate_limit(PG_FUNCTION_ARGS)
{
	FmRate		rate;

	if (PG_ARGISNULL(0))
		fm_null_argument("rate");
	if (PG_ARGISNULL(1))
		fm_null_argument("per");
	if (PG_ARGISNULL(2))
		fm_null_argument("burst");
	fm_rate_from_args(PG_GETARG_INT64(0), PG_GETARG_INTERVAL_P(1), PG_GETARG_INT64(2), &rate);
	PG_RETURN_VOID();
}
