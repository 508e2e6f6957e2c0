/*
 * consume_one.c
 *	  The common consume: one sum or count meter without an idempotency
 *	  key, credit grants, reservations or a pool, decided in one of two
 *	  ways.  Preloaded, it decides on the table of consumes in flight
 *	  (inflight.h) without stripe 0's row lock and writes as track does
 *	  (consume_in_flight); when that table sends it back, or without
 *	  preloading, it decides in one conditional UPDATE of stripe 0
 *	  (consume_under_lock).
 *
 * consume.c's fm_consume_items sends such a call here (fm_consume_one,
 * consume_one.h) and decides every other one itself, under the row locks.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/int.h"
#include "executor/spi.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "consume_one.h"
#include "counter.h"
#include "decision.h"
#include "inflight.h"
#include "pending.h"
#include "statements.h"
#include "track_alerts.h"
#include "usage_rows.h"

/* What is consumed: the meter, the amount, its limit and its period. */
typedef struct ConsumeOneItem
{
	const char *meter;
	int64		amount;
	const FmLimit *limit;
	TimestampTz period_start;
	TimestampTz period_end;
} ConsumeOneItem;

/*
 * consume_one's statements.  First, before any lock: the event, returning
 * where it went (a refusal deletes it), and the tracked stripes.  The
 * Append runs its branches in order, so the event is inserted first.
 */
static FmStatement consume_event_stmt = {
	"WITH event AS ("
	"  INSERT INTO flagmeter.events"
	"   (tenant, meter, amount, occurred_at, recorded_at)"
	"  VALUES ($1, $2, $4, $5, $5)"
	"  RETURNING tableoid, ctid"
	")"
	" SELECT e.tableoid, e.ctid, NULL::flagmeter.quota_counter FROM event e"
	" UNION ALL"
	" SELECT NULL, NULL, o.counter FROM flagmeter.counters o"
	" WHERE o.tenant" FM_EQ "$1 AND o.meter" FM_EQ "$2 AND o.period_start" FM_EQ "$3"
	" AND" FM_IS_TRACK_STRIPE("o.stripe"),
	5, {TEXTOID, TEXTOID, TIMESTAMPTZOID, INT8OID, TIMESTAMPTZOID}
};

/*
 * Then the one conditional statement: stripe 0 gets the event if its own
 * usage is at most $5 (NULL: no bound), the room the limit leaves it once
 * the tracked usage and the event are counted.  Sum and count add up over
 * merges, so the bound on the merged usage is a bound on stripe 0's.
 */
#define CONSUME_STRIPE0(used_fn) \
	"UPDATE flagmeter.counters c" \
	" SET counter = c.counter OPERATOR(flagmeter.+) $4" \
	" WHERE c.tenant" FM_EQ "$1 AND c.meter" FM_EQ "$2 AND c.period_start" FM_EQ "$3" \
	" AND c.stripe" FM_EQ "0::pg_catalog.int2" \
	" AND ($5 IS NULL OR " used_fn "(c.counter) OPERATOR(pg_catalog.<=) $5)" \
	" RETURNING c.counter"
#define CONSUME_STRIPE0_ARGTYPES \
	{TEXTOID, TEXTOID, TIMESTAMPTZOID, FM_TYPE_COUNTER, INT8OID}

static FmStatement consume_sum_stmt = {
	CONSUME_STRIPE0("flagmeter.used"),
	5, CONSUME_STRIPE0_ARGTYPES
};

static FmStatement consume_count_stmt = {
	CONSUME_STRIPE0("flagmeter.events"),
	5, CONSUME_STRIPE0_ARGTYPES
};

/*
 * consume_one's first way, preloaded: decide in inflight.c, without
 * stripe 0's lock, and when granted write as track does (one row when it
 * may, pending.h).  False when that table sends the consume back to the
 * row lock (a decider under the row lock is in flight on the period, or
 * no room): consume_under_lock then decides.
 */
