# flagmeter: PGXS build.  `make demo` and `make test` are the two entry
# points of the README; both install what they need from Debian first.

PG_CONFIG ?= pg_config

EXTENSION  = flagmeter
EXTVERSION = 0.4.0

MODULE_big = flagmeter
OBJS = \
	src/flagmeter.o \
	src/args.o \
	src/counter_core.o \
	src/counter.o \
	src/period.o \
	src/pk_scan.o \
	src/statements.o \
	src/limit.o \
	src/limit_lookup.o \
	src/shared_limits.o \
	src/rate_limiter.o \
	src/rate_limit_calls.o \
	src/inflight.o \
	src/inflight_consume.o \
	src/pending_table.o \
	src/pending_databases.o \
	src/pending_add.o \
	src/pending_read.o \
	src/pending_fold.o \
	src/pending_xact.o \
	src/decision.o \
	src/usage_rows.o \
	src/stripes.o \
	src/event_keys.o \
	src/track_alerts.o \
	src/review.o \
	src/track.o \
	src/track_batch.o \
	src/consume_one.o \
	src/consume_rate.o \
	src/consume.o \
	src/consume_batch.o \
	src/grants.o \
	src/pools.o \
	src/holds.o \
	src/reservations.o \
	src/reads.o \
	src/void.o \
	src/unique_values.o \
	src/entitlements.o \
	src/notify.o \
	src/notify_outbox.o \
	src/notify_invalidations.o \
	src/notify_commit.o \
	src/notify_announce.o \
	src/invalidate.o

# The install script is built from one file per concern under sql/parts;
# the install scripts of released versions and the upgrade scripts
# (sql/flagmeter--A--B.sql) are shipped as they are.
SQL_PARTS  = $(sort $(wildcard sql/parts/*.sql))
DATA_built = sql/$(EXTENSION)--$(EXTVERSION).sql
DATA       = $(filter-out $(DATA_built),$(wildcard sql/$(EXTENSION)--*.sql))

# flagmeter_proxy, the API in a PL/Proxy proxy database (README "Scale-out"):
# the counter and decision types of sql/parts, then contrib/plproxy/proxy.sql.
PROXY_PARTS = sql/parts/10_counter.sql sql/parts/15_decision.sql contrib/plproxy/proxy.sql
DATA_built += contrib/plproxy/flagmeter_proxy--$(EXTVERSION).sql
DATA       += contrib/plproxy/flagmeter_proxy.control \
	$(filter-out $(DATA_built),$(wildcard contrib/plproxy/flagmeter_proxy--*.sql))

REGRESS      = $(patsubst test/sql/%.sql,%,$(sort $(wildcard test/sql/*.sql)))
REGRESS_OPTS = --inputdir=test --load-extension=flagmeter

ISOLATION      = $(patsubst test/specs/%.spec,%,$(sort $(wildcard test/specs/*.spec)))
ISOLATION_OPTS = --inputdir=test --load-extension=flagmeter

TAP_TESTS   = 1
PROVE_TESTS = $(sort $(wildcard test/t/*.pl))

# The library names the version it was built as (PG_MODULE_MAGIC_EXT, 18+).
PG_CPPFLAGS = -DFLAGMETER_VERSION='"$(EXTVERSION)"'

# Warnings are errors when WERROR=1 (make test and CI set it).
PG_CFLAGS += -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers \
	-Wno-sign-compare
ifeq ($(WERROR),1)
PG_CFLAGS += -Werror
endif

EXTRA_CLEAN = results output_iso output_row_lock output_iso_row_lock tmp_check regression.diffs regression.out

PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

sql/$(EXTENSION)--$(EXTVERSION).sql: $(SQL_PARTS)
	cat $^ > $@

contrib/plproxy/flagmeter_proxy--$(EXTVERSION).sql: $(PROXY_PARTS)
	{ printf '%s\n' '\echo Use "CREATE EXTENSION flagmeter_proxy" to load this file. \quit'; cat $^; } > $@

# PGXS tracks header dependencies only in servers built with --enable-depend:
# rebuild every object when any of our headers changes.
$(OBJS): $(wildcard src/*.h)

.PHONY: demo dashboard test bench indent
demo:
	bash tools/demo.sh

dashboard:
	bash tools/dashboard.sh

# make test PG=17 or PG=18: the same suites against that release, in a
# chroot of the Debian suite that packages it (tools/chroot.sh).
PG ?= 15
test:
	PG=$(PG) bash tools/test.sh

bench:
	bash bench/run

# pgindent's formatting (pg_bsd_indent and typedefs.list): tools/pgindent.sh.
indent:
	bash tools/pgindent.sh

# The checks that read the tree and need no server, all five with a line of
# summary each (tools/check_static.sh), or one by one: the C as pgindent
# leaves it and typedefs.list complete; contrib/plproxy/proxy.sql against
# the functions it routes to; docs/architecture.md naming what exists; the
# reference (docs/reference/) documenting every function and setting; the
# version of every file that states it the Makefile's EXTVERSION.
.PHONY: check-static check-indent check-proxy check-docs check-reference check-versions package
check-static:
	bash tools/check_static.sh

check-indent:
	bash tools/pgindent.sh --check

check-proxy:
	python3 -B tools/check_proxy_stubs.py

check-docs:
	python3 -B tools/check_docs_map.py

check-versions:
	bash tools/check_versions.sh

check-reference:
	perl tools/check_reference.pl

# The Debian packages of PG's release (debian/, pg_buildext), proved by the
# regression suite against their files alone, copied to dist/.
package:
	PG=$(PG) bash tools/package.sh --out dist

# Fuzzing the quota_counter parsers (libFuzzer, clang): see fuzz/fuzz.mk.
-include fuzz/fuzz.mk

# The PGXN source archive, dist/flagmeter-$(EXTVERSION).zip: what git tracks at
# HEAD under flagmeter-$(EXTVERSION)/ (no .git, node_modules or dist/), after
# the version check (tools/check_versions.sh) and META.json against the PGXN
# Meta Spec (tools/check_meta.py); every file META.json's provides names must
# be in it.
.PHONY: dist
DIST = dist/$(EXTENSION)-$(EXTVERSION).zip
dist:
	bash tools/check_versions.sh
	python3 -B tools/check_meta.py META.json
	@git diff --quiet HEAD -- || echo "note: uncommitted changes are not in $(DIST) (it is HEAD)"
	mkdir -p dist
	git archive --format=zip --prefix=$(EXTENSION)-$(EXTVERSION)/ -o $(DIST) HEAD
	@for f in $$(python3 -c 'import json; print(" ".join(p["file"] for p in json.load(open("META.json"))["provides"].values()))') \
		META.json Makefile $(EXTENSION).control; do \
		unzip -l $(DIST) "$(EXTENSION)-$(EXTVERSION)/$$f" >/dev/null || { echo "$(DIST) lacks $$f"; exit 1; }; \
	done
	@echo "$(DIST): $$(unzip -Z1 $(DIST) | grep -vc '/$$') files, $$(du -k $(DIST) | cut -f1) kB"
