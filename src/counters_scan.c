/*
 * counters_scan.c
 *	  The read-only merge of a period's counter rows, by a direct scan of
 *	  the primary key of flagmeter.counters (pk_scan.c says why), in the
 *	  caller's snapshot, as the read-only statement it replaced did.
 */
#include "postgres.h"

#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "counter.h"
#include "counters_scan.h"
#include "pk_scan.h"

FmCounter
fm_scan_period(const char *tenant, const char *meter, TimestampTz period_start)
{
	/* (tenant, meter, period_start): the leading columns of the key */
	const Datum keys[3] = {CStringGetTextDatum(tenant), CStringGetTextDatum(meter),
	TimestampTzGetDatum(period_start)};
	const Oid	eqprocs[3] = {F_TEXTEQ, F_TEXTEQ, F_TIMESTAMPTZ_EQ};
	FmPkScan	s;
	AttrNumber	counter_attnum;
	FmCounter	total;

	fm_counter_init(&total);
	fm_pk_scan_begin(&s, "counters", 3, keys, eqprocs, GetActiveSnapshot());
	counter_attnum = fm_pk_scan_attnum(&s, "counter");
	while (fm_pk_scan_next(&s))
	{
		bool		isnull;
		Datum		d = slot_getattr(s.slot, counter_attnum, &isnull);

		if (!isnull)
			fm_counter_report(fm_counter_merge(&total, DatumGetFmCounterP(d)));
	}
	fm_pk_scan_end(&s);
	return total;
}