static bool
consume_in_flight(const char *tenant, ConsumeOneItem *item, TimestampTz now,
				  FmDecision *decision)
{
	const FmLimit *limit = item->limit;
	FmCounter	delta = fm_empty_counter();
	FmCounter	counted;
	bool		read_due;
	FmInflightOutcome outcome = fm_inflight_consume(tenant, item->meter,
													item->period_start,
													item->period_end, limit,
													item->amount, now, decision,
													&counted);

	if (outcome == FM_INFLIGHT_FALL_BACK)
		return false;
	if (outcome == FM_INFLIGHT_GRANTED)
	{
		fm_counter_report(fm_counter_add_event(&delta, item->amount, now));
		if (!fm_write_event_alone(tenant, item->meter, item->amount, now,
								  item->period_start, &delta, limit, &read_due))
			fm_write_event_to_stripe(tenant, item->meter, item->amount, now, NULL,
									 item->period_start, &delta);
		fm_announce_usage_level(tenant, item->meter, limit, item->period_start,
								&counted);
	}
	return true;
}

/*
 * consume_under_lock's first statement, before any lock: insert the
 * event and read the tracked stripes (consume_event_stmt, args filled
 * here), then add the pending usage that statement's snapshot sees.
 * *tracked gets the tracked usage, *event_rel and *event_tid where the
 * event went (a refusal deletes it).
 */
static void
insert_event_read_tracked(const char *tenant, const ConsumeOneItem *item, TimestampTz now,
						  Datum *args, FmCounter *tracked, Oid *event_rel,
						  ItemPointer event_tid)
{
	Snapshot	snapshot;
	uint64		i;

	ItemPointerSetInvalid(event_tid);
	fm_period_args(args, tenant, item->meter, item->period_start);
	args[3] = Int64GetDatum(item->amount);
	args[4] = TimestampTzGetDatum(now);
	snapshot = RegisterSnapshot(GetTransactionSnapshot());
	fm_execute_snapshot(&consume_event_stmt, args, NULL, false, 0, snapshot);
	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	row = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		Datum		d = SPI_getbinval(row, desc, 3, &isnull);

		if (!isnull)
			fm_counter_report(fm_counter_merge(tracked, DatumGetFmCounterP(d)));
		else
		{
			*event_rel = DatumGetObjectId(SPI_getbinval(row, desc, 1, &isnull));
			ItemPointerCopy((ItemPointer) DatumGetPointer(SPI_getbinval(row, desc, 2, &isnull)),
							event_tid);
		}
	}
	if (!OidIsValid(*event_rel))
		elog(ERROR, "consume inserted no event for tenant \"%s\" meter \"%s\"",
			 tenant, item->meter);
	fm_pending_add_visible(tenant, item->meter, item->period_start, snapshot, tracked);
	UnregisterSnapshot(snapshot);
}

/*
 * A consume_under_lock that found no room: its event deleted again, and
 * the refusal decided as decide_items decides, on stripe 0 as it is now
 * and the tracked usage (fm_decide raises the event's overflow).
 */
static void
refuse_under_lock(const ConsumeOneItem *item, Datum *args, Oid event_rel,
				  ItemPointer event_tid, const FmCounter *tracked, TimestampTz now,
				  FmDecision *decision)
{
	Relation	rel = table_open(event_rel, RowExclusiveLock);
	FmCounter	current;

	simple_table_tuple_delete(rel, event_tid, GetActiveSnapshot());
	table_close(rel, RowExclusiveLock);

	current = fm_read_stripe0(args);
	fm_counter_report(fm_counter_merge(&current, tracked));
	fm_decide(item->limit, &current, item->amount, now, item->period_end, false,
			  decision, NULL);
	decision->granted = false;
	decision->reason = FM_REASON_QUOTA_EXCEEDED;
}

