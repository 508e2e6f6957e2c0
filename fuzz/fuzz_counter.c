/*
 * fuzz_counter.c
 *	  libFuzzer harness for the quota_counter text and binary forms and the
 *	  operations on them (src/counter_core.c, linked without a server).
 *
 * Besides "no crash, no sanitizer report", every accepted input must keep
 * the promises counter_core.h makes; any broken promise calls abort(), which
 * libFuzzer reports like a crash and saves as an artifact.
 *
 * The first byte of an input, modulo 5, picks what the rest is (so 'A'..'E'
 * in the seed files):
 *	 0 'A'	text form			parse; if accepted: valid, formats within
 *								FM_COUNTER_TEXT_MAX to the canonical text, which
 *								re-parses to an equal counter and is the input
 *								itself when the input was canonical; its binary
 *								form reads back equal
 *	 1 'B'	binary form			from_wire; only 50 bytes can be accepted; if
 *								accepted: valid, to_wire gives back the exact
 *								input bytes, and the text form round-trips
 *	 2 'C'	2 or 3 text forms,	merge of each accepted pair: FM_ERR_RANGE with
 *			one per line		the target unchanged, or a valid counter;
 *								commutative; associative for three
 *	 3 'D'	2 or 3 binary forms	the same, from 50-byte wire forms
 *	 4 'E'	amount, timestamp	add_event: an error with the counter unchanged,
 *			(8 bytes each, big-	or a valid counter equal to a merge with that
 *			endian), then one	single event; voiding the event afterwards
 *			binary form			gives back the original used and events;
 *								and fm_counter_subtract of that amount and
 *								the second number as a count of events is
 *								refused with the counter unchanged or leaves
 *								a valid counter with exactly that much less
 *
 * A crash artifact is replayed with `fuzz/build/fuzz_counter FILE`.
 */
