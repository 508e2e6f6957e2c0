/*
 * rate_limiter.c
 *	  Rate limits decided in shared memory: the generic cell rate algorithm
 *	  (GCRA) over a table of keys, each one theoretical arrival time.
 *
 * A rate limit of rate units per per, in bursts of burst, spaces units
 * T = per / rate apart, rounded up to a whole nanosecond.  A key's state is
 * one instant, tat: when its spent units will have been "paid for".  A
 * cost fits when, counted from max(tat, now), it ends no later than now
 * plus the burst's worth of time:
 *
 *	   T = ceil(per / rate)	  inc = cost * T	  cap = burst * T
 *	   allowed  <=>  max(tat, now) + inc - now <= cap
 *	   then  tat := max(tat, now) + inc
 *
 * This is a token bucket of burst units refilled one unit per T, kept as
 * one number.  In any window of length t it grants at most burst + t / T
 * <= burst + rate * t / per units: tat rises by inc per granted cost and
 * can stand at most cap ahead of the clock.  Counting in whole T keeps a
 * full burst grantable at one instant; rounding T up only ever grants less
 * (by less than one part in T nanoseconds: 1/1000 of the rate for T of a
 * microsecond, nothing when rate divides per in nanoseconds).  A key
 * whose tat is past is the same as a key never seen, so an idle key can be
 * forgotten at any time without changing an answer: that is the eviction.
 *
 * A key remembers the limit its time was counted in.  When a call brings
 * another (a plan's limit changed, or limit() called with other figures),
 * the time still owed is turned back into units at the old rate and
 * those units into time at the new one (at most a full burst of it), so
 * that what was spent stays spent and a looser limit helps at once.
 *
 * The table is an array of buckets of FM_RATE_WAYS slots, each bucket under
 * its own spinlock (the work under it is a scan of the slots and a few
 * additions).  A key lives in the bucket its first hash picks; a new key
 * takes an empty or idle slot there.  A bucket whose every slot holds a key
 * that is not idle cannot take another: the call fails (53400) rather than
 * evict a key that would then be granted a fresh burst, and the error says
 * to raise flagmeter.rate_limit_keys.
 *
 * Times are nanoseconds since the PostgreSQL epoch (2000-01-01), read from
 * the clock at each call, not the transaction's start: a long transaction
 * must not see a frozen clock.  The table is not WAL-logged and starts
 * empty: after a restart every key has its whole burst again.
 */
#include "postgres.h"
#include "fmgr.h"
#include "funcapi.h"

#include "access/htup_details.h"
#include "common/hashfn.h"
#include "common/int.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/timestamp.h"

#include "bounds.h"
#include "rate_limiter.h"

#define FM_RATE_WAYS 16

#define NSECS_PER_USEC INT64CONST(1000)

/* the longest per, and the longest a burst may take to refill */
#define FM_RATE_MAX_PER_USECS USECS_PER_HOUR
#define FM_RATE_MAX_REFILL_NSECS (INT64CONST(366) * USECS_PER_DAY * NSECS_PER_USEC)

/* the test clock's range around 2000-01-01: 250 years, in microseconds */
#define FM_RATE_CLOCK_RANGE_USECS (INT64CONST(250) * 365 * USECS_PER_DAY)

typedef struct RateSlot
{
	uint64		h1;				/* 0: empty */
	uint64		h2;
	int64		tat;			/* nanoseconds since 2000-01-01 */
	int64		rate;			/* the limit tat was counted in */
	int64		per_usecs;
} RateSlot;

typedef struct RateBucket
{
	slock_t		mutex;
	RateSlot	slots[FM_RATE_WAYS];
} RateBucket;

typedef struct RateTable
{
	uint32		nbuckets;
	pg_atomic_uint64 full_refusals; /* calls failed for a full bucket */
	RateBucket	buckets[FLEXIBLE_ARRAY_MEMBER];
} RateTable;

static RateTable *rate_table = NULL;

/* flagmeter.rate_limit_keys: how many keys the table holds */
static int	rate_limit_keys = 100000;

/* the clock set_test_clock() set for this session: microseconds, or unset */
static bool test_clock_set = false;
static TimestampTz test_clock;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static uint32
table_buckets(void)
{
	return (uint32) ((rate_limit_keys + FM_RATE_WAYS - 1) / FM_RATE_WAYS);
}

static Size
table_size(void)
{
	return add_size(offsetof(RateTable, buckets),
					mul_size(table_buckets(), sizeof(RateBucket)));
}

static void
rate_limiter_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(table_size());
}

