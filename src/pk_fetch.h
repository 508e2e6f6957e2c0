/*
 * pk_fetch.h
 *	  Fetch one row of a flagmeter table by its primary key (pk_fetch.c).
 */
#ifndef FLAGMETER_PK_FETCH_H
#define FLAGMETER_PK_FETCH_H

#include "postgres.h"
#include "utils/snapshot.h"

#define FM_PK_FETCH_MAX_KEYS 4

/*
 * The row of flagmeter.<relname> whose (text) primary key columns equal
 * keys[0 .. nkeys-1], in snapshot: false when there is none; otherwise the
 * named columns' values (copied into the current memory context) and
 * nulls.
 */
extern bool fm_pk_fetch(const char *relname, int nkeys, const char *const *keys,
						Snapshot snapshot, int ncolumns, const char *const *columns,
						Datum *values, bool *nulls);

#endif							/* FLAGMETER_PK_FETCH_H */
