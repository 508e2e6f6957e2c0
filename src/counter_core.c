/*
 * counter_core.c
 *	  Server-independent quota_counter logic: validation, event addition,
 *	  merge, and the text and binary forms.
 *
 * Every way a counter enters the system (text input, binary receive, the
 * aggregates) ends in fm_counter_validate(), so a stored counter always
 * satisfies the same invariants.  No function here allocates or longjmps;
 * errors are returned as FmResult codes.
 */
#include "counter_core.h"

#include <stdio.h>
#include <string.h>

#define USECS_PER_SEC	INT64_C(1000000)
#define USECS_PER_DAY	INT64_C(86400000000)
/* days from 0000-03-01 (proleptic Gregorian) to 2000-01-01 */
#define DAYS_TO_PG_EPOCH 730425

static bool
add_overflows(int64_t a, int64_t b, int64_t *result)
{
	return __builtin_add_overflow(a, b, result);
}

void
fm_counter_init(FmCounter *c)
{
	memset(c, 0, sizeof(*c));
	c->version = FM_COUNTER_VERSION;
}

/*
 * The invariants of a stored counter.  Returns FM_ERR_RANGE for a negative
 * field and FM_ERR_INCONSISTENT when fields contradict each other; *detail
 * (when detail is not NULL) then says which invariant failed, as a
 * sentence for errdetail.
 */
#define FAIL(code, why) \
	do { if (detail) *detail = (why); return (code); } while (0)

FmResult
fm_counter_validate(const FmCounter *c, const char **detail)
{
	int			i;

	if (c->version != FM_COUNTER_VERSION)
		FAIL(FM_ERR_INCONSISTENT, "Unknown format version.");
	if ((c->flags & ~FM_COUNTER_KNOWN_FLAGS) != 0)
		FAIL(FM_ERR_INCONSISTENT, "Unknown flag bits are set.");
	for (i = 0; i < (int) sizeof(c->reserved); i++)
		if (c->reserved[i] != 0)
			FAIL(FM_ERR_INCONSISTENT, "Reserved bytes are not zero.");

	if (c->used < 0 || c->events < 0 || c->max_amount < 0 || c->latest < 0)
		FAIL(FM_ERR_RANGE, "Counter fields must not be negative.");

	if (c->events == 0 && c->used != 0)
		FAIL(FM_ERR_INCONSISTENT, "A counter with no events cannot have usage.");

	if (c->flags & FM_COUNTER_HAS_LATEST)
	{
		if (c->latest_at < FM_TS_MIN || c->latest_at > FM_TS_MAX)
			FAIL(FM_ERR_TIMESTAMP, "The latest timestamp must lie between years 1 and 9999.");
		if (c->latest > c->max_amount)
			FAIL(FM_ERR_INCONSISTENT, "The latest amount cannot exceed the maximum amount.");
	}
	else if (c->events != 0 || c->max_amount != 0 ||
			 c->latest != 0 || c->latest_at != 0)
		FAIL(FM_ERR_INCONSISTENT, "Without a latest event a counter cannot have events or a maximum.");

	if (c->flags & FM_COUNTER_HAS_LIMIT)
	{
		if (c->limit_value <= 0)
			FAIL(FM_ERR_RANGE, "The limit must be positive.");
	}
	else if (c->limit_value != 0)
		FAIL(FM_ERR_INCONSISTENT, "A limit value is set without the limit flag.");

	return FM_OK;
}

#undef FAIL

/* Does (at, amount) win "latest" over what c holds?  Ties: larger amount. */
static bool
is_later(const FmCounter *c, int64_t at, int64_t amount)
{
	if (!(c->flags & FM_COUNTER_HAS_LATEST))
		return true;
	if (at != c->latest_at)
		return at > c->latest_at;
	return amount > c->latest;
}

/*
 * Add one event.  On error c is left unchanged.
 */
FmResult
fm_counter_add_event(FmCounter *c, int64_t amount, int64_t at)
{
	int64_t		used;
	int64_t		events;

	if (amount < 0)
		return FM_ERR_NEGATIVE_AMOUNT;
	if (at < FM_TS_MIN || at > FM_TS_MAX)
		return FM_ERR_TIMESTAMP;
	if (add_overflows(c->used, amount, &used) ||
		add_overflows(c->events, 1, &events))
		return FM_ERR_RANGE;

	c->used = used;
	c->events = events;
	if (amount > c->max_amount)
		c->max_amount = amount;
	if (is_later(c, at, amount))
	{
		c->latest = amount;
		c->latest_at = at;
		c->flags |= FM_COUNTER_HAS_LATEST;
	}
	return FM_OK;
}