/*
 * consume_one's second way, under stripe 0's row lock, once the lock-free
 * consumes in flight ended: a hot tenant's consumes run one at a time
 * behind that lock, held through the commit flush, so what runs under it
 * bounds their rate: here only one conditional UPDATE (docs/design.md,
 * "The write path"), deciding on stripe 0's latest committed version
 * (READ COMMITTED rechecks the condition on it after waiting for a
 * concurrent consume).  The event is inserted and the tracked stripes
 * read before it (insert_event_read_tracked), so the lock is held for that
 * one statement, not for a read, a decision and a write as in
 * decide_items; a refusal deletes the event again (refuse_under_lock).
 */
static void
consume_under_lock(const char *tenant, ConsumeOneItem *item, TimestampTz now,
				   FmDecision *decision)
{
	const FmLimit *limit = item->limit;
	FmStatement *update = limit->aggregation == FM_AGG_COUNT ?
	&consume_count_stmt : &consume_sum_stmt;
	FmCounter	delta = fm_empty_counter();
	FmCounter	tracked = fm_empty_counter();
	FmCounter	counted;
	Datum		args[5];
	Oid			event_rel = InvalidOid;
	ItemPointerData event_tid;
	int64		room = 0;
	bool		bounded = limit->limited && limit->hard;

	fm_inflight_before_lock(tenant, item->meter, item->period_start, now, &tracked);
	insert_event_read_tracked(tenant, item, now, args, &tracked, &event_rel, &event_tid);

	/* the room stripe 0 has: quota - tracked - the event (< 0: none) */
	fm_counter_report(fm_counter_add_event(&delta, item->amount, now));
	counted = tracked;
	fm_counter_report(fm_counter_merge(&counted, &delta));
	if (bounded && pg_sub_s64_overflow(limit->quota,
									   fm_used_of(&counted, limit->aggregation), &room))
		room = -1;				/* more than a bigint beyond the quota */

	args[3] = FmCounterPGetDatum(&delta);
	args[4] = Int64GetDatum(room);
	fm_execute(update, args, bounded ? NULL : "    n", false, 0);
	if (SPI_processed == 0)
	{
		/*
		 * No room, or no stripe 0 in this statement's snapshot: create it (a
		 * concurrent consume may have, after the snapshot; then this waits
		 * for it to commit) and decide again in a newer snapshot.
		 */
		fm_create_stripe0(args);
		fm_execute(update, args, bounded ? NULL : "    n", false, 0);
	}

	if (SPI_processed == 1)
	{
		FmCounter	after = fm_merge_result_rows(); /* stripe 0, as updated */

		fm_counter_report(fm_counter_merge(&after, &tracked));
		fm_decision_at(limit, true, fm_used_of(&after, limit->aggregation),
					   item->period_end, decision);
		fm_announce_usage_level(tenant, item->meter, limit, item->period_start, &after);
	}
	else
		refuse_under_lock(item, args, event_rel, &event_tid, &tracked, now, decision);
}

/*
 * consume of one sum or count meter without an idempotency key, the common
 * call, in one of two ways: preloaded, it decides in inflight.c and writes
 * as track does (consume_in_flight); when that sends it back, or without
 * preloading, it decides in one conditional UPDATE of stripe 0
 * (consume_under_lock).
 */
FmDecision *
fm_consume_one(const char *tenant, const char *meter, int64 amount,
			   const FmLimit *limit, TimestampTz period_start, TimestampTz period_end,
			   TimestampTz now)
{
	FmDecision *decision = SPI_palloc(sizeof(FmDecision));
	ConsumeOneItem one;
	ConsumeOneItem *item = &one;

	item->meter = meter;
	item->amount = amount;
	item->limit = limit;
	item->period_start = period_start;
	fm_usage_target(tenant, meter, period_start);
	item->period_end = period_end;
	if (!fm_inflight_consume_enabled() ||
		!consume_in_flight(tenant, item, now, decision))
		consume_under_lock(tenant, item, now, decision);
	decision->meter = item->meter;
	return decision;
}
