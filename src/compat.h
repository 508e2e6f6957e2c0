/*
 * compat.h
 *	  The few PostgreSQL API differences between 15 and 18 that flagmeter
 *	  meets, in one place.  Each block is keyed on the release that made the
 *	  change; the code uses the fm_ and FM_ names and never tests
 *	  PG_VERSION_NUM itself.
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
/*
 * 17 numbers backends by ProcNumber, moves lxid into PGPROC.vxid and asks
 * LockHeldByMe whether a stronger lock will do (false: only this mode, as
 * before).
 */
#define FM_MY_BACKEND_NUMBER MyProcNumber
#define FM_MY_LOCAL_XID (MyProc->vxid.lxid)
#define fm_lock_held_by_me(tag, mode) LockHeldByMe((tag), (mode), false)
#else
#define FM_MY_BACKEND_NUMBER MyBackendId
#define FM_MY_LOCAL_XID (MyProc->lxid)
#define fm_lock_held_by_me(tag, mode) LockHeldByMe((tag), (mode))
#endif

#if PG_VERSION_NUM >= 180000
/*
 * 18 replaced pg_attribute_noreturn(), written after a declarator, with
 * pg_noreturn (C11 _Noreturn), written before the declaration; fm_noreturn
 * goes before it, where GCC and clang take the attribute as well.
 */
#define fm_noreturn pg_noreturn
/*
 * 18 lets the caller accept a deferrable primary key; false keeps the answer
 * of earlier releases, where a deferrable one was no primary key at all.
 */
#define fm_primary_key_index(rel) RelationGetPrimaryKeyIndex((rel), false)
/* 18 counts index scans for EXPLAIN; ours are not part of a plan. */
#define fm_index_beginscan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), NULL, (nkeys), (norderbys))
/*
 * 18 lets a library say its name and version, shown by
 * pg_get_loaded_modules(); FLAGMETER_VERSION is the Makefile's EXTVERSION.
 */
#define FM_MODULE_MAGIC \
	PG_MODULE_MAGIC_EXT(.name = "flagmeter", .version = FLAGMETER_VERSION)
#else
#define fm_noreturn pg_attribute_noreturn()
#define fm_primary_key_index(rel) RelationGetPrimaryKeyIndex(rel)
#define fm_index_beginscan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), (nkeys), (norderbys))
#define FM_MODULE_MAGIC PG_MODULE_MAGIC
#endif

#endif							/* FLAGMETER_COMPAT_H */
