/*
 * args.h
 *	  The argument checks of every SQL call (args.c): one function per
 *	  kind of value, each raising the documented SQLSTATE and message, so
 *	  that a bad value reads the same whichever call it was passed to.
 *	  Every call checks all its arguments before it writes anything.
 */
#ifndef FLAGMETER_ARGS_H
#define FLAGMETER_ARGS_H

#include "postgres.h"
#include "fmgr.h"
#include "datatype/timestamp.h"

#include "bounds.h"
#include "compat.h"

/* 22004 "<what> must not be NULL" */
fm_noreturn extern void fm_null_argument(const char *what);

/* Checks of values, wherever they come from. */
extern void fm_check_tenant(const char *tenant);
extern void fm_check_meter_name(const char *meter);
extern void fm_check_feature_name(const char *feature);
extern void fm_check_key(const char *key);
extern void fm_check_amount(int64 amount, bool zero_allowed);
extern void fm_check_timestamp(TimestampTz ts);

/* Scalar arguments: NULL is an error, except for the key (NULL: no key). */
extern char *fm_arg_tenant(FunctionCallInfo fcinfo, int argno);
extern char *fm_arg_meter(FunctionCallInfo fcinfo, int argno);
extern char *fm_arg_key(FunctionCallInfo fcinfo, int argno);
extern int64 fm_arg_amount(FunctionCallInfo fcinfo, int argno, bool zero_allowed);
extern TimestampTz fm_arg_timestamp(FunctionCallInfo fcinfo, int argno,
									const char *what);

/*
 * The same from a text argument (the overloads that take untyped literals
 * and driver parameters, which PostgreSQL could not otherwise resolve):
 * read as bigint and timestamptz input reads them, their errors (22P02,
 * 22007, 22008) with hint added when it is not NULL.
 */
extern int64 fm_arg_amount_text(FunctionCallInfo fcinfo, int argno, bool zero_allowed);
extern TimestampTz fm_arg_timestamp_text(FunctionCallInfo fcinfo, int argno,
										 const char *what, const char *hint);

/*
 * Array arguments of the batch calls, one-dimensional, element i of each
 * describing event i.  fm_arg_text_array returns the strings (NULL
 * elements as NULL pointers when allowed) and their count;
 * fm_arg_amount_array needs exactly expected valid amounts.
 */
extern char **fm_arg_text_array(FunctionCallInfo fcinfo, int argno, const char *what,
								int *n, bool nulls_allowed);
extern int64 *fm_arg_amount_array(FunctionCallInfo fcinfo, int argno, int expected,
								  bool zero_allowed);
extern TimestampTz *fm_arg_timestamp_array(FunctionCallInfo fcinfo, int argno,
										   const char *what, int expected,
										   TimestampTz null_means);
extern void fm_check_array_length(const char *what, int n, int expected);

/*
 * The leading arguments of the batch calls, (tenants[], meters[],
 * amounts[]) at 0, 1, 2: none NULL (each named in argument order), no
 * NULL elements, the same length (returned); amounts checked as by
 * fm_arg_amount_array.
 */
extern int	fm_arg_batch_rows(FunctionCallInfo fcinfo, char ***tenants, char ***meters,
							  int64 **amounts, bool zero_allowed);

/*
 * The elements of array argument argno (not NULL), one-dimensional, of
 * elemtype: text, integer, bigint, timestamptz or interval.
 */
extern void fm_arg_array_elements(FunctionCallInfo fcinfo, int argno, const char *what,
								  Oid elemtype, Datum **elems, bool **isnull, int *n);

/* idempotency_keys[] of expected elements, NULL elements allowed; NULL: none */
extern char **fm_arg_key_array(FunctionCallInfo fcinfo, int argno, int expected);

/* an int4 array of expected elements without NULLs; NULL when the argument is */
extern int32 *fm_arg_int4_array(FunctionCallInfo fcinfo, int argno, const char *what,
								int expected);

#endif							/* FLAGMETER_ARGS_H */
