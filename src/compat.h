/*
 * compat.h
 *	  The few PostgreSQL API differences between 15 and 18 that flagmeter
 *	  meets, in one place.
 */
#ifndef FLAGMETER_COMPAT_H
#define FLAGMETER_COMPAT_H

#include "postgres.h"

#if PG_VERSION_NUM >= 160000
#include "varatt.h"				/* VARDATA and friends left postgres.h in 16 */
#include "nodes/miscnodes.h"	/* soft input errors */
/* Report bad input softly, so pg_input_is_valid() works (16+). */
#define fm_ereturn(context, dummy, ...) ereturn(context, dummy, __VA_ARGS__)
#else
#define fm_ereturn(context, dummy, ...) \
	do { \
		(void) (context); \
		ereport(ERROR, __VA_ARGS__); \
		return dummy; \
	} while (0)
#endif

#if PG_VERSION_NUM >= 170000
#define FM_MY_BACKEND_NUMBER MyProcNumber
#define FM_MY_LOCAL_XID (MyProc->vxid.lxid)
#define fm_lock_held_by_me(tag, mode) LockHeldByMe((tag), (mode), false)
#else
#define FM_MY_BACKEND_NUMBER MyBackendId
#define FM_MY_LOCAL_XID (MyProc->lxid)
#define fm_lock_held_by_me(tag, mode) LockHeldByMe((tag), (mode))
#endif

#endif							/* FLAGMETER_COMPAT_H */
