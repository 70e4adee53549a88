/*
 * test_safe_file.c — the rules for the engine's own files: exclusive creation never through a
 * link, only regular files read (a FIFO does not block), directories the server alone can write.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safe_file.h"
#include "test.h"

/* a fresh private directory under /tmp, its path in buf */
static void
make_temp_dir(char *buf, size_t len)
{
	snprintf(buf, len, "/tmp/cai_safe_file.XXXXXX");
	if (!mkdtemp(buf))
		buf[0] = '\0';
}

TEST(safe_file_create_is_exclusive_and_never_follows_a_link)
{
	char		dir[64], path[128], victim[128], link_path[128];
	cai_error	err;
	int			e = 0, fd;
	struct stat st;

	make_temp_dir(dir, sizeof(dir));
	CHECK(dir[0] != '\0');
	snprintf(path, sizeof(path), "%s/new", dir);
	snprintf(victim, sizeof(victim), "%s/victim", dir);
	snprintf(link_path, sizeof(link_path), "%s/planted", dir);

	fd = cai_safe_create(path, &err, &e);
	CHECK(fd >= 0);
	CHECK(fstat(fd, &st) == 0 && (st.st_mode & 0777) == 0600);
	close(fd);
	/* a second create of the same name fails instead of truncating */
	CHECK(cai_safe_create(path, &err, &e) < 0 && e == EEXIST);

	/* a link planted at the name: the create fails and the link's target is untouched */
	fd = open(victim, O_WRONLY | O_CREAT, 0600);
	CHECK(fd >= 0 && write(fd, "keep", 4) == 4);
	close(fd);
	CHECK(symlink(victim, link_path) == 0);
	CHECK(cai_safe_create(link_path, &err, &e) < 0 && e == EEXIST);
	CHECK(stat(victim, &st) == 0 && st.st_size == 4);

	unlink(link_path);
	unlink(victim);
	unlink(path);
	rmdir(dir);
}

TEST(safe_file_reads_only_regular_files)
{
	char		dir[64], file[128], fifo[128], link_path[128];
	cai_error	err;
	int			e = 0, fd;
	off_t		size = -1;

	make_temp_dir(dir, sizeof(dir));
	snprintf(file, sizeof(file), "%s/file", dir);
	snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
	snprintf(link_path, sizeof(link_path), "%s/link", dir);
	fd = open(file, O_WRONLY | O_CREAT, 0600);
	CHECK(fd >= 0 && write(fd, "abc", 3) == 3);
	close(fd);
	CHECK(mkfifo(fifo, 0600) == 0);
	CHECK(symlink(file, link_path) == 0);

	fd = cai_safe_open_regular(file, &size, &err, &e);
	CHECK(fd >= 0 && size == 3);
	CHECK(fd < 0 || (fcntl(fd, F_GETFL) & O_NONBLOCK) == 0);
	if (fd >= 0)
		close(fd);
	/* a FIFO with no writer would block a plain open(); here it is refused at once */
	CHECK(cai_safe_open_regular(fifo, NULL, &err, &e) < 0);
	CHECK(strstr(err.message, "not a regular file") != NULL);
	CHECK(cai_safe_open_regular_follow(fifo, NULL, &err, &e) < 0);
	/* a link: refused by the strict open, followed by the other */
	CHECK(cai_safe_open_regular(link_path, NULL, &err, &e) < 0 && e == ELOOP);
	fd = cai_safe_open_regular_follow(link_path, &size, &err, &e);
	CHECK(fd >= 0 && size == 3);
	if (fd >= 0)
		close(fd);
	CHECK(cai_safe_open_regular(dir, NULL, &err, &e) < 0);
	snprintf(file + strlen(file), sizeof(file) - strlen(file), ".missing");
	CHECK(cai_safe_open_regular(file, NULL, &err, &e) < 0 && e == ENOENT);

	unlink(link_path);
	unlink(fifo);
	file[strlen(file) - strlen(".missing")] = '\0';
	unlink(file);
	rmdir(dir);
}

TEST(safe_file_directories_the_server_alone_can_write)
{
	char		dir[64], sub[128], link_path[128];
	cai_error	err;

	make_temp_dir(dir, sizeof(dir));
	snprintf(sub, sizeof(sub), "%s/a/b", dir);
	snprintf(link_path, sizeof(link_path), "%s/link", dir);
	CHECK(cai_safe_dir_make(sub, &err) == CAI_OK);
	CHECK(cai_safe_dir_check(sub, &err) == CAI_OK);
	CHECK(chmod(sub, 0770) == 0);
	CHECK(cai_safe_dir_check(sub, &err) == CAI_ERR_IO && strstr(err.message, "writable by group"));
	CHECK(chmod(sub, 0703) == 0);
	CHECK(cai_safe_dir_check(sub, &err) == CAI_ERR_IO);
	CHECK(chmod(sub, 0755) == 0);
	CHECK(cai_safe_dir_check(sub, &err) == CAI_OK);
	CHECK(symlink(sub, link_path) == 0);
	CHECK(cai_safe_dir_check(link_path, &err) == CAI_ERR_IO && strstr(err.message, "symbolic link"));
	CHECK(cai_safe_dir_check("/", &err) == (geteuid() == 0 ? CAI_OK : CAI_ERR_IO));

	unlink(link_path);
	rmdir(sub);
	snprintf(sub, sizeof(sub), "%s/a", dir);
	rmdir(sub);
	rmdir(dir);
}
