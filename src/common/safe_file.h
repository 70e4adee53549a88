/*
 * safe_file.h — opening and creating the files the engine keeps on disk (the weights cache, the
 * KV disk tier) under PostgreSQL's own rule for its data directory: the directory belongs to the
 * server's user and no one else can write it, files are created exclusively and never through a
 * symbolic link, and only regular files are read (a FIFO or a device must not block or feed a
 * load).  Every function returns a status with a one-line message; none exits.
 */
#ifndef CAI_SAFE_FILE_H
#define CAI_SAFE_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "cai.h"

/*
 * Checks that dir is a directory (not a symbolic link to one) owned by this process's effective
 * user and not writable by group or others.  CAI_ERR_IO with the reason otherwise.
 */
cai_status	cai_safe_dir_check(const char *dir, cai_error *err);

/*
 * Creates the directory dir (and missing parents) with mode 0700, then checks it as
 * cai_safe_dir_check does.  Existing parents are left as they are; only dir itself is checked.
 */
cai_status	cai_safe_dir_make(const char *dir, cai_error *err);

/*
 * Creates path for writing, mode 0600, with O_CREAT | O_EXCL | O_NOFOLLOW: an existing file or a
 * link at path fails (CAI_ERR_IO, errno kept in *errno_out when not NULL) rather than being
 * followed or truncated.  Returns the descriptor (close-on-exec) or -1.
 */
int			cai_safe_create(const char *path, cai_error *err, int *errno_out);

/*
 * Opens path read-only without following a final symbolic link and without blocking on a FIFO,
 * and accepts only a regular file; the descriptor is returned in blocking mode, close-on-exec,
 * with its size in *size_out (when not NULL).  -1 with the reason otherwise (errno kept in
 * *errno_out: ENOENT tells a missing file from a refused one).
 */
int			cai_safe_open_regular(const char *path, off_t *size_out, cai_error *err,
								  int *errno_out);

/*
 * As cai_safe_open_regular, but a final symbolic link is followed (a model file the
 * administrator named may be a link); still only a regular file is accepted and a FIFO never
 * blocks the open.
 */
int			cai_safe_open_regular_follow(const char *path, off_t *size_out, cai_error *err,
										 int *errno_out);

#endif							/* CAI_SAFE_FILE_H */
