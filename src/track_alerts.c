/*
 * track_alerts.c
 *	  What a track (and track_batch) announces: thresholds reached and a
 *	  hard limit reached, found without reading the whole period on every
 *	  call (see fm_period_read_due).
 */
#include "postgres.h"
#include "utils/snapmgr.h"

#include "catalog/pg_type.h"
#include "common/int.h"
#include "executor/spi.h"

#include "counter.h"
#include "decision.h"
#include "notify.h"
#include "stripes.h"
#include "pending.h"
#include "track_alerts.h"
#include "usage_rows.h"

/* when the stripe's own usage reaches recheck_at, track reads the period */
static FmStatement set_recheck_stmt = {
	"UPDATE flagmeter.counters SET recheck_at = $5, recheck_for = $6"
	" WHERE tenant" FM_EQ "$1 AND meter" FM_EQ "$2 AND period_start" FM_EQ "$3"
	" AND stripe" FM_EQ "$4 AND ctid" FM_EQ "$7",
	7, {TEXTOID, TEXTOID, TIMESTAMPTZOID, INT2OID, INT8OID, INT4OID, TIDOID}
};

void
fm_announce_usage_level(const char *tenant, const char *meter, const FmLimit *limit,
						TimestampTz period_start, const FmCounter *total)
{
	if (!limit->limited)
		return;
	fm_queue_usage_level(tenant, meter, limit, period_start,
						 fm_used_of(total, limit->aggregation));
}

FmStripeWritten
fm_stripe_written(uint64 r, int first)
{
	HeapTuple	row = SPI_tuptable->vals[r];
	TupleDesc	desc = SPI_tuptable->tupdesc;
	FmStripeWritten w;
	bool		null_at;
	bool		null_for;
	bool		isnull;

	w.stripe = DatumGetInt16(SPI_getbinval(row, desc, first, &isnull));
	w.counter = *DatumGetFmCounterP(SPI_getbinval(row, desc, first + 1, &isnull));
	w.recheck_at = DatumGetInt64(SPI_getbinval(row, desc, first + 2, &null_at));
	w.recheck_for = DatumGetInt32(SPI_getbinval(row, desc, first + 3, &null_for));
	w.has_recheck = !null_at && !null_for;
	ItemPointerCopy((ItemPointer) DatumGetPointer(SPI_getbinval(row, desc, first + 4, &isnull)), &w.ctid);
	return w;
}

/*
 * After track added to a stripe: queue what the period's new usage reaches
 * (thresholds, blocked), reading the whole period only when it may have
 * reached something.
 *
 * Reading every stripe on every track would cost as much as the rest of
 * the call.  Instead a stripe carries recheck_at, a figure of its own
 * usage: the track that takes the stripe to it reads the period.  A read
 * that finds usage S, with L the next level to announce (the next
 * threshold, the hard quota, or the end of the bigint range, so overflow
 * is still caught), lets the stripe grow by (L - S) / max(n,
 * flagmeter.stripes), n being the period's track stripes, before the next
 * read.  With one writer at a time this is exact: the track that reaches L
 * reads and announces it.  With concurrent writers a stripe's figure may
 * date from before another's increments committed, so the crossing is
 * announced by the first track that passes its stripe's figure after it:
 * late by at most the stripes' unspent allowances, each a
 * flagmeter.stripes-th of the distance at its read, one unit when usage is
 * that close (README, "Alerts from track").  Reads get rarer the further
 * usage is from every level: a tenant far below its quota reads about
 * flagmeter.stripes times per stripe each time the distance shrinks by
 * e (2.7x).
 *
 * max: the period's max is the greatest of its stripes', so the stripe
 * itself shows what this event reached, and period_read_due announces it
 * from the stripe.  latest: the period's latest may be in another stripe,
 * so every track reads.
 */
bool
fm_period_read_due(const char *tenant, const char *meter, const FmLimit *limit,
				   TimestampTz period_start, const FmStripeWritten *written)
{
	if (limit->aggregation == FM_AGG_MAX)
	{
		fm_announce_usage_level(tenant, meter, limit, period_start, &written->counter);
		return false;
	}
	if (limit->aggregation == FM_AGG_LATEST)
		return true;
	return !(written->has_recheck && written->recheck_for == limit->fingerprint &&
			 fm_used_of(&written->counter, limit->aggregation) < written->recheck_at);
}

/*
 * The stripe's recheck_at after a read found total, the period having
 * nstripes track stripes; false when the stripe already has it (nothing to
 * write).  Not for latest, which reads every time.
 */
bool
fm_next_recheck(const FmLimit *limit, const FmStripeWritten *written,
				const FmCounter *total, int nstripes, int64 *recheck_at)
{
	int64		own = fm_used_of(&written->counter, limit->aggregation);
	int64		used = fm_used_of(total, limit->aggregation);
	int64		next;

	next = limit->limited ?
		fm_next_usage_level(used, limit->quota, limit->hard,
							limit->thresholds, limit->nthresholds) :
		PG_INT64_MAX;
	if (next <= used)
		*recheck_at = 0;		/* every track looks: own >= 0 */
	else if (pg_add_s64_overflow(own, Max((next - used) / Max(nstripes, fm_stripes), 1),
								 recheck_at))
		*recheck_at = PG_INT64_MAX;
	return !(written->has_recheck && written->recheck_at == *recheck_at &&
			 written->recheck_for == limit->fingerprint);
}

void
fm_announce_after_track(const char *tenant, const char *meter, const FmLimit *limit,
						TimestampTz period_start, const FmStripeWritten *written)
{
	FmCounter	total;
	int64		recheck_at;
	int			nstripes = 0;
	Datum		args[7];
	uint64		i;

	if (!fm_period_read_due(tenant, meter, limit, period_start, written))
		return;

	total = fm_read_period(tenant, meter, period_start);
	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;

		if (DatumGetInt16(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
										2, &isnull)) != 0)
			nstripes++;
	}
	fm_announce_usage_level(tenant, meter, limit, period_start, &total);
	if (limit->aggregation == FM_AGG_LATEST ||
		!fm_next_recheck(limit, written, &total, nstripes, &recheck_at))
		return;

	fm_period_args(args, tenant, meter, period_start);
	args[3] = Int16GetDatum(written->stripe);
	args[4] = Int64GetDatum(recheck_at);
	args[5] = Int32GetDatum(limit->fingerprint);
	args[6] = PointerGetDatum(&written->ctid);
	fm_execute(&set_recheck_stmt, args, NULL, false, 0);
}

void
fm_announce_after_pending_track(const char *tenant, const char *meter,
								const FmLimit *limit, TimestampTz period_start)
{
	Snapshot	snapshot = RegisterSnapshot(GetTransactionSnapshot());
	FmCounter	total = fm_scan_period(tenant, meter, period_start, snapshot);

	UnregisterSnapshot(snapshot);
	fm_announce_usage_level(tenant, meter, limit, period_start, &total);
	fm_pending_set_recheck(tenant, meter, period_start, limit,
						   fm_used_of(&total, limit->aggregation));
}
