/*
 * period.c
 *	  Billing periods in the tenant's time zone, and their SQL interface
 *	  flagmeter.period_bounds().
 *
 * Calendar periods (day, week, month, year) start at a local date and time
 * of day.  Those are converted to UTC with DetermineTimeZoneOffset(), the
 * rule timestamptz input uses, so a local time that does not exist (DST
 * gap) counts with the offset in force before the change, and an ambiguous
 * one (DST overlap) as its later occurrence.  A boundary converted that way
 * can land after the instant asked about, so the search steps to the
 * neighbouring boundary until start <= at < end.
 *
 * Hours are cut from the wall clock at the instant itself, and also where
 * the UTC offset changes, so they never convert local times at all.
 *
 * All of this depends on the time zone database: STABLE, not IMMUTABLE.
 */
#include "postgres.h"
#include "fmgr.h"

#include <limits.h>

#include "access/htup_details.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "period.h"

static const char *const fm_period_names[] = {
	[FM_PERIOD_HOUR] = "hour",
	[FM_PERIOD_DAY] = "day",
	[FM_PERIOD_WEEK] = "week",
	[FM_PERIOD_MONTH] = "month",
	[FM_PERIOD_YEAR] = "year",
	[FM_PERIOD_LIFETIME] = "lifetime",
};

/*
 * What a calendar period's boundaries are computed from.  A boundary is
 * numbered by a Julian day (day, week) or by a month number, year * 12 +
 * month - 1 (month, year).
 */
typedef struct FmCalendar
{
	FmPeriodKind kind;
	pg_tz	   *tz;
	int			step;			/* distance between boundary numbers */
	/* month and year only: the anchor in local time */
	TimestampTz anchor;
	int64		anchor_month;	/* month number of the anchor's local date */
	int			anchor_mon;		/* its month of the year, 1-12 */
	int			anchor_mday;
	int64		anchor_time;	/* local time of day, microseconds */
} FmCalendar;

/* Never returns (not declared noreturn: the spelling differs in 15 and 18). */
static void
fm_timestamp_out_of_range(const char *detail)
{
	ereport(ERROR,
			(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
			 errmsg("timestamp out of range"),
			 detail ? errdetail_internal("%s", detail) : 0));
}

FmPeriodKind
fm_period_kind_from_name(const char *name)
{
	int			i;

	for (i = 0; i < (int) lengthof(fm_period_names); i++)
	{
		if (strcmp(name, fm_period_names[i]) == 0)
			return (FmPeriodKind) i;
	}
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("invalid period \"%s\"", name),
			 errhint("Valid periods are \"hour\", \"day\", \"week\", \"month\", \"year\" and \"lifetime\".")));
	pg_unreachable();
}

const char *
fm_period_kind_name(FmPeriodKind kind)
{
	return fm_period_names[kind];
}

pg_tz *
fm_lookup_timezone(const char *name)
{
	size_t		len = strlen(name);
	pg_tz	   *tz;

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("time zone name must not be empty"),
				 errhint("Use a name from pg_timezone_names, such as \"UTC\" or \"Europe/Berlin\".")));
	/* pg_tzset() would refuse it too, but quietly, as if it were unknown */
	if (len > TZ_STRLEN_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("time zone name is too long"),
				 errdetail("Time zone names are at most %d bytes long.",
						   TZ_STRLEN_MAX)));

	tz = pg_tzset(name);
	if (tz == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("time zone \"%s\" not recognized", name),
				 errhint("Use a name from pg_timezone_names, such as \"UTC\" or \"Europe/Berlin\".")));
	/* the "right/" zones count leap seconds, which timestamps cannot hold */
	if (!pg_tz_acceptable(tz))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("time zone \"%s\" appears to use leap seconds", name),
				 errdetail("PostgreSQL does not support leap seconds.")));
	return tz;
}

/* The longest zone name kept (the longest in the database has 32 bytes). */
#define FM_ZONE_NAME_MAX 64

/* The names of pg_timezone_names, in upper case, read once per backend. */
static HTAB *zone_names = NULL;

static void
upper_zone_name(const char *name, char *upper)
{
	int			i;

	for (i = 0; name[i] && i < FM_ZONE_NAME_MAX - 1; i++)
		upper[i] = pg_toupper((unsigned char) name[i]);
	upper[i] = '\0';
}

