# pg_cai — one Makefile for the engine (libcai), the PostgreSQL extension (PGXS), the `cai` CLI,
# the optional CUDA backend and the tests.
#
#   make              build pg_cai.so, the CLI and (when nvcc is found) the CUDA backend
#   make install      install the extension (PGXS)
#   make model        fetch the default model into models/ (scripts/fetch-model.sh)
#   make unit         build and run the engine's unit tests
#   make test         the whole suite: unit, pg_regress on a throwaway cluster, scenarios
#   make check-versions  build and test against PostgreSQL 15, 16, 17 and 18 (one line each)
#   make setup        fresh machine: apt packages, build, install, model, cluster, first chat
#   make gpu-check    the GPU kit: build, GPU tests, GPU-vs-CPU tokens, bench_gpu (dry without a
#                     GPU); make gpu-kit prepares what a bare GPU machine lacks (scripts/gpu-check.sh)
#
# Without pg_config (a bare GPU machine) the engine, the CLI and the tests that need no server
# still build.

.DEFAULT_GOAL := all

EXTENSION = pg_cai
# install scripts are frozen once released; each later version is an upgrade script from the last
DATA = $(wildcard pg_cai--*.sql) router/pg_cai_router.control $(wildcard router/pg_cai_router--*.sql)
PG_CONFIG ?= pg_config

# ---- the engine: PostgreSQL-free, CUDA-free, built with its own flags -------------------------
# the library: the engine, the wire format both programs share, the backends' host side (the CPU
# backend; the CUDA backend is its own shared object below) and the engine process's serving loop
# the engine's folders from the bottom up: each includes only those before it (src/README.md;
# scripts/check-include-graph.py checks it); one -I each, so that "name.h" needs no folder
ENGINE_DIRS := src/common src/gguf src/text src/structured src/chat src/backend src/model src/engine \
	src/serve
