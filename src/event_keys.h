/*
 * event_keys.h
 *	  Idempotency keys (flagmeter.event_keys): a key names one event of
 *	  track or one consume, and a consume's key remembers its decision, so
 *	  that a retry returns it unchanged and records nothing (event_keys.c).
 *	  Call inside SPI.
 */
#ifndef FLAGMETER_EVENT_KEYS_H
#define FLAGMETER_EVENT_KEYS_H

#include "postgres.h"
#include "datatype/timestamp.h"

#include "decision.h"

/*
 * Record the key's row seq (one row per meter of a consume, in call
 * order); kind is "track" (decision NULL) or "consume", or "track_pool" or
 * "consume_pool" for the part of the call a credit pool records (pools.h).  False when the
 * key is already recorded: by a committed transaction, or by one that
 * commits while this waits on its row.
 */
extern bool fm_claim_key(const char *tenant, const char *key, int seq,
						 const char *meter, int64 amount, TimestampTz occurred_at,
						 TimestampTz period_start, const char *kind,
						 const FmDecision *decision);

/*
 * The decisions remembered for a consume's key, in seq order, in memory
 * that outlives SPI, and their number in *n (the meters of the call that
 * recorded the key, whatever a retry names); NULL when the key has none.
 * A key recorded by track is an error (23505).
 */
extern FmDecision *fm_replayed_decisions(const char *tenant, const char *key, int *n);

#endif							/* FLAGMETER_EVENT_KEYS_H */