static void
load_zone_names(void)
{
	HASHCTL		ctl;
	HTAB	   *names;
	pg_tzenum  *dir;
	pg_tz	   *tz;

	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = FM_ZONE_NAME_MAX;
	ctl.entrysize = FM_ZONE_NAME_MAX;
	ctl.hcxt = TopMemoryContext;
	names = hash_create("flagmeter zone names", 1024, &ctl,
						HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	dir = pg_tzenumerate_start();
	while ((tz = pg_tzenumerate_next(dir)) != NULL)
	{
		const char *name = pg_get_timezone_name(tz);
		char		upper[FM_ZONE_NAME_MAX];

		if (strlen(name) >= FM_ZONE_NAME_MAX)
			continue;
		upper_zone_name(name, upper);
		(void) hash_search(names, upper, HASH_ENTER, NULL);
	}
	pg_tzenumerate_end(dir);
	zone_names = names;
}

pg_tz *
fm_lookup_zone_name(const char *name)
{
	pg_tz	   *tz = fm_lookup_timezone(name);
	char		upper[FM_ZONE_NAME_MAX];
	bool		found = false;

	if (zone_names == NULL)
		load_zone_names();
	if (strlen(name) < FM_ZONE_NAME_MAX)
	{
		upper_zone_name(name, upper);
		(void) hash_search(zone_names, upper, HASH_FIND, &found);
	}
	if (!found)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("time zone \"%s\" is not a zone name", name),
				 errdetail("PostgreSQL reads it as a POSIX time zone specification, whose offsets "
						   "count hours west of UTC (\"+05:30\" is UTC-05:30) and which follows no "
						   "zone's daylight-saving rules."),
				 errhint("Use a name from pg_timezone_names, such as \"Asia/Kolkata\" or \"UTC\".")));
	return tz;
}

/*
 * check_timezone(timezone) -> void: the check of the zones assign_plan
 * stores and usage_series groups by.
 */
PG_FUNCTION_INFO_V1(fm_check_timezone);
Datum
fm_check_timezone(PG_FUNCTION_ARGS)
{
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("time zone must not be NULL")));
	(void) fm_lookup_zone_name(text_to_cstring(PG_GETARG_TEXT_PP(0)));
	PG_RETURN_VOID();
}

/* Floor division: the calendar extends to before 2000 (negative values). */
static inline int64
fm_floor_div(int64 a, int64 b)
{
	int64		q = a / b;

	if ((a % b) != 0 && ((a < 0) != (b < 0)))
		q--;
	return q;
}

/* t in local time in tz; returns the UTC offset in seconds east of UTC. */
static long
fm_local_time(TimestampTz t, pg_tz *tz, struct pg_tm *tm, fsec_t *fsec)
{
	int			tzoff;

	if (timestamp2tm(t, &tzoff, tm, fsec, NULL, tz) != 0)
		fm_timestamp_out_of_range(NULL);
	return -(long) tzoff;
}

static long
fm_utc_offset(TimestampTz t, pg_tz *tz)
{
	struct pg_tm tm;
	fsec_t		fsec;

	return fm_local_time(t, tz, &tm, &fsec);
}

/*
 * The instant of a local date and time of day in tz, as timestamptz input
 * reads it.
 */
static TimestampTz
fm_local_to_utc(int year, int month, int mday, int64 time_of_day, pg_tz *tz)
{
	struct pg_tm tm;
	fsec_t		fsec;
	int			tzoff;
	TimestampTz result;

	memset(&tm, 0, sizeof(tm));
	tm.tm_year = year;
	tm.tm_mon = month;
	tm.tm_mday = mday;
	tm.tm_hour = (int) (time_of_day / USECS_PER_HOUR);
	tm.tm_min = (int) ((time_of_day / USECS_PER_MINUTE) % MINS_PER_HOUR);
	tm.tm_sec = (int) ((time_of_day / USECS_PER_SEC) % SECS_PER_MINUTE);
	fsec = (fsec_t) (time_of_day % USECS_PER_SEC);

	/* an out-of-range date gives offset 0 here and fails just below */
	tzoff = DetermineTimeZoneOffset(&tm, tz);
	if (tm2timestamp(&tm, fsec, &tzoff, &result) != 0)
		fm_timestamp_out_of_range(NULL);
	return result;
}

/*
 * The first whole second in (lo, hi] whose UTC offset is the one at hi;
 * the offset at lo must differ.  Offsets change on whole seconds, so the
 * answer exists and lies in (lo, hi].
 */
