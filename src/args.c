/*
 * args.c
 *	  The argument checks of every SQL call (see args.h).
 */
#include "postgres.h"
#include "fmgr.h"

#include "catalog/pg_type.h"
#include "mb/pg_wchar.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/timestamp.h"

#include "args.h"
#include "counter_core.h"

/* How many bytes of s to quote in a message: 64, never half a character. */
static int
clip(const char *s)
{
	return pg_mbcliplen(s, strlen(s), 64);
}

void
fm_null_argument(const char *what)
{
	ereport(ERROR,
			(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
			 errmsg("%s must not be NULL", what)));
}

void
fm_check_tenant(const char *tenant)
{
	size_t		len = strlen(tenant);

	if (len == 0 || len > FM_TENANT_MAX_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid tenant id \"%.*s\"", clip(tenant), tenant),
				 errdetail("A tenant id is 1 to %d bytes long.", FM_TENANT_MAX_BYTES)));
}

/* Longer names cannot exist (flagmeter.check_name); say so plainly. */
static void
check_name_length(const char *kind, const char *plural, const char *name)
{
	if (strlen(name) > FM_NAME_MAX_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_NAME),
				 errmsg("%s name is too long: \"%.*s...\"", kind, clip(name), name),
				 errdetail("%s are at most %d characters.", plural, FM_NAME_MAX_BYTES)));
}

void
fm_check_meter_name(const char *meter)
{
	check_name_length("meter", "Meter names", meter);
}

void
fm_check_feature_name(const char *feature)
{
	check_name_length("feature", "Feature names", feature);
}

void
fm_check_key(const char *key)
{
	size_t		len = strlen(key);

	if (len == 0 || len > FM_KEY_MAX_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid idempotency key \"%.*s\"", clip(key), key),
				 errdetail("An idempotency key is 1 to %d bytes long.", FM_KEY_MAX_BYTES)));
}

void
fm_check_amount(int64 amount, bool zero_allowed)
{
	if (amount < 0 || (amount == 0 && !zero_allowed))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg(zero_allowed ? "amount must not be negative: " INT64_FORMAT :
						"amount must be positive: " INT64_FORMAT, amount)));
}

void
fm_check_timestamp(TimestampTz ts)
{
	if (TIMESTAMP_NOT_FINITE(ts) || ts < FM_TS_MIN || ts > FM_TS_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("timestamp out of range"),
				 errdetail("Events must lie between 0001-01-01 and 9999-12-31 UTC.")));
}

char *
fm_arg_tenant(FunctionCallInfo fcinfo, int argno)
{
	char	   *tenant;

	if (PG_ARGISNULL(argno))
		fm_null_argument("tenant");
	tenant = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	fm_check_tenant(tenant);
	return tenant;
}

char *
fm_arg_meter(FunctionCallInfo fcinfo, int argno)
{
	char	   *meter;

	if (PG_ARGISNULL(argno))
		fm_null_argument("meter");
	meter = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	fm_check_meter_name(meter);
	return meter;
}

char *
fm_arg_key(FunctionCallInfo fcinfo, int argno)
{
	char	   *key;

	if (PG_NARGS() <= argno || PG_ARGISNULL(argno))
		return NULL;
	key = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	fm_check_key(key);
	return key;
}

int64
fm_arg_amount(FunctionCallInfo fcinfo, int argno, bool zero_allowed)
{
	int64		amount;

	if (PG_ARGISNULL(argno))
		fm_null_argument("amount");
	amount = PG_GETARG_INT64(argno);
	fm_check_amount(amount, zero_allowed);
	return amount;
}

TimestampTz
fm_arg_timestamp(FunctionCallInfo fcinfo, int argno, const char *what)
{
	TimestampTz ts;

	if (PG_ARGISNULL(argno))
		fm_null_argument(what);
	ts = PG_GETARG_TIMESTAMPTZ(argno);
	fm_check_timestamp(ts);
	return ts;
}

int64
fm_arg_amount_text(FunctionCallInfo fcinfo, int argno, bool zero_allowed)
{
	int64		amount;

	if (PG_ARGISNULL(argno))
		fm_null_argument("amount");
	amount = DatumGetInt64(DirectFunctionCall1(int8in,
											   CStringGetDatum(TextDatumGetCString(PG_GETARG_DATUM(argno)))));
	fm_check_amount(amount, zero_allowed);
	return amount;
}

