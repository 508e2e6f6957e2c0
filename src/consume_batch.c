/*
 * consume_batch.c
 *	  consume_batch(): many independent consumes in one call, decided in
 *	  order, each exactly as consume decides it (consume.h): a hard limit
 *	  is never exceeded, a retried key returns its original decision, and
 *	  an item of several meters is all or nothing within itself.  Items do
 *	  not depend on each other beyond that: a later item sees what the
 *	  earlier ones recorded, as a later consume in the same transaction
 *	  would.
 *
 *	  What it buys is one transaction for many consumes: the commit flush
 *	  is paid once, and the consumes of one tenant in one call wait for its
 *	  period's row lock once: the call locks every period it decides on
 *	  first, in (tenant, meter) order (so two calls cannot deadlock,
 *	  whatever the order of their items), and the items find their locks
 *	  held.  The price is that the locks are held until the caller's
 *	  transaction ends, so callers keep batches small (the Node client
 *	  groups what arrived while its previous groups ran).
 */
#include "postgres.h"
#include "fmgr.h"
#include "funcapi.h"

#include "access/htup_details.h"
#include "utils/builtins.h"

#include "args.h"
#include "consume.h"
#include "decision.h"
#include "limit_lookup.h"
#include "usage_rows.h"

/* One item: rows first .. first + n - 1 of the arrays. */
typedef struct BatchItem
{
	int32		id;
	int			first;
	int			n;
} BatchItem;

static bool
same_key(const char *a, const char *b)
{
	if (a == NULL || b == NULL)
		return a == b;
	return strcmp(a, b) == 0;
}

/*
 * Split the rows into items: without ids each row is an item (numbered
 * from 1); with ids, adjacent rows with the same id are one item, and an
 * id may not come back after another.  Returns the number of items.
 */
static int
split_items(int32 *ids, int n, BatchItem *items)
{
	int			nitems = 0;
	int			i,
				j;

	for (i = 0; i < n; i++)
	{
		if (ids == NULL || i == 0 || ids[i] != ids[i - 1])
		{
			if (ids != NULL)
				for (j = 0; j < nitems; j++)
					if (items[j].id == ids[i])
						ereport(ERROR,
								(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
								 errmsg("rows of item %d are not adjacent", ids[i]),
								 errdetail("Row %d belongs to item %d, which ended at row %d.",
										   i + 1, ids[i], items[j].first + items[j].n),
								 errhint("List the meters of one item one after the other.")));
			items[nitems].id = ids ? ids[i] : i + 1;
			items[nitems].first = i;
			items[nitems].n = 0;
			nitems++;
		}
		items[nitems - 1].n++;
	}
	return nitems;
}

/* An item names one tenant and one key (or none) and its meters once. */
static void
check_item(const BatchItem *item, char **tenants, char **meters, char **keys)
{
	int			i;

	for (i = item->first + 1; i < item->first + item->n; i++)
	{
		if (strcmp(tenants[i], tenants[item->first]) != 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("item %d names more than one tenant", item->id),
					 errdetail("Rows %d and %d have tenants \"%s\" and \"%s\".",
							   item->first + 1, i + 1, tenants[item->first], tenants[i])));
		if (keys && !same_key(keys[i], keys[item->first]))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("item %d has more than one idempotency key", item->id),
					 errdetail("A key names the whole item: give each of its rows the same key.")));
	}
	fm_check_consume_meters(meters + item->first, item->n);
}

/* Decide and record one item as consume does, its decisions as rows of rsinfo. */
static void
consume_item(ReturnSetInfo *rsinfo, const BatchItem *item, char **tenants, char **meters,
			 const int64 *amounts, char **keys)
{
	FmConsumeItem *citems = palloc0(sizeof(FmConsumeItem) * item->n);
	FmDecision *decisions;
	int			ndecisions;
	int			i;

	for (i = 0; i < item->n; i++)
	{
		citems[i].meter = meters[item->first + i];
		citems[i].amount = amounts[item->first + i];
	}
	decisions = fm_consume_items(tenants[item->first], citems, item->n,
								 keys ? keys[item->first] : NULL, &ndecisions);
	for (i = 0; i < ndecisions; i++)
	{
		Datum		values[FM_DECISION_COLUMNS + 1];
		bool		nulls[FM_DECISION_COLUMNS + 1];

		values[0] = Int32GetDatum(item->id);
		nulls[0] = false;
		fm_decision_columns(&decisions[i], values + 1, nulls + 1);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	pfree(citems);
}

/*
 * consume_batch(tenants[], meters[], amounts[], idempotency_keys[], items[])
 *   -> TABLE (item, granted, used, quota, remaining, resets_at, overage, meter)
 *
 * One row per argument row, in argument order, carrying its item's id
 * (a retried key: one row per meter of the call that recorded it).
 * Every argument is checked, and every meter looked up, before the first
 * item is decided; an error while deciding (a key of track reused, usage
 * past the bigint range) fails the whole call, and the caller's
 * transaction rolls back what earlier items recorded.
 */
PG_FUNCTION_INFO_V1(fm_consume_batch);
Datum
fm_consume_batch(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	char	  **tenants;
	char	  **meters;
	char	  **keys;
	int64	   *amounts;
	int32	   *ids;
	BatchItem  *items;
	int			n,
				nitems,
				i,
				k;

	n = fm_arg_batch_rows(fcinfo, &tenants, &meters, &amounts, false);
	keys = fm_arg_key_array(fcinfo, 3, n);
	ids = fm_arg_int4_array(fcinfo, 4, "items", n);
	for (i = 0; i < n; i++)
	{
		fm_check_tenant(tenants[i]);
		if (keys && keys[i])
			fm_check_key(keys[i]);
	}
	items = palloc(sizeof(BatchItem) * Max(n, 1));
	nitems = split_items(ids, n, items);
	for (k = 0; k < nitems; k++)
		check_item(&items[k], tenants, meters, keys);

	/*
	 * Unknown meters, too, before the first item is recorded (consume checks
	 * them when it loads the limit, as here; the limits come from the
	 * backend's cache, which the items then hit).
	 */
	fm_lock_counters_for_write();
	for (i = 0; i < n; i++)
	{
		FmLimit		limit;

		fm_load_limit(tenants[i], meters[i], false, &limit);
	}

	/*
	 * Then every period the items decide on, locked in one order: items come
	 * in whatever order callers arrived, and two calls locking one tenant's
	 * row each as they meet them could each wait for the other. Each tenant's
	 * lock is waited for once, here; the items then find it held.
	 */
	fm_lock_consume_periods(tenants, meters, n);

	InitMaterializedSRF(fcinfo, 0);
	for (k = 0; k < nitems; k++)
		consume_item(rsinfo, &items[k], tenants, meters, amounts, keys);
	return (Datum) 0;
}
