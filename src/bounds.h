/*
 * bounds.h
 *	  The bounds every call checks, in one place (documented in README,
 *	  "Bounds and errors").  The SQL side calls the same checks:
 *	  flagmeter.check_tenant() is fm_check_tenant (args.c), so no script
 *	  states the tenant bound again; flagmeter.check_name() holds the 63 of
 *	  names in its regular expression, next to the message that says it.
 */
#ifndef FLAGMETER_BOUNDS_H
#define FLAGMETER_BOUNDS_H

#define FM_TENANT_MAX_BYTES		256
#define FM_NAME_MAX_BYTES		63	/* meters and plans:
									 * flagmeter.check_name() */
#define FM_KEY_MAX_BYTES		256

/* Most alert thresholds one limit may have (flagmeter.check_thresholds). */
#define FM_MAX_THRESHOLDS		32

/* Most meters one multi-meter consume may name. */
#define FM_MAX_METERS_PER_CONSUME 64

/* "tenant \0 meter \0": the fixed-size keys of per-call hash tables */
#define FM_TENANT_METER_KEY_BYTES (FM_TENANT_MAX_BYTES + 1 + FM_NAME_MAX_BYTES + 1)

#endif							/* FLAGMETER_BOUNDS_H */
