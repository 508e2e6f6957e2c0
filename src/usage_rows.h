/*
 * usage_rows.h
 *	  The rows usage lives in, as the accounting calls read and lock them
 *	  through SPI (usage_rows.c).
 *
 * Where usage lives (sql/parts/40_usage.sql): a raw row per event in
 * flagmeter.events, and per tenant, meter and period a few quota_counter
 * rows in flagmeter.counters, merged on read.  Stripe 0 is consume's: the
 * one row where a limit serializes (consume.c).  Stripes 1 and up are
 * track's, one per concurrent writer (stripes.c), and 32767 the merge of
 * those that went idle, which maintain() keeps and no call writes
 * (merge_idle_stripes in sql/parts/50_maintenance.sql).  Every call first takes
 * ROW EXCLUSIVE on flagmeter.counters (fm_lock_counters_for_write), before
 * it reads the configuration; flagmeter.recount_current_period() takes
 * SHARE ROW EXCLUSIVE, so a change of period boundaries never races a
 * writer.
 */
#ifndef FLAGMETER_USAGE_ROWS_H
#define FLAGMETER_USAGE_ROWS_H

#include "postgres.h"
#include "datatype/timestamp.h"
#include "utils/snapshot.h"

#include "counter_core.h"
#include "limit.h"
#include "statements.h"

/*
 * A track stripe, not consume's stripe 0.  Stripes are never negative, so
 * "> 0" says it as a condition of the primary key's index scan; "<> 0"
 * would be a filter that fetches stripe 0's heap row first.
 */
#define FM_IS_TRACK_STRIPE(col) " " col " OPERATOR(pg_catalog.>) 0::pg_catalog.int2"

/* a period's stripe 0: (counter) */
#define FM_STRIPE0_SELECT \
	"SELECT counter FROM flagmeter.counters" \
	" WHERE tenant" FM_EQ "$1 AND meter" FM_EQ "$2 AND period_start" FM_EQ "$3" \
	" AND stripe" FM_EQ "0::pg_catalog.int2"

/* Serialize against recount_current_period; see above. */
extern void fm_lock_counters_for_write(void);

static inline FmCounter
fm_empty_counter(void)
{
	FmCounter	c;

	fm_counter_init(&c);
	return c;
}

/* Merge of the counters in column 1 of the current SPI result. */
extern FmCounter fm_merge_result_rows(void);

/*
 * The period's usage: merge of all its rows, in a fresh snapshot that
 * includes this transaction's writes; the rows (counter, stripe) stay in
 * SPI_tuptable.
 */
extern FmCounter fm_read_period(const char *tenant, const char *meter,
								TimestampTz period_start);

/* Stripe 0 of the period (args from fm_period_args) as last committed. */
extern FmCounter fm_read_stripe0(Datum *args);

/*
 * Create stripe 0 of the period if it does not exist; when a concurrent
 * transaction creates it first, this waits for that one to end.
 */
extern void fm_create_stripe0(Datum *args);

/* Lock stripe 0 of the period, creating it first if needed; it stays in SPI_tuptable. */
extern void fm_lock_stripe0(const char *tenant, const char *meter,
							TimestampTz period_start);

/*
 * The period's usage: merge of all its rows in snapshot, by a direct scan
 * of the primary key (pk_scan.c says why); 22003 when the merge overflows.
 */
extern FmCounter fm_scan_period(const char *tenant, const char *meter,
								TimestampTz period_start, Snapshot snapshot);

/*
 * What a track writes (and a consume deciding without stripe 0): the raw
 * event and the increment delta of a stripe of the period, the one
 * fm_pick_stripe chooses (READ COMMITTED) or the backend's own.  The
 * written stripe's row (stripe, counter, recheck_at, recheck_for) is left
 * in SPI_tuptable for fm_stripe_written.  A stripe whose usage would
 * overflow raises 22003 and rolls the event back.
 */
extern void fm_write_event_to_stripe(const char *tenant, const char *meter, int64 amount,
									 TimestampTz occurred_at, const char *key,
									 TimestampTz period_start, const FmCounter *delta);

/*
 * What a track of a sum or count meter without a key, grants or a pool
 * writes when it may (pending.h): its amount pending in shared memory, and
 * the event alone with the period it counts in.  False, nothing written,
 * when it may not or the table has no room: then it writes a stripe.  On
 * true, *read_due says whether the period is due for an alert read.
 */
extern bool fm_write_event_alone(const char *tenant, const char *meter, int64 amount,
								 TimestampTz occurred_at, TimestampTz period_start,
								 const FmCounter *delta, const FmLimit *limit,
								 bool *read_due);

#endif							/* FLAGMETER_USAGE_ROWS_H */
