/*
 * grants.h
 *	  Credit grants (grants.c): units a tenant may use on top of a meter's
 *	  period quota, drawn once the quota is used up, in a fixed order.
 *
 * The rows are flagmeter.credit_grants (sql/parts/47_credits.sql).  A call
 * draws only grants active at its transaction's start (started, not
 * expired, not voided, not exhausted), lowest priority number first, then
 * soonest expiry (never-expiring last), then oldest (lowest id).  Grants
 * are locked or written only by a caller that already holds the period's
 * stripe 0 (usage_rows.h), and in grant id order, so two calls cannot
 * deadlock on them.  consume reads them without a lock in the statement
 * that locks stripe 0, and draws with guarded updates (fm_grants_try_draw):
 * a grant spent or voided by a transaction it did not see fails the guard,
 * and the call then locks them (fm_grants_lock) and decides again, so a
 * draw is never more than a grant holds (the table's CHECK constraint holds
 * the line too) while a call that draws nothing writes no grant row.
 *
 * A tenant without a limit on the meter that has been granted credits
 * (FmLimit.grants) is limited by its grants alone: a hard quota of zero.
 * Only sum and count meters take grants.  Call inside SPI.
 */
#ifndef FLAGMETER_GRANTS_H
#define FLAGMETER_GRANTS_H

#include "postgres.h"
#include "datatype/timestamp.h"

#include "counter_core.h"
#include "decision.h"
#include "limit.h"

/* The active grants of one (tenant, meter), locked, in draw order. */
typedef struct FmGrantsHeld
{
	const char *tenant;
	const char *meter;
	int			n;
	int64	   *ids;
	int64	   *remaining;
	int64	   *amounts;
	int		   *low_percents;	/* 0: no grant_low event */
	int64	   *taken;			/* what this call drew from each */
	int64		available;		/* sum of remaining */
	bool		locked;			/* read FOR UPDATE: remaining is exact */
} FmGrantsHeld;

/* an active grant at now_param ($1 tenant, $2 meter), as the calls see it */
#define FM_ACTIVE_GRANT(alias, now_param) \
	" " alias ".tenant OPERATOR(pg_catalog.=) $1 AND " alias ".meter OPERATOR(pg_catalog.=) $2" \
	" AND " alias ".voided_at IS NULL" \
	" AND " alias ".starts_at OPERATOR(pg_catalog.<=) " now_param \
	" AND (" alias ".expires_at IS NULL OR " alias ".expires_at OPERATOR(pg_catalog.>) " now_param ")" \
	" AND " alias ".drawn OPERATOR(pg_catalog.<) " alias ".amount"

/*
 * The rows of the active grants, locked in id order by the inner query
 * (its LockRows runs above its sort), in draw order: (grant_id, remaining,
 * amount, low percent).  READ COMMITTED rechecks the condition on a row
 * updated meanwhile: a grant voided or used up by the transaction waited
 * for is left out.
 */
#define FM_LOCK_GRANTS_ROWS(now_param) \
	"SELECT g.grant_id, g.amount OPERATOR(pg_catalog.-) g.drawn, g.amount," \
	" COALESCE(g.low_balance_percent, 0) FROM (" \
	"  SELECT c.grant_id, c.amount, c.drawn, c.priority, c.expires_at, c.low_balance_percent" \
	"  FROM flagmeter.credit_grants c WHERE" FM_ACTIVE_GRANT("c", now_param) \
	"  ORDER BY c.grant_id FOR UPDATE) g" \
	" ORDER BY g.priority, g.expires_at NULLS LAST, g.grant_id"

/*
 * The same rows read without a lock, in draw order, as the statement's
 * snapshot shows them (consume's).
 */
#define FM_READ_GRANTS_ROWS(now_param) \
	"SELECT c.grant_id, c.amount OPERATOR(pg_catalog.-) c.drawn, c.amount," \
	" COALESCE(c.low_balance_percent, 0)" \
	" FROM flagmeter.credit_grants c WHERE" FM_ACTIVE_GRANT("c", now_param) \
	" ORDER BY c.priority, c.expires_at NULLS LAST, c.grant_id"