/*
 * into := into + other.  Commutative and associative: sums add, max and
 * latest pick deterministically, and of two limits the smaller (stricter)
 * one is kept.  On error into is left unchanged.
 */
FmResult
fm_counter_merge(FmCounter *into, const FmCounter *other)
{
	int64_t		used;
	int64_t		events;

	if (add_overflows(into->used, other->used, &used) ||
		add_overflows(into->events, other->events, &events))
		return FM_ERR_RANGE;

	into->used = used;
	into->events = events;
	if (other->max_amount > into->max_amount)
		into->max_amount = other->max_amount;
	if ((other->flags & FM_COUNTER_HAS_LATEST) &&
		is_later(into, other->latest_at, other->latest))
	{
		into->latest = other->latest;
		into->latest_at = other->latest_at;
		into->flags |= FM_COUNTER_HAS_LATEST;
	}
	if (other->flags & FM_COUNTER_HAS_LIMIT)
	{
		if (!(into->flags & FM_COUNTER_HAS_LIMIT) ||
			other->limit_value < into->limit_value)
			into->limit_value = other->limit_value;
		into->flags |= FM_COUNTER_HAS_LIMIT;
	}
	return FM_OK;
}

/*
 * Take events back out: amount is their total, nevents how many they were
 * (voided events).  Refuses to go below zero or to leave usage without
 * events: that would mean removing something that was never counted here.
 * max_amount and latest are left as they are.
 */
FmResult
fm_counter_subtract(FmCounter *c, int64_t amount, int64_t nevents)
{
	if (amount < 0 || nevents < 0)
		return FM_ERR_NEGATIVE_AMOUNT;
	if (c->events < nevents || c->used < amount)
		return FM_ERR_INCONSISTENT;
	if (c->events == nevents && c->used != amount)
		return FM_ERR_INCONSISTENT;
	c->events -= nevents;
	c->used -= amount;
	return FM_OK;
}

FmResult
fm_counter_void(FmCounter *c, int64_t amount)
{
	return fm_counter_subtract(c, amount, 1);
}

bool
fm_counter_equal(const FmCounter *a, const FmCounter *b)
{
	return a->flags == b->flags &&
		a->used == b->used &&
		a->events == b->events &&
		a->max_amount == b->max_amount &&
		a->latest == b->latest &&
		a->latest_at == b->latest_at &&
		a->limit_value == b->limit_value;
}

/* ---------------------------------------------------------------------
 * Text form
 *
 *	 used=10 events=3 max=5 latest=2@2026-11-30T10:00:00.5Z limit=100
 *
 * Fields in this order, separated by single spaces; latest is present
 * exactly when the counter has seen an event, limit when one is set.
 * Timestamps are UTC, so the text does not depend on TimeZone or DateStyle.
 * ---------------------------------------------------------------------
 */

/* days since 2000-01-01 for a proleptic Gregorian date (H. Hinnant) */
static int64_t
days_from_civil(int64_t y, int m, int d)
{
	int64_t		era;
	int64_t		yoe;
	int64_t		doy;
	int64_t		doe;

	y -= m <= 2;
	era = (y >= 0 ? y : y - 399) / 400;
	yoe = y - era * 400;
	doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
	doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
	return era * 146097 + doe - DAYS_TO_PG_EPOCH;
}

static void
civil_from_days(int64_t days, int64_t *y, int *m, int *d)
{
	int64_t		z = days + DAYS_TO_PG_EPOCH;
	int64_t		era = (z >= 0 ? z : z - 146096) / 146097;
	int64_t		doe = z - era * 146097;
	int64_t		yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
	int64_t		doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
	int64_t		mp = (5 * doy + 2) / 153;

	*d = (int) (doy - (153 * mp + 2) / 5 + 1);
	*m = (int) (mp < 10 ? mp + 3 : mp - 9);
	*y = yoe + era * 400 + (*m <= 2);
}

static int
days_in_month(int64_t y, int m)
{
	static const int mdays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};

	if (m == 2 && ((y % 4 == 0 && y % 100 != 0) || y % 400 == 0))
		return 29;
	return mdays[m - 1];
}

/* exactly n decimal digits */
static bool
take_digits(const char **p, int n, int *out)
{
	int			v = 0;
	int			i;

	for (i = 0; i < n; i++)
	{
		char		ch = (*p)[i];

		if (ch < '0' || ch > '9')
			return false;
		v = v * 10 + (ch - '0');
	}
	*p += n;
	*out = v;
	return true;
}

