/*
 * statements.c
 *	  Prepared SPI statements shared by the accounting calls.
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "catalog/pg_namespace.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/snapmgr.h"
#include "catalog/pg_type.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
#include "access/htup_details.h"

#include "statements.h"

static Oid
schema_oid(void)
{
	return get_namespace_oid("flagmeter", false);
}

Oid
fm_relation_oid(const char *relname)
{
	Oid			relid = get_relname_relid(relname, schema_oid());

	if (!OidIsValid(relid))
		elog(ERROR, "flagmeter table \"%s\" is missing", relname);
	return relid;
}

Oid
fm_counter_type_oid(void)
{
	Oid			typid = GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid,
										CStringGetDatum("quota_counter"),
										ObjectIdGetDatum(schema_oid()));

	if (!OidIsValid(typid))
		elog(ERROR, "type flagmeter.quota_counter is missing");
	return typid;
}

/*
 * The owner of schema flagmeter (the extension's owner).  flagmeter's own
 * statements run as this role, so the roles that call track or consume
 * need EXECUTE on those functions and no privileges on the tables: a
 * caller cannot change limits or read other tenants' rows through them.
 * The statements take only parameters, never caller-supplied SQL.
 */
static Oid
owner_oid(void)
{
	HeapTuple	tuple;
	Oid			owner;

	tuple = SearchSysCache1(NAMESPACEOID, ObjectIdGetDatum(schema_oid()));
	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for schema flagmeter");
	owner = ((Form_pg_namespace) GETSTRUCT(tuple))->nspowner;
	ReleaseSysCache(tuple);
	return owner;
}

static void
fm_prepare(FmStatement *st, Oid counter_type)
{
	Oid			argtypes[FM_STATEMENT_MAX_ARGS];
	SPIPlanPtr	plan;
	int			i;

	for (i = 0; i < st->nargs; i++)
	{
		if (st->argtypes[i] == FM_TYPE_COUNTER)
			argtypes[i] = counter_type;
		else if (st->argtypes[i] == FM_TYPE_COUNTER_ARRAY)
			argtypes[i] = get_array_type(counter_type);
		else
			argtypes[i] = st->argtypes[i];
	}
	plan = SPI_prepare(st->sql, st->nargs, argtypes);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for \"%s\": %s",
			 st->sql, SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "SPI_keepplan failed");
	if (st->plan != NULL)
		SPI_freeplan(st->plan);
	st->plan = plan;
	st->prepared_for = counter_type;
}

static int
execute_as_owner(FmStatement *st, Datum *values, const char *nulls,
				 bool read_only, long count, Snapshot snapshot)
{
	Oid			counter_type = fm_counter_type_oid();
	Oid			saved_user;
	int			saved_context;
	int			rc;

	if (st->plan == NULL || st->prepared_for != counter_type)
		fm_prepare(st, counter_type);

	/* as the owner; an error resets the user at abort */
	GetUserIdAndSecContext(&saved_user, &saved_context);
	SetUserIdAndSecContext(owner_oid(),
						   saved_context | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	if (snapshot != InvalidSnapshot)
		rc = SPI_execute_snapshot(st->plan, values, nulls, snapshot,
								  InvalidSnapshot, read_only, true, count);
	else
		rc = SPI_execute_plan(st->plan, values, nulls, read_only, count);
	SetUserIdAndSecContext(saved_user, saved_context);
	if (rc < 0)
		elog(ERROR, "SPI_execute_plan failed for \"%s\": %s",
			 st->sql, SPI_result_code_string(rc));
	return rc;
}

int
fm_execute(FmStatement *st, Datum *values, const char *nulls,
		   bool read_only, long count)
{
	return execute_as_owner(st, values, nulls, read_only, count, InvalidSnapshot);
}

int
fm_execute_snapshot(FmStatement *st, Datum *values, const char *nulls,
					bool read_only, long count, Snapshot snapshot)
{
	return execute_as_owner(st, values, nulls, read_only, count, snapshot);
}

int
fm_execute_latest(FmStatement *st, Datum *values, const char *nulls, long count)
{
	return execute_as_owner(st, values, nulls, false, count, GetLatestSnapshot());
}

void
fm_period_args(Datum *args, const char *tenant, const char *meter,
			   TimestampTz period_start)
{
	args[0] = CStringGetTextDatum(tenant);
	args[1] = CStringGetTextDatum(meter);
	args[2] = TimestampTzGetDatum(period_start);
}

Datum
fm_text_array(Datum *elems, int n)
{
	return PointerGetDatum(construct_array(elems, n, TEXTOID, -1, false, TYPALIGN_INT));
}

Datum
fm_int8_array(Datum *elems, int n)
{
	return PointerGetDatum(construct_array(elems, n, INT8OID, 8, FLOAT8PASSBYVAL,
										   TYPALIGN_DOUBLE));
}

Datum
fm_timestamptz_array(Datum *elems, int n)
{
	return PointerGetDatum(construct_array(elems, n, TIMESTAMPTZOID, 8, FLOAT8PASSBYVAL,
										   TYPALIGN_DOUBLE));
}
