/*
 * synth_presets.h — the tiny synthetic models the architecture goldens are made from: one per
 * architecture the suite checks against llama.cpp.  The unit test (test_arch_golden.c) and the
 * write_synth_model tool (which tests/bench/make_arch_goldens.py runs) take the same preset, so
 * the file llama.cpp scored and the file the engine loads are byte for byte the same.
 */
#ifndef CAI_SYNTH_PRESETS_H
#define CAI_SYNTH_PRESETS_H

#include <stdbool.h>

#include "synth_model.h"

/*
 * The preset's configuration by name ("llama", "llama3", "qwen2", "qwen3", "gemma3", and the
 * embedding shapes "qwen3-embed" and "gemma3-embed", which write pooling metadata and are not
 * in the golden list); false if unknown.
 */
bool		synth_preset_config(const char *name, synth_model_config *cfg);

/* The preset names, in order; NULL past the end. */
const char *synth_preset_name(int i);

/*
 * Real models' shapes, for benchmarks (tests/bench/make_real_shapes.sh): "llama32-1b",
 * "llama32-3b", "llama3-8b", "qwen3-4b".  Layer count, widths, heads, RoPE and tied head as
 * the real model, F16 weights, the real vocabulary size (cfg->vocab_from, left NULL, picks
 * the tokenizer that the size pads).  Billions of weights: never for a unit test.
 */
bool		synth_shape_config(const char *name, synth_model_config *cfg);
const char *synth_shape_name(int i);

/*
 * The fixed token sequence the goldens score, from position 0 (ids below the synthetic
 * vocabulary, no control tokens).
 */
#define SYNTH_GOLDEN_TOKENS 48
void		synth_golden_tokens(int *tokens);

#endif							/* CAI_SYNTH_PRESETS_H */
