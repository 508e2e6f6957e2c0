/*
 * accounting.c
 *	  The calls an app makes on every request: track, track_batch, consume
 *	  (one meter and all-or-nothing across meters), check, usage and void.
 *
 * Where usage lives (see sql/parts/40_usage.sql): a raw row per event in
 * flagmeter.events, and per tenant, meter and period a few quota_counter
 * rows in flagmeter.counters that are merged on read.  track adds to a
 * stripe no other transaction holds; consume decides and writes on stripe 0
 * of the period (the one row where the limit serializes) once it holds its
 * lock, counting the other stripes as committed before (consume_one,
 * consume_items); check and usage merge the rows by a direct scan
 * (counters_scan.c).  All writes are in the caller's
 * transaction: a rollback leaves nothing, a commit makes the usage durable.
 *
 * Every call first takes ROW EXCLUSIVE on flagmeter.counters, before it
 * reads the configuration; flagmeter.recount_current_period() takes SHARE
 * ROW EXCLUSIVE, so a change of period boundaries never races a writer.
 */
#include "postgres.h"
#include "fmgr.h"
#include "funcapi.h"

#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "common/int.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/xid8.h"

#include "accounting.h"
#include "compat.h"
#include "counter.h"
#include "counters_scan.h"
#include "limits.h"
#include "notify.h"
#include "period.h"
#include "statements.h"

/* flagmeter.stripes: how many counter rows track spreads a period over */
static int	fm_stripes = 32;

/* Most meters one multi-meter consume may name (documented). */
#define FM_MAX_METERS_PER_CONSUME 64

#define EQ " OPERATOR(pg_catalog.=) "

/*
 * A track stripe, not consume's stripe 0.  Stripes are never negative (0
 * is consume's, track's are 1 .. 2 x flagmeter.stripes), and "> 0" is a
 * condition of the primary key's index scan, where "<> 0" was a filter
 * that fetched stripe 0's heap row first (5 buffers against 2 for the
 * tracked read of a tenant that only consumes).
 */
#define IS_TRACK_STRIPE(col) " " col " OPERATOR(pg_catalog.>) 0::pg_catalog.int2"

/* ---------------------------------------------------------------------
 * Statements
 * ---------------------------------------------------------------------
 */
/*
 * track's statements; pick_stripe says which stripe they write.  Each
 * returns (stripe, counter, recheck_at, recheck_for) of the row written.
 */
#define TRACK_EVENT_CTE \
	"WITH event AS (" \
	"  INSERT INTO flagmeter.events" \
	"   (tenant, meter, amount, occurred_at, recorded_at, idempotency_key)" \
	"  VALUES ($1, $2, $3, $4, $5, $6)" \
	") "
#define TRACK_STRIPE_KEY(alias) \
	" " alias ".tenant" EQ "$1 AND " alias ".meter" EQ "$2" \
	" AND " alias ".period_start" EQ "$7"
#define ADD_TO_STRIPE \
	"INSERT INTO flagmeter.counters AS c (tenant, meter, period_start, stripe, counter)" \
	" VALUES ($1, $2, $7, $8, $9)" \
	" ON CONFLICT (tenant, meter, period_start, stripe) DO UPDATE" \
	" SET counter = c.counter OPERATOR(flagmeter.+) EXCLUDED.counter" \
	" RETURNING c.stripe, c.counter, c.recheck_at, c.recheck_for"
#define TRACK_ARGTYPES \
	{TEXTOID, TEXTOID, INT8OID, TIMESTAMPTZOID, TIMESTAMPTZOID, TEXTOID, \
	TIMESTAMPTZOID, INT2OID, FM_TYPE_COUNTER}

/*
 * The event and the increment of an existing stripe: no row when the
 * stripe does not exist yet.  A plain UPDATE, not an upsert: ON CONFLICT DO
 * UPDATE locks the row first, a WAL record of its own.
 */
static FmStatement track_update_stripe_stmt = {
	TRACK_EVENT_CTE
	"UPDATE flagmeter.counters c"
	" SET counter = c.counter OPERATOR(flagmeter.+) $9"
	" WHERE" TRACK_STRIPE_KEY("c") " AND c.stripe" EQ "$8"
	" RETURNING c.stripe, c.counter, c.recheck_at, c.recheck_for",
	9, TRACK_ARGTYPES
};

/* the increment of a stripe that may not exist yet (it creates it) */
static FmStatement add_to_stripe_stmt = {
	ADD_TO_STRIPE,
	9, TRACK_ARGTYPES
};

/* the event and the increment of a stripe that may not exist yet */
static FmStatement track_add_to_stripe_stmt = {
	TRACK_EVENT_CTE ADD_TO_STRIPE,
	9, TRACK_ARGTYPES
};

/* when the stripe's own usage reaches recheck_at, track reads the period */
static FmStatement set_recheck_stmt = {
	"UPDATE flagmeter.counters SET recheck_at = $5, recheck_for = $6"
	" WHERE tenant" EQ "$1 AND meter" EQ "$2 AND period_start" EQ "$3"
	" AND stripe" EQ "$4",
	6, {TEXTOID, TEXTOID, TIMESTAMPTZOID, INT2OID, INT8OID, INT4OID}
};

