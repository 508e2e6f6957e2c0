/*
 * usage_rows.c
 *	  The rows usage lives in, read and locked through SPI (see
 *	  usage_rows.h), and the transaction id flagmeter.events records.
 */
#include "postgres.h"
#include "fmgr.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/xid8.h"

#include "counter.h"
#include "usage_rows.h"

static FmStatement read_period_stmt = {
	"SELECT counter, stripe FROM flagmeter.counters"
	" WHERE tenant" FM_EQ "$1 AND meter" FM_EQ "$2 AND period_start" FM_EQ "$3",
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

static FmStatement read_stripe0_stmt = {
	FM_STRIPE0_SELECT,
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

static FmStatement lock_stripe0_stmt = {
	FM_STRIPE0_SELECT " FOR UPDATE",
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

static FmStatement create_stripe0_stmt = {
	"INSERT INTO flagmeter.counters (tenant, meter, period_start, stripe, counter)"
	" VALUES ($1, $2, $3, 0, 'used=0 events=0 max=0')"
	" ON CONFLICT (tenant, meter, period_start, stripe) DO NOTHING",
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

/*
 * xid_int(xid8) -> bigint: a transaction id as flagmeter.events.xid stores
 * it.  FullTransactionIds stay far below 2^63 (the epoch would have to pass
 * 2^31); the largest xid8 maps to the largest bigint, so that "up to the
 * end" bounds keep their meaning.
 */
PG_FUNCTION_INFO_V1(fm_xid_int);
Datum
fm_xid_int(PG_FUNCTION_ARGS)
{
	uint64		xid = U64FromFullTransactionId(PG_GETARG_FULLTRANSACTIONID(0));

	PG_RETURN_INT64(xid > (uint64) PG_INT64_MAX ? PG_INT64_MAX : (int64) xid);
}

void
fm_lock_counters_for_write(void)
{
	LockRelationOid(fm_relation_oid("counters"), RowExclusiveLock);
}

void
fm_period_args(Datum *args, const char *tenant, const char *meter,
			   TimestampTz period_start)
{
	args[0] = CStringGetTextDatum(tenant);
	args[1] = CStringGetTextDatum(meter);
	args[2] = TimestampTzGetDatum(period_start);
}

FmCounter
fm_merge_result_rows(void)
{
	FmCounter	total = fm_empty_counter();
	uint64		i;

	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		Datum		d = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
									  1, &isnull);

		if (!isnull)
			fm_counter_report(fm_counter_merge(&total, DatumGetFmCounterP(d)));
	}
	return total;
}

FmCounter
fm_read_period(const char *tenant, const char *meter, TimestampTz period_start)
{
	Datum		args[3];

	fm_period_args(args, tenant, meter, period_start);
	fm_execute(&read_period_stmt, args, NULL, false, 0);
	return fm_merge_result_rows();
}

FmCounter
fm_read_stripe0(Datum *args)
{
	fm_execute(&read_stripe0_stmt, args, NULL, false, 0);
	return fm_merge_result_rows();
}

void
fm_create_stripe0(Datum *args)
{
	fm_execute(&create_stripe0_stmt, args, NULL, false, 0);
}

void
fm_lock_stripe0(const char *tenant, const char *meter, TimestampTz period_start)
{
	Datum		args[3];

	fm_period_args(args, tenant, meter, period_start);
	fm_execute(&lock_stripe0_stmt, args, NULL, false, 0);
	if (SPI_processed == 0)
	{
		fm_create_stripe0(args);
		fm_execute(&lock_stripe0_stmt, args, NULL, false, 0);
		if (SPI_processed != 1)
			elog(ERROR, "could not lock the counter of tenant \"%s\" meter \"%s\"",
				 tenant, meter);
	}
}
