/*
 * decision.c
 *	  The decision of consume and check: arithmetic, usage levels and the
 *	  encoding (see decision.h).
 */
#include "postgres.h"
#include "fmgr.h"
#include "funcapi.h"

#include "access/htup_details.h"
#include "common/int.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "counter.h"
#include "decision.h"

void
fm_decide(const FmLimit *limit, const FmCounter *current, int64 amount,
		  TimestampTz at, TimestampTz period_end, bool record,
		  FmDecision *decision, FmCounter *after)
{
	FmCounter	next = *current;
	int64		used_after;
	bool		granted;

	fm_counter_report(fm_counter_add_event(&next, amount, at));
	used_after = fm_used_of(&next, limit->aggregation);
	granted = !limit->limited || !limit->hard || used_after <= limit->quota;
	fm_decision_at(limit, granted,
				   (record && granted) ? used_after : fm_used_of(current, limit->aggregation),
				   period_end, decision);
	if (granted && limit->limited && used_after > limit->quota)
		decision->reason = FM_REASON_OVER_SOFT_LIMIT;
	if (after)
		*after = next;
}

void
fm_decision_at(const FmLimit *limit, bool granted, int64 used,
			   TimestampTz period_end, FmDecision *decision)
{
	decision->granted = granted;
	decision->used = used;
	decision->limited = limit->limited;
	decision->quota = limit->quota;
	decision->remaining = 0;
	decision->overage = 0;
	if (limit->limited)
	{
		if (used < limit->quota)
			decision->remaining = limit->quota - used;
		else
			decision->overage = used - limit->quota;
	}
	decision->resets = limit->period != FM_PERIOD_LIFETIME;
	decision->resets_at = period_end;
	/* without credit grants the balance is the quota's (grants.c adds theirs) */
	decision->from_grants = 0;
	decision->has_balance = limit->limited;
	decision->balance = decision->remaining;
	decision->retry_after = -1;
	if (!limit->limited)
		decision->reason = FM_REASON_UNLIMITED;
	else if (!granted)
		decision->reason = FM_REASON_QUOTA_EXCEEDED;
	else if (used > limit->quota)
		decision->reason = FM_REASON_OVER_SOFT_LIMIT;
	else
		decision->reason = FM_REASON_OK;
}

void
fm_decision_refused_with_others(FmDecision *decision)
{
	if (decision->granted)
		decision->reason = FM_REASON_OTHER_METER_REFUSED;
	decision->granted = false;
}

void
fm_decision_rate_limited(FmDecision *decision, int64 retry_after)
{
	decision->granted = false;
	decision->reason = FM_REASON_RATE_LIMITED;
	decision->from_grants = 0;
	decision->retry_after = retry_after;
}

/* in FmReason's order */
static const char *const reason_names[] = {
	"ok", "over_soft_limit", "unlimited", "quota_exceeded", "other_meter_refused",
	"rate_limited"
};

static FmReason
reason_from_name(const char *name)
{
	int			i;

	for (i = 0; i < (int) lengthof(reason_names); i++)
		if (strcmp(name, reason_names[i]) == 0)
			return (FmReason) i;
	elog(ERROR, "unknown decision reason \"%s\" in flagmeter.event_keys", name);
	return FM_REASON_OK;		/* keep compiler quiet */
}

bool
fm_threshold_reached(int64 used, int64 quota, int percent)
{
	int64		used100;
	int64		scaled;

	if (pg_mul_s64_overflow(used, 100, &used100))
		return true;
	if (pg_mul_s64_overflow(quota, percent, &scaled))
		return false;
	return used100 >= scaled;
}

/* The least usage that reaches percent of quota (see fm_threshold_reached). */
static int64
threshold_level(int64 quota, int percent)
{
	int64		scaled;
	int64		level;

	if (pg_mul_s64_overflow(quota, percent, &scaled))
		return PG_INT64_MAX;	/* reached only by usage*100 overflowing */
	level = scaled / 100 + (scaled % 100 > 0 ? 1 : 0);
	/* usage * 100 overflowing counts as reached, too */
	return Min(level, PG_INT64_MAX / 100 + 1);
}

int64
fm_next_usage_level(int64 used, int64 quota, bool hard,
					const int *thresholds, int nthresholds)
{
	int64		next = PG_INT64_MAX;
	int			i;

	if (hard && used >= quota)
		return used;
	if (hard)
		next = quota;
	for (i = 0; i < nthresholds; i++)
	{
		int64		level = threshold_level(quota, thresholds[i]);

		if (level > used)
		{
			next = Min(next, level);
			break;				/* ascending */
		}
	}
	return next;
}

