/*
 * test_gemm_blocks_avxvnni.c — cpu/gemm_blocks_avxvnni.c compiled a second time through SIMDe
 * (Debian's libsimde-dev; no AVX-VNNI compiler flag), as cai_bkernel_avxvnni_simde, which
 * test_gemm_blocks.c runs against the portable kernel on every machine.  A translation unit of
 * its own: the 256-bit file's helpers have the 512-bit file's names.
 */
#if !__has_include(<simde/x86/avx512.h>)
#error "the unit tests need SIMDe's headers (Debian: apt-get install libsimde-dev)"
#endif
#define CAI_BLOCKS_SIMDE 1
#include "cpu/gemm_blocks_avxvnni.c"