static bool
take_char(const char **p, char ch)
{
	if (**p != ch)
		return false;
	(*p)++;
	return true;
}

/*
 * Parse YYYY-MM-DDTHH:MM:SS[.ffffff]Z at *p, advancing *p.
 */
static FmResult
parse_timestamp(const char **p, int64_t *out)
{
	const char *s = *p;
	int			year,
				month,
				day,
				hour,
				minute,
				second;
	int64_t		usec = 0;

	if (!take_digits(&s, 4, &year) || !take_char(&s, '-') ||
		!take_digits(&s, 2, &month) || !take_char(&s, '-') ||
		!take_digits(&s, 2, &day) || !take_char(&s, 'T') ||
		!take_digits(&s, 2, &hour) || !take_char(&s, ':') ||
		!take_digits(&s, 2, &minute) || !take_char(&s, ':') ||
		!take_digits(&s, 2, &second))
		return FM_ERR_SYNTAX;
	if (*s == '.')
	{
		int			ndigits = 0;

		s++;
		while (*s >= '0' && *s <= '9')
		{
			if (++ndigits > 6)
				return FM_ERR_SYNTAX;
			usec = usec * 10 + (*s - '0');
			s++;
		}
		if (ndigits == 0)
			return FM_ERR_SYNTAX;
		while (ndigits++ < 6)
			usec *= 10;
	}
	if (!take_char(&s, 'Z'))
		return FM_ERR_SYNTAX;

	if (year < 1 || month < 1 || month > 12 || day < 1 ||
		day > days_in_month(year, month) ||
		hour > 23 || minute > 59 || second > 59)
		return FM_ERR_TIMESTAMP;

	*out = days_from_civil(year, month, day) * USECS_PER_DAY +
		((int64_t) hour * 3600 + minute * 60 + second) * USECS_PER_SEC + usec;
	*p = s;
	return FM_OK;
}

/*
 * Format a timestamp in the form parse_timestamp reads; the fraction is
 * printed only when non-zero, without trailing zeros.
 */
int
fm_format_timestamp(int64_t ts, char *buf, size_t buflen)
{
	int64_t		days = ts / USECS_PER_DAY;
	int64_t		rem = ts % USECS_PER_DAY;
	int64_t		y;
	int			m,
				d;
	int			secs;
	int			usec;
	int			n;

	if (rem < 0)
	{
		rem += USECS_PER_DAY;
		days--;
	}
	civil_from_days(days, &y, &m, &d);
	secs = (int) (rem / USECS_PER_SEC);
	usec = (int) (rem % USECS_PER_SEC);

	n = snprintf(buf, buflen, "%04lld-%02d-%02dT%02d:%02d:%02d",
				 (long long) y, m, d, secs / 3600, (secs / 60) % 60, secs % 60);
	if (usec != 0 && n > 0 && (size_t) n < buflen)
	{
		char		frac[8];
		int			len;

		snprintf(frac, sizeof(frac), "%06d", usec);
		len = 6;
		while (frac[len - 1] == '0')
			len--;
		frac[len] = '\0';
		n += snprintf(buf + n, buflen - n, ".%s", frac);
	}
	if (n > 0 && (size_t) n < buflen)
		n += snprintf(buf + n, buflen - n, "Z");
	return n;
}

/*
 * Parse "name=" followed by a non-negative decimal int64.  A minus sign is
 * read so that "-1" reports a range error, not a syntax error.
 */
static FmResult
take_field(const char **p, const char *name, int64_t *out)
{
	const char *s = *p;
	size_t		len = strlen(name);
	bool		negative = false;
	uint64_t	v = 0;
	int			ndigits = 0;

	if (strncmp(s, name, len) != 0 || s[len] != '=')
		return FM_ERR_SYNTAX;
	s += len + 1;
	if (*s == '-')
	{
		negative = true;
		s++;
	}
	while (*s >= '0' && *s <= '9')
	{
		if (v > (UINT64_C(1) << 63) / 10)
			return FM_ERR_RANGE;
		v = v * 10 + (uint64_t) (*s - '0');
		ndigits++;
		s++;
	}
	if (ndigits == 0)
		return FM_ERR_SYNTAX;
	if (negative || v > (uint64_t) INT64_MAX)
		return FM_ERR_RANGE;
	*out = (int64_t) v;
	*p = s;
	return FM_OK;
}

