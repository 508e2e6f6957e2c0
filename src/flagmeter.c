/*
 * flagmeter.c
 *	  Module entry point.  Each part of flagmeter that needs start-up work
 *	  has its own init function; _PG_init only calls them.
 */
#include "postgres.h"
#include "fmgr.h"

#include "utils/guc.h"

#include "accounting.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

void
_PG_init(void)
{
	fm_accounting_init();
	MarkGUCPrefixReserved("flagmeter");
}
