/*
 * notify_commit.c
 *	  The transaction's callbacks that run the phases of the notifications:
 *	  at pre-commit the quota events (notify_outbox.c), then the
 *	  invalidations (notify_invalidations.c), with the room of the NOTIFY
 *	  queue looked up once for both (flagmeter.notify_queue_limit); at the
 *	  end, the queue (notify.c) remembered and dropped.  fm_notify_init.
 *
 * See notify.h for the contract and notify_internal.h for how it holds.
 */
#include "postgres.h"

#include "fmgr.h"

#include "access/xact.h"
#include "commands/async.h"
#include "utils/fmgrprotos.h"
#include "utils/guc.h"

#include "notify.h"
#include "notify_internal.h"

/* flagmeter.notify_queue_limit */
static double fm_notify_queue_limit = 0.5;

/* ---------------------------------------------------------------------
 * Commit processing
 * ---------------------------------------------------------------------
 */
static bool
queue_has_room(void)
{
	double		usage;

	usage = DatumGetFloat8(DirectFunctionCall1(pg_notification_queue_usage, (Datum) 0));
	return usage <= fm_notify_queue_limit;
}

static void
fm_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			if (fm_queued_events != NIL || fm_queued_invalidations != NIL)
			{
				bool		room = queue_has_room();

				if (fm_queued_events != NIL)
					fm_notify_commit_quota_events(room);
				if (fm_queued_invalidations != NIL)
					fm_notify_commit_invalidations(room);
			}
			break;
		case XACT_EVENT_PRE_PREPARE:
			if (fm_queued_events != NIL || fm_queued_invalidations != NIL)
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot PREPARE a transaction that has flagmeter notifications pending"),
						 errdetail("Quota events and invalidations are announced at commit, like NOTIFY.")));
			break;
		case XACT_EVENT_COMMIT:
			fm_notify_remember_announced();
			fm_notify_forget_queued();
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_PARALLEL_ABORT:
			fm_notify_forget_queued();
			break;
		default:
			break;
	}
}

void
fm_notify_init(void)
{
	DefineCustomRealVariable("flagmeter.notify_queue_limit",
							 gettext_noop("Fill level of the NOTIFY queue above which flagmeter sends no notifications."),
							 gettext_noop("A full queue would fail the committing transaction; above this level "
										  "notifications are skipped (quota events stay in flagmeter.outbox) and "
										  "counted in flagmeter.stats."),
							 &fm_notify_queue_limit,
							 0.5, 0.0, 1.0,
							 PGC_SUSET, 0,
							 NULL, NULL, NULL);
	RegisterXactCallback(fm_xact_callback, NULL);
	RegisterSubXactCallback(fm_notify_subxact_callback, NULL);
}