/* the period's rows: (counter, stripe) */
static FmStatement read_period_stmt = {
	"SELECT counter, stripe FROM flagmeter.counters"
	" WHERE tenant" EQ "$1 AND meter" EQ "$2 AND period_start" EQ "$3",
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

/* a period's stripe 0: (counter) */
#define STRIPE0 \
	"SELECT counter FROM flagmeter.counters" \
	" WHERE tenant" EQ "$1 AND meter" EQ "$2 AND period_start" EQ "$3" \
	" AND stripe" EQ "0::pg_catalog.int2"

/*
 * consume's read: the other stripes (tracked usage) and stripe 0 locked
 * (its latest committed value), in one statement; the first column says
 * which is which.  The tracked rows come first: the Append runs its
 * branches in order, so they are read before the lock is requested, not
 * while it is held (a hot tenant has a stripe per concurrent tracker), and
 * as the statement's snapshot shows them.
 */
static FmStatement lock_for_consume_stmt = {
	"SELECT false, o.counter FROM flagmeter.counters o"
	" WHERE o.tenant" EQ "$1 AND o.meter" EQ "$2 AND o.period_start" EQ "$3"
	" AND" IS_TRACK_STRIPE("o.stripe")
	" UNION ALL"
	" SELECT true, l.counter FROM (" STRIPE0 " FOR UPDATE) l",
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

static FmStatement lock_stripe0_stmt = {
	STRIPE0 " FOR UPDATE",
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

static FmStatement create_stripe0_stmt = {
	"INSERT INTO flagmeter.counters (tenant, meter, period_start, stripe, counter)"
	" VALUES ($1, $2, $3, 0, 'used=0 events=0 max=0')"
	" ON CONFLICT (tenant, meter, period_start, stripe) DO NOTHING",
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

/* consume's write: stripe 0 (locked) gets its new value, and the event */
static FmStatement record_consumed_stmt = {
	"WITH event AS ("
	"  INSERT INTO flagmeter.events"
	"   (tenant, meter, amount, occurred_at, recorded_at, idempotency_key)"
	"  VALUES ($1, $2, $5, $6, $6, $7)"
	")"
	" UPDATE flagmeter.counters SET counter = $4"
	" WHERE tenant" EQ "$1 AND meter" EQ "$2 AND period_start" EQ "$3"
	" AND stripe" EQ "0::pg_catalog.int2",
	7, {TEXTOID, TEXTOID, TIMESTAMPTZOID, FM_TYPE_COUNTER, INT8OID,
	TIMESTAMPTZOID, TEXTOID}
};

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
	" WHERE o.tenant" EQ "$1 AND o.meter" EQ "$2 AND o.period_start" EQ "$3"
	" AND" IS_TRACK_STRIPE("o.stripe"),
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
	" WHERE c.tenant" EQ "$1 AND c.meter" EQ "$2 AND c.period_start" EQ "$3" \
	" AND c.stripe" EQ "0::pg_catalog.int2" \
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

/* a refused consume_one's figures: stripe 0 as last committed */
static FmStatement read_stripe0_stmt = {
	STRIPE0,
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

static FmStatement claim_key_stmt = {
	"INSERT INTO flagmeter.event_keys"
	" (tenant, idempotency_key, seq, meter, amount, occurred_at, period_start,"
	"  recorded_at, kind, granted, used, quota, remaining, resets_at, overage)"
	" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)"
	" ON CONFLICT (tenant, idempotency_key, seq) DO NOTHING",
	15, {TEXTOID, TEXTOID, INT2OID, TEXTOID, INT8OID, TIMESTAMPTZOID,
		TIMESTAMPTZOID, TIMESTAMPTZOID, TEXTOID, BOOLOID, INT8OID, INT8OID,
	INT8OID, TIMESTAMPTZOID, INT8OID}
};

static FmStatement read_key_stmt = {
	"SELECT kind, meter, granted, used, quota, remaining, resets_at, overage"
	" FROM flagmeter.event_keys"
	" WHERE tenant" EQ "$1 AND idempotency_key" EQ "$2 ORDER BY seq",
	2, {TEXTOID, TEXTOID}
};

static FmStatement lock_key_stmt = {
	"SELECT meter, amount, occurred_at, granted, voided_at IS NOT NULL,"
	" kind OPERATOR(pg_catalog.=) 'consume'"
	" FROM flagmeter.event_keys"
	" WHERE tenant" EQ "$1 AND idempotency_key" EQ "$2 ORDER BY seq FOR UPDATE",
	2, {TEXTOID, TEXTOID}
};

static FmStatement mark_voided_stmt = {
	"UPDATE flagmeter.event_keys SET voided_at = $3"
	" WHERE tenant" EQ "$1 AND idempotency_key" EQ "$2",
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

static FmStatement log_void_stmt = {
	"INSERT INTO flagmeter.voids"
	" (tenant, meter, amount, occurred_at, idempotency_key, voided_at)"
	" VALUES ($1, $2, $3, $4, $5, $6)",
	6, {TEXTOID, TEXTOID, INT8OID, TIMESTAMPTZOID, TEXTOID, TIMESTAMPTZOID}
};

/* a period's track stripes: (counter, stripe) */
#define TRACK_STRIPES \
	"SELECT counter, stripe FROM flagmeter.counters" \
	" WHERE tenant" EQ "$1 AND meter" EQ "$2 AND period_start" EQ "$3" \
	" AND" IS_TRACK_STRIPE("stripe")

static FmStatement track_stripes_stmt = {
	TRACK_STRIPES " ORDER BY stripe",
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

/* the ones void found (and tagged), in stripe order */
static FmStatement lock_track_stripes_stmt = {
	TRACK_STRIPES " AND stripe OPERATOR(pg_catalog.=) ANY ($4) ORDER BY stripe FOR UPDATE",
	4, {TEXTOID, TEXTOID, TIMESTAMPTZOID, INT2ARRAYOID}
};

/*
 * Only the stripes that were locked and merged: a stripe that a concurrent
 * track created after the lock is not in the merge, and must stay.
 */
static FmStatement drop_stripes_stmt = {
	"DELETE FROM flagmeter.counters"
	" WHERE tenant" EQ "$1 AND meter" EQ "$2 AND period_start" EQ "$3"
	" AND stripe OPERATOR(pg_catalog.=) ANY ($4)"
	" AND" IS_TRACK_STRIPE("stripe"),
	4, {TEXTOID, TEXTOID, TIMESTAMPTZOID, INT2ARRAYOID}
};

/* void's merge of the period's track stripes, kept in the lowest of them */
static FmStatement set_merged_stripe_stmt = {
	"UPDATE flagmeter.counters SET counter = $4, recheck_at = NULL, recheck_for = NULL"
	" WHERE tenant" EQ "$1 AND meter" EQ "$2 AND period_start" EQ "$3"
	" AND stripe" EQ "$5",
	5, {TEXTOID, TEXTOID, TIMESTAMPTZOID, FM_TYPE_COUNTER, INT2OID}
};

static FmStatement set_stripe0_stmt = {
	"INSERT INTO flagmeter.counters AS c (tenant, meter, period_start, stripe, counter)"
	" VALUES ($1, $2, $3, 0, $4)"
	" ON CONFLICT (tenant, meter, period_start, stripe) DO UPDATE"
	" SET counter = EXCLUDED.counter",
	4, {TEXTOID, TEXTOID, TIMESTAMPTZOID, FM_TYPE_COUNTER}
};

static FmStatement insert_events_batch_stmt = {
	"INSERT INTO flagmeter.events"
	" (tenant, meter, amount, occurred_at, recorded_at, idempotency_key)"
	" SELECT u.t, u.m, u.a, u.o, $5, u.k"
	" FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3),"
	"                pg_catalog.unnest($4), pg_catalog.unnest($6)) AS u(t, m, a, o, k)",
	6, {TEXTARRAYOID, TEXTARRAYOID, INT8ARRAYOID, TIMESTAMPTZARRAYOID,
	TIMESTAMPTZOID, TEXTARRAYOID}
};

/* the rows of many periods: (ordinal of the period in the arrays, counter, stripe) */
static FmStatement read_groups_stmt = {
	"SELECT u.i, c.counter, c.stripe"
	" FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3))"
	"      WITH ORDINALITY AS u(t, m, p, i)"
	" JOIN flagmeter.counters c"
	"   ON c.tenant" EQ "u.t AND c.meter" EQ "u.m AND c.period_start" EQ "u.p",
	3, {TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZARRAYOID}
};

static FmStatement add_to_stripes_batch_stmt = {
	"INSERT INTO flagmeter.counters AS c (tenant, meter, period_start, stripe, counter)"
	" SELECT u.t, u.m, u.p, $4, u.q"
	" FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3),"
	"                pg_catalog.unnest($5)) AS u(t, m, p, q)"
	" ON CONFLICT (tenant, meter, period_start, stripe) DO UPDATE"
	" SET counter = c.counter OPERATOR(flagmeter.+) EXCLUDED.counter"
	" RETURNING c.tenant, c.meter, c.period_start,"
	"  c.stripe, c.counter, c.recheck_at, c.recheck_for",
	5, {TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZARRAYOID, INT2OID,
	FM_TYPE_COUNTER_ARRAY}
};

static FmStatement set_recheck_batch_stmt = {
	"UPDATE flagmeter.counters c SET recheck_at = u.r, recheck_for = u.f"
	" FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3),"
	"                pg_catalog.unnest($5), pg_catalog.unnest($6)) AS u(t, m, p, r, f)"
	" WHERE c.tenant" EQ "u.t AND c.meter" EQ "u.m AND c.period_start" EQ "u.p"
	" AND c.stripe" EQ "$4",
	6, {TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZARRAYOID, INT2OID,
	INT8ARRAYOID, INT4ARRAYOID}
};

/* ---------------------------------------------------------------------
 * Helpers
 * ---------------------------------------------------------------------
 */

/*
 * xid_int(xid8) -> bigint: a transaction id as flagmeter.events.xid stores
 * it.  FullTransactionIds stay far below 2^63 (the epoch would have to pass
 * 2^31); the largest xid8 maps to the largest bigint, so that "up to the
 * end" bounds keep their meaning.
 */
PG_FUNCTION_INFO_V1(fm_xid_int);
Datum
fm_xid_int(PG_FUNCTION_ARGS)
{
	uint64		xid = U64FromFullTransactionId(PG_GETARG_FULLTRANSACTIONID(0));

	PG_RETURN_INT64(xid > (uint64) PG_INT64_MAX ? PG_INT64_MAX : (int64) xid);
}

void
fm_accounting_init(void)
{
	DefineCustomIntVariable("flagmeter.stripes",
							gettext_noop("Number of shared counter rows track spreads each tenant's period over."),
							gettext_noop("READ COMMITTED track writes the lowest shared stripe (1 .. this) no "
										 "other transaction holds; a backend's own stripe is this + 1 + backend "
										 "number modulo this, written under REPEATABLE READ, in track_batch and "
										 "when every shared stripe is held. It also divides the allowance "
										 "between two reads of a period for alerts."),
							&fm_stripes,
							32, 1, 1024,
							PGC_USERSET, 0,
							NULL, NULL, NULL);
}

/* ---------------------------------------------------------------------
 * Which stripe a track writes
 * ---------------------------------------------------------------------
 *
 * Shared stripes 1 .. flagmeter.stripes: in READ COMMITTED, track writes
 * shared stripe k of a period only while its transaction holds the
 * period's stripe tag k, a transaction-level advisory lock taken without
 * waiting; it takes the lowest free one.  So writers of one tenant never
 * queue behind each other, a tenant has about as many stripes as it has
 * concurrent writers (most tenants one: few rows for a read to merge), and
 * choosing writes nothing: the FOR UPDATE SKIP LOCKED search this replaced
 * locked the row (a WAL record of its own) before updating it, and ran a
 * plan four nodes deep.  A transaction keeps the stripe it took for a
 * period: void locks a period's track stripes in stripe order, and a void
 * that holds the lower stripes while it waits for ours would deadlock with
 * us if we moved to one of them.
 *
 * Own stripes flagmeter.stripes + 1 .. 2 * flagmeter.stripes: a backend's
 * is flagmeter.stripes + 1 + backend number % flagmeter.stripes, written
 * without a tag under REPEATABLE READ and SERIALIZABLE (a row another
 * backend updated after the snapshot would fail the transaction with
 * 40001), by track_batch (thousands of periods: a tag each would fill the
 * lock table), when every shared stripe is taken, and for the periods past
 * the first FM_MAX_STRIPE_TAGS of a transaction.  With one
 * flagmeter.stripes everywhere (the README asks for it) the ranges never
 * meet, so a READ COMMITTED track never waits for a batch or a REPEATABLE
 * READ transaction; sessions that set different values may wait for each
 * other, and still count right (row locks do).
 *
 * The tags only choose; row locks keep the counts right.  Two periods whose
 * tags collide (a 32-bit hash) only make one of their writers take another
 * stripe.
 */

/* field4 of flagmeter's stripe tags (user advisory locks use 1 and 2) */
#define FM_STRIPE_TAG_CLASS 0x464D

/* Most stripe tags one transaction takes (each is a lock table entry). */
#define FM_MAX_STRIPE_TAGS 16

typedef struct StripeTaken
{
	uint32		period_hash;
	int16		stripe;
} StripeTaken;

/* the shared stripes the transaction stripes_taken_lxid took */
static StripeTaken stripes_taken[FM_MAX_STRIPE_TAGS];
static int	nstripes_taken = 0;
static LocalTransactionId stripes_taken_lxid = InvalidLocalTransactionId;

static int16
own_stripe(void)
{
	return (int16) (fm_stripes + 1 + (FM_MY_BACKEND_NUMBER % fm_stripes));
}

static uint32
period_hash(const char *tenant, const char *meter, TimestampTz period_start)
{
	return hash_combine(fm_tenant_meter_hash(tenant, meter),
						hash_bytes((const unsigned char *) &period_start,
								   sizeof(period_start)));
}

static void
stripe_tag(LOCKTAG *tag, uint32 period_hash, int16 stripe)
{
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, period_hash, (uint32) stripe,
						 FM_STRIPE_TAG_CLASS);
}

/* The stripe a READ COMMITTED track of a period writes; see above. */
static int16
pick_stripe(const char *tenant, const char *meter, TimestampTz period_start)
{
	uint32		hash = period_hash(tenant, meter, period_start);
	LOCKTAG		tag;
	int			i;
	int16		k;

	if (stripes_taken_lxid != FM_MY_LOCAL_XID)
	{
		stripes_taken_lxid = FM_MY_LOCAL_XID;
		nstripes_taken = 0;
	}
	for (i = 0; i < nstripes_taken; i++)
	{
		if (stripes_taken[i].period_hash != hash)
			continue;
		stripe_tag(&tag, hash, stripes_taken[i].stripe);
		if (fm_lock_held_by_me(&tag, ExclusiveLock))
			return stripes_taken[i].stripe;
		/* a rolled-back subtransaction released it: choose again */
		stripes_taken[i] = stripes_taken[--nstripes_taken];
		break;
	}
	if (nstripes_taken == FM_MAX_STRIPE_TAGS)
		return own_stripe();
	for (k = 1; k <= fm_stripes; k++)
	{
		stripe_tag(&tag, hash, k);
		if (LockAcquire(&tag, ExclusiveLock, false, true) != LOCKACQUIRE_NOT_AVAIL)
		{
			stripes_taken[nstripes_taken].period_hash = hash;
			stripes_taken[nstripes_taken].stripe = k;
			nstripes_taken++;
			return k;
		}
	}
	return own_stripe();
}

/* Serialize against recount_current_period; see the file header. */
static void
lock_counters_for_write(void)
{
	LockRelationOid(fm_relation_oid("counters"), RowExclusiveLock);
}

static FmCounter
empty_counter(void)
{
	FmCounter	c;

	fm_counter_init(&c);
	return c;
}

/* Merge of the counters in the current SPI result (column 1). */
static FmCounter
merge_result_rows(void)
{
	FmCounter	total = empty_counter();
	uint64		i;

	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		Datum		d = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
									  1, &isnull);

		if (!isnull)
			fm_counter_report(fm_counter_merge(&total, DatumGetFmCounterP(d)));
	}
	return total;
}

/* The stripe column (the second) of the last statement's rows, as an int2[]. */
static ArrayType *
result_stripes(void)
{
	Datum	   *stripes = palloc(sizeof(Datum) * Max(SPI_processed, 1));
	uint64		i;

	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;

		stripes[i] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2, &isnull);
	}
	return construct_array(stripes, (int) SPI_processed, INT2OID, 2, true, TYPALIGN_SHORT);
}

/* The arguments (tenant, meter, period_start) of the per-period statements. */
static void
period_args(Datum *args, const char *tenant, const char *meter,
			TimestampTz period_start)
{
	args[0] = CStringGetTextDatum(tenant);
	args[1] = CStringGetTextDatum(meter);
	args[2] = TimestampTzGetDatum(period_start);
}

/* The merge of the counter rows a per-period statement returns. */
static FmCounter
merged_rows(FmStatement *st, const char *tenant, const char *meter,
			TimestampTz period_start, bool read_only)
{
	Datum		args[3];

	period_args(args, tenant, meter, period_start);
	fm_execute(st, args, NULL, read_only, 0);
	return merge_result_rows();
}

/*
 * The period's usage: merge of all its rows, in a fresh snapshot that
 * includes this transaction's writes; the rows stay in SPI_tuptable.
 */
static FmCounter
read_period(const char *tenant, const char *meter, TimestampTz period_start)
{
	return merged_rows(&read_period_stmt, tenant, meter, period_start, false);
}

/*
 * Lock stripe 0 of the period for consume (creating it first if needed)
 * and read it and the tracked usage, in one statement.
 */
static void
lock_for_consume(const char *tenant, const char *meter, TimestampTz period_start,
				 FmCounter *stripe0, FmCounter *tracked)
{
	Datum		args[3];
	bool		found = false;
	bool		isnull;
	uint64		i;

	period_args(args, tenant, meter, period_start);
	fm_execute(&lock_for_consume_stmt, args, NULL, false, 0);
	for (i = 0; i < SPI_processed && !found; i++)
		found = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
										   1, &isnull));
	if (!found)
	{
		fm_execute(&create_stripe0_stmt, args, NULL, false, 0);
		fm_execute(&lock_for_consume_stmt, args, NULL, false, 0);
	}

	*stripe0 = empty_counter();
	*tracked = empty_counter();
	found = false;
	for (i = 0; i < SPI_processed; i++)
	{
		bool		is_stripe0 = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[i],
															SPI_tuptable->tupdesc, 1, &isnull));
		Datum		d = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2, &isnull);

		fm_counter_report(fm_counter_merge(is_stripe0 ? stripe0 : tracked,
										   DatumGetFmCounterP(d)));
		found = found || is_stripe0;
	}
	if (!found)
		elog(ERROR, "could not lock the counter of tenant \"%s\" meter \"%s\"",
			 tenant, meter);
}