#include "counter_core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond) \
	do { \
		if (!(cond)) \
			violation(#cond, __LINE__); \
	} while (0)

static void
violation(const char *what, int line)
{
	fprintf(stderr, "fuzz_counter.c:%d: property violated: %s\n", line, what);
	abort();
}

static bool
known_result(FmResult r)
{
	switch (r)
	{
		case FM_OK:
		case FM_ERR_SYNTAX:
		case FM_ERR_RANGE:
		case FM_ERR_INCONSISTENT:
		case FM_ERR_NEGATIVE_AMOUNT:
		case FM_ERR_TIMESTAMP:
			return true;
	}
	return false;
}

/* The stored bytes, reserved ones included, are equal. */
static bool
same_bytes(const FmCounter *a, const FmCounter *b)
{
	return memcmp(a, b, sizeof(FmCounter)) == 0;
}

/*
 * Is accepted text in the one spelling fm_counter_format produces?  The
 * parser also accepts leading zeros in a number ("used=007") and trailing
 * zeros in a fraction of a second (".500000", ".0"); nothing else can vary.
 */
static bool
canonical_spelling(const char *s)
{
	const char *p;

	for (p = s; *p; p++)
	{
		if (p[0] == '=' && p[1] == '0' && p[2] >= '0' && p[2] <= '9')
			return false;
		if (p[0] == '.')
		{
			const char *q = p + 1;

			while (*q >= '0' && *q <= '9')
				q++;
			if (q > p + 1 && q[-1] == '0')
				return false;
		}
	}
	return true;
}

/*
 * Format c into a buffer of exactly FM_COUNTER_TEXT_MAX bytes on the heap
 * (so that ASan sees any write past it) and check that it fits.  Also
 * format into a shorter buffer: that must stay inside it, NUL-terminated,
 * and hold a prefix of the full text.  Returns a malloc'd string.
 */
static char *
format_checked(const FmCounter *c, size_t short_len)
{
	char	   *buf = malloc(FM_COUNTER_TEXT_MAX);
	char	   *big = malloc(4 * FM_COUNTER_TEXT_MAX);
	char	   *small;
	size_t		len;

	CHECK(buf != NULL && big != NULL);
	memset(big, 'x', 4 * FM_COUNTER_TEXT_MAX);
	fm_counter_format(c, big, 4 * FM_COUNTER_TEXT_MAX);
	len = strlen(big);
	CHECK(len < FM_COUNTER_TEXT_MAX);

	fm_counter_format(c, buf, FM_COUNTER_TEXT_MAX);
	CHECK(strcmp(buf, big) == 0);

	short_len = 1 + short_len % FM_COUNTER_TEXT_MAX;
	small = malloc(short_len);
	CHECK(small != NULL);
	fm_counter_format(c, small, short_len);
	CHECK(memchr(small, '\0', short_len) != NULL);
	CHECK(strncmp(small, big, strlen(small)) == 0);
	CHECK(strlen(small) == (len < short_len ? len : short_len - 1));

	free(small);
	free(big);
	return buf;
}

/*
 * Everything that must hold for a counter an entry point accepted: it is
 * valid, its text form is canonical and round-trips, and so does its binary
 * form.  Returns the text form (malloc'd).
 */
static char *
check_accepted(const FmCounter *c, size_t short_len)
{
	char	   *text;
	char	   *again;
	FmCounter	back;
	unsigned char wire[FM_COUNTER_WIRE_SIZE];
	unsigned char wire2[FM_COUNTER_WIRE_SIZE];
	const char *detail = NULL;

	CHECK(fm_counter_validate(c, &detail) == FM_OK);

	text = format_checked(c, short_len);
	CHECK(canonical_spelling(text));
	memset(&back, 0xa5, sizeof(back));
	CHECK(fm_counter_parse(text, &back, &detail) == FM_OK);
	CHECK(fm_counter_equal(c, &back));
	CHECK(same_bytes(c, &back));
	again = format_checked(&back, short_len + 7);
	CHECK(strcmp(text, again) == 0);
	free(again);

	fm_counter_to_wire(c, wire);
	memset(&back, 0x5a, sizeof(back));
	CHECK(fm_counter_from_wire(wire, sizeof(wire), &back, &detail) == FM_OK);
	CHECK(same_bytes(c, &back));
	fm_counter_to_wire(&back, wire2);
	CHECK(memcmp(wire, wire2, sizeof(wire)) == 0);

	return text;
}

/* Parse NUL-terminated text; true and *out set when accepted. */
static bool
parse_text(const char *s, FmCounter *out, size_t short_len)
{
	FmCounter	c;
	const char *detail = NULL;
	FmResult	r;
	char	   *canon;

	memset(&c, 0xa5, sizeof(c));
	r = fm_counter_parse(s, &c, &detail);
	CHECK(known_result(r));
	if (r != FM_OK)
		return false;

	canon = check_accepted(&c, short_len);
	if (canonical_spelling(s))
		CHECK(strcmp(canon, s) == 0);
	free(canon);
	*out = c;
	return true;
}

/* Read len bytes of wire form; true and *out set when accepted. */
static bool
parse_wire(const unsigned char *b, size_t len, FmCounter *out, size_t short_len)
{
	FmCounter	c;
	const char *detail = NULL;
	FmResult	r;
	unsigned char wire[FM_COUNTER_WIRE_SIZE];

	memset(&c, 0xa5, sizeof(c));
	r = fm_counter_from_wire(b, len, &c, &detail);
	CHECK(known_result(r));
	if (len != FM_COUNTER_WIRE_SIZE)
		CHECK(r == FM_ERR_SYNTAX);
	if (r != FM_OK)
		return false;

	free(check_accepted(&c, short_len));
	fm_counter_to_wire(&c, wire);
	CHECK(memcmp(wire, b, FM_COUNTER_WIRE_SIZE) == 0);
	*out = c;
	return true;
}

/*
 * into := a + b.  Either FM_ERR_RANGE with into untouched or FM_OK with a
 * valid counter; the same either way round.  Returns the result code.
 */
static FmResult
merge_checked(const FmCounter *a, const FmCounter *b, FmCounter *into)
{
	FmCounter	ab = *a;
	FmCounter	ba = *b;
	FmResult	r1 = fm_counter_merge(&ab, b);
	FmResult	r2 = fm_counter_merge(&ba, a);

	CHECK(r1 == FM_OK || r1 == FM_ERR_RANGE);
	CHECK(r1 == r2);
	if (r1 != FM_OK)
	{
		CHECK(same_bytes(&ab, a));
		CHECK(same_bytes(&ba, b));
		return r1;
	}
	CHECK(fm_counter_validate(&ab, NULL) == FM_OK);
	CHECK(same_bytes(&ab, &ba));
	/* sums add; the rest is the greater or stricter of the two */
	CHECK(ab.used == a->used + b->used);
	CHECK(ab.events == a->events + b->events);
	CHECK(ab.max_amount == (a->max_amount > b->max_amount ? a->max_amount : b->max_amount));
	CHECK((ab.flags & FM_COUNTER_HAS_LIMIT) ==
		  ((a->flags | b->flags) & FM_COUNTER_HAS_LIMIT));
	if ((a->flags & b->flags) & FM_COUNTER_HAS_LIMIT)
		CHECK(ab.limit_value == (a->limit_value < b->limit_value ?
								 a->limit_value : b->limit_value));
	CHECK((ab.flags & FM_COUNTER_HAS_LATEST) ==
		  ((a->flags | b->flags) & FM_COUNTER_HAS_LATEST));
	if ((a->flags & b->flags) & FM_COUNTER_HAS_LATEST)
	{
		/* the later event wins, the larger amount on a tie */
		const FmCounter *w = (a->latest_at > b->latest_at ||
							  (a->latest_at == b->latest_at && a->latest >= b->latest)) ? a : b;

		CHECK(ab.latest_at == w->latest_at && ab.latest == w->latest);
	}
	*into = ab;
	return r1;
}

static void
check_merges(const FmCounter *c, int n, size_t short_len)
{
	FmCounter	ab,
				bc,
				ab_c,
				a_bc;
	FmResult	r1,
				r2;

	if (n < 2)
		return;
	if (merge_checked(&c[0], &c[1], &ab) == FM_OK)
		free(check_accepted(&ab, short_len));
	if (n < 3)
		return;

	/* (a + b) + c == a + (b + c), and both overflow or neither does */
	r1 = merge_checked(&c[0], &c[1], &ab);
	if (r1 == FM_OK)
		r1 = merge_checked(&ab, &c[2], &ab_c);
	r2 = merge_checked(&c[1], &c[2], &bc);
	if (r2 == FM_OK)
		r2 = merge_checked(&c[0], &bc, &a_bc);
	CHECK(r1 == r2);
	if (r1 == FM_OK)
	{
		CHECK(same_bytes(&ab_c, &a_bc));
		free(check_accepted(&ab_c, short_len));
	}
}

static int64_t
get_be64(const unsigned char *b)
{
	uint64_t	u = 0;
	int			i;

	for (i = 0; i < 8; i++)
		u = (u << 8) | b[i];
	return (int64_t) u;
}

/*
 * Taking events back out either is refused with the counter unchanged or
 * leaves a valid counter with exactly that much less.
 */
static void
check_subtract(const FmCounter *c, int64_t amount, int64_t nevents, size_t short_len)
{
	FmCounter	sub = *c;
	FmResult	r = fm_counter_subtract(&sub, amount, nevents);

	CHECK(known_result(r));
	if (amount < 0 || nevents < 0)
		CHECK(r == FM_ERR_NEGATIVE_AMOUNT);
	else if (nevents > c->events || amount > c->used ||
			 (nevents == c->events && amount != c->used))
		CHECK(r == FM_ERR_INCONSISTENT);
	else
		CHECK(r == FM_OK);
	if (r != FM_OK)
	{
		CHECK(same_bytes(&sub, c));
		return;
	}
	free(check_accepted(&sub, short_len));
	CHECK(sub.used == c->used - amount);
	CHECK(sub.events == c->events - nevents);
	CHECK(sub.max_amount == c->max_amount && sub.latest == c->latest &&
		  sub.latest_at == c->latest_at);
}

/* add_event agrees with a merge of the single-event counter. */
static void
check_add_event(const FmCounter *c, int64_t amount, int64_t at, size_t short_len)
{
	FmCounter	added = *c;
	FmCounter	single;
	FmCounter	merged;
	FmResult	r,
				rs,
				rm;

	r = fm_counter_add_event(&added, amount, at);
	CHECK(known_result(r));
	if (amount < 0)
		CHECK(r == FM_ERR_NEGATIVE_AMOUNT);
	else if (at < FM_TS_MIN || at > FM_TS_MAX)
		CHECK(r == FM_ERR_TIMESTAMP);
	else
		CHECK(r == FM_OK || r == FM_ERR_RANGE);

	fm_counter_init(&single);
	rs = fm_counter_add_event(&single, amount, at);
	CHECK(rs == r || (r == FM_ERR_RANGE && rs == FM_OK));

	if (r != FM_OK)
	{
		CHECK(same_bytes(&added, c));
		if (rs == FM_OK)
			CHECK(merge_checked(c, &single, &merged) == FM_ERR_RANGE);
		return;
	}

	free(check_accepted(&single, short_len));
	free(check_accepted(&added, short_len));
	CHECK(added.used == c->used + amount);
	CHECK(added.events == c->events + 1);
	rm = merge_checked(c, &single, &merged);
	CHECK(rm == FM_OK);
	CHECK(same_bytes(&merged, &added));

	/* voiding it takes the amount and the count back out */
	CHECK(fm_counter_void(&added, amount) == FM_OK);
	CHECK(fm_counter_validate(&added, NULL) == FM_OK);
	CHECK(added.used == c->used);
	CHECK(added.events == c->events);
}

int			LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const unsigned char *body = data + 1;
	size_t		len;
	size_t		short_len = size;	/* some length that varies */
	char	   *text;
	FmCounter	c[3];
	int			n = 0;

	if (size < 1)
		return 0;
	len = size - 1;

	switch (data[0] % 5)
	{
		case 0:
			text = malloc(len + 1);
			CHECK(text != NULL);
			memcpy(text, body, len);
			text[len] = '\0';
			parse_text(text, &c[0], short_len);
			free(text);
			break;

		case 1:
			{
				/* an exact-size copy, so ASan sees any read past the end */
				unsigned char *copy = malloc(len ? len : 1);

				CHECK(copy != NULL);
				memcpy(copy, body, len);
				parse_wire(copy, len, &c[0], short_len);
				free(copy);
			}
			break;

		case 2:
			{
				char	   *line;
				char	   *next;

				text = malloc(len + 1);
				CHECK(text != NULL);
				memcpy(text, body, len);
				text[len] = '\0';
				for (line = text; line != NULL && n < 3; line = next)
				{
					next = strchr(line, '\n');
					if (next != NULL)
						*next++ = '\0';
					if (!parse_text(line, &c[n], short_len))
						break;
					n++;
				}
				free(text);
				check_merges(c, n, short_len);
			}
			break;

		case 3:
			while (n < 3 && len >= (size_t) (n + 1) * FM_COUNTER_WIRE_SIZE &&
				   parse_wire(body + n * FM_COUNTER_WIRE_SIZE,
							  FM_COUNTER_WIRE_SIZE, &c[n], short_len))
				n++;
			check_merges(c, n, short_len);
			break;

		case 4:
			if (len >= 16 + FM_COUNTER_WIRE_SIZE &&
				parse_wire(body + 16, FM_COUNTER_WIRE_SIZE, &c[0], short_len))
			{
				check_add_event(&c[0], get_be64(body), get_be64(body + 8),
								short_len);
				check_subtract(&c[0], get_be64(body), get_be64(body + 8),
							   short_len);
			}
			break;
	}
	return 0;
}