/* Lock the grants active at now, in id order (see above). */
extern void fm_grants_lock(const char *tenant, const char *meter, TimestampTz now,
						   FmGrantsHeld *held);

/*
 * Read them without a lock, in a statement of its own: a caller holding
 * stripe 0 sees every draw of the period's consumes committed before it.
 */
extern void fm_grants_read(const char *tenant, const char *meter, TimestampTz now,
						   FmGrantsHeld *held);

/*
 * The grants of the rows of the current SPI result whose column first (a
 * grant_id, of FM_LOCK_GRANTS_ROWS' or FM_READ_GRANTS_ROWS' columns) is not
 * NULL, in their order; locked says which of the two.
 */
extern void fm_grants_from_result(const char *tenant, const char *meter, int first,
								  bool locked, FmGrantsHeld *held);

/*
 * What the active grants hold, unlocked (for the balance a decision
 * reports); read_only as for fm_execute.  Connects to SPI itself.
 */
extern int64 fm_grants_available(const char *tenant, const char *meter,
								 TimestampTz now, bool read_only);

/*
 * Draw amount (at most held->available) from held, in draw order, writing
 * the rows in id order, each only if it still holds what it takes and is
 * not voided.  False, having drawn nothing, when one did not (only grants
 * read without a lock can fail so); then held is stale.  Otherwise
 * held->available is what is left, exact for the grants drawn from.
 * Announces nothing
 * yet: fm_grants_announce_draw once the draw stands, or
 * fm_grants_undo_draw to take it back (both under the rows' locks, which
 * the draw took).
 */
extern bool fm_grants_try_draw(FmGrantsHeld *held, int64 amount);

extern void fm_grants_announce_draw(const FmGrantsHeld *held);
extern void fm_grants_undo_draw(FmGrantsHeld *held);

/*
 * Draw from grants locked by fm_grants_lock, and queue grant_low and
 * grant_exhausted for the grants it takes there (notify.h).
 */
extern void fm_grants_draw(FmGrantsHeld *held, int64 amount);

/*
 * The part of a change of usage from used_before to used_after that lies
 * beyond the limit's quota (zero for an unlimited tenant with grants):
 * what grants must cover.
 */
extern int64 fm_grants_needed(const FmLimit *limit, int64 used_before, int64 used_after);

/*
 * fm_decide for a tenant with grants or reservations, available being what
 * its active grants hold and held what its active reservations hold:
 * granted when quota plus grants, less the holds, cover the amount (hard
 * limits, and unlimited tenants with grants), or always (soft limits, and
 * force: a settle records usage that happened).  *draw is what grants give
 * when it is recorded (the part of the usage past the quota).  The
 * decision reports from_grants and the balance, net of the holds (after
 * the call when recorded and granted).
 */
extern void fm_decide_with_grants(const FmLimit *limit, const FmCounter *current,
								  int64 amount, TimestampTz at, TimestampTz period_end,
								  bool record, bool force, int64 available, int64 held,
								  FmDecision *decision, int64 *draw);

/*
 * The limit to queue usage levels with: a hard limit does not block while
 * grants are left.
 */
extern FmLimit fm_grants_announce_limit(const FmLimit *limit, int64 grants_left);

/*
 * After track (or track_batch) added used_delta to the period: when the
 * period is past its quota, lock stripe 0 and the grants, read the period
 * again and draw the part beyond the quota, as far as grants cover it
 * (track is never refused).  Returns what the grants still hold, or -1
 * when they were not looked at (within the quota).
 */
extern int64 fm_grants_after_track(const char *tenant, const char *meter,
								   const FmLimit *limit, TimestampTz period_start,
								   int64 used_delta, TimestampTz now);

#endif							/* FLAGMETER_GRANTS_H */