/* Lock stripe 0 of the period, creating it first if needed. */
static void
lock_stripe0(const char *tenant, const char *meter, TimestampTz period_start)
{
	Datum		args[3];

	period_args(args, tenant, meter, period_start);
	fm_execute(&lock_stripe0_stmt, args, NULL, false, 0);
	if (SPI_processed == 0)
	{
		fm_execute(&create_stripe0_stmt, args, NULL, false, 0);
		fm_execute(&lock_stripe0_stmt, args, NULL, false, 0);
		if (SPI_processed != 1)
			elog(ERROR, "could not lock the counter of tenant \"%s\" meter \"%s\"",
				 tenant, meter);
	}
}

/*
 * Record the idempotency key (one row per meter, seq in call order).
 * Returns false when the key is already recorded: by a committed
 * transaction, or by one that commits while we wait on its row.
 */
static bool
claim_key(const char *tenant, const char *key, int seq, const char *meter,
		  int64 amount, TimestampTz occurred_at, TimestampTz period_start,
		  const char *kind, const FmDecision *decision)
{
	Datum		args[15];
	char		nulls[16] = "               ";

	args[0] = CStringGetTextDatum(tenant);
	args[1] = CStringGetTextDatum(key);
	args[2] = Int16GetDatum((int16) seq);
	args[3] = CStringGetTextDatum(meter);
	args[4] = Int64GetDatum(amount);
	args[5] = TimestampTzGetDatum(occurred_at);
	args[6] = TimestampTzGetDatum(period_start);
	args[7] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	args[8] = CStringGetTextDatum(kind);
	if (decision == NULL)
	{
		args[9] = BoolGetDatum(true);
		memset(nulls + 10, 'n', 5);
	}
	else
	{
		args[9] = BoolGetDatum(decision->granted);
		args[10] = Int64GetDatum(decision->used);
		args[11] = Int64GetDatum(decision->quota);
		args[12] = Int64GetDatum(decision->remaining);
		args[13] = TimestampTzGetDatum(decision->resets_at);
		args[14] = Int64GetDatum(decision->overage);
		if (!decision->limited)
			nulls[11] = nulls[12] = nulls[14] = 'n';
		if (!decision->resets)
			nulls[13] = 'n';
	}
	fm_execute(&claim_key_stmt, args, nulls, false, 0);
	return SPI_processed == 1;
}

/* Queue the announcements a new usage level of a limited meter calls for. */
static void
announce_usage_level(const char *tenant, const char *meter, const FmLimit *limit,
					 TimestampTz period_start, const FmCounter *total)
{
	if (!limit->limited)
		return;
	fm_queue_usage_level(tenant, meter, period_start,
						 fm_used_of(total, limit->aggregation), limit->quota,
						 limit->hard, limit->thresholds, limit->nthresholds);
}

/*
 * The tuple descriptor of flagmeter.decision, blessed, kept for the call
 * site (fn_extra) so that check and consume do not look the type up on
 * every call.
 */
static TupleDesc
decision_desc(FunctionCallInfo fcinfo)
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

/* Build a flagmeter.decision tuple. */
static HeapTuple
decision_tuple(TupleDesc desc, const FmDecision *d)
{
	Datum		values[7];
	bool		nulls[7] = {false, false, false, false, false, false, false};

	values[0] = BoolGetDatum(d->granted);
	values[1] = Int64GetDatum(d->used);
	values[2] = Int64GetDatum(d->quota);
	values[3] = Int64GetDatum(d->remaining);
	values[4] = TimestampTzGetDatum(d->resets_at);
	values[5] = Int64GetDatum(d->overage);
	values[6] = CStringGetTextDatum(d->meter);
	if (!d->limited)
		nulls[2] = nulls[3] = nulls[5] = true;
	if (!d->resets)
		nulls[4] = true;
	return heap_form_tuple(desc, values, nulls);
}

/*
 * The decisions remembered for a key, in seq order, copied out of SPI
 * memory; *n = 0 when the key is unknown.  kind_out gets the kind of the
 * first row.
 */
static FmDecision *
remembered_decisions(const char *tenant, const char *key, int *n,
					 bool read_only, char **kind_out)
{
	Datum		args[2];
	FmDecision *out;
	uint64		i;

	args[0] = CStringGetTextDatum(tenant);
	args[1] = CStringGetTextDatum(key);
	fm_execute(&read_key_stmt, args, NULL, read_only, 0);
	*n = (int) SPI_processed;
	if (SPI_processed == 0)
		return NULL;

	/* SPI_palloc: the results must outlive SPI_finish */
	out = SPI_palloc(sizeof(FmDecision) * SPI_processed);
	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	row = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		Datum		d;
		FmDecision *dec = &out[i];

		if (i == 0)
		{
			char	   *kind = TextDatumGetCString(SPI_getbinval(row, desc, 1, &isnull));
			size_t		len = strlen(kind) + 1;

			*kind_out = SPI_palloc(len);
			memcpy(*kind_out, kind, len);
		}
		{
			char	   *meter = TextDatumGetCString(SPI_getbinval(row, desc, 2, &isnull));
			size_t		len = strlen(meter) + 1;
			char	   *copy = SPI_palloc(len);

			memcpy(copy, meter, len);
			dec->meter = copy;
		}
		dec->granted = DatumGetBool(SPI_getbinval(row, desc, 3, &isnull));
		d = SPI_getbinval(row, desc, 4, &isnull);
		dec->used = isnull ? 0 : DatumGetInt64(d);
		d = SPI_getbinval(row, desc, 5, &isnull);
		dec->limited = !isnull;
		dec->quota = isnull ? 0 : DatumGetInt64(d);
		d = SPI_getbinval(row, desc, 6, &isnull);
		dec->remaining = isnull ? 0 : DatumGetInt64(d);
		d = SPI_getbinval(row, desc, 7, &isnull);
		dec->resets = !isnull;
		dec->resets_at = isnull ? 0 : DatumGetTimestampTz(d);
		d = SPI_getbinval(row, desc, 8, &isnull);
		dec->overage = isnull ? 0 : DatumGetInt64(d);
	}
	return out;
}

static void
key_used_by_track(const char *tenant, const char *key)
{
	ereport(ERROR,
			(errcode(ERRCODE_UNIQUE_VIOLATION),
			 errmsg("idempotency key \"%s\" of tenant \"%s\" was recorded by track",
					key, tenant),
			 errdetail("A key names one event; consume cannot reuse a key of track.")));
}

