/*
 * counter_core.h
 *	  The quota_counter value and its pure operations.
 *
 * Nothing here depends on the server: the parser, formatter, validator and
 * merge are plain C so that the fuzz harness links them without a backend.
 * The SQL-callable wrappers live in counter.c and turn the result codes
 * below into ereport()s.
 */
#ifndef FLAGMETER_COUNTER_CORE_H
#define FLAGMETER_COUNTER_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* On-disk format version; bump only with an upgrade path for stored data. */
#define FM_COUNTER_VERSION		1

/* flags */
#define FM_COUNTER_HAS_LIMIT	0x01	/* limit_value is meaningful */
#define FM_COUNTER_HAS_LATEST	0x02	/* latest and latest_at are meaningful */
#define FM_COUNTER_KNOWN_FLAGS	(FM_COUNTER_HAS_LIMIT | FM_COUNTER_HAS_LATEST)

/*
 * The stored value: 56 bytes, double-aligned, passed by reference.
 *
 * "latest" is the amount of the event with the greatest timestamp; among
 * events with the same timestamp the greatest amount wins, so merge is
 * commutative and associative.  Timestamps are PostgreSQL TimestampTz
 * (microseconds since 2000-01-01 00:00:00 UTC).
 *
 * Voiding an event (fm_counter_void) takes its amount and its count back
 * out; max_amount and latest keep describing the events that were
 * recorded, since they cannot be recomputed without the raw events.
 */
typedef struct FmCounter
{
	uint8_t		version;		/* FM_COUNTER_VERSION */
	uint8_t		flags;			/* FM_COUNTER_* */
	uint8_t		reserved[6];	/* zero; room for future fields */
	int64_t		used;			/* sum of amounts */
	int64_t		events;			/* number of events */
	int64_t		max_amount;		/* greatest single amount */
	int64_t		latest;			/* amount at latest_at */
	int64_t		latest_at;		/* TimestampTz of the latest event */
	int64_t		limit_value;	/* quota, > 0, if FM_COUNTER_HAS_LIMIT */
} FmCounter;

#define FM_COUNTER_SIZE ((int) sizeof(FmCounter))

/* Result of a core operation; the server maps these to SQLSTATEs. */
typedef enum FmResult
{
	FM_OK = 0,
	FM_ERR_SYNTAX,				/* malformed text: 22P02 */
	FM_ERR_RANGE,				/* number or overflow: 22003 */
	FM_ERR_INCONSISTENT,		/* fields contradict each other: 22P02 */
	FM_ERR_NEGATIVE_AMOUNT,		/* event amount < 0: 22023 */
	FM_ERR_TIMESTAMP			/* timestamp not finite or out of range: 22008 */
} FmResult;

/*
 * Timestamps the text form can carry: years 0001 to 9999, UTC.  Events
 * outside this window are refused by the aggregate as well, so every
 * counter has a text form.
 */
#define FM_TS_MIN	INT64_C(-63082281600000000) /* 0001-01-01 00:00:00 */
#define FM_TS_MAX	INT64_C(252455615999999999) /* 9999-12-31 23:59:59.999999 */

/* Longest text form, with the terminating NUL. */
#define FM_COUNTER_TEXT_MAX 160

extern void fm_counter_init(FmCounter *c);
extern FmResult fm_counter_validate(const FmCounter *c, const char **detail);
extern FmResult fm_counter_add_event(FmCounter *c, int64_t amount, int64_t at);
extern FmResult fm_counter_merge(FmCounter *into, const FmCounter *other);
extern FmResult fm_counter_subtract(FmCounter *c, int64_t amount, int64_t nevents);
extern FmResult fm_counter_void(FmCounter *c, int64_t amount);
extern bool fm_counter_equal(const FmCounter *a, const FmCounter *b);

extern FmResult fm_counter_parse(const char *text, FmCounter *out,
								 const char **detail);
extern void fm_counter_format(const FmCounter *c, char *buf, size_t buflen);

/* Binary wire form: 2 bytes of header then 6 big-endian int64 fields. */
#define FM_COUNTER_WIRE_SIZE (2 + 6 * 8)
extern void fm_counter_to_wire(const FmCounter *c, unsigned char *buf);
extern FmResult fm_counter_from_wire(const unsigned char *buf, size_t len,
									 FmCounter *out, const char **detail);

/* The timestamp of the text form, as fm_counter_parse reads it. */
extern int	fm_format_timestamp(int64_t ts, char *buf, size_t buflen);

#endif							/* FLAGMETER_COUNTER_CORE_H */