/* adds the hint of fm_arg_timestamp_text to an error of the input function */
static void
timestamp_text_error_callback(void *arg)
{
	errhint("%s", (const char *) arg);
}

TimestampTz
fm_arg_timestamp_text(FunctionCallInfo fcinfo, int argno, const char *what,
					  const char *hint)
{
	ErrorContextCallback callback;
	TimestampTz ts;

	if (PG_ARGISNULL(argno))
		fm_null_argument(what);
	callback.callback = timestamp_text_error_callback;
	callback.arg = (void *) hint;
	callback.previous = error_context_stack;
	if (hint)
		error_context_stack = &callback;
	ts = DatumGetTimestampTz(DirectFunctionCall3(timestamptz_in,
												 CStringGetDatum(TextDatumGetCString(PG_GETARG_DATUM(argno))),
												 ObjectIdGetDatum(InvalidOid),
												 Int32GetDatum(-1)));
	error_context_stack = callback.previous;
	fm_check_timestamp(ts);
	return ts;
}

void
fm_check_array_length(const char *what, int n, int expected)
{
	if (n != expected)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("%s has %d elements, expected %d", what, n, expected),
				 errdetail("The arrays of one call are parallel: element i of each describes event i.")));
}

/* The elements of array argument argno, which must be one-dimensional. */
void
fm_arg_array_elements(FunctionCallInfo fcinfo, int argno, const char *what, Oid elemtype,
					  Datum **elems, bool **isnull, int *n)
{
	ArrayType  *arr = PG_GETARG_ARRAYTYPE_P(argno);
	int16		typlen;
	bool		typbyval;
	char		typalign;

	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("%s must be a one-dimensional array", what)));
	if (elemtype == TEXTOID)
	{
		typlen = -1;
		typbyval = false;
		typalign = TYPALIGN_INT;
	}
	else if (elemtype == INT4OID)
	{
		typlen = 4;
		typbyval = true;
		typalign = TYPALIGN_INT;
	}
	else if (elemtype == INTERVALOID)
	{
		typlen = sizeof(Interval);
		typbyval = false;
		typalign = TYPALIGN_DOUBLE;
	}
	else
	{
		/* bigint and timestamptz */
		typlen = 8;
		typbyval = FLOAT8PASSBYVAL;
		typalign = TYPALIGN_DOUBLE;
	}
	deconstruct_array(arr, elemtype, typlen, typbyval, typalign, elems, isnull, n);
}

char	  **
fm_arg_text_array(FunctionCallInfo fcinfo, int argno, const char *what, int *n,
				  bool nulls_allowed)
{
	Datum	   *elems;
	bool	   *isnull;
	char	  **out;
	int			i;

	if (PG_ARGISNULL(argno))
		fm_null_argument(what);
	fm_arg_array_elements(fcinfo, argno, what, TEXTOID, &elems, &isnull, n);
	out = palloc(sizeof(char *) * Max(*n, 1));
	for (i = 0; i < *n; i++)
	{
		if (isnull[i])
		{
			if (!nulls_allowed)
				ereport(ERROR,
						(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						 errmsg("%s must not contain NULLs", what)));
			out[i] = NULL;
		}
		else
			out[i] = TextDatumGetCString(elems[i]);
	}
	return out;
}

int64 *
fm_arg_amount_array(FunctionCallInfo fcinfo, int argno, int expected,
					bool zero_allowed)
{
	Datum	   *elems;
	bool	   *isnull;
	int64	   *out;
	int			n,
				i;

	if (PG_ARGISNULL(argno))
		fm_null_argument("amounts");
	fm_arg_array_elements(fcinfo, argno, "amounts", INT8OID, &elems, &isnull, &n);
	fm_check_array_length("amounts", n, expected);
	out = palloc(sizeof(int64) * Max(n, 1));
	for (i = 0; i < n; i++)
	{
		if (isnull[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("amounts must not contain NULLs")));
		out[i] = DatumGetInt64(elems[i]);
		fm_check_amount(out[i], zero_allowed);
	}
	return out;
}

/*
 * A timestamptz array argument of expected elements; a NULL array or
 * element means null_means.  The instants are not checked here: callers
 * check each with fm_check_timestamp in their validation pass.
 */