/* ---------------------------------------------------------------------
 * track
 * ---------------------------------------------------------------------
 */

/* The row a track statement wrote (its RETURNING list). */
typedef struct StripeWritten
{
	int16		stripe;
	FmCounter	counter;		/* after the increment */
	bool		has_recheck;
	int64		recheck_at;
	int32		recheck_for;
} StripeWritten;

/* From row r of SPI_tuptable, columns first .. first + 3. */
static StripeWritten
stripe_written(uint64 r, int first)
{
	HeapTuple	row = SPI_tuptable->vals[r];
	TupleDesc	desc = SPI_tuptable->tupdesc;
	StripeWritten w;
	bool		null_at;
	bool		null_for;
	bool		isnull;

	w.stripe = DatumGetInt16(SPI_getbinval(row, desc, first, &isnull));
	w.counter = *DatumGetFmCounterP(SPI_getbinval(row, desc, first + 1, &isnull));
	w.recheck_at = DatumGetInt64(SPI_getbinval(row, desc, first + 2, &null_at));
	w.recheck_for = DatumGetInt32(SPI_getbinval(row, desc, first + 3, &null_for));
	w.has_recheck = !null_at && !null_for;
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
static bool
period_read_due(const char *tenant, const char *meter, const FmLimit *limit,
				TimestampTz period_start, const StripeWritten *written)
{
	if (limit->aggregation == FM_AGG_MAX)
	{
		announce_usage_level(tenant, meter, limit, period_start, &written->counter);
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
static bool
next_recheck(const FmLimit *limit, const StripeWritten *written,
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

static void
announce_after_track(const char *tenant, const char *meter, const FmLimit *limit,
					 TimestampTz period_start, const StripeWritten *written)
{
	FmCounter	total;
	int64		recheck_at;
	int			nstripes = 0;
	Datum		args[6];
	uint64		i;

	if (!period_read_due(tenant, meter, limit, period_start, written))
		return;

	total = read_period(tenant, meter, period_start);
	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;

		if (DatumGetInt16(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
										2, &isnull)) != 0)
			nstripes++;
	}
	announce_usage_level(tenant, meter, limit, period_start, &total);
	if (limit->aggregation == FM_AGG_LATEST ||
		!next_recheck(limit, written, &total, nstripes, &recheck_at))
		return;

	period_args(args, tenant, meter, period_start);
	args[3] = Int16GetDatum(written->stripe);
	args[4] = Int64GetDatum(recheck_at);
	args[5] = Int32GetDatum(limit->fingerprint);
	fm_execute(&set_recheck_stmt, args, NULL, false, 0);
}

/*
 * track(tenant, meter, amount, occurred_at, idempotency_key) -> boolean
 *
 * Records amount in the period containing occurred_at: a raw event row
 * and an increment of a stripe (see pick_stripe).  Returns
 * false, recording nothing, when the key is already recorded.  Writes no
 * row that another transaction holds (in REPEATABLE READ, unless two
 * backends share a stripe), so writers of one tenant do not queue behind
 * each other.
 */
PG_FUNCTION_INFO_V1(fm_track);
Datum
fm_track(PG_FUNCTION_ARGS)
{
	char	   *tenant = fm_arg_tenant(fcinfo, 0);
	char	   *meter = fm_arg_meter(fcinfo, 1);
	char	   *key = fm_arg_key(fcinfo, 4);
	int64		amount;
	TimestampTz occurred_at;
	FmLimit		limit;
	TimestampTz period_start;
	TimestampTz period_end;
	FmCounter	delta;
	StripeWritten written;
	Datum		args[9];

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("amount must not be NULL")));
	amount = PG_GETARG_INT64(2);
	fm_check_amount(amount, true);
	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("occurred_at must not be NULL")));
	occurred_at = PG_GETARG_TIMESTAMPTZ(3);
	fm_check_timestamp(occurred_at);

	lock_counters_for_write();
	SPI_connect();
	fm_load_limit(tenant, meter, false, &limit);
	fm_period_bounds(limit.period, limit.anchor, limit.tz, occurred_at,
					 &period_start, &period_end);

	if (key && !claim_key(tenant, key, 0, meter, amount, occurred_at,
						  period_start, "track", NULL))
	{
		SPI_finish();
		PG_RETURN_BOOL(false);
	}

	/*
	 * One statement (two when the stripe does not exist yet): the raw event
	 * and the stripe's increment.  A stripe whose usage would overflow raises 22003
	 * and rolls the event back; so does the period's total when it is read.
	 */
	delta = empty_counter();
	fm_counter_report(fm_counter_add_event(&delta, amount, occurred_at));
	args[0] = CStringGetTextDatum(tenant);
	args[1] = CStringGetTextDatum(meter);
	args[2] = Int64GetDatum(amount);
	args[3] = TimestampTzGetDatum(occurred_at);
	args[4] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	args[5] = key ? CStringGetTextDatum(key) : (Datum) 0;
	args[6] = TimestampTzGetDatum(period_start);
	args[8] = FmCounterPGetDatum(&delta);
	if (IsolationUsesXactSnapshot())
	{
		args[7] = Int16GetDatum(own_stripe());
		fm_execute(&track_add_to_stripe_stmt, args, key ? NULL : "     n   ",
				   false, 0);
	}
	else
	{
		args[7] = Int16GetDatum(pick_stripe(tenant, meter, period_start));
		fm_execute(&track_update_stripe_stmt, args, key ? NULL : "     n   ",
				   false, 0);
		if (SPI_processed == 0)
			fm_execute(&add_to_stripe_stmt, args, NULL, false, 0);
	}
	if (SPI_processed != 1)
		elog(ERROR, "track wrote " UINT64_FORMAT " counter rows of tenant \"%s\" meter \"%s\"",
			 (uint64) SPI_processed, tenant, meter);
	written = stripe_written(0, 1);
	announce_after_track(tenant, meter, &limit, period_start, &written);

	SPI_finish();
	PG_RETURN_BOOL(true);
}

/* ---------------------------------------------------------------------
 * track_batch
 * ---------------------------------------------------------------------
 */

/* One (tenant, meter): its limit, loaded once per batch. */
typedef struct BatchLimitEntry
{
	char		key[FM_TENANT_MAX_BYTES + 1 + 64 + 1];	/* tenant \0 meter */
	FmLimit		limit;
} BatchLimitEntry;

/* One (tenant, meter, period): the increment of the batch. */
typedef struct BatchGroupKey
{
	char		tenant_meter[FM_TENANT_MAX_BYTES + 1 + 64 + 1];
	TimestampTz period_start;
} BatchGroupKey;

typedef struct BatchGroupEntry
{
	BatchGroupKey key;
	int			first;			/* an event of the group, for its names */
	FmCounter	delta;
	const FmLimit *limit;
	StripeWritten written;		/* the group's stripe after the increment */
} BatchGroupEntry;

/* One-dimensional arrays of the element types the batch statements take. */
static Datum
text_array(Datum *elems, int n)
{
	return PointerGetDatum(construct_array(elems, n, TEXTOID, -1, false, TYPALIGN_INT));
}

static Datum
int8_array(Datum *elems, int n)
{
	return PointerGetDatum(construct_array(elems, n, INT8OID, 8, FLOAT8PASSBYVAL,
										   TYPALIGN_DOUBLE));
}

static Datum
timestamptz_array(Datum *elems, int n)
{
	return PointerGetDatum(construct_array(elems, n, TIMESTAMPTZOID, 8, FLOAT8PASSBYVAL,
										   TYPALIGN_DOUBLE));
}

/* args[0..2]: the (tenant, meter, period_start) arrays of n periods. */
static void
period_array_args(Datum *args, Datum *tenants, Datum *meters, Datum *starts, int n)
{
	args[0] = text_array(tenants, n);
	args[1] = text_array(meters, n);
	args[2] = timestamptz_array(starts, n);
}

static void
tenant_meter_key(char *buf, const char *tenant, const char *meter)
{
	size_t		tlen = strlen(tenant);

	memset(buf, 0, FM_TENANT_MAX_BYTES + 1 + 64 + 1);
	memcpy(buf, tenant, tlen);
	memcpy(buf + tlen + 1, meter, strlen(meter));
}

/* Elements of a 1-D text array argument; NULL elements as NULL pointers. */
static char **
text_array_arg(FunctionCallInfo fcinfo, int argno, const char *what, int *n,
			   bool nulls_allowed)
{
	ArrayType  *arr;
	Datum	   *elems;
	bool	   *isnull;
	char	  **out;
	int			i;

	arr = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("%s must be a one-dimensional array", what)));
	deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT, &elems, &isnull, n);
	out = palloc(sizeof(char *) * Max(*n, 1));
	for (i = 0; i < *n; i++)
	{
		if (isnull[i])
		{
			if (!nulls_allowed)
				ereport(ERROR,
						(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						 errmsg("%s must not contain NULLs", what)));
			out[i] = NULL;
		}
		else
			out[i] = TextDatumGetCString(elems[i]);
	}
	return out;
}

static void
check_array_length(const char *what, int n, int expected)
{
	if (n != expected)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("%s has %d elements, expected %d", what, n, expected),
				 errdetail("The arrays of one call are parallel: element i of each describes event i.")));
}

/*
 * Elements of a 1-D bigint array argument that must have expected
 * elements, none NULL, each a valid amount.
 */
static int64 *
amount_array_arg(FunctionCallInfo fcinfo, int argno, int expected,
				 bool zero_allowed)
{
	ArrayType  *arr = PG_GETARG_ARRAYTYPE_P(argno);
	Datum	   *elems;
	bool	   *isnull;
	int64	   *out;
	int			n,
				i;

	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("amounts must be a one-dimensional array")));
	deconstruct_array(arr, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE,
					  &elems, &isnull, &n);
	check_array_length("amounts", n, expected);
	out = palloc(sizeof(int64) * Max(n, 1));
	for (i = 0; i < n; i++)
	{
		if (isnull[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("amounts must not contain NULLs")));
		out[i] = DatumGetInt64(elems[i]);
		fm_check_amount(out[i], zero_allowed);
	}
	return out;
}

static void
null_array_argument(const char *what)
{
	ereport(ERROR,
			(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
			 errmsg("%s must not be NULL", what)));
}

