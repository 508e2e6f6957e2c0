/*
 * accounting.h
 *	  track, consume, check, usage and void (see accounting.c).
 */
#ifndef FLAGMETER_ACCOUNTING_H
#define FLAGMETER_ACCOUNTING_H

/* Defines the flagmeter.* settings of the accounting calls. */
extern void fm_accounting_init(void);

#endif							/* FLAGMETER_ACCOUNTING_H */