static TimestampTz
fm_offset_change(TimestampTz lo, TimestampTz hi, pg_tz *tz)
{
	long		target = fm_utc_offset(hi, tz);
	int64		lo_s = fm_floor_div(lo, USECS_PER_SEC);
	int64		hi_s = fm_floor_div(hi, USECS_PER_SEC);

	Assert(lo_s < hi_s);
	while (hi_s - lo_s > 1)
	{
		int64		mid = lo_s + (hi_s - lo_s) / 2;

		if (fm_utc_offset(mid * USECS_PER_SEC, tz) == target)
			hi_s = mid;
		else
			lo_s = mid;
	}
	return hi_s * USECS_PER_SEC;
}

/*
 * The wall-clock hour containing at: from the last full hour on the local
 * clock at at's own UTC offset, so both hours of a DST fall-back are
 * periods of their own and :30 and :45 zones cut hours where their clocks
 * do.  Where the offset changes inside an hour (Australia/Lord_Howe's
 * half-hour DST, Pacific/Chatham's changes at :45) the hour is cut there
 * too: otherwise neighbouring hours would overlap.  Elsewhere end = start +
 * 1 hour.  An offset that changes and changes back within one hour is not
 * looked for; no zone has done that.
 */
static void
fm_hour_bounds(pg_tz *tz, TimestampTz at, TimestampTz *start, TimestampTz *end)
{
	long		off = fm_utc_offset(at, tz);
	int64		into = (at + off * USECS_PER_SEC) % USECS_PER_HOUR;
	TimestampTz s;
	TimestampTz e;

	if (into < 0)
		into += USECS_PER_HOUR;
	s = at - into;
	e = s + USECS_PER_HOUR;
	if (!IS_VALID_TIMESTAMP(s) || !IS_VALID_TIMESTAMP(e))
		fm_timestamp_out_of_range(NULL);

	if (fm_utc_offset(s, tz) != off)
		s = fm_offset_change(s, at, tz);
	if (fm_utc_offset(e - 1, tz) != off)
		e = fm_offset_change(at, e - 1, tz);

	*start = s;
	*end = e;
}

/* The start of the calendar period numbered n (see FmCalendar). */
static TimestampTz
fm_calendar_boundary(const FmCalendar *cal, int64 n)
{
	int			year;
	int			month;
	int			mday;

	if (cal->kind == FM_PERIOD_DAY || cal->kind == FM_PERIOD_WEEK)
	{
		if (n < 0 || n > INT_MAX)
			fm_timestamp_out_of_range(NULL);
		j2date((int) n, &year, &month, &mday);
		return fm_local_to_utc(year, month, mday, 0, cal->tz);
	}

	/*
	 * The anchor's own occurrence is the anchor itself, even when its local
	 * time is ambiguous and would read back as the other occurrence: a
	 * subscription starts a period at the instant it starts.
	 */
	if (n == cal->anchor_month)
		return cal->anchor;

	if (fm_floor_div(n, MONTHS_PER_YEAR) < JULIAN_MINYEAR ||
		fm_floor_div(n, MONTHS_PER_YEAR) > JULIAN_MAXYEAR)
		fm_timestamp_out_of_range(NULL);
	year = (int) fm_floor_div(n, MONTHS_PER_YEAR);
	month = (int) (n - (int64) year * MONTHS_PER_YEAR) + 1;
	/* clamp at the month end: Jan 31 -> Feb 28/29, Feb 29 -> Feb 28 */
	mday = Min(cal->anchor_mday, day_tab[isleap(year)][month - 1]);
	return fm_local_to_utc(year, month, mday, cal->anchor_time, cal->tz);
}

/*
 * Boundaries never decrease with their number (they are a local day or
 * more apart, and no zone has moved its clocks by more than a day), so the
 * period of at is the one that starts at the last boundary <= at; an empty
 * period (Pacific/Apia skipped 2011-12-30) is passed over.  Start from the
 * period of at's local date and step; it takes a step or two at most.
 */
