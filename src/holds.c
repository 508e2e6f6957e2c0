/*
 * holds.c
 *	  The sum of a tenant's active reservations of a meter (see holds.h
 *	  for the locking rule); reservations.c makes and ends them.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "holds.h"
#include "statements.h"

/* the active holds at $3 */
static FmStatement held_stmt = {
	"SELECT COALESCE(pg_catalog.sum(r.amount), 0)::pg_catalog.int8"
	" FROM flagmeter.reservations r"
	" WHERE r.tenant" FM_EQ "$1 AND r.meter" FM_EQ "$2"
	" AND r.settled_at IS NULL AND r.released_at IS NULL"
	" AND r.expires_at OPERATOR(pg_catalog.>) $3",
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

int64
fm_reservations_held(const char *tenant, const char *meter, TimestampTz now,
					 bool read_only)
{
	Datum		args[3];
	bool		isnull;
	int64		held;

	args[0] = CStringGetTextDatum(tenant);
	args[1] = CStringGetTextDatum(meter);
	args[2] = TimestampTzGetDatum(now);
	SPI_connect();
	fm_execute(&held_stmt, args, NULL, read_only, 1);
	held = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1,
									   &isnull));
	SPI_finish();
	return held;
}