static void
rate_limiter_startup(void)
{
	bool		found;
	uint32		i;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	rate_table = ShmemInitStruct("flagmeter rate limiters", table_size(), &found);
	if (!found)
	{
		memset(rate_table, 0, table_size());
		rate_table->nbuckets = table_buckets();
		pg_atomic_init_u64(&rate_table->full_refusals, 0);
		for (i = 0; i < rate_table->nbuckets; i++)
			SpinLockInit(&rate_table->buckets[i].mutex);
	}
	LWLockRelease(AddinShmemInitLock);
}

void
fm_rate_limiter_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	DefineCustomIntVariable("flagmeter.rate_limit_keys",
							gettext_noop("Keys the rate limiters' table holds at once."),
							gettext_noop("Only when flagmeter is in shared_preload_libraries; "
										 "a key takes 40.5 bytes of shared memory.  Idle keys "
										 "make room by themselves."),
							&rate_limit_keys,
							100000, FM_RATE_WAYS, 100000000,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = rate_limiter_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = rate_limiter_startup;
}

/* Validation ------------------------------------------------------------------ */

/*
 * per in microseconds; -1 when it is not a duration of 1 second to 1 hour
 * (months and days are out of that range whatever the rest says).
 */
static int64
per_usecs(const Interval *per)
{
	if (per->month != 0 || per->day != 0 || per->time < USECS_PER_SEC ||
		per->time > FM_RATE_MAX_PER_USECS)
		return -1;
	return per->time;
}

/* T, the nanoseconds per unit: ceil(per / rate) */
static int64
unit_nsecs(int64 rate, int64 per_usecs)
{
	return (per_usecs * NSECS_PER_USEC + rate - 1) / rate;
}

/* NULL when the limit is valid, else why not (and *usecs is per's) */
static const char *
rate_problem(int64 rate, const Interval *per, int64 burst, int64 *usecs)
{
	int64		unit;
	int64		refill;

	*usecs = per_usecs(per);
	if (rate <= 0)
		return "rate must be positive";
	if (*usecs < 0)
		return "per must be from 1 second to 1 hour";
	if (burst <= 0)
		return "burst must be positive";
	if (rate > *usecs * NSECS_PER_USEC)
		return "rate is more than one unit per nanosecond";
	unit = unit_nsecs(rate, *usecs);
	if (pg_mul_s64_overflow(unit, burst, &refill) || refill > FM_RATE_MAX_REFILL_NSECS)
		return "burst takes more than a year to refill at this rate";
	return NULL;
}

bool
fm_rate_valid(int64 rate, const Interval *per, int64 burst)
{
	int64		usecs;

	return rate_problem(rate, per, burst, &usecs) == NULL;
}

void
fm_rate_from_args(int64 rate, const Interval *per, int64 burst, FmRate *out)
{
	int64		usecs;
	const char *problem;

	problem = rate_problem(rate, per, burst, &usecs);
	if (problem)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid rate limit: %s", problem),
				 errdetail("The rate limit was " INT64_FORMAT " per %s, bursts of " INT64_FORMAT ".",
						   rate,
						   DatumGetCString(DirectFunctionCall1(interval_out,
															   IntervalPGetDatum(per))),
						   burst),
				 errhint("A rate limit is rate >= 1 units per 1 second to 1 hour, in bursts of "
						 "burst >= 1 units, at most one unit per nanosecond, and a burst refills "
						 "within a year.")));
	out->rate = rate;
	out->per_usecs = usecs;
	out->burst = burst;
}

/* Keys --------------------------------------------------------------------------- */

static FmRateKey
key_of_bytes(const char *bytes, size_t len, uint32 kind)
{
	uint64		seed = ((uint64) MyDatabaseId << 32) | kind;
	FmRateKey	key;

	key.h1 = hash_bytes_extended((const unsigned char *) bytes, len, seed);
	key.h2 = hash_bytes_extended((const unsigned char *) bytes, len, ~seed);
	if (key.h1 == 0)
		key.h1 = 1;				/* 0 marks an empty slot */
	return key;
}

FmRateKey
fm_rate_key_of_text(const char *key)
{
	return key_of_bytes(key, strlen(key), 'k');
}

FmRateKey
fm_rate_key_of_meter(const char *tenant, const char *meter)
{
	char		buf[FM_TENANT_METER_KEY_BYTES];
	size_t		tlen = strlen(tenant);
	size_t		mlen = strlen(meter);

	/* tenant, a NUL, meter: no two pairs give the same bytes */
	Assert(tlen + 1 + mlen <= sizeof(buf));
	memcpy(buf, tenant, tlen);
	buf[tlen] = '\0';
	memcpy(buf + tlen + 1, meter, mlen);
	return key_of_bytes(buf, tlen + 1 + mlen, 'm');
}