TimestampTz *
fm_arg_timestamp_array(FunctionCallInfo fcinfo, int argno, const char *what,
					   int expected, TimestampTz null_means)
{
	TimestampTz *out = palloc(sizeof(TimestampTz) * Max(expected, 1));
	Datum	   *elems;
	bool	   *isnull;
	int			n,
				i;

	if (PG_ARGISNULL(argno))
	{
		for (i = 0; i < expected; i++)
			out[i] = null_means;
		return out;
	}
	fm_arg_array_elements(fcinfo, argno, what, TIMESTAMPTZOID, &elems, &isnull, &n);
	fm_check_array_length(what, n, expected);
	for (i = 0; i < n; i++)
		out[i] = isnull[i] ? null_means : DatumGetTimestampTz(elems[i]);
	return out;
}

int
fm_arg_batch_rows(FunctionCallInfo fcinfo, char ***tenants, char ***meters,
				  int64 **amounts, bool zero_allowed)
{
	int			n,
				n2;

	if (PG_ARGISNULL(0))
		fm_null_argument("tenants");
	if (PG_ARGISNULL(1))
		fm_null_argument("meters");
	if (PG_ARGISNULL(2))
		fm_null_argument("amounts");
	*tenants = fm_arg_text_array(fcinfo, 0, "tenants", &n, false);
	*meters = fm_arg_text_array(fcinfo, 1, "meters", &n2, false);
	fm_check_array_length("meters", n2, n);
	*amounts = fm_arg_amount_array(fcinfo, 2, n, zero_allowed);
	return n;
}

char	  **
fm_arg_key_array(FunctionCallInfo fcinfo, int argno, int expected)
{
	char	  **keys;
	int			n;

	if (PG_ARGISNULL(argno))
		return NULL;
	keys = fm_arg_text_array(fcinfo, argno, "idempotency_keys", &n, true);
	fm_check_array_length("idempotency_keys", n, expected);
	return keys;
}

int32 *
fm_arg_int4_array(FunctionCallInfo fcinfo, int argno, const char *what, int expected)
{
	Datum	   *elems;
	bool	   *isnull;
	int32	   *out;
	int			n,
				i;

	if (PG_ARGISNULL(argno))
		return NULL;
	fm_arg_array_elements(fcinfo, argno, what, INT4OID, &elems, &isnull, &n);
	fm_check_array_length(what, n, expected);
	out = palloc(sizeof(int32) * Max(n, 1));
	for (i = 0; i < n; i++)
	{
		if (isnull[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s must not contain NULLs", what)));
		out[i] = DatumGetInt32(elems[i]);
	}
	return out;
}

/*
 * check_tenant(tenant) -> void: the SQL catalog functions' tenant check,
 * this file's, so that both sides raise the same error for the same bound.
 */
PG_FUNCTION_INFO_V1(fm_check_tenant_sql);
Datum
fm_check_tenant_sql(PG_FUNCTION_ARGS)
{
	(void) fm_arg_tenant(fcinfo, 0);
	PG_RETURN_VOID();
}

/*
 * raise_plain(sqlstate, message, detail, hint) -> void: raises the error
 * that a public catalog function caught from its helpers again, with its
 * SQLSTATE, message, detail and hint ('' or NULL: none) and no CONTEXT:
 * the PL/pgSQL helpers it passed through are the extension's business, not
 * the caller's.
 */
PG_FUNCTION_INFO_V1(fm_raise_plain);
Datum
fm_raise_plain(PG_FUNCTION_ARGS)
{
	char	   *state = PG_ARGISNULL(0) ? "XX000" : text_to_cstring(PG_GETARG_TEXT_PP(0));
	char	   *message = PG_ARGISNULL(1) ? "" : text_to_cstring(PG_GETARG_TEXT_PP(1));
	char	   *detail = PG_ARGISNULL(2) ? "" : text_to_cstring(PG_GETARG_TEXT_PP(2));
	char	   *hint = PG_ARGISNULL(3) ? "" : text_to_cstring(PG_GETARG_TEXT_PP(3));

	if (strlen(state) != 5)
		state = "XX000";
	error_context_stack = NULL;
	ereport(ERROR,
			(errcode(MAKE_SQLSTATE(state[0], state[1], state[2], state[3], state[4])),
			 errmsg_internal("%s", message),
			 detail[0] ? errdetail_internal("%s", detail) : 0,
			 hint[0] ? errhint("%s", hint) : 0));
	PG_RETURN_VOID();
}
