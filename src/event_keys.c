/*
 * event_keys.c
 *	  Idempotency keys: claimed in the caller's transaction, read back for
 *	  a retry (see event_keys.h).  void locks and marks them (void.c).
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "event_keys.h"
#include "statements.h"

/* $10 .. $18: the decision, encoded as fm_decision_values does */
static FmStatement claim_key_stmt = {
	"INSERT INTO flagmeter.event_keys"
	" (tenant, idempotency_key, seq, meter, amount, occurred_at, period_start,"
	"  recorded_at, kind, granted, used, quota, remaining, resets_at, overage,"
	"  reason, from_grants, balance)"
	" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,"
	"  $17, $18)"
	" ON CONFLICT (tenant, idempotency_key, seq) DO NOTHING",
	18, {TEXTOID, TEXTOID, INT2OID, TEXTOID, INT8OID, TIMESTAMPTZOID,
		TIMESTAMPTZOID, TIMESTAMPTZOID, TEXTOID, BOOLOID, INT8OID, INT8OID,
	INT8OID, TIMESTAMPTZOID, INT8OID, TEXTOID, INT8OID, INT8OID}
};

#define CLAIM_KEY_DECISION_ARG 9	/* 0-based: $10 */

/*
 * columns 3 .. 11: the decision; of the meters the call named (a pool's
 * part, pools.h, is not returned to a retry)
 */
static FmStatement read_key_stmt = {
	"SELECT kind, meter, granted, used, quota, remaining, resets_at, overage, reason,"
	" from_grants, balance"
	" FROM flagmeter.event_keys"
	" WHERE tenant" FM_EQ "$1 AND idempotency_key" FM_EQ "$2"
	" AND kind OPERATOR(pg_catalog.<>) ALL ('{consume_pool,track_pool}'::pg_catalog.text[])"
	" ORDER BY seq",
	2, {TEXTOID, TEXTOID}
};

#define READ_KEY_DECISION_COLUMN 3

bool
fm_claim_key(const char *tenant, const char *key, int seq, const char *meter,
			 int64 amount, TimestampTz occurred_at, TimestampTz period_start,
			 const char *kind, const FmDecision *decision)
{
	Datum		args[CLAIM_KEY_DECISION_ARG + FM_DECISION_FIELDS];
	bool		isnull[FM_DECISION_FIELDS];
	char		nulls[CLAIM_KEY_DECISION_ARG + FM_DECISION_FIELDS + 1];
	int			i;

	args[0] = CStringGetTextDatum(tenant);
	args[1] = CStringGetTextDatum(key);
	args[2] = Int16GetDatum((int16) seq);
	args[3] = CStringGetTextDatum(meter);
	args[4] = Int64GetDatum(amount);
	args[5] = TimestampTzGetDatum(occurred_at);
	args[6] = TimestampTzGetDatum(period_start);
	args[7] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	args[8] = CStringGetTextDatum(kind);
	memset(nulls, ' ', sizeof(nulls) - 1);
	nulls[sizeof(nulls) - 1] = '\0';
	if (decision == NULL)
	{
		/* track's key: granted, no figures */
		args[CLAIM_KEY_DECISION_ARG] = BoolGetDatum(true);
		memset(nulls + CLAIM_KEY_DECISION_ARG + 1, 'n', FM_DECISION_FIELDS - 1);
	}
	else
	{
		fm_decision_values(decision, args + CLAIM_KEY_DECISION_ARG, isnull);
		for (i = 0; i < FM_DECISION_FIELDS; i++)
			if (isnull[i])
				nulls[CLAIM_KEY_DECISION_ARG + i] = 'n';
	}
	fm_execute(&claim_key_stmt, args, nulls, false, 0);
	return SPI_processed == 1;
}

/* SPI_palloc'd copy of column col of row, a text */
static char *
spi_text_copy(HeapTuple row, TupleDesc desc, int col)
{
	bool		isnull;
	char	   *s = TextDatumGetCString(SPI_getbinval(row, desc, col, &isnull));
	size_t		len = strlen(s) + 1;
	char	   *copy = SPI_palloc(len);

	memcpy(copy, s, len);
	return copy;
}

FmDecision *
fm_replayed_decisions(const char *tenant, const char *key, int *n)
{
	Datum		args[2];
	FmDecision *out;
	bool		isnull;
	uint64		i;

	args[0] = CStringGetTextDatum(tenant);
	args[1] = CStringGetTextDatum(key);
	fm_execute(&read_key_stmt, args, NULL, false, 0);
	if (SPI_processed == 0)
		return NULL;
	if (strcmp(TextDatumGetCString(SPI_getbinval(SPI_tuptable->vals[0],
												 SPI_tuptable->tupdesc, 1, &isnull)),
			   "track") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg("idempotency key \"%s\" of tenant \"%s\" was recorded by track",
						key, tenant),
				 errdetail("A key names one event; consume cannot reuse a key of track.")));

	/* SPI_palloc: the results must outlive SPI_finish */
	*n = (int) SPI_processed;
	out = SPI_palloc(sizeof(FmDecision) * SPI_processed);
	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	row = SPI_tuptable->vals[i];

		fm_decision_from_row(row, SPI_tuptable->tupdesc, READ_KEY_DECISION_COLUMN, &out[i]);
		out[i].meter = spi_text_copy(row, SPI_tuptable->tupdesc, 2);
	}
	return out;
}
