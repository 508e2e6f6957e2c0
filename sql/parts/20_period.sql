-- ---------------------------------------------------------------------------
-- Billing periods: hour, day and week follow the calendar in the tenant's
-- time zone (weeks start on Monday); month and year follow the tenant's
-- anchor instant, clamped at month ends; lifetime is all of time.
-- ---------------------------------------------------------------------------

CREATE FUNCTION flagmeter.period_bounds(
	at timestamptz,
	period text,
	anchor timestamptz,
	timezone text,
	OUT period_start timestamptz,
	OUT period_end timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'fm_period_bounds_sql'
LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.period_bounds(timestamptz, text, timestamptz, text) IS
'[period_start, period_end) of the period (hour, day, week, month, year or lifetime) containing at, in the given time zone; month and year periods start at the local date and time of day of anchor, clamped at month ends (Jan 31 -> Feb 28/29); STABLE because it reads the time zone database';
