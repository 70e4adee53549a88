# pg_cai — one Makefile for the engine (libcai), the PostgreSQL extension (PGXS), the `cai` CLI,
# the optional CUDA backend and the tests.
#
#   make              build pg_cai.so, the CLI and (when nvcc is found) the CUDA backend
#   make install      install the extension (PGXS)
#   make model        fetch the default model into models/ (scripts/fetch-model.sh)
#   make unit         build and run the engine's unit tests
#   make test         the whole suite: unit, pg_regress on a throwaway cluster, scenarios
#   make setup        fresh machine: apt packages, build, install, model, cluster, first chat

EXTENSION = pg_cai
DATA = pg_cai--0.1.sql
PG_CONFIG ?= pg_config

# ---- the engine: PostgreSQL-free, CUDA-free, built with its own flags -------------------------
ENGINE_SRCS := $(wildcard src/engine/*.c src/engine/cpu/*.c)
ENGINE_OBJS := $(patsubst src/%.c,build/%.o,$(ENGINE_SRCS))
ENGINE_CFLAGS := -O3 -g -std=gnu11 -fPIC -pthread -fno-strict-aliasing -Wall -Wextra \
	-Wno-unused-parameter -Wno-sign-compare -Werror=vla -Isrc/engine -MMD -MP $(EXTRA_CFLAGS)
ENGINE_LIBS := -lxxhash -lpthread -lm -ldl

build/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(CC) $(ENGINE_CFLAGS) -c $< -o $@

build/libcai.a: $(ENGINE_OBJS)
	@rm -f $@
	$(AR) rcs $@ $^

# ---- the CLI ----------------------------------------------------------------------------------
CLI_SRCS := $(wildcard src/cli/*.c)
cai: $(CLI_SRCS) build/libcai.a
	$(CC) $(ENGINE_CFLAGS) -o $@ $(CLI_SRCS) build/libcai.a $(ENGINE_LIBS)

# ---- unit tests -------------------------------------------------------------------------------
UNIT_SRCS := $(wildcard tests/unit/*.c tests/synth/*.c)
tests/unit/run_unit: $(UNIT_SRCS) $(wildcard tests/unit/*.h tests/synth/*.h) build/libcai.a
	$(CC) $(ENGINE_CFLAGS) -Itests/unit -Itests/synth -o $@ $(UNIT_SRCS) build/libcai.a $(ENGINE_LIBS)

unit: tests/unit/run_unit
	tests/unit/run_unit

# ---- the extension (PGXS) ---------------------------------------------------------------------
MODULE_big = pg_cai
OBJS = pg_cai.o $(patsubst %.c,%.o,$(wildcard src/pg/*.c))
PG_CPPFLAGS = -Isrc/engine -Isrc/pg
SHLIB_LINK = build/libcai.a $(ENGINE_LIBS)
REGRESS = $(patsubst sql/%.sql,%,$(sort $(wildcard sql/*.sql)))
REGRESS_OPTS = --inputdir=. --load-extension=pg_cai

PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

$(shlib): build/libcai.a
all: cai

model:
	scripts/fetch-model.sh

test: all
	scripts/run-tests.sh

setup:
	scripts/setup.sh

clean: clean-engine
clean-engine:
	rm -rf build cai tests/unit/run_unit tests/gpu/run_gpu

.PHONY: unit model test setup clean-engine

-include $(ENGINE_OBJS:.o=.d)