void
fm_decision_values(const FmDecision *d, Datum *values, bool *nulls)
{
	values[0] = BoolGetDatum(d->granted);
	values[1] = Int64GetDatum(d->used);
	values[2] = Int64GetDatum(d->quota);
	values[3] = Int64GetDatum(d->remaining);
	values[4] = TimestampTzGetDatum(d->resets_at);
	values[5] = Int64GetDatum(d->overage);
	values[6] = CStringGetTextDatum(reason_names[d->reason]);
	values[7] = Int64GetDatum(d->from_grants);
	values[8] = Int64GetDatum(d->balance);
	nulls[0] = nulls[1] = nulls[6] = nulls[7] = false;
	nulls[2] = nulls[3] = nulls[5] = !d->limited;
	nulls[4] = !d->resets;
	nulls[8] = !d->has_balance;
}

void
fm_decision_from_row(HeapTuple row, TupleDesc desc, int first, FmDecision *d)
{
	bool		isnull;
	Datum		v;

	d->granted = DatumGetBool(SPI_getbinval(row, desc, first, &isnull));
	v = SPI_getbinval(row, desc, first + 1, &isnull);
	d->used = isnull ? 0 : DatumGetInt64(v);
	v = SPI_getbinval(row, desc, first + 2, &isnull);
	d->limited = !isnull;
	d->quota = isnull ? 0 : DatumGetInt64(v);
	v = SPI_getbinval(row, desc, first + 3, &isnull);
	d->remaining = isnull ? 0 : DatumGetInt64(v);
	v = SPI_getbinval(row, desc, first + 4, &isnull);
	d->resets = !isnull;
	d->resets_at = isnull ? 0 : DatumGetTimestampTz(v);
	v = SPI_getbinval(row, desc, first + 5, &isnull);
	d->overage = isnull ? 0 : DatumGetInt64(v);
	v = SPI_getbinval(row, desc, first + 6, &isnull);
	d->reason = reason_from_name(TextDatumGetCString(v));
	v = SPI_getbinval(row, desc, first + 7, &isnull);
	d->from_grants = isnull ? 0 : DatumGetInt64(v);
	v = SPI_getbinval(row, desc, first + 8, &isnull);
	d->has_balance = !isnull;
	d->balance = isnull ? 0 : DatumGetInt64(v);
	d->retry_after = -1;
}

/*
 * The tuple descriptor of flagmeter.decision, blessed, kept for the call
 * site (fn_extra) so that check and consume do not look the type up on
 * every call.
 */
TupleDesc
fm_decision_desc(FunctionCallInfo fcinfo)
{
	TupleDesc	desc = (TupleDesc) fcinfo->flinfo->fn_extra;

	if (desc == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);

		if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
			elog(ERROR, "function must return flagmeter.decision");
		desc = BlessTupleDesc(CreateTupleDescCopy(desc));
		MemoryContextSwitchTo(old);
		fcinfo->flinfo->fn_extra = desc;
	}
	return desc;
}

void
fm_decision_columns(const FmDecision *d, Datum *values, bool *nulls)
{
	Datum		fields[FM_DECISION_FIELDS];
	bool		field_nulls[FM_DECISION_FIELDS];

	/*
	 * the type's order: granted .. overage, meter, reason .. balance,
	 * retry_after
	 */
	fm_decision_values(d, fields, field_nulls);
	memcpy(values, fields, sizeof(Datum) * 6);
	memcpy(nulls, field_nulls, sizeof(bool) * 6);
	values[6] = CStringGetTextDatum(d->meter);
	nulls[6] = false;
	memcpy(values + 7, fields + 6, sizeof(Datum) * (FM_DECISION_FIELDS - 6));
	memcpy(nulls + 7, field_nulls + 6, sizeof(bool) * (FM_DECISION_FIELDS - 6));
	values[FM_DECISION_FIELDS + 1] = d->retry_after < 0 ? (Datum) 0 :
		IntervalPGetDatum(fm_interval_of_usecs(d->retry_after));
	nulls[FM_DECISION_FIELDS + 1] = d->retry_after < 0;
}

HeapTuple
fm_decision_tuple(TupleDesc desc, const FmDecision *d)
{
	Datum		values[FM_DECISION_COLUMNS];
	bool		nulls[FM_DECISION_COLUMNS];

	fm_decision_columns(d, values, nulls);
	return heap_form_tuple(desc, values, nulls);
}