/*
 * Read the periods of the groups glist[0 .. n-1] (whose names and starts
 * are in the Datum arrays), queue what each reached, and write the
 * stripes' new recheck figures: track's announce_after_track for many
 * periods, in two statements.
 */
static void
read_due_periods(char **tenants, char **meters, BatchGroupEntry **glist,
				 Datum *g_tenants, Datum *g_meters, Datum *g_starts, int n)
{
	Datum		args[6];
	FmCounter  *totals = palloc(sizeof(FmCounter) * n);
	int		   *nstripes = palloc0(sizeof(int) * n);
	Datum	   *r_tenants = palloc(sizeof(Datum) * n);
	Datum	   *r_meters = palloc(sizeof(Datum) * n);
	Datum	   *r_starts = palloc(sizeof(Datum) * n);
	Datum	   *r_at = palloc(sizeof(Datum) * n);
	Datum	   *r_for = palloc(sizeof(Datum) * n);
	int			nrecheck = 0;
	uint64		r;
	int			g;

	period_array_args(args, g_tenants, g_meters, g_starts, n);
	fm_execute(&read_groups_stmt, args, NULL, false, 0);
	for (g = 0; g < n; g++)
		totals[g] = empty_counter();
	for (r = 0; r < SPI_processed; r++)
	{
		HeapTuple	row = SPI_tuptable->vals[r];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		int64		ordinal = DatumGetInt64(SPI_getbinval(row, desc, 1, &isnull));

		fm_counter_report(fm_counter_merge(&totals[ordinal - 1],
										   DatumGetFmCounterP(SPI_getbinval(row, desc, 2, &isnull))));
		if (DatumGetInt16(SPI_getbinval(row, desc, 3, &isnull)) != 0)
			nstripes[ordinal - 1]++;
	}

	for (g = 0; g < n; g++)
	{
		BatchGroupEntry *group = glist[g];
		int64		recheck_at;

		announce_usage_level(tenants[group->first], meters[group->first],
							 group->limit, group->key.period_start, &totals[g]);
		if (group->limit->aggregation == FM_AGG_LATEST ||
			!next_recheck(group->limit, &group->written, &totals[g], nstripes[g],
						  &recheck_at))
			continue;
		r_tenants[nrecheck] = g_tenants[g];
		r_meters[nrecheck] = g_meters[g];
		r_starts[nrecheck] = g_starts[g];
		r_at[nrecheck] = Int64GetDatum(recheck_at);
		r_for[nrecheck] = Int32GetDatum(group->limit->fingerprint);
		nrecheck++;
	}
	if (nrecheck == 0)
		return;
	period_array_args(args, r_tenants, r_meters, r_starts, nrecheck);
	args[3] = Int16GetDatum(own_stripe());
	args[4] = int8_array(r_at, nrecheck);
	args[5] = PointerGetDatum(construct_array(r_for, nrecheck, INT4OID, 4, true, TYPALIGN_INT));
	fm_execute(&set_recheck_batch_stmt, args, NULL, false, 0);
}

/*
 * track_batch(tenants[], meters[], amounts[], occurred_at[], keys[]) -> bigint
 *
 * The same guarantees as track for many events: everything is validated
 * before anything is written, and the call writes one statement of raw
 * events and one increment per (tenant, meter, period) of the batch.
 * Keyed events already recorded (or repeated within the batch) are
 * skipped; the result is how many events were counted.
 */
