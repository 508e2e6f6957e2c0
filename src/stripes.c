/*
 * stripes.c
 *	  Which counter row (stripe) of a period a track writes.
 *
 * Shared stripes 1 .. flagmeter.stripes: in READ COMMITTED, track writes
 * shared stripe k of a period only while its transaction holds the
 * period's stripe tag k, a transaction-level advisory lock taken without
 * waiting; it takes the lowest free one.  So writers of one tenant never
 * queue behind each other, a tenant has about as many stripes as it has
 * concurrent writers (most tenants one: few rows for a read to merge), and
 * choosing writes nothing (a FOR UPDATE SKIP LOCKED search would lock the
 * row, a WAL record of its own, before updating it).  A transaction keeps
 * the stripe it took for a period: void locks a period's track stripes in stripe order, and a void
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
#include "postgres.h"

#include "common/hashfn.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "utils/guc.h"

#include "compat.h"
#include "limit.h"
#include "stripes.h"

int			fm_stripes = 32;

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

int16
fm_own_stripe(void)
{
	return (int16) (fm_stripes + 1 + (FM_MY_BACKEND_NUMBER % fm_stripes));
}

uint32
fm_period_hash(const char *tenant, const char *meter, TimestampTz period_start)
{
	return hash_combine(fm_tenant_meter_hash(tenant, meter),
						hash_bytes((const unsigned char *) &period_start,
								   sizeof(period_start)));
}

void
fm_stripe_tag(LOCKTAG *tag, uint32 period_hash, int16 stripe)
{
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, period_hash, (uint32) stripe,
						 FM_STRIPE_TAG_CLASS);
}

int16
fm_pick_stripe(const char *tenant, const char *meter, TimestampTz period_start)
{
	uint32		hash = fm_period_hash(tenant, meter, period_start);
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
		fm_stripe_tag(&tag, hash, stripes_taken[i].stripe);
		if (fm_lock_held_by_me(&tag, ExclusiveLock))
			return stripes_taken[i].stripe;
		/* a rolled-back subtransaction released it: choose again */
		stripes_taken[i] = stripes_taken[--nstripes_taken];
		break;
	}
	if (nstripes_taken == FM_MAX_STRIPE_TAGS)
		return fm_own_stripe();
	for (k = 1; k <= fm_stripes; k++)
	{
		fm_stripe_tag(&tag, hash, k);
		if (LockAcquire(&tag, ExclusiveLock, false, true) != LOCKACQUIRE_NOT_AVAIL)
		{
			stripes_taken[nstripes_taken].period_hash = hash;
			stripes_taken[nstripes_taken].stripe = k;
			nstripes_taken++;
			return k;
		}
	}
	return fm_own_stripe();
}

void
fm_stripes_init(void)
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
