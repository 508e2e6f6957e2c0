/*
 * find_tag_collision.c
 *	  Finds tenant names whose track stripe tags collide: the same 32-bit
 *	  period hash (src/stripes.c, fm_period_hash) for one meter and period
 *	  start.  test/specs/stripe_tag_collision.spec uses a pair it printed.
 *
 *	  gcc -O2 -I$(pg_config --includedir-server) tools/find_tag_collision.c \
 *	      $(pg_config --pkglibdir)/libpgcommon.a $(pg_config --pkglibdir)/libpgport.a \
 *	      -o /tmp/find_tag_collision && /tmp/find_tag_collision
 *
 *	  hash_bytes reads memory in native byte order: pairs found on a
 *	  little-endian machine collide there only.
 */
#include "postgres.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hashfn.h"

#define CANDIDATES 400000
#define METER "calls"
/* 2026-03-01 00:00:00+00 (March 2026, a tenant without a plan) as TimestampTz */
#define PERIOD_START ((int64) 825638400 * 1000000)

typedef struct Candidate
{
	uint32		hash;
	int			n;
} Candidate;

/* as fm_period_hash (src/stripes.c) over fm_tenant_meter_hash (src/limit.c) */
static uint32
stripe_tag_hash(const char *tenant, const char *meter, int64 period_start)
{
	uint32		tenant_meter = hash_combine(hash_bytes((const unsigned char *) tenant, strlen(tenant)),
											hash_bytes((const unsigned char *) meter, strlen(meter)));

	return hash_combine(tenant_meter,
						hash_bytes((const unsigned char *) &period_start, sizeof(period_start)));
}

static int
by_hash(const void *a, const void *b)
{
	uint32		x = ((const Candidate *) a)->hash;
	uint32		y = ((const Candidate *) b)->hash;

	return (x > y) - (x < y);
}

int
main(void)
{
	Candidate  *c = malloc(sizeof(Candidate) * CANDIDATES);
	char		name[32];
	int			i;

	for (i = 0; i < CANDIDATES; i++)
	{
		snprintf(name, sizeof(name), "tenant-%d", i);
		c[i].hash = stripe_tag_hash(name, METER, PERIOD_START);
		c[i].n = i;
	}
	qsort(c, CANDIDATES, sizeof(Candidate), by_hash);
	for (i = 1; i < CANDIDATES; i++)
		if (c[i].hash == c[i - 1].hash)
			printf("tenant-%d tenant-%d %u\n", c[i - 1].n, c[i].n, c[i].hash);
	return 0;
}
