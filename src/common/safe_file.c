/*
 * safe_file.c — see safe_file.h.
 */
#include "safe_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

cai_status
cai_safe_dir_check(const char *dir, cai_error *err)
{
	struct stat st;

	if (lstat(dir, &st) != 0)
		return cai_fail(err, CAI_ERR_IO, "could not stat directory \"%s\": %s", dir,
						strerror(errno));
	if (S_ISLNK(st.st_mode))
		return cai_fail(err, CAI_ERR_IO, "directory \"%s\" is a symbolic link", dir);
	if (!S_ISDIR(st.st_mode))
		return cai_fail(err, CAI_ERR_IO, "\"%s\" is not a directory", dir);
	if (st.st_uid != geteuid())
		return cai_fail(err, CAI_ERR_IO,
						"directory \"%s\" is owned by user id %u, not by the server's user (%u)",
						dir, (unsigned) st.st_uid, (unsigned) geteuid());
	if (st.st_mode & (S_IWGRP | S_IWOTH))
		return cai_fail(err, CAI_ERR_IO,
						"directory \"%s\" is writable by group or others (mode %04o); it must be "
						"u=rwx (0700) or u=rwx,go=rx (0755)", dir, (unsigned) (st.st_mode & 07777));
	return CAI_OK;
}

cai_status
cai_safe_dir_make(const char *dir, cai_error *err)
{
	char		path[4096];
	size_t		len = strlen(dir);

	if (len == 0 || len >= sizeof(path))
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "directory name \"%s\" is invalid", dir);
	memcpy(path, dir, len + 1);
	for (size_t i = 1; i <= len; i++)
	{
		if (path[i] != '/' && path[i] != '\0')
			continue;
		path[i] = '\0';
		if (mkdir(path, 0700) != 0 && errno != EEXIST)
			return cai_fail(err, CAI_ERR_IO, "could not create directory \"%s\": %s", path,
							strerror(errno));
		path[i] = dir[i];
	}
	return cai_safe_dir_check(dir, err);
}

int
cai_safe_create(const char *path, cai_error *err, int *errno_out)
{
	int			fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);

	if (fd < 0)
	{
		if (errno_out)
			*errno_out = errno;
		cai_fail(err, CAI_ERR_IO, "could not create file \"%s\": %s", path, strerror(errno));
	}
	return fd;
}

static int
open_regular(const char *path, int extra_flags, off_t *size_out, cai_error *err, int *errno_out)
{
	struct stat st;
	int			flags;
	int			fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | extra_flags);

	if (fd < 0)
	{
		if (errno_out)
			*errno_out = errno;
		cai_fail(err, CAI_ERR_IO, errno == ELOOP ? "could not open file \"%s\": it is a symbolic link"
				 : "could not open file \"%s\": %s", path, strerror(errno));
		return -1;
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
	{
		int			e = errno;

		if (errno_out)
			*errno_out = S_ISREG(st.st_mode) ? e : EINVAL;
		close(fd);
		cai_fail(err, CAI_ERR_IO, "\"%s\" is not a regular file", path);
		return -1;
	}
	/* a regular file never blocks; clear O_NONBLOCK so reads behave as usual */
	if ((flags = fcntl(fd, F_GETFL)) >= 0)
		fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
	if (size_out)
		*size_out = st.st_size;
	return fd;
}

int
cai_safe_open_regular(const char *path, off_t *size_out, cai_error *err, int *errno_out)
{
	return open_regular(path, O_NOFOLLOW, size_out, err, errno_out);
}

int
cai_safe_open_regular_follow(const char *path, off_t *size_out, cai_error *err, int *errno_out)
{
	return open_regular(path, 0, size_out, err, errno_out);
}