PG_FUNCTION_INFO_V1(fm_track_batch);
Datum
fm_track_batch(PG_FUNCTION_ARGS)
{
	char	  **tenants;
	char	  **meters;
	char	  **keys = NULL;
	int64	   *amounts;
	TimestampTz *occurred;
	TimestampTz *period_starts;
	bool	   *counted;
	int			n,
				n2,
				i;
	int64		ncounted = 0;
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	HASHCTL		ctl;
	HTAB	   *limits;
	HTAB	   *groups;

	if (PG_ARGISNULL(0))
		null_array_argument("tenants");
	if (PG_ARGISNULL(1))
		null_array_argument("meters");
	if (PG_ARGISNULL(2))
		null_array_argument("amounts");

	/* Validate every argument before writing anything. */
	tenants = text_array_arg(fcinfo, 0, "tenants", &n, false);
	meters = text_array_arg(fcinfo, 1, "meters", &n2, false);
	check_array_length("meters", n2, n);
	amounts = amount_array_arg(fcinfo, 2, n, true);
	occurred = palloc(sizeof(TimestampTz) * Max(n, 1));
	if (PG_ARGISNULL(3))
	{
		for (i = 0; i < n; i++)
			occurred[i] = now;
	}
	else
	{
		ArrayType  *arr = PG_GETARG_ARRAYTYPE_P(3);
		Datum	   *elems;
		bool	   *isnull;

		if (ARR_NDIM(arr) > 1)
			ereport(ERROR,
					(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
					 errmsg("occurred_at must be a one-dimensional array")));
		deconstruct_array(arr, TIMESTAMPTZOID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE,
						  &elems, &isnull, &n2);
		check_array_length("occurred_at", n2, n);
		for (i = 0; i < n; i++)
			occurred[i] = isnull[i] ? now : DatumGetTimestampTz(elems[i]);
	}
	if (!PG_ARGISNULL(4))
	{
		keys = text_array_arg(fcinfo, 4, "idempotency_keys", &n2, true);
		check_array_length("idempotency_keys", n2, n);
	}
	for (i = 0; i < n; i++)
	{
		fm_check_tenant(tenants[i]);
		fm_check_meter_name(meters[i]);
		fm_check_timestamp(occurred[i]);
		if (keys && keys[i])
			fm_check_key(keys[i]);
	}
	if (n == 0)
		PG_RETURN_INT64(0);

	lock_counters_for_write();
	SPI_connect();

	/* The limit of each distinct (tenant, meter), and each event's period. */
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(((BatchLimitEntry *) 0)->key);
	ctl.entrysize = sizeof(BatchLimitEntry);
	ctl.hcxt = CurrentMemoryContext;
	limits = hash_create("flagmeter batch limits", 64, &ctl,
						 HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	period_starts = palloc(sizeof(TimestampTz) * n);
	counted = palloc(sizeof(bool) * n);
	for (i = 0; i < n; i++)
	{
		char		hkey[sizeof(((BatchLimitEntry *) 0)->key)];
		BatchLimitEntry *entry;
		bool		found;
		TimestampTz end;

		tenant_meter_key(hkey, tenants[i], meters[i]);
		entry = hash_search(limits, hkey, HASH_ENTER, &found);
		if (!found)
			fm_load_limit(tenants[i], meters[i], false, &entry->limit);
		fm_period_bounds(entry->limit.period, entry->limit.anchor, entry->limit.tz,
						 occurred[i], &period_starts[i], &end);
		counted[i] = true;
	}

	/* Claim keys one by one: a repeat within the batch is a duplicate too. */
	if (keys)
	{
		for (i = 0; i < n; i++)
			if (keys[i] != NULL)
				counted[i] = claim_key(tenants[i], keys[i], 0, meters[i], amounts[i],
									   occurred[i], period_starts[i], "track", NULL);
	}

	/* Raw events and per-group increments of the counted events. */
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(BatchGroupKey);
	ctl.entrysize = sizeof(BatchGroupEntry);
	ctl.hcxt = CurrentMemoryContext;
	groups = hash_create("flagmeter batch groups", 64, &ctl,
						 HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	{
		Datum	   *ev_tenants = palloc(sizeof(Datum) * n);
		Datum	   *ev_meters = palloc(sizeof(Datum) * n);
		Datum	   *ev_amounts = palloc(sizeof(Datum) * n);
		Datum	   *ev_occurred = palloc(sizeof(Datum) * n);
		Datum	   *ev_keys = palloc(sizeof(Datum) * n);
		bool	   *ev_key_nulls = palloc(sizeof(bool) * n);
		int			dims[1];
		int			lbs[1] = {1};
		Datum		args[6];
		int			ngroups;
		HASH_SEQ_STATUS scan;
		BatchGroupEntry *group;

		for (i = 0; i < n; i++)
		{
			BatchGroupKey gkey;
			BatchGroupEntry *entry;
			bool		found;

			if (!counted[i])
				continue;
			ev_tenants[ncounted] = CStringGetTextDatum(tenants[i]);
			ev_meters[ncounted] = CStringGetTextDatum(meters[i]);
			ev_amounts[ncounted] = Int64GetDatum(amounts[i]);
			ev_occurred[ncounted] = TimestampTzGetDatum(occurred[i]);
			ev_key_nulls[ncounted] = !(keys && keys[i]);
			ev_keys[ncounted] = ev_key_nulls[ncounted] ? (Datum) 0 :
				CStringGetTextDatum(keys[i]);
			ncounted++;

			memset(&gkey, 0, sizeof(gkey));
			tenant_meter_key(gkey.tenant_meter, tenants[i], meters[i]);
			gkey.period_start = period_starts[i];
			entry = hash_search(groups, &gkey, HASH_ENTER, &found);
			if (!found)
			{
				char		hkey[sizeof(((BatchLimitEntry *) 0)->key)];

				entry->first = i;
				entry->delta = empty_counter();
				tenant_meter_key(hkey, tenants[i], meters[i]);
				entry->limit = &((BatchLimitEntry *) hash_search(limits, hkey, HASH_FIND,
																  NULL))->limit;
			}
			fm_counter_report(fm_counter_add_event(&entry->delta, amounts[i], occurred[i]));
		}

		if (ncounted > 0)
		{
			dims[0] = (int) ncounted;
			args[0] = text_array(ev_tenants, ncounted);
			args[1] = text_array(ev_meters, ncounted);
			args[2] = int8_array(ev_amounts, ncounted);
			args[3] = timestamptz_array(ev_occurred, ncounted);
			args[4] = TimestampTzGetDatum(now);
			args[5] = PointerGetDatum(construct_md_array(ev_keys, ev_key_nulls, 1, dims, lbs,
														 TEXTOID, -1, false, TYPALIGN_INT));
			fm_execute(&insert_events_batch_stmt, args, NULL, false, 0);

			ngroups = (int) hash_get_num_entries(groups);
			{
				Datum	   *g_tenants = palloc(sizeof(Datum) * ngroups);
				Datum	   *g_meters = palloc(sizeof(Datum) * ngroups);
				Datum	   *g_starts = palloc(sizeof(Datum) * ngroups);
				Datum	   *g_counters = palloc(sizeof(Datum) * ngroups);
				BatchGroupEntry **glist = palloc(sizeof(BatchGroupEntry *) * ngroups);
				uint64		r;
				int			g = 0;
				int			ndue;

				hash_seq_init(&scan, groups);
				while ((group = hash_seq_search(&scan)) != NULL)
				{
					glist[g] = group;
					g_tenants[g] = CStringGetTextDatum(tenants[group->first]);
					g_meters[g] = CStringGetTextDatum(meters[group->first]);
					g_starts[g] = TimestampTzGetDatum(group->key.period_start);
					g_counters[g] = FmCounterPGetDatum(fm_counter_copy(&group->delta));
					g++;
				}
				period_array_args(args, g_tenants, g_meters, g_starts, ngroups);
				args[3] = Int16GetDatum(own_stripe());
				args[4] = PointerGetDatum(construct_array(g_counters, ngroups, fm_counter_type_oid(),
														  FM_COUNTER_SIZE, false, TYPALIGN_DOUBLE));
				fm_execute(&add_to_stripes_batch_stmt, args, NULL, false, 0);
				if (SPI_processed != (uint64) ngroups)
					elog(ERROR, "track_batch wrote " UINT64_FORMAT " counter rows for %d periods",
						 (uint64) SPI_processed, ngroups);
				for (r = 0; r < SPI_processed; r++)
				{
					BatchGroupKey gkey;
					bool		isnull;
					HeapTuple	row = SPI_tuptable->vals[r];
					TupleDesc	desc = SPI_tuptable->tupdesc;

					memset(&gkey, 0, sizeof(gkey));
					tenant_meter_key(gkey.tenant_meter,
									 TextDatumGetCString(SPI_getbinval(row, desc, 1, &isnull)),
									 TextDatumGetCString(SPI_getbinval(row, desc, 2, &isnull)));
					gkey.period_start = DatumGetTimestampTz(SPI_getbinval(row, desc, 3, &isnull));
					group = hash_search(groups, &gkey, HASH_FIND, NULL);
					if (group == NULL)
						elog(ERROR, "track_batch wrote a counter row it has no period for");
					group->written = stripe_written(r, 4);
				}

				/*
				 * Which periods may have reached something, as in track: only
				 * those are read, all in one statement.
				 */
				ndue = 0;
				for (g = 0; g < ngroups; g++)
				{
					group = glist[g];
					if (period_read_due(tenants[group->first], meters[group->first],
										group->limit, group->key.period_start,
										&group->written))
					{
						glist[ndue] = group;
						g_tenants[ndue] = g_tenants[g];
						g_meters[ndue] = g_meters[g];
						g_starts[ndue] = g_starts[g];
						ndue++;
					}
				}
				if (ndue > 0)
					read_due_periods(tenants, meters, glist, g_tenants, g_meters,
									 g_starts, ndue);
			}
		}
	}

	SPI_finish();
	PG_RETURN_INT64(ncounted);
}

/* ---------------------------------------------------------------------
 * consume
 * ---------------------------------------------------------------------
 */
/*
 * The decisions remembered for a consume's idempotency key (SPI memory), or
 * NULL when the key has none; a key recorded by track is an error.
 */
static FmDecision *
replayed_decisions(const char *tenant, const char *key)
{
	int			nremembered;
	char	   *kind = NULL;
	FmDecision *remembered = remembered_decisions(tenant, key, &nremembered,
												  false, &kind);

	if (nremembered == 0)
		return NULL;
	if (strcmp(kind, "track") == 0)
		key_used_by_track(tenant, key);
	return remembered;
}

typedef struct ConsumeItem
{
	const char *meter;
	int64		amount;
	FmLimit		limit;
	TimestampTz period_start;
	TimestampTz period_end;
	FmCounter	tracked;		/* the other stripes, as seen before the lock */
	FmCounter	stripe0;		/* stripe 0 as locked */
} ConsumeItem;

static int
compare_items_by_meter(const void *a, const void *b)
{
	return strcmp((*(ConsumeItem *const *) a)->meter,
				  (*(ConsumeItem *const *) b)->meter);
}

/*
 * consume of one sum or count meter without an idempotency key, the common
 * call.  A hot tenant's consumes run one at a time behind stripe 0's row
 * lock, held through the commit flush, so what runs under the lock bounds
 * their rate: here only one conditional UPDATE (DESIGN.md, mechanism 3),
 * deciding on stripe 0's latest committed version (READ COMMITTED
 * rechecks the condition on it after waiting for a concurrent consume).
 * The event is inserted and the tracked stripes read before it; a refusal
 * deletes the event again.  (consume_items' FOR UPDATE, then event and
 * update under the lock, ran a hot tenant at 0.65 of a conditional UPDATE;
 * this shape measured 1.0 as plain SQL.)
 */
static FmDecision *
consume_one(const char *tenant, ConsumeItem *item, TimestampTz now)
{
	const FmLimit *limit = &item->limit;
	FmStatement *update = limit->aggregation == FM_AGG_COUNT ?
		&consume_count_stmt : &consume_sum_stmt;
	FmDecision *decision = SPI_palloc(sizeof(FmDecision));
	FmCounter	delta = empty_counter();
	FmCounter	tracked = empty_counter();
	FmCounter	counted;
	Datum		args[5];
	Oid			event_rel = InvalidOid;
	ItemPointerData event_tid;
	int64		room = 0;
	bool		bounded = limit->limited && limit->hard;
	uint64		i;

	ItemPointerSetInvalid(&event_tid);
	period_args(args, tenant, item->meter, item->period_start);
	args[3] = Int64GetDatum(item->amount);
	args[4] = TimestampTzGetDatum(now);
	fm_execute(&consume_event_stmt, args, NULL, false, 0);
	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	row = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		Datum		d = SPI_getbinval(row, desc, 3, &isnull);

		if (!isnull)
			fm_counter_report(fm_counter_merge(&tracked, DatumGetFmCounterP(d)));
		else
		{
			event_rel = DatumGetObjectId(SPI_getbinval(row, desc, 1, &isnull));
			ItemPointerCopy((ItemPointer) DatumGetPointer(SPI_getbinval(row, desc, 2, &isnull)),
							&event_tid);
		}
	}
	if (!OidIsValid(event_rel))
		elog(ERROR, "consume inserted no event for tenant \"%s\" meter \"%s\"",
			 tenant, item->meter);

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
		 * No room, or no stripe 0 in this statement's snapshot: create it
		 * (a concurrent consume may have, after the snapshot; then this
		 * waits for it to commit) and decide again in a newer snapshot.
		 */
		fm_execute(&create_stripe0_stmt, args, NULL, false, 0);
		fm_execute(update, args, bounded ? NULL : "    n", false, 0);
	}

	if (SPI_processed == 1)
	{
		FmCounter	after = merge_result_rows();	/* stripe 0, as updated */

		fm_counter_report(fm_counter_merge(&after, &tracked));
		fm_decision_at(limit, true, fm_used_of(&after, limit->aggregation),
					   item->period_end, decision);
		announce_usage_level(tenant, item->meter, limit, item->period_start, &after);
	}
	else
	{
		Relation	rel = table_open(event_rel, RowExclusiveLock);
		FmCounter	current;

		simple_table_tuple_delete(rel, &event_tid, GetActiveSnapshot());
		table_close(rel, RowExclusiveLock);

		fm_execute(&read_stripe0_stmt, args, NULL, false, 0);
		current = merge_result_rows();
		fm_counter_report(fm_counter_merge(&current, &tracked));
		/* as consume_items (fm_decide raises the event's overflow) */
		fm_decide(limit, &current, item->amount, now, item->period_end, false,
				  decision, NULL);
		decision->granted = false;
	}
	decision->meter = item->meter;
	return decision;
}

/*
 * The heart of consume: decide and record all items or none.  Returns the
 * decisions in item order (memory that outlives SPI).
 *
 * Every consume of a period goes through its stripe 0, which is locked, in
 * meter-name order so that concurrent multi-meter consumes cannot deadlock;
 * SELECT ... FOR UPDATE returns its latest committed value, so a hard limit
 * is never exceeded by consumes.  The other stripes hold tracked usage,
 * which is read just before the lock, as committed then: track is never
 * refused and does not serialize with consume, and reading it before the
 * lock keeps the lock held only for the decision and the write.
 */
