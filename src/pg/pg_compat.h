/*
 * pg_compat.h — the few PostgreSQL APIs that differ between the versions pg_cai supports (15 to
 * 18), behind one name each, so that no other file carries a PG_VERSION_NUM guard.
 *
 * Include after postgres.h.  A new major version's changes belong here: an API that changed its
 * signature must get a wrapper even when the compiler only warns, since a pointer of the wrong
 * type passed to the server crashes the worker (the Makefile makes those warnings errors).
 */
#ifndef PG_CAI_PG_COMPAT_H
#define PG_CAI_PG_COMPAT_H

#include "common/jsonapi.h"
#include "mb/pg_wchar.h"
#include "storage/latch.h"
#include "utils/memutils.h"
#include "utils/wait_event.h"

/*
 * A function that never returns: 18 replaced the trailing pg_attribute_noreturn() with a
 * leading pg_noreturn.
 */
#if PG_VERSION_NUM < 180000 && !defined(pg_noreturn)
#if defined(__GNUC__) || defined(__clang__)
#define pg_noreturn __attribute__((noreturn))
#else
#define pg_noreturn
#endif
#endif

/*
 * A wait event set that lives as long as the caller keeps it and is freed by FreeWaitEventSet.
 * Up to 16 the set is allocated in the given memory context; from 17 on it lives in
 * TopMemoryContext and may be tracked by a resource owner instead: none here, since the
 * background worker frees its set itself and runs without a resource owner.
 */
static inline WaitEventSet *
CaiCreateWaitEventSet(MemoryContext context, int nevents)
{
#if PG_VERSION_NUM >= 170000
	return CreateWaitEventSet(NULL, nevents);
#else
	return CreateWaitEventSet(context, nevents);
#endif
}

/*
 * The wait event a pg_cai process waits under, as pg_stat_activity shows it: from 17 on a named
 * custom event of type Extension (wait_event = name), before that the generic PG_WAIT_EXTENSION
 * (wait_event "Extension").  *id caches the event per process: WaitEventExtensionNew takes a lock
 * and gives every process the same id for the same name.
 */
static inline uint32
CaiWaitEvent(const char *name, uint32 *id)
{
#if PG_VERSION_NUM >= 170000
	if (*id == 0)
		*id = WaitEventExtensionNew(name);
	return *id;
#else
	(void) name;
	(void) id;
	return PG_WAIT_EXTENSION;
#endif
}

/*
 * A lexer over len bytes of json in the database encoding, without de-escaping: 17 gave
 * makeJsonLexContextCstringLen the context to fill as a new first argument (NULL allocates).
 */
static inline JsonLexContext *
CaiJsonLexContext(char *json, int len)
{
#if PG_VERSION_NUM >= 170000
	return makeJsonLexContextCstringLen(NULL, json, len, GetDatabaseEncoding(), false);
#else
	return makeJsonLexContextCstringLen(json, len, GetDatabaseEncoding(), false);
#endif
}

/*
 * Sets up a set-returning function's result as a tuplestore of its declared row type: 16
 * renamed SetSingleFuncCall to InitMaterializedSRF.
 */
#if PG_VERSION_NUM >= 160000
#define CaiInitMaterializedSRF(fcinfo) InitMaterializedSRF((fcinfo), 0)
#else
#define CaiInitMaterializedSRF(fcinfo) SetSingleFuncCall((fcinfo), 0)
#endif

#endif							/* PG_CAI_PG_COMPAT_H */