static bool
at_field(const char *s, const char *name)
{
	size_t		len = strlen(name);

	return strncmp(s, name, len) == 0 && s[len] == '=';
}

FmResult
fm_counter_parse(const char *text, FmCounter *out, const char **detail)
{
	const char *p = text;
	FmCounter	c;
	FmResult	r;

	fm_counter_init(&c);

	if ((r = take_field(&p, "used", &c.used)) != FM_OK)
		return r;
	if (!take_char(&p, ' '))
		return FM_ERR_SYNTAX;
	if ((r = take_field(&p, "events", &c.events)) != FM_OK)
		return r;
	if (!take_char(&p, ' '))
		return FM_ERR_SYNTAX;
	if ((r = take_field(&p, "max", &c.max_amount)) != FM_OK)
		return r;

	if (*p == ' ' && at_field(p + 1, "latest"))
	{
		p++;
		if ((r = take_field(&p, "latest", &c.latest)) != FM_OK)
			return r;
		if (!take_char(&p, '@'))
			return FM_ERR_SYNTAX;
		if ((r = parse_timestamp(&p, &c.latest_at)) != FM_OK)
			return r;
		c.flags |= FM_COUNTER_HAS_LATEST;
	}
	if (*p == ' ' && at_field(p + 1, "limit"))
	{
		p++;
		if ((r = take_field(&p, "limit", &c.limit_value)) != FM_OK)
			return r;
		c.flags |= FM_COUNTER_HAS_LIMIT;
	}
	if (*p != '\0')
		return FM_ERR_SYNTAX;

	if ((r = fm_counter_validate(&c, detail)) != FM_OK)
		return r;
	*out = c;
	return FM_OK;
}

void
fm_counter_format(const FmCounter *c, char *buf, size_t buflen)
{
	int			n;

	n = snprintf(buf, buflen, "used=%lld events=%lld max=%lld",
				 (long long) c->used, (long long) c->events,
				 (long long) c->max_amount);
	if ((c->flags & FM_COUNTER_HAS_LATEST) && n > 0 && (size_t) n < buflen)
	{
		n += snprintf(buf + n, buflen - n, " latest=%lld@", (long long) c->latest);
		if (n > 0 && (size_t) n < buflen)
			n += fm_format_timestamp(c->latest_at, buf + n, buflen - n);
	}
	if ((c->flags & FM_COUNTER_HAS_LIMIT) && n > 0 && (size_t) n < buflen)
		snprintf(buf + n, buflen - n, " limit=%lld", (long long) c->limit_value);
}

/* ---------------------------------------------------------------------
 * Binary form: version, flags, then the six int64 fields big-endian.
 * ---------------------------------------------------------------------
 */
static void
put_int64(unsigned char *buf, int64_t v)
{
	uint64_t	u = (uint64_t) v;
	int			i;

	for (i = 7; i >= 0; i--)
	{
		buf[i] = (unsigned char) (u & 0xff);
		u >>= 8;
	}
}

static int64_t
get_int64(const unsigned char *buf)
{
	uint64_t	u = 0;
	int			i;

	for (i = 0; i < 8; i++)
		u = (u << 8) | buf[i];
	return (int64_t) u;
}

void
fm_counter_to_wire(const FmCounter *c, unsigned char *buf)
{
	buf[0] = c->version;
	buf[1] = c->flags;
	put_int64(buf + 2, c->used);
	put_int64(buf + 10, c->events);
	put_int64(buf + 18, c->max_amount);
	put_int64(buf + 26, c->latest);
	put_int64(buf + 34, c->latest_at);
	put_int64(buf + 42, c->limit_value);
}

FmResult
fm_counter_from_wire(const unsigned char *buf, size_t len, FmCounter *out,
					 const char **detail)
{
	FmCounter	c;
	FmResult	r;

	if (len != FM_COUNTER_WIRE_SIZE)
	{
		if (detail)
			*detail = "A binary quota_counter is 50 bytes long.";
		return FM_ERR_SYNTAX;
	}
	fm_counter_init(&c);
	c.version = buf[0];
	c.flags = buf[1];
	c.used = get_int64(buf + 2);
	c.events = get_int64(buf + 10);
	c.max_amount = get_int64(buf + 18);
	c.latest = get_int64(buf + 26);
	c.latest_at = get_int64(buf + 34);
	c.limit_value = get_int64(buf + 42);
	if ((r = fm_counter_validate(&c, detail)) != FM_OK)
		return r;
	*out = c;
	return FM_OK;
}
