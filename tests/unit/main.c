/*
 * main.c — the unit-test runner.  Usage: run_unit [substring]
 */
#include "test.h"

int
main(int argc, char **argv)
{
	test_counts counts;

	test_run_selected(argc > 1 ? argv[1] : NULL, NULL, &counts);
	printf("%d passed, %d failed, %d skipped\n", counts.passed, counts.failed, counts.skipped);
	return counts.failed ? 1 : 0;
}
