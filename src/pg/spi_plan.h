/*
 * spi_plan.h — pg_cai's one way of running SQL through SPI: statements prepared once per process
 * and kept.
 */
#ifndef PG_CAI_SPI_PLAN_H
#define PG_CAI_SPI_PLAN_H

#include "executor/spi.h"

extern SPIPlanPtr CaiKeepPlan(SPIPlanPtr *cache, const char *query, int nargs, Oid *argtypes);

#endif							/* PG_CAI_SPI_PLAN_H */
