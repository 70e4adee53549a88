/*
 * spi_plan.c — statements prepared once per process and kept (SPI_keepplan), the way every SPI
 * query of pg_cai runs: a backend's triggers and conversation functions and a job runner's loop
 * each run the same few statements again and again, so parsing and planning them once pays.
 *
 * The plan cache keeps a kept plan valid: it replans when a table it reads changes (an extension
 * upgrade, say) and, for tables with row-level security, when the calling role changes, so each
 * caller's policies apply.
 */
#include "postgres.h"

#include "executor/spi.h"

#include "spi_plan.h"

/*
 * CaiKeepPlan
 *		Prepares a statement once per process (kept with SPI_keepplan) and caches it in *cache.
 *		Requires an SPI connection.
 */
SPIPlanPtr
CaiKeepPlan(SPIPlanPtr *cache, const char *query, int nargs, Oid *argtypes)
{
	if (*cache == NULL)
	{
		SPIPlanPtr	plan = SPI_prepare(query, nargs, argtypes);

		if (plan == NULL)
			elog(ERROR, "SPI_prepare failed for \"%s\": %s", query,
				 SPI_result_code_string(SPI_result));
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "SPI_keepplan failed");
		*cache = plan;
	}
	return *cache;
}