ENGINE_SRCS := $(wildcard src/common/*.c src/gguf/*.c src/text/*.c src/structured/*.c src/chat/*.c \
	src/backend/*.c src/backend/cpu/*.c src/model/*.c src/model/arch/*.c src/engine/*.c src/serve/*.c)
ENGINE_INCLUDES := $(addprefix -I,$(ENGINE_DIRS))
ENGINE_OBJS := $(patsubst src/%.c,build/%.o,$(ENGINE_SRCS))
# -ffp-contract=off: results are bit-identical across builds and backends only if no compiler
# fuses a multiply and an add (GCC does by default where the target has FMA: aarch64, say; on
# x86-64 the engine's code is the same either way)
ENGINE_CFLAGS := -O3 -g -std=gnu11 -fPIC -pthread -fno-strict-aliasing -ffp-contract=off -Wall -Wextra \
	-Wno-unused-parameter -Wno-sign-compare -Werror=vla $(ENGINE_INCLUDES) -MMD -MP $(EXTRA_CFLAGS)
ENGINE_LIBS := $(EXTRA_LDFLAGS) -lxxhash -lpthread -lm -ldl

build/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(CC) $(ENGINE_CFLAGS) -c $< -o $@

# The engine loads the CUDA library by absolute path only: the installed engine from where
# install-cuda puts it, so the directories pg_config names are compiled into the loader (and a
# change of pg_config rebuilds it).  Without pg_config there is none, and only a build tree's
# library or an explicit path is tried.
CAI_INSTALL_BINDIR := $(shell $(PG_CONFIG) --bindir 2>/dev/null)
CAI_INSTALL_PKGLIBDIR := $(shell $(PG_CONFIG) --pkglibdir 2>/dev/null)
build/model/backend_loader.o: ENGINE_CFLAGS += \
	$(if $(CAI_INSTALL_BINDIR),-DCAI_INSTALL_BINDIR='"$(CAI_INSTALL_BINDIR)"') \
	$(if $(CAI_INSTALL_PKGLIBDIR),-DCAI_INSTALL_PKGLIBDIR='"$(CAI_INSTALL_PKGLIBDIR)"')
build/model/backend_loader.o: build/install-dirs
build/install-dirs: install-dirs-check
	@mkdir -p build
	@echo '$(CAI_INSTALL_BINDIR) $(CAI_INSTALL_PKGLIBDIR)' | cmp -s - $@ || \
		echo '$(CAI_INSTALL_BINDIR) $(CAI_INSTALL_PKGLIBDIR)' > $@
.PHONY: install-dirs-check

build/libcai.a: $(ENGINE_OBJS)
	@rm -f $@
	$(AR) rcs $@ $^

# ---- the CLI ----------------------------------------------------------------------------------
# the `cai` program: the CLI's commands, `cai serve` (the engine process) among them
CLI_SRCS := $(wildcard src/cli/*.c)
cai: $(CLI_SRCS) build/libcai.a
	$(CC) $(ENGINE_CFLAGS) -Isrc/cli -o $@ $(CLI_SRCS) build/libcai.a $(ENGINE_LIBS)

# ---- unit tests -------------------------------------------------------------------------------
SYNTH_TOOL := tests/synth/write_synth_model
UNIT_SRCS := $(filter-out $(SYNTH_TOOL).c,$(wildcard tests/unit/*.c tests/synth/*.c))
# test_gemm_blocks.c builds the AVX-512 kernels through SIMDe without AVX-512 enabled: GCC's note
# that 512-bit vectors then pass by value under another ABI concerns nothing outside that file
tests/unit/run_unit: ENGINE_CFLAGS += -Wno-psabi
tests/unit/run_unit: $(UNIT_SRCS) $(wildcard tests/unit/*.h tests/synth/*.h) build/libcai.a
	$(CC) $(ENGINE_CFLAGS) -Itests/unit -Itests/synth -o $@ $(UNIT_SRCS) build/libcai.a $(ENGINE_LIBS)

unit: tests/unit/run_unit
	tests/unit/run_unit

# writes synthetic GGUF models for the scenario tests (a second model to reload to, say) and the
# architecture goldens' models (tests/bench/make_arch_goldens.py)
$(SYNTH_TOOL): $(SYNTH_TOOL).c $(filter-out $(SYNTH_TOOL).c,$(wildcard tests/synth/*.c tests/synth/*.h)) build/libcai.a
	$(CC) $(ENGINE_CFLAGS) -Itests/synth -o $@ $(SYNTH_TOOL).c tests/synth/synth_model.c \
		tests/synth/synth_presets.c tests/synth/gguf_writer.c build/libcai.a $(ENGINE_LIBS)

include tests/fuzz/fuzz.mk

# ---- the extension (PGXS) ---------------------------------------------------------------------
MODULE_big = pg_cai
OBJS = pg_cai.o $(patsubst %.c,%.o,$(wildcard src/pg/*.c))
PG_CPPFLAGS = -Isrc/common -Isrc/pg
# A server API whose signature changed between major versions shows first as one of these; as a
# warning it once built a worker that crashed on the first request, so they are errors.
PG_CFLAGS = -Werror=incompatible-pointer-types -Werror=implicit-function-declaration -Werror=int-conversion
SHLIB_LINK = build/libcai.a $(ENGINE_LIBS)
REGRESS = $(patsubst sql/%.sql,%,$(sort $(wildcard sql/*.sql)))
REGRESS_OPTS = --inputdir=. --load-extension=pg_cai
# PGXS tracks no header dependencies: rebuild the extension's objects when an interface changes
# (a stale cai_engine_stats layout corrupts the worker's stack).
$(OBJS): src/common/cai.h src/common/wire.h $(wildcard src/pg/*.h)

PGXS := $(shell $(PG_CONFIG) --pgxs 2>/dev/null)
ifneq ($(PGXS),)
include $(PGXS)
$(shlib): build/libcai.a
endif
all: cai

# The engine process is the `cai` program's serving mode: the worker execs it from the server's
# own bin directory (src/pg/engine_process.c).
ifneq ($(PGXS),)
install: install-engine
install-engine: cai
	$(INSTALL_PROGRAM) cai '$(DESTDIR)$(bindir)/cai'
uninstall: uninstall-engine
uninstall-engine:
	rm -f '$(DESTDIR)$(bindir)/cai'

# Gemma 3 270M through the worker, on a server that serves the Gemma file
# (scripts/run-tests.sh starts one when models/ has it; results in build/regress_gemma)
installcheck-gemma:
	@mkdir -p build/regress_gemma
	$(pg_regress_installcheck) --inputdir=tests/regress_gemma --outputdir=build/regress_gemma \
		--load-extension=pg_cai cai_gemma
endif

# MODEL=hf:OWNER/REPO/FILE.gguf or an https URL (with SHA256=...) fetches another model.  Both
# reach the script through its environment, unexpanded (exporting MODEL itself would expand it),
# never through a shell command line: the script checks their shape and refuses anything else
unexport MODEL SHA256
model: export CAI_FETCH_SOURCE = $(value MODEL)
model: export CAI_FETCH_SHA256 = $(value SHA256)
model:
	scripts/fetch-model.sh "$$CAI_FETCH_SOURCE" "$$CAI_FETCH_SHA256"

test: all install $(SYNTH_TOOL)
	scripts/run-tests.sh

# a router and NODES pg_cai data nodes on 127.0.0.1 (scripts/scale-out.sh; README "Scaling out")
NODES ?= 3
cluster: all install
	scripts/scale-out.sh start $(NODES)
cluster-stop:
	scripts/scale-out.sh stop

# the PostgreSQL version matrix: build, install and test against 15, 16, 17 and 18, one line
# each (scripts/check-versions.sh; VERSIONS="16 18" for a subset)
check-versions: all
	scripts/check-versions.sh $(VERSIONS)

setup:
	scripts/setup.sh

# the GPU kit (scripts/gpu-check.sh): OUT is the report's folder
OUT ?= build/gpu-check
gpu-kit:
	scripts/gpu-kit.sh
gpu-check:
	scripts/gpu-check.sh $(OUT)

clean: clean-engine
clean-engine:
	rm -rf build cai tests/unit/run_unit tests/gpu/run_gpu tests/gpu/e2e_greedy $(SYNTH_TOOL)

# the whole engine on the GPU against the CPU, through the public API (the GPU kit runs it); plain
# C: the engine's loader finds the CUDA library at run time, so this builds without nvcc too
tests/gpu/e2e_greedy: tests/gpu/e2e_greedy.c tests/synth/synth_model.c tests/synth/gguf_writer.c \
		$(wildcard tests/synth/*.h) build/libcai.a
	$(CC) $(ENGINE_CFLAGS) -Itests/synth -o $@ tests/gpu/e2e_greedy.c tests/synth/synth_model.c \
		tests/synth/gguf_writer.c build/libcai.a $(ENGINE_LIBS)

.PHONY: unit model test cluster cluster-stop check-versions setup clean-engine install-engine uninstall-engine \
	gpu-kit gpu-check

# ==== BEGIN CUDA backend (src/backend/cuda/, tests/gpu, tests/bench/bench_gpu) =============================
# Built only where nvcc is found.  build/libcai_cuda.so is a separate shared object that the engine
# dlopen()s when pg_cai.device is auto or cuda, so a CPU-only server never loads libcudart; the
# extension and the CLI do not link it.  tests/gpu/run_gpu compares every kernel and every backend
# operation with the CPU (skips, saying so, without a device); tests/bench/bench_gpu measures.
NVCC ?= $(shell command -v nvcc || echo /usr/local/cuda/bin/nvcc)
ifneq ($(wildcard $(NVCC)),)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_LIBDIR ?= $(firstword $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib))
# Hopper machine code (sm_90) and its PTX for newer GPUs; Ampere/Ada machine code (sm_80) too.
CUDA_GENCODE ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
	-gencode arch=compute_90,code=compute_90
# warnings are errors in CI; the GPU kit turns that off on the device, whose host compiler may be
# newer and warn about more
CUDA_WERROR ?= -Werror all-warnings
BACKEND_WERROR ?= -Werror
NVCC_FLAGS := -O3 -std=c++17 $(CUDA_GENCODE) $(CUDA_WERROR) \
	-Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra,-Wno-unused-parameter \
	$(ENGINE_INCLUDES) -Isrc/backend/cuda -MMD -MP
CUDA_SRCS := $(wildcard src/backend/cuda/*.cu)
CUDA_OBJS := $(patsubst src/backend/cuda/%.cu,build/backend/cuda/%.o,$(CUDA_SRCS)) build/backend/cuda/backend_cuda.o \
	build/backend/cuda/blocks_pack.o build/backend/cuda/cuda_error.o
CUDA_LINK := -cudart shared -lcublasLt $(if $(CUDA_LIBDIR),-L$(CUDA_LIBDIR) -Xlinker -rpath=$(CUDA_LIBDIR))
GPU_TEST_LIBS := -Lbuild -lcai_cuda -Wl,-rpath,'$$ORIGIN/../../build' $(ENGINE_LIBS)

build/backend/cuda/%.o: src/backend/cuda/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -c $< -o $@

build/backend/cuda/backend_cuda.o build/backend/cuda/blocks_pack.o build/backend/cuda/cuda_error.o: build/backend/cuda/%.o: src/backend/cuda/%.c
	@mkdir -p $(dir $@)
	$(CC) $(ENGINE_CFLAGS) $(BACKEND_WERROR) -fvisibility=hidden -Isrc/backend/cuda -c $< -o $@

build/libcai_cuda.so: $(CUDA_OBJS)
	$(NVCC) -shared $(CUDA_GENCODE) -o $@ $(CUDA_OBJS) $(CUDA_LINK)

GPU_TEST_SRCS := $(filter-out tests/gpu/e2e_greedy.c,$(wildcard tests/gpu/*.c))
tests/gpu/run_gpu: $(GPU_TEST_SRCS) $(wildcard tests/gpu/*.h) tests/unit/test.h tests/unit/test_runner.c \
		build/libcai_cuda.so build/libcai.a
	$(CC) $(ENGINE_CFLAGS) -Isrc/backend/cuda -Itests/gpu -Itests/unit -o $@ $(GPU_TEST_SRCS) \
		tests/unit/test_runner.c build/libcai.a $(GPU_TEST_LIBS)

tests/bench/bench_gpu: tests/bench/bench_gpu.c build/libcai_cuda.so build/libcai.a
	$(CC) $(ENGINE_CFLAGS) -Isrc/backend/cuda -o $@ tests/bench/bench_gpu.c build/libcai.a $(GPU_TEST_LIBS)

cuda: build/libcai_cuda.so tests/gpu/run_gpu tests/bench/bench_gpu
gpu-test: tests/gpu/run_gpu
	tests/gpu/run_gpu
all: cuda
ifneq ($(PGXS),)
install: install-cuda
install-cuda: build/libcai_cuda.so
	$(INSTALL_SHLIB) build/libcai_cuda.so '$(DESTDIR)$(pkglibdir)/'
endif

-include $(CUDA_OBJS:.o=.d)
else
cuda gpu-test:
	@echo "nvcc not found (NVCC=$(NVCC)): the CUDA backend is not built"
endif
clean: clean-cuda
clean-cuda:
	rm -f tests/gpu/run_gpu tests/bench/bench_gpu
.PHONY: cuda gpu-test install-cuda clean-cuda
# ==== END CUDA backend ==========================================================================

-include $(ENGINE_OBJS:.o=.d)

# the tool-call test set on the real models (tests/tools): every call's arguments validated
# against its tool's schema; `make tool-eval` runs it on SmolLM2 and Gemma 3
tests/tools/tool_eval: tests/tools/tool_eval.c tests/unit/json_validate.h build/libcai.a
	$(CC) $(ENGINE_CFLAGS) -Itests/unit -o $@ $< build/libcai.a $(ENGINE_LIBS)

TOOL_EVAL_MODELS ?= models/SmolLM2-135M-Instruct.Q4_1.gguf models/gemma-3-270m-q4_k_m.gguf
tool-eval: tests/tools/tool_eval
	@set -e; for m in $(TOOL_EVAL_MODELS); do tests/tools/tool_eval $$m tests/tools/tools.json; done
.PHONY: tool-eval
tests/tools/render_tools: tests/tools/render_tools.c build/libcai.a
	$(CC) $(ENGINE_CFLAGS) -o $@ $< build/libcai.a $(ENGINE_LIBS)