static FmDecision *
consume_items(const char *tenant, ConsumeItem *items, int n, const char *key)
{
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	FmDecision *decisions;
	FmCounter  *currents;
	FmCounter  *afters;
	ConsumeItem **order;
	bool		all_granted = true;
	int			i;

	lock_counters_for_write();
	SPI_connect();

	for (i = 0; i < n; i++)
	{
		fm_load_limit(tenant, items[i].meter, false, &items[i].limit);
		fm_period_bounds(items[i].limit.period, items[i].limit.anchor,
						 items[i].limit.tz, now,
						 &items[i].period_start, &items[i].period_end);
	}

	if (n == 1 && key == NULL &&
		(items[0].limit.aggregation == FM_AGG_SUM ||
		 items[0].limit.aggregation == FM_AGG_COUNT))
	{
		decisions = consume_one(tenant, &items[0], now);
		SPI_finish();
		return decisions;
	}

	/* A retried key: the original decision, nothing recorded. */
	if (key)
	{
		FmDecision *remembered = replayed_decisions(tenant, key);

		if (remembered)
		{
			SPI_finish();
			return remembered;
		}
	}

	order = palloc(sizeof(ConsumeItem *) * n);
	for (i = 0; i < n; i++)
		order[i] = &items[i];
	qsort(order, n, sizeof(ConsumeItem *), compare_items_by_meter);
	for (i = 0; i < n; i++)
		lock_for_consume(tenant, order[i]->meter, order[i]->period_start,
						 &order[i]->stripe0, &order[i]->tracked);

	decisions = SPI_palloc(sizeof(FmDecision) * n);
	currents = palloc(sizeof(FmCounter) * n);
	afters = palloc(sizeof(FmCounter) * n);
	for (i = 0; i < n; i++)
	{
		currents[i] = items[i].stripe0;
		fm_counter_report(fm_counter_merge(&currents[i], &items[i].tracked));
		fm_decide(&items[i].limit, &currents[i], items[i].amount, now,
				  items[i].period_end, true, &decisions[i], NULL);
		decisions[i].meter = items[i].meter;
		if (!decisions[i].granted)
			all_granted = false;
		/* stripe 0 after recording, checked for overflow before any write */
		afters[i] = items[i].stripe0;
		fm_counter_report(fm_counter_add_event(&afters[i], items[i].amount, now));
	}

	/*
	 * All or nothing: one refusal refuses every meter, each decision then
	 * showing the usage unchanged.
	 */
	if (!all_granted)
	{
		for (i = 0; i < n; i++)
		{
			fm_decide(&items[i].limit, &currents[i], items[i].amount, now,
					  items[i].period_end, false, &decisions[i], NULL);
			decisions[i].meter = items[i].meter;
			decisions[i].granted = false;
		}
	}

	if (key)
	{
		for (i = 0; i < n; i++)
		{
			if (!claim_key(tenant, key, i, items[i].meter, items[i].amount, now,
						   items[i].period_start, "consume", &decisions[i]))
			{
				/* a concurrent call with this key committed first */
				FmDecision *remembered = replayed_decisions(tenant, key);

				if (remembered == NULL)
					elog(ERROR, "idempotency key \"%s\" of tenant \"%s\" was claimed but has no decision",
						 key, tenant);
				SPI_finish();
				return remembered;
			}
		}
	}

	if (all_granted)
	{
		for (i = 0; i < n; i++)
		{
			Datum		args[7];

			args[0] = CStringGetTextDatum(tenant);
			args[1] = CStringGetTextDatum(items[i].meter);
			args[2] = TimestampTzGetDatum(items[i].period_start);
			args[3] = FmCounterPGetDatum(&afters[i]);
			args[4] = Int64GetDatum(items[i].amount);
			args[5] = TimestampTzGetDatum(now);
			args[6] = key ? CStringGetTextDatum(key) : (Datum) 0;
			fm_execute(&record_consumed_stmt, args, key ? NULL : "      n", false, 0);
			if (items[i].limit.limited)
				fm_queue_usage_level(tenant, items[i].meter, items[i].period_start,
									 decisions[i].used, items[i].limit.quota,
									 items[i].limit.hard, items[i].limit.thresholds,
									 items[i].limit.nthresholds);
		}
	}

	SPI_finish();
	return decisions;
}

/* consume(tenant, meter, amount, idempotency_key) -> decision */
PG_FUNCTION_INFO_V1(fm_consume);
Datum
fm_consume(PG_FUNCTION_ARGS)
{
	char	   *tenant = fm_arg_tenant(fcinfo, 0);
	ConsumeItem item;
	char	   *key = fm_arg_key(fcinfo, 3);
	FmDecision *decision;
	TupleDesc	desc;

	memset(&item, 0, sizeof(item));
	item.meter = fm_arg_meter(fcinfo, 1);
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("amount must not be NULL")));
	item.amount = PG_GETARG_INT64(2);
	fm_check_amount(item.amount, false);

	desc = decision_desc(fcinfo);

	decision = consume_items(tenant, &item, 1, key);
	PG_RETURN_DATUM(HeapTupleGetDatum(decision_tuple(desc, &decision[0])));
}

/* consume(tenant, meters[], amounts[], idempotency_key) -> setof decision */
PG_FUNCTION_INFO_V1(fm_consume_multi);
Datum
fm_consume_multi(PG_FUNCTION_ARGS)
{
	char	   *tenant = fm_arg_tenant(fcinfo, 0);
	char	   *key = fm_arg_key(fcinfo, 3);
	char	  **meters;
	int64	   *amounts;
	ConsumeItem *items;
	FmDecision *decisions;
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int			n,
				i,
				j;

	if (PG_ARGISNULL(1))
		null_array_argument("meters");
	if (PG_ARGISNULL(2))
		null_array_argument("amounts");
	meters = text_array_arg(fcinfo, 1, "meters", &n, false);
	if (n == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("meters must not be empty")));
	if (n > FM_MAX_METERS_PER_CONSUME)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("too many meters in one consume: %d", n),
				 errdetail("One consume names at most %d meters.", FM_MAX_METERS_PER_CONSUME)));

	amounts = amount_array_arg(fcinfo, 2, n, false);
	items = palloc0(sizeof(ConsumeItem) * n);
	for (i = 0; i < n; i++)
		items[i].amount = amounts[i];
	for (i = 0; i < n; i++)
	{
		fm_check_meter_name(meters[i]);
		for (j = 0; j < i; j++)
			if (strcmp(meters[i], meters[j]) == 0)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("meter \"%s\" is listed twice", meters[i]),
						 errhint("Add the amounts up into one element.")));
		items[i].meter = meters[i];
	}

	decisions = consume_items(tenant, items, n, key);

	InitMaterializedSRF(fcinfo, 0);
	for (i = 0; i < n; i++)
		tuplestore_puttuple(rsinfo->setResult,
							decision_tuple(rsinfo->setDesc, &decisions[i]));
	return (Datum) 0;
}

/* ---------------------------------------------------------------------
 * check and usage: read only, in the caller's snapshot
 * ---------------------------------------------------------------------
 */

/* check(tenant, meter, amount) -> decision */
PG_FUNCTION_INFO_V1(fm_check);
Datum
fm_check(PG_FUNCTION_ARGS)
{
	char	   *tenant = fm_arg_tenant(fcinfo, 0);
	char	   *meter = fm_arg_meter(fcinfo, 1);
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	int64		amount;
	FmLimit		limit;
	TimestampTz period_start;
	TimestampTz period_end;
	FmCounter	current;
	FmDecision	decision;
	TupleDesc	desc;
	HeapTuple	tuple;

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("amount must not be NULL")));
	amount = PG_GETARG_INT64(2);
	fm_check_amount(amount, true);
	desc = decision_desc(fcinfo);

	fm_load_limit(tenant, meter, true, &limit);
	fm_period_bounds(limit.period, limit.anchor, limit.tz, now,
					 &period_start, &period_end);
	current = fm_scan_period(tenant, meter, period_start);

	fm_decide(&limit, &current, amount, now, period_end, false, &decision, NULL);
	decision.meter = meter;
	tuple = decision_tuple(desc, &decision);
	PG_RETURN_DATUM(HeapTupleGetDatum(tuple));
}

/* usage(tenant, meter, at) -> quota_counter of the period containing at */
PG_FUNCTION_INFO_V1(fm_usage);
Datum
fm_usage(PG_FUNCTION_ARGS)
{
	char	   *tenant = fm_arg_tenant(fcinfo, 0);
	char	   *meter = fm_arg_meter(fcinfo, 1);
	TimestampTz at;
	FmLimit		limit;
	TimestampTz period_start;
	TimestampTz period_end;
	FmCounter	current;

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("at must not be NULL")));
	at = PG_GETARG_TIMESTAMPTZ(2);
	fm_check_timestamp(at);

	fm_load_limit(tenant, meter, true, &limit);
	fm_period_bounds(limit.period, limit.anchor, limit.tz, at,
					 &period_start, &period_end);
	current = fm_scan_period(tenant, meter, period_start);

	if (limit.limited)
	{
		current.flags |= FM_COUNTER_HAS_LIMIT;
		current.limit_value = limit.quota;
	}
	PG_RETURN_FMCOUNTER_P(fm_counter_copy(&current));
}

/* ---------------------------------------------------------------------
 * void
 * ---------------------------------------------------------------------
 */
typedef struct VoidItem
{
	char	   *meter;
	int64		amount;
	TimestampTz occurred_at;
	bool		consumed;		/* recorded by consume: it went into stripe 0 */
} VoidItem;

static int
compare_void_items(const void *a, const void *b)
{
	return strcmp(((const VoidItem *) a)->meter, ((const VoidItem *) b)->meter);
}

/*
 * void: the period's track stripes (an int2[]), having taken the stripe
 * tags of the shared ones, in stripe order, waiting for the transactions
 * tracking into them.  void then locks exactly these rows: a track while
 * the void holds the period finds their tags taken and writes another
 * stripe (one the void leaves alone) instead of waiting for its row locks.
 * The event being voided committed before, so its usage is in one of these
 * rows, in stripe 0, or in a stripe that a concurrent void merged these
 * into (void_in_counters then reads them again).
 */
static ArrayType *
take_track_stripe_tags(const char *tenant, const char *meter,
					   TimestampTz period_start)
{
	uint32		hash = period_hash(tenant, meter, period_start);
	Datum		args[3];
	ArrayType  *found;
	int16	   *stripes;
	int			n,
				i;

	period_args(args, tenant, meter, period_start);
	fm_execute(&track_stripes_stmt, args, NULL, false, 0);
	found = result_stripes();
	stripes = (int16 *) ARR_DATA_PTR(found);
	n = ArrayGetNItems(ARR_NDIM(found), ARR_DIMS(found));
	for (i = 0; i < n; i++)
	{
		if (stripes[i] <= fm_stripes)
		{
			LOCKTAG		tag;

			stripe_tag(&tag, hash, stripes[i]);
			(void) LockAcquire(&tag, ExclusiveLock, false, false);
		}
	}
	return found;
}

/* A period a void takes an event out of: its rows as void_in_counters locked them. */
typedef struct VoidPeriod
{
	const char *tenant;
	const char *meter;
	TimestampTz period_start;
	Datum		args[5];		/* [0..2]: the three above, as statement arguments */
	ArrayType  *locked;			/* the track stripes locked, in stripe order */
	int			nlocked;
	FmCounter	tracked;		/* their merge */
	bool		stripe0_locked;
	FmCounter	stripe0;		/* once stripe0_locked */
} VoidPeriod;

/*
 * Case 1: out of the track stripes, when their merge holds the amount: the
 * merge minus the event is kept in the lowest of them, the others are
 * deleted.  *total gets the period's usage after it (stripe 0 as last
 * committed, unless it is locked already).
 */
