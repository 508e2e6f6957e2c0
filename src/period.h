/*
 * period.h
 *	  Billing periods: the span of time a limit is counted over.
 *
 * hour, day and week follow the calendar in the tenant's time zone (weeks
 * start on Monday); month and year follow the tenant's anchor instant,
 * clamped at month ends; lifetime is all of time.  Every function here
 * raises an error with a SQLSTATE on bad input and never returns a period
 * that does not contain the instant asked about.
 */
#ifndef FLAGMETER_PERIOD_H
#define FLAGMETER_PERIOD_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "pgtime.h"

typedef enum FmPeriodKind
{
	FM_PERIOD_HOUR,
	FM_PERIOD_DAY,
	FM_PERIOD_WEEK,
	FM_PERIOD_MONTH,
	FM_PERIOD_YEAR,
	FM_PERIOD_LIFETIME
} FmPeriodKind;

/*
 * The kind named by name ("hour" ... "lifetime", lower case only); an
 * unknown name is an error (22023) whose hint lists the valid ones.
 */
extern FmPeriodKind fm_period_kind_from_name(const char *name);
extern const char *fm_period_kind_name(FmPeriodKind kind);

/*
 * The time zone called name, as pg_tzset() knows it (IANA names, case
 * insensitive; POSIX zone specifications).  Unknown, empty, overlong and
 * leap-second names are errors (22023).  The result is cached by pg_tzset
 * for the life of the backend and must not be freed.
 */
extern pg_tz *fm_lookup_timezone(const char *name);

/*
 * The same, refusing (22023) what is not the name of a zone of the time
 * zone database (pg_timezone_names), such as the POSIX specification
 * "+05:30", which PostgreSQL reads as UTC-05:30: for the zones flagmeter
 * stores and groups by.  The first call in a backend reads the database's
 * list of names.
 */
extern pg_tz *fm_lookup_zone_name(const char *name);

/*
 * Sets [*start, *end) to the period of kind containing at, in time zone
 * tz: always *start <= at < *end, and periods tile time (the period of
 * *start is the same period; the period of *end starts at *end).
 *
 * anchor is the tenant's billing anchor; month and year periods start at
 * its local date and time of day, the day clamped to the length of the
 * month.  Local times that do not exist or are ambiguous (DST changes)
 * resolve as timestamptz input does (DetermineTimeZoneOffset).  lifetime
 * is (-infinity, infinity).
 *
 * at and anchor must be finite, and the bounds representable, or this
 * raises 22008 "timestamp out of range".
 */
extern void fm_period_bounds(FmPeriodKind kind, TimestampTz anchor, pg_tz *tz,
							 TimestampTz at,
							 TimestampTz *start, TimestampTz *end);

/*
 * A duration in microseconds as an interval (time only, so that it prints
 * as 00:00:01.5 rather than in days), palloc'd.
 */
extern Interval *fm_interval_of_usecs(int64 usecs);

#endif							/* FLAGMETER_PERIOD_H */
