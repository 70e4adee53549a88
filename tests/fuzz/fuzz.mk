# tests/fuzz/fuzz.mk — libFuzzer targets over the engine's parsers of untrusted input, built
# with clang under AddressSanitizer + UndefinedBehaviorSanitizer (included by the top-level
# Makefile; see tests/fuzz/README.md).
#
#   make fuzz-build     build every target into build/fuzz/
#   make fuzz-seeds     write the hand-made seeds into tests/fuzz/corpus/ (gen_corpus.c)
#   make fuzz           run each target FUZZ_SECONDS (60) over its corpus
#   make fuzz-smoke     run each target FUZZ_SMOKE_SECONDS (30); fails, naming it, on any crash
#
# A target is tests/fuzz/fuzz_<name>.c defining LLVMFuzzerTestOneInput; its seeds live in
# tests/fuzz/corpus/fuzz_<name>/, an optional dictionary in tests/fuzz/fuzz_<name>.dict, and
# its input size limit in FUZZ_MAX_LEN_fuzz_<name> below (default FUZZ_MAX_LEN).  Runs write
# new inputs and crash artifacts under tests/fuzz/out/ (ignored), never into the corpus.

FUZZ_CC ?= clang
FUZZ_SANITIZE := -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_CFLAGS := -g -O1 -std=gnu11 -pthread -fno-omit-frame-pointer -fno-strict-aliasing -ffp-contract=off \
	$(FUZZ_SANITIZE) -fsanitize=fuzzer-no-link -Wall -Wextra -Wno-unused-parameter \
	-Wno-sign-compare -Wno-unknown-pragmas $(ENGINE_INCLUDES) -Itests/synth -Itests/unit -MMD -MP
FUZZ_LDFLAGS := $(FUZZ_SANITIZE) -fsanitize=fuzzer

# the engine and the synthetic GGUF writer, compiled for fuzzing (never the gcc objects)
FUZZ_ENGINE_OBJS := $(patsubst src/%.c,build/fuzz/%.o,$(ENGINE_SRCS))
FUZZ_SYNTH_OBJS := $(patsubst tests/synth/%.c,build/fuzz/synth/%.o,$(filter-out $(SYNTH_TOOL).c,$(wildcard tests/synth/*.c)))
FUZZ_TARGETS ?= $(sort $(basename $(notdir $(wildcard tests/fuzz/fuzz_*.c))))
FUZZ_BINS := $(addprefix build/fuzz/,$(FUZZ_TARGETS))

FUZZ_SECONDS ?= 60
FUZZ_SMOKE_SECONDS ?= 30
FUZZ_MAX_LEN ?= 4096
FUZZ_MAX_LEN_fuzz_gguf ?= 65536
FUZZ_MAX_LEN_fuzz_tokenizer_load ?= 65536
FUZZ_MAX_LEN_fuzz_prefix_cache ?= 8192
FUZZ_MAX_LEN_fuzz_block_weights ?= 12288
FUZZ_MAX_LEN_fuzz_weight_cache ?= 16384
FUZZ_MAX_LEN_fuzz_kv_disk ?= 8192

build/fuzz/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@

build/fuzz/synth/%.o: tests/synth/%.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@

build/fuzz/fuzz_%: tests/fuzz/fuzz_%.c $(wildcard tests/fuzz/*.h) $(FUZZ_ENGINE_OBJS) $(FUZZ_SYNTH_OBJS)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_LDFLAGS) -o $@ $< $(FUZZ_ENGINE_OBJS) $(FUZZ_SYNTH_OBJS) $(ENGINE_LIBS)

fuzz-build: $(FUZZ_BINS)

# the hand-made seeds (synthetic GGUF models, inputs in each structured target's format)
build/fuzz/gen_corpus: tests/fuzz/gen_corpus.c $(wildcard tests/fuzz/*.h) $(FUZZ_ENGINE_OBJS) $(FUZZ_SYNTH_OBJS)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_SANITIZE) -o $@ $< $(FUZZ_ENGINE_OBJS) $(FUZZ_SYNTH_OBJS) $(ENGINE_LIBS)

fuzz-seeds: build/fuzz/gen_corpus
	@mkdir -p tests/fuzz/corpus
	build/fuzz/gen_corpus tests/fuzz/corpus

# tests/fuzz/run.sh checks for clang and its fuzzer runtime first, then builds and runs
FUZZ_RUN = FUZZ_CC='$(FUZZ_CC)' FUZZ_MAX_LEN='$(FUZZ_MAX_LEN)' \
	$(foreach t,$(FUZZ_TARGETS),$(if $(FUZZ_MAX_LEN_$(t)),FUZZ_MAX_LEN_$(t)=$(FUZZ_MAX_LEN_$(t)))) \
	tests/fuzz/run.sh

fuzz:
	$(FUZZ_RUN) run $(FUZZ_SECONDS) $(FUZZ_TARGETS)

fuzz-smoke:
	$(FUZZ_RUN) smoke $(FUZZ_SMOKE_SECONDS) $(FUZZ_TARGETS)

clean: clean-fuzz
clean-fuzz:
	rm -rf build/fuzz tests/fuzz/out

.PHONY: fuzz fuzz-build fuzz-seeds fuzz-smoke clean-fuzz

-include $(FUZZ_ENGINE_OBJS:.o=.d) $(FUZZ_SYNTH_OBJS:.o=.d) $(FUZZ_BINS:=.d)