/* The algorithm ----------------------------------------------------------------- */

static int64
now_nsecs(void)
{
	TimestampTz now = test_clock_set ? test_clock : GetCurrentTimestamp();

	return now * NSECS_PER_USEC;
}

/* nanoseconds to microseconds, rounded up */
static int64
usecs_of(int64 nsecs)
{
	return nsecs <= 0 ? 0 : (nsecs + NSECS_PER_USEC - 1) / NSECS_PER_USEC;
}

/*
 * tat counted in the limit of rate units per per_usecs, counted in rate
 * instead: the units still owed at now (rounded up) as time at rate, at
 * most a full burst of it.
 */
static int64
recount(int64 tat, int64 now, int64 old_rate, int64 old_per_usecs, const FmRate *rate)
{
	int64		old_unit;
	int64		owed;

	if (tat <= now || (old_rate == rate->rate && old_per_usecs == rate->per_usecs))
		return tat;
	old_unit = unit_nsecs(old_rate, old_per_usecs);
	owed = (tat - now + old_unit - 1) / old_unit;
	return now + Min(owed, rate->burst) * unit_nsecs(rate->rate, rate->per_usecs);
}

/*
 * The decision on a key whose state is tat (0: idle) at now; returns the
 * state after it (tat itself when nothing is spent).
 */
static int64
gcra(int64 tat, int64 now, const FmRate *rate, int64 cost, bool spend,
	 FmRateVerdict *verdict)
{
	int64		unit = unit_nsecs(rate->rate, rate->per_usecs);
	int64		cap = rate->burst * unit;	/* within a year: rate_problem */
	int64		base = Max(tat, now);
	int64		after = tat;

	verdict->retry_after = -1;
	if (cost > rate->burst)
		verdict->allowed = false;	/* waiting cannot help */
	else
	{
		int64		next = base + cost * unit;

		verdict->allowed = next - now <= cap;
		if (!verdict->allowed)
			verdict->retry_after = usecs_of(next - cap - now);
		else if (spend && cost > 0)
			after = next;
	}
	verdict->remaining = Max(cap - (Max(after, now) - now), 0) / unit;
	verdict->reset_after = usecs_of(after - now);
	return after;
}

/* The table --------------------------------------------------------------------- */

static void
require_table(void)
{
	if (rate_table == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("rate limits need flagmeter in shared_preload_libraries"),
				 errdetail("Rate limiters keep their state in shared memory, which only a "
						   "preloaded library can have."),
				 errhint("Add flagmeter to shared_preload_libraries in postgresql.conf and "
						 "restart the server.")));
}

static RateBucket *
bucket_of(const FmRateKey *key)
{
	return &rate_table->buckets[(key->h1 ^ (key->h1 >> 32)) % rate_table->nbuckets];
}

void
fm_rate_take(const FmRateKey *key, const FmRate *rate, int64 cost, bool spend,
			 FmRateVerdict *verdict)
{
	RateBucket *bucket;
	RateSlot   *slot = NULL;
	RateSlot   *free_slot = NULL;
	int64		now;
	int			i;

	require_table();
	bucket = bucket_of(key);
	now = now_nsecs();

	SpinLockAcquire(&bucket->mutex);
	for (i = 0; i < FM_RATE_WAYS; i++)
	{
		RateSlot   *s = &bucket->slots[i];

		if (s->h1 == key->h1 && s->h2 == key->h2)
		{
			slot = s;
			break;
		}
		if (free_slot == NULL && (s->h1 == 0 || s->tat <= now))
			free_slot = s;
	}
	if (slot != NULL)
	{
		slot->tat = gcra(recount(slot->tat, now, slot->rate, slot->per_usecs, rate), now,
						 rate, cost, spend, verdict);
		slot->rate = rate->rate;
		slot->per_usecs = rate->per_usecs;
	}
	else
	{
		int64		after = gcra(0, now, rate, cost, spend, verdict);

		/* an idle key needs no slot; a spending one takes a free one */
		if (after > now)
		{
			if (free_slot == NULL)
			{
				SpinLockRelease(&bucket->mutex);
				pg_atomic_fetch_add_u64(&rate_table->full_refusals, 1);
				ereport(ERROR,
						(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
						 errmsg("the rate limiters' table has no room for another key"),
						 errdetail("Its part for this key holds %d keys, none idle.",
								   FM_RATE_WAYS),
						 errhint("Raise flagmeter.rate_limit_keys (now %d) and restart the "
								 "server; flagmeter.rate_limiter() shows how many keys are "
								 "in use.", rate_limit_keys)));
			}
			free_slot->h1 = key->h1;
			free_slot->h2 = key->h2;
			free_slot->tat = after;
			free_slot->rate = rate->rate;
			free_slot->per_usecs = rate->per_usecs;
		}
	}
	SpinLockRelease(&bucket->mutex);
}