static void
fm_calendar_bounds(const FmCalendar *cal, TimestampTz at,
				   TimestampTz *start, TimestampTz *end)
{
	struct pg_tm tm;
	fsec_t		fsec;
	int64		n;
	int			julian;
	TimestampTz s;
	TimestampTz e;

	fm_local_time(at, cal->tz, &tm, &fsec);
	switch (cal->kind)
	{
		case FM_PERIOD_DAY:
			n = date2j(tm.tm_year, tm.tm_mon, tm.tm_mday);
			break;
		case FM_PERIOD_WEEK:
			julian = date2j(tm.tm_year, tm.tm_mon, tm.tm_mday);
			/* j2day() counts from Sunday = 0; weeks start on Monday */
			n = julian - (j2day(julian) + 6) % 7;
			break;
		case FM_PERIOD_MONTH:
			n = (int64) tm.tm_year * MONTHS_PER_YEAR + tm.tm_mon - 1;
			break;
		case FM_PERIOD_YEAR:
			n = (int64) tm.tm_year * MONTHS_PER_YEAR + cal->anchor_mon - 1;
			break;
		default:
			elog(ERROR, "unexpected calendar period kind: %d", (int) cal->kind);
			pg_unreachable();
	}

	s = fm_calendar_boundary(cal, n);
	while (s > at)
	{
		n -= cal->step;
		s = fm_calendar_boundary(cal, n);
	}
	e = fm_calendar_boundary(cal, n + cal->step);
	while (e <= at)
	{
		n += cal->step;
		s = e;
		e = fm_calendar_boundary(cal, n + cal->step);
	}

	*start = s;
	*end = e;
}

void
fm_period_bounds(FmPeriodKind kind, TimestampTz anchor, pg_tz *tz,
				 TimestampTz at, TimestampTz *start, TimestampTz *end)
{
	FmCalendar	cal;

	/* also refuses -infinity and infinity, which are outside the range */
	if (!IS_VALID_TIMESTAMP(at))
		fm_timestamp_out_of_range("Periods are defined for finite timestamps only.");
	if (!IS_VALID_TIMESTAMP(anchor))
		fm_timestamp_out_of_range("The billing anchor must be a finite timestamp.");

	memset(&cal, 0, sizeof(cal));
	cal.kind = kind;
	cal.tz = tz;
	switch (kind)
	{
		case FM_PERIOD_HOUR:
			fm_hour_bounds(tz, at, start, end);
			return;
		case FM_PERIOD_LIFETIME:
			TIMESTAMP_NOBEGIN(*start);
			TIMESTAMP_NOEND(*end);
			return;
		case FM_PERIOD_DAY:
			cal.step = 1;
			break;
		case FM_PERIOD_WEEK:
			cal.step = 7;
			break;
		case FM_PERIOD_MONTH:
		case FM_PERIOD_YEAR:
			{
				struct pg_tm tm;
				fsec_t		fsec;

				cal.step = kind == FM_PERIOD_MONTH ? 1 : MONTHS_PER_YEAR;
				fm_local_time(anchor, tz, &tm, &fsec);
				cal.anchor = anchor;
				cal.anchor_month = (int64) tm.tm_year * MONTHS_PER_YEAR + tm.tm_mon - 1;
				cal.anchor_mon = tm.tm_mon;
				cal.anchor_mday = tm.tm_mday;
				cal.anchor_time = ((int64) tm.tm_hour * MINS_PER_HOUR + tm.tm_min) *
					USECS_PER_MINUTE + (int64) tm.tm_sec * USECS_PER_SEC + fsec;
				break;
			}
		default:
			elog(ERROR, "unrecognized period kind: %d", (int) kind);
	}
	fm_calendar_bounds(&cal, at, start, end);
}

/*
 * period_bounds(at, period, anchor, timezone, OUT period_start, OUT
 * period_end): fm_period_bounds() for SQL.  Validates the period name and
 * the time zone before anything else.
 */
PG_FUNCTION_INFO_V1(fm_period_bounds_sql);
Datum
fm_period_bounds_sql(PG_FUNCTION_ARGS)
{
	TimestampTz at = PG_GETARG_TIMESTAMPTZ(0);
	char	   *period = text_to_cstring(PG_GETARG_TEXT_PP(1));
	TimestampTz anchor = PG_GETARG_TIMESTAMPTZ(2);
	char	   *zone = text_to_cstring(PG_GETARG_TEXT_PP(3));
	FmPeriodKind kind;
	pg_tz	   *tz;
	TimestampTz start;
	TimestampTz end;
	TupleDesc	tupdesc;
	Datum		values[2];
	bool		nulls[2] = {false, false};

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	kind = fm_period_kind_from_name(period);
	tz = fm_lookup_timezone(zone);
	fm_period_bounds(kind, anchor, tz, at, &start, &end);

	values[0] = TimestampTzGetDatum(start);
	values[1] = TimestampTzGetDatum(end);
	tupdesc = BlessTupleDesc(tupdesc);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

Interval *
fm_interval_of_usecs(int64 usecs)
{
	Interval   *result = palloc0(sizeof(Interval));

	result->time = usecs;
	return result;
}
