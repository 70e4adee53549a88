/*
 * test.h — a minimal unit-test framework: TEST(name) { ... CHECK(...) ... } registers itself;
 * run_unit runs every test (or those whose names contain argv[1]) and ends with
 * "N passed, N failed".
 */
#ifndef CAI_TEST_H
#define CAI_TEST_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef void (*test_fn) (void);

void		test_register(const char *name, const char *file, test_fn fn);

/* Failures of the running test (a test fails if this grows). */
extern int	test_current_failures;

#define TEST(name) \
	static void test_##name(void); \
	__attribute__((constructor)) static void register_##name(void) \
	{ test_register(#name, __FILE__, test_##name); } \
	static void test_##name(void)

#define CHECK(cond) do { \
	if (!(cond)) { \
		test_current_failures++; \
		fprintf(stderr, "    %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
	} } while (0)

#define CHECK_MSG(cond, ...) do { \
	if (!(cond)) { \
		test_current_failures++; \
		fprintf(stderr, "    %s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
		fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); \
	} } while (0)

#define CHECK_EQ_INT(a, b) do { \
	long long _a = (long long) (a), _b = (long long) (b); \
	if (_a != _b) { \
		test_current_failures++; \
		fprintf(stderr, "    %s:%d: %s == %s failed: %lld != %lld\n", \
				__FILE__, __LINE__, #a, #b, _a, _b); \
	} } while (0)

#define CHECK_NEAR(a, b, tol) do { \
	double _a = (double) (a), _b = (double) (b); \
	if (!(fabs(_a - _b) <= (tol))) { \
		test_current_failures++; \
		fprintf(stderr, "    %s:%d: |%s - %s| <= %g failed: %g vs %g\n", \
				__FILE__, __LINE__, #a, #b, (double) (tol), _a, _b); \
	} } while (0)

/* Skips the rest of the test (counted as skipped) with a reason. */
void		test_skip(const char *reason);
extern int	test_current_skipped;
#define SKIP(reason) do { test_skip(reason); return; } while (0)

/* Running (test_runner.c): the tests whose name or file contains filter (NULL = all). */
typedef struct test_counts
{
	int			passed;
	int			failed;
	int			skipped;
} test_counts;

int			test_count_selected(const char *filter);
void		test_run_selected(const char *filter, void (*after_each) (void), test_counts *counts);

/* splitmix64: the tests' seeded generator, well mixed from any seed. */
static inline uint64_t
test_next_u64(uint64_t *state)
{
	uint64_t	z = (*state += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* Path of the default real model if present (models/...gguf or $CAI_TEST_MODEL), else NULL. */
const char *test_real_model_path(void);

#endif							/* CAI_TEST_H */
