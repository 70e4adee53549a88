/*
 * replica.c — pg_cai beside hot standbys and base backups.
 *
 * A hot standby serves the functions that only read (cai_complete, cai_chat_completion,
 * cai_embed, the tokenizer) with its own engine; the functions that store turns cannot run
 * there.  They check first, so that the caller learns which function failed and where to call
 * it, instead of the error of an internal statement.
 *
 * The weights cache is a cache: any server rebuilds it from the model file.  Its default
 * directory's name begins with "pgsql_tmp", which pg_basebackup (and pg_rewind) leave out in
 * any directory, so base backups and new standbys do not carry a copy of the model's weights.
 * Installations from before kept it in pg_cai/weight_cache: the worker moves it at start.
 */
#include "postgres.h"

#include <sys/stat.h>
#include <unistd.h>

#include "access/xact.h"
#include "access/xlog.h"
#include "miscadmin.h"

#include "guc.h"
#include "replica.h"

/* the default of pg_cai.weights_cache before it moved out of base backups */
#define CAI_WEIGHTS_CACHE_OLD_DEFAULT "pg_cai/weight_cache"

/*
 * CaiRequireWritable
 *		Raises an error when the server is a hot standby, or the transaction is read-only:
 *		function (its SQL name) stores rows.  Called before the function reads or sends
 *		anything.
 */
void
CaiRequireWritable(const char *function)
{
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot execute %s on a hot standby", function),
				 errdetail("%s stores conversations or their turns, and a server in recovery is read-only.",
						   function),
				 errhint("Call it on the primary, where turns are stored; cai_complete, cai_chat_completion and cai_embed work here.")));
	if (XactReadOnly)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot execute %s in a read-only transaction", function),
				 errdetail("%s stores conversations or their turns.", function),
				 errhint("Call it in a read-write transaction; cai_complete, cai_chat_completion and cai_embed store nothing.")));
}

/* Whether path is a directory (not a symbolic link to one). */
static bool
is_plain_directory(const char *path)
{
	struct stat st;

	return lstat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/*
 * CaiWeightsCacheMoveOldDefault
 *		When pg_cai.weights_cache has its default and the data directory still holds the cache
 *		at the old default path, renames that directory to the new one (same file system, so
 *		nothing is copied and the cache stays valid).  Where both exist the old one is left, with
 *		a log line saying it can be removed.  Called by the worker before it starts an engine.
 */
void
CaiWeightsCacheMoveOldDefault(void)
{
	char		old_path[MAXPGPATH];
	char		new_path[MAXPGPATH];

	if (cai_weights_cache == NULL || strcmp(cai_weights_cache, CAI_WEIGHTS_CACHE_DEFAULT) != 0)
		return;
	snprintf(old_path, sizeof(old_path), "%s/%s", DataDir, CAI_WEIGHTS_CACHE_OLD_DEFAULT);
	snprintf(new_path, sizeof(new_path), "%s/%s", DataDir, CAI_WEIGHTS_CACHE_DEFAULT);
	if (!is_plain_directory(old_path))
		return;
	if (is_plain_directory(new_path))
	{
		ereport(LOG,
				(errmsg("pg_cai: the old weights cache directory \"%s\" is no longer used", old_path),
				 errhint("Remove it: base backups copy it, and the cache in \"%s\" replaces it.",
						 new_path)));
		return;
	}
	if (rename(old_path, new_path) != 0)
		ereport(LOG,
				(errcode_for_file_access(),
				 errmsg("pg_cai: could not move the weights cache from \"%s\" to \"%s\": %m",
						old_path, new_path),
				 errhint("Base backups copy the old directory; remove it, the engine rebuilds the cache.")));
	else
		ereport(LOG,
				(errmsg("pg_cai: moved the weights cache from \"%s\" to \"%s\", which base backups leave out",
						old_path, new_path)));
}