static bool
void_from_track_stripes(VoidPeriod *p, int64 amount, FmCounter *total)
{
	int16	   *stripes;

	*total = p->tracked;
	if (p->nlocked == 0 || fm_counter_void(total, amount) != FM_OK)
		return false;
	stripes = (int16 *) ARR_DATA_PTR(p->locked);
	if (p->nlocked > 1)
	{
		Datum	   *others = palloc(sizeof(Datum) * (p->nlocked - 1));
		int			i;

		for (i = 1; i < p->nlocked; i++)
			others[i - 1] = Int16GetDatum(stripes[i]);
		p->args[3] = PointerGetDatum(construct_array(others, p->nlocked - 1, INT2OID, 2,
													 true, TYPALIGN_SHORT));
		fm_execute(&drop_stripes_stmt, p->args, NULL, false, 0);
	}
	p->args[3] = FmCounterPGetDatum(total);
	p->args[4] = Int16GetDatum(stripes[0]);
	fm_execute(&set_merged_stripe_stmt, p->args, NULL, false, 0);

	if (!p->stripe0_locked)
	{
		fm_execute(&read_stripe0_stmt, p->args, NULL, false, 0);
		p->stripe0 = merge_result_rows();
	}
	fm_counter_report(fm_counter_merge(total, &p->stripe0));
	return true;
}

/*
 * Case 2: out of stripe 0 alone (locked here), when it holds the amount.
 * *total gets the period's usage after it.
 */
static bool
void_from_stripe0(VoidPeriod *p, int64 amount, FmCounter *total)
{
	if (!p->stripe0_locked)
	{
		lock_stripe0(p->tenant, p->meter, p->period_start);
		p->stripe0 = merge_result_rows();
		p->stripe0_locked = true;
	}
	*total = p->stripe0;
	if (fm_counter_void(total, amount) != FM_OK)
		return false;
	p->args[3] = FmCounterPGetDatum(total);
	fm_execute(&set_stripe0_stmt, p->args, NULL, false, 0);
	fm_counter_report(fm_counter_merge(total, &p->tracked));
	return true;
}

/*
 * Case 3: everything merged into stripe 0 (locked by now), minus the
 * event.  False when even that cannot hold it: the period's boundaries
 * moved after the event was recorded into a period that was not
 * recounted; then only the raw event is marked voided.
 */
static bool
void_merging_all(VoidPeriod *p, int64 amount, FmCounter *total)
{
	Assert(p->stripe0_locked);
	*total = p->tracked;
	fm_counter_report(fm_counter_merge(total, &p->stripe0));
	if (fm_counter_void(total, amount) != FM_OK)
		return false;
	p->args[3] = PointerGetDatum(p->locked);
	fm_execute(&drop_stripes_stmt, p->args, NULL, false, 0);
	p->args[3] = FmCounterPGetDatum(total);
	fm_execute(&set_stripe0_stmt, p->args, NULL, false, 0);
	return true;
}

/*
 * Take one voided event out of the counters of its period: its amount
 * (and one event) comes out of a merge of rows that holds it, as far as
 * possible one that leaves the other side alone.  The track stripes that
 * exist are locked first (their tags, then their rows, in stripe order),
 * stripe 0 after them when it is needed:
 *
 * 1. out of the track stripes, when they hold it: their merge minus the
 *    event is kept in the lowest of them and the others are deleted;
 * 2. out of stripe 0 alone, when it holds it;
 * 3. otherwise everything is merged into stripe 0, minus the event.
 *
 * A consumed event is tried against stripe 0 first (2, then 1; stripe 0
 * stays locked even when 1 takes the amount), a tracked one against the
 * track stripes first (1, then 2; stripe 0 is locked only if 1 cannot):
 * where it was recorded, so that both sides keep holding what their later
 * voids take out.
 *
 * Why one side only: consume reads the tracked usage in its snapshot and
 * then decides on stripe 0's latest version.  A void that moved tracked
 * usage into stripe 0 while a consume waited for stripe 0 made that
 * consume count the moved usage twice (refused with room left, reporting
 * more usage than there was; spec void_consume_race).  After 1 or 2 a
 * consume sees the period before the void, or the tracked usage before it
 * and stripe 0 after it: both add up.  3 (an event whose amount neither
 * side holds alone, after earlier merges) keeps that window.  A consume
 * that does not wait for the void (stripe 0 not locked) and reaches the
 * quota on the usage before it can leave its tenant marked blocked below
 * the quota, which the next maintain() (review_blocks) clears.
 *
 * A stripe that a concurrent track creates meanwhile is not locked, not
 * merged and not deleted.  A stripe found but gone once its lock is had
 * was merged into another by a concurrent void (or compaction) that
 * committed meanwhile: the stripes are read and locked again, since the
 * merge may sit in a stripe not found the first time.  That second pass
 * takes the tag of a lower stripe while holding higher ones, so a third
 * void waiting in between can deadlock with this one (40P01: one of them
 * is rolled back and may be retried); without it this void was lost.
 * Track stripes are locked before stripe 0: a transaction that tracked
 * (holding a stripe) and then voids would otherwise deadlock with a void
 * that holds stripe 0 and waits for that stripe.
 */
static void
void_in_counters(const char *tenant, const VoidItem *item)
{
	FmLimit		limit;
	TimestampTz period_start;
	TimestampTz period_end;
	VoidPeriod	p;
	FmCounter	total;
	bool		stripe0_first;
	bool		voided = false;

	fm_load_limit(tenant, item->meter, false, &limit);
	fm_period_bounds(limit.period, limit.anchor, limit.tz, item->occurred_at,
					 &period_start, &period_end);
	memset(&p, 0, sizeof(p));
	p.tenant = tenant;
	p.meter = item->meter;
	p.period_start = period_start;
	period_args(p.args, tenant, item->meter, period_start);

	for (;;)
	{
		ArrayType  *found = take_track_stripe_tags(tenant, item->meter, period_start);

		p.args[3] = PointerGetDatum(found);
		fm_execute(&lock_track_stripes_stmt, p.args, NULL, false, 0);
		p.tracked = merge_result_rows();
		p.locked = result_stripes();
		p.nlocked = ArrayGetNItems(ARR_NDIM(p.locked), ARR_DIMS(p.locked));
		if (p.nlocked == ArrayGetNItems(ARR_NDIM(found), ARR_DIMS(found)))
			break;
	}

	stripe0_first = item->consumed || p.nlocked == 0;
	if (stripe0_first)
		voided = void_from_stripe0(&p, item->amount, &total);
	if (!voided)
		voided = void_from_track_stripes(&p, item->amount, &total);
	if (!voided && !stripe0_first)
		voided = void_from_stripe0(&p, item->amount, &total);
	if (!voided && !void_merging_all(&p, item->amount, &total))
		return;

	/* back under a hard limit: unblocked, if it was blocked */
	if (limit.limited && limit.hard &&
		fm_used_of(&total, limit.aggregation) < limit.quota)
	{
		FmQuotaEvent event;

		memset(&event, 0, sizeof(event));
		event.kind = FM_EVENT_UNBLOCKED;
		event.tenant = tenant;
		event.meter = item->meter;
		event.has_period = true;
		event.period_start = period_start;
		event.has_usage = true;
		event.used = fm_used_of(&total, limit.aggregation);
		event.has_quota = true;
		event.quota = limit.quota;
		fm_queue_quota_event(&event);
	}
}

/*
 * void(tenant, idempotency_key) -> boolean
 *
 * Cancels what the key recorded: true when voided now, false when it was
 * already voided or recorded nothing (a denied consume).  An unknown key
 * is an error.  The key's rows are locked first, so two concurrent voids
 * of one key void once.
 */
PG_FUNCTION_INFO_V1(fm_void);
Datum
fm_void(PG_FUNCTION_ARGS)
{
	char	   *tenant = fm_arg_tenant(fcinfo, 0);
	char	   *key;
	Datum		args[3];
	VoidItem   *items;
	int			n,
				i;
	bool		already_voided;
	bool		granted;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("idempotency_key must not be NULL")));
	key = fm_arg_key(fcinfo, 1);

	lock_counters_for_write();
	SPI_connect();

	args[0] = CStringGetTextDatum(tenant);
	args[1] = CStringGetTextDatum(key);
	fm_execute(&lock_key_stmt, args, NULL, false, 0);
	n = (int) SPI_processed;
	if (n == 0)
		ereport(ERROR,
				(errcode(ERRCODE_NO_DATA_FOUND),
				 errmsg("idempotency key \"%s\" of tenant \"%s\" does not exist",
						key, tenant),
				 errhint("Only events recorded with an idempotency key can be voided.")));

	items = palloc(sizeof(VoidItem) * n);
	granted = true;
	already_voided = false;
	for (i = 0; i < n; i++)
	{
		HeapTuple	row = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;

		items[i].meter = TextDatumGetCString(SPI_getbinval(row, desc, 1, &isnull));
		items[i].amount = DatumGetInt64(SPI_getbinval(row, desc, 2, &isnull));
		items[i].occurred_at = DatumGetTimestampTz(SPI_getbinval(row, desc, 3, &isnull));
		granted = granted && DatumGetBool(SPI_getbinval(row, desc, 4, &isnull));
		already_voided = already_voided || DatumGetBool(SPI_getbinval(row, desc, 5, &isnull));
		items[i].consumed = DatumGetBool(SPI_getbinval(row, desc, 6, &isnull));
	}
	if (!granted || already_voided)
	{
		SPI_finish();
		PG_RETURN_BOOL(false);
	}

	args[2] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	fm_execute(&mark_voided_stmt, args, NULL, false, 0);

	qsort(items, n, sizeof(VoidItem), compare_void_items);
	for (i = 0; i < n; i++)
	{
		Datum		vargs[6];

		void_in_counters(tenant, &items[i]);

		/* maintain() takes the event out of the rollups */
		vargs[0] = CStringGetTextDatum(tenant);
		vargs[1] = CStringGetTextDatum(items[i].meter);
		vargs[2] = Int64GetDatum(items[i].amount);
		vargs[3] = TimestampTzGetDatum(items[i].occurred_at);
		vargs[4] = CStringGetTextDatum(key);
		vargs[5] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
		fm_execute(&log_void_stmt, vargs, NULL, false, 0);
	}

	SPI_finish();
	PG_RETURN_BOOL(true);
}