void
fm_rate_give_back(const FmRateKey *key, const FmRate *rate, int64 cost)
{
	RateBucket *bucket;
	int			i;

	if (rate_table == NULL || cost <= 0 || cost > rate->burst)
		return;
	bucket = bucket_of(key);
	SpinLockAcquire(&bucket->mutex);
	for (i = 0; i < FM_RATE_WAYS; i++)
	{
		RateSlot   *s = &bucket->slots[i];

		/*
		 * A key evicted since was idle: there is nothing to give back.  One
		 * counted in another limit since (a concurrent change) keeps it:
		 * keeping too much only refuses, never grants.
		 */
		if (s->h1 == key->h1 && s->h2 == key->h2)
		{
			if (s->rate == rate->rate && s->per_usecs == rate->per_usecs)
				s->tat -= cost * unit_nsecs(rate->rate, rate->per_usecs);
			break;
		}
	}
	SpinLockRelease(&bucket->mutex);
}

/* Decisions ------------------------------------------------------------------------ */

void
fm_decision_apply_rate(const char *tenant, const char *meter, const FmLimit *limit,
					   int64 amount, bool spend, FmDecision *decision)
{
	FmRateKey	key;
	FmRateVerdict verdict;

	if (!decision->granted || limit->rate_limit.rate == 0)
		return;
	key = fm_rate_key_of_meter(tenant, meter);
	fm_rate_take(&key, &limit->rate_limit, amount, spend, &verdict);
	if (!verdict.allowed)
		fm_decision_rate_limited(decision, verdict.retry_after);
}

void
fm_decision_give_back_rate(const char *tenant, const char *meter, const FmLimit *limit,
						   int64 amount)
{
	FmRateKey	key;

	if (limit->rate_limit.rate == 0)
		return;
	key = fm_rate_key_of_meter(tenant, meter);
	fm_rate_give_back(&key, &limit->rate_limit, amount);
}

/* SQL ------------------------------------------------------------------------------ */

/* rate_limiter() -> (capacity, keys, full_refusals) */
PG_FUNCTION_INFO_V1(fm_rate_limiter_stats);
Datum
fm_rate_limiter_stats(PG_FUNCTION_ARGS)
{
	TupleDesc	desc;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};
	int64		live = 0;
	int64		now = now_nsecs();
	uint32		b;
	int			i;

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	require_table();
	for (b = 0; b < rate_table->nbuckets; b++)
	{
		RateBucket *bucket = &rate_table->buckets[b];

		SpinLockAcquire(&bucket->mutex);
		for (i = 0; i < FM_RATE_WAYS; i++)
			if (bucket->slots[i].h1 != 0 && bucket->slots[i].tat > now)
				live++;
		SpinLockRelease(&bucket->mutex);
	}
	values[0] = Int64GetDatum((int64) rate_table->nbuckets * FM_RATE_WAYS);
	values[1] = Int64GetDatum(live);
	values[2] = Int64GetDatum((int64) pg_atomic_read_u64(&rate_table->full_refusals));
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}

/* set_test_clock(at timestamptz): superuser only; NULL: the clock again */
PG_FUNCTION_INFO_V1(fm_set_test_clock);
Datum
fm_set_test_clock(PG_FUNCTION_ARGS)
{
	if (!superuser())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("only a superuser may set the rate limiters' test clock")));
	test_clock_set = !PG_ARGISNULL(0);
	if (test_clock_set)
	{
		test_clock = PG_GETARG_TIMESTAMPTZ(0);
		/* times are int64 nanoseconds from 2000: about 292 years each way */
		if (TIMESTAMP_NOT_FINITE(test_clock) ||
			test_clock < -FM_RATE_CLOCK_RANGE_USECS || test_clock > FM_RATE_CLOCK_RANGE_USECS)
		{
			test_clock_set = false;
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("the test clock must lie between 1750 and 2250")));
		}
	}
	PG_RETURN_VOID();
}
