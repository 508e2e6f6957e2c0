# fuzz/fuzz.mk -- fuzzing targets, included at the end of the Makefile.
#
#   make fuzz          libFuzzer on the quota_counter text and binary forms:
#                      FUZZ_RUNS executions (default 10 million), capped at
#                      FUZZ_MAX_TIME seconds; prints the execution count
#   make fuzz-smoke    the same, bounded for `make test` (FUZZ_SMOKE_RUNS,
#                      FUZZ_SMOKE_MAX_TIME)
#   make fuzz-build    only build fuzz/build/fuzz_counter
#   make sqlsmith      random SQL from sqlsmith against a throwaway cluster
#                      with flagmeter installed (tools/sqlsmith.sh,
#                      SQLSMITH_QUERIES queries); it fuzzes the SQL surface
#                      rather than the C parsers, but is kept here with the
#                      other fuzzing targets
#
# The harness links src/counter_core.c on its own: it needs no server, only
# clang and its libFuzzer runtime (Debian: clang-14, libclang-rt-14-dev).
# See fuzz/README.md.

FUZZ_CC             ?= clang-14
FUZZ_CFLAGS         ?= -g -O1 -fno-omit-frame-pointer -Wall -Wextra -Werror
# -fno-sanitize-recover: a UBSan report stops the run like an ASan one.
FUZZ_SANITIZE       ?= -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
FUZZ_RUNS           ?= 10000000
FUZZ_MAX_TIME       ?= 1800
FUZZ_SMOKE_RUNS     ?= 200000
FUZZ_SMOKE_MAX_TIME ?= 30
# extra libFuzzer options, e.g. FUZZ_FLAGS=-seed=1
FUZZ_FLAGS          ?=
SQLSMITH_QUERIES    ?= 20000

FUZZ_BIN = fuzz/build/fuzz_counter

.PHONY: fuzz fuzz-smoke fuzz-build sqlsmith

fuzz-build: $(FUZZ_BIN)

$(FUZZ_BIN): fuzz/fuzz_counter.c src/counter_core.c src/counter_core.h
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_SANITIZE) -Isrc -o $@ fuzz/fuzz_counter.c src/counter_core.c

fuzz: $(FUZZ_BIN)
	bash fuzz/run.sh $(FUZZ_RUNS) $(FUZZ_MAX_TIME) $(FUZZ_FLAGS)

fuzz-smoke: $(FUZZ_BIN)
	bash fuzz/run.sh $(FUZZ_SMOKE_RUNS) $(FUZZ_SMOKE_MAX_TIME) $(FUZZ_FLAGS)

sqlsmith:
	bash tools/sqlsmith.sh $(SQLSMITH_QUERIES)

# The binary, the corpus it grew and any crash inputs.
EXTRA_CLEAN += fuzz/build
