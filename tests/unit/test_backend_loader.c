/*
 * test_backend_loader.c — where the engine looks for the CUDA backend library
 * (src/model/backend_loader.c): only absolute paths, the installed engine only in the install's
 * library directory, a build tree's program in its build/ directory, a relative setting refused.
 * No CUDA is needed: nothing here loads a real library.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend_loader.h"
#include "test.h"

#define BINDIR "/usr/lib/postgresql/15/bin"
#define LIBDIR "/usr/lib/postgresql/15/lib"

/* The path chosen for s, or NULL (with why) when there is none. */
static const char *
chosen(const cai_cuda_search *s, char *why)
{
	static char path[CAI_CUDA_PATH_MAX];

	return cai_cuda_library_path(s, path, why, 512) ? path : NULL;
}

#define CHECK_PATH(s, expected) do { \
	char _why[512]; \
	const char *_p = chosen(s, _why); \
	CHECK_MSG(_p && strcmp(_p, expected) == 0, "got %s (%s)", _p ? _p : "none", _why); \
	} while (0)

TEST(cuda_library_explicit_paths_must_be_absolute)
{
	char		why[512];
	cai_cuda_search s = {.exe_path = BINDIR "/cai", .install_bindir = BINDIR,
	.install_libdir = LIBDIR};
	const char *relative[] = {"libcai_cuda.so", "./libcai_cuda.so", "build/libcai_cuda.so",
	"../lib/libcai_cuda.so"};

	/* a setting wins over everything */
	s.explicit_path = "/opt/cuda-backend/libcai_cuda.so";
	s.env_path = "/elsewhere/libcai_cuda.so";
	CHECK_PATH(&s, "/opt/cuda-backend/libcai_cuda.so");

	for (int i = 0; i < (int) (sizeof(relative) / sizeof(relative[0])); i++)
	{
		s.explicit_path = relative[i];
		CHECK(chosen(&s, why) == NULL);
		CHECK_MSG(strstr(why, "must be an absolute path") && strstr(why, relative[i]), "%s", why);

		/* the environment's is held to the same rule */
		s.explicit_path = NULL;
		s.env_path = relative[i];
		CHECK(chosen(&s, why) == NULL);
		CHECK_MSG(strstr(why, "CAI_CUDA_LIBRARY must be an absolute path"), "%s", why);
		s.env_path = "/elsewhere/libcai_cuda.so";
	}

	/* without a setting, the environment's; empty means unset */
	s.explicit_path = "";
	CHECK_PATH(&s, "/elsewhere/libcai_cuda.so");
	s.env_path = "";
	CHECK_PATH(&s, LIBDIR "/libcai_cuda.so");
}

TEST(cuda_library_installed_engine_looks_in_the_install_only)
{
	char		why[512];
	cai_cuda_search s = {.exe_path = BINDIR "/cai", .install_bindir = BINDIR,
	.install_libdir = LIBDIR};

	CHECK_PATH(&s, LIBDIR "/libcai_cuda.so");

	/* trailing slashes in the configured directories change nothing */
	s.install_bindir = BINDIR "/";
	s.install_libdir = LIBDIR "//";
	CHECK_PATH(&s, LIBDIR "/libcai_cuda.so");

	/* an installed engine without a known library directory loads nothing */
	s.install_libdir = NULL;
	CHECK(chosen(&s, why) == NULL);
	CHECK_MSG(strstr(why, "CAI_CUDA_LIBRARY") != NULL, "%s", why);
	s.install_libdir = "lib";
	CHECK(chosen(&s, why) == NULL);

	/* a directory that only starts like the bindir, or lies below it, is another directory */
	s.install_bindir = BINDIR;
	s.install_libdir = LIBDIR;
	s.exe_path = BINDIR "x/cai";
	CHECK_PATH(&s, BINDIR "x/build/libcai_cuda.so");
	s.exe_path = BINDIR "/sub/cai";
	CHECK_PATH(&s, BINDIR "/sub/build/libcai_cuda.so");
}

TEST(cuda_library_build_tree_program_uses_its_build_dir)
{
	char		why[512];
	cai_cuda_search s = {.exe_path = "/home/dev/pg_cai/cai", .install_bindir = BINDIR,
	.install_libdir = LIBDIR};

	/* its own build, never the installed library (which may be another version's) */
	CHECK_PATH(&s, "/home/dev/pg_cai/build/libcai_cuda.so");
	s.install_bindir = s.install_libdir = NULL;
	CHECK_PATH(&s, "/home/dev/pg_cai/build/libcai_cuda.so");
	s.exe_path = "/cai";
	CHECK_PATH(&s, "/build/libcai_cuda.so");

	/* a program's name as argv[0] gives it (relative) is never a place to look in */
	s.install_bindir = BINDIR;
	s.install_libdir = LIBDIR;
	s.exe_path = "pg_cai engine";
	CHECK(chosen(&s, why) == NULL);
	CHECK_MSG(strstr(why, "CAI_CUDA_LIBRARY") != NULL, "%s", why);
	s.exe_path = "./cai";
	CHECK(chosen(&s, why) == NULL);
	s.exe_path = NULL;
	CHECK(chosen(&s, why) == NULL);
}

/* Writes a few bytes that are no shared object to path. */
static bool
write_junk(const char *path)
{
	int			fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	bool		ok = fd >= 0 && write(fd, "not a library\n", 14) == 14;

	if (fd >= 0)
		close(fd);
	return ok;
}

TEST(cuda_loader_never_opens_the_working_directory)
{
	char		dir[] = "/tmp/cai_loader_test.XXXXXX";
	char		file[256];
	char		build_dir[256];
	char		build_file[256];
	char		why[2048];
	cai_cuda_loader loader;
	const char *saved_env = getenv("CAI_CUDA_LIBRARY");
	char	   *saved = saved_env ? strdup(saved_env) : NULL;
	int			cwd = open(".", O_RDONLY | O_DIRECTORY);

	CHECK(cwd >= 0);
	CHECK(mkdtemp(dir) != NULL);
	snprintf(file, sizeof(file), "%s/libcai_cuda.so", dir);
	snprintf(build_dir, sizeof(build_dir), "%s/build", dir);
	snprintf(build_file, sizeof(build_file), "%s/build/libcai_cuda.so", dir);
	CHECK(write_junk(file));
	CHECK(mkdir(build_dir, 0755) == 0);
	CHECK(write_junk(build_file));
	CHECK(chdir(dir) == 0);

	/* a relative setting or environment variable is refused before anything is opened */
	CHECK(!cai_cuda_loader_open("libcai_cuda.so", &loader, why, sizeof(why)));
	CHECK_MSG(strstr(why, "must be an absolute path") != NULL, "%s", why);
	CHECK(loader.handle == NULL && loader.path[0] == '\0');
	setenv("CAI_CUDA_LIBRARY", "libcai_cuda.so", 1);
	CHECK(!cai_cuda_loader_open(NULL, &loader, why, sizeof(why)));
	CHECK_MSG(strstr(why, "CAI_CUDA_LIBRARY must be an absolute path") != NULL, "%s", why);

	/* an absolute one that does not exist is named, and not found */
	setenv("CAI_CUDA_LIBRARY", "/nonexistent/libcai_cuda.so", 1);
	CHECK(!cai_cuda_loader_open(NULL, &loader, why, sizeof(why)));
	CHECK_MSG(strcmp(why, "/nonexistent/libcai_cuda.so not found") == 0, "%s", why);
	CHECK(strcmp(loader.path, "/nonexistent/libcai_cuda.so") == 0);

	/*
	 * Left to itself, whatever it finds (or not), it tries no file in the working directory:
	 * the junk there would fail to load with a reason naming it.
	 */
	unsetenv("CAI_CUDA_LIBRARY");
	{
		bool		loaded = cai_cuda_loader_open(NULL, &loader, why, sizeof(why));
		char		tried[sizeof(loader.path)];

		memcpy(tried, loader.path, sizeof(tried));
		if (loaded)
			cai_cuda_loader_close(&loader);
		CHECK_MSG(strstr(why, dir) == NULL && strstr(why, "too short") == NULL &&
				  strstr(why, "invalid ELF") == NULL, "%s", why);
		CHECK_MSG(tried[0] == '/' && strstr(tried, dir) == NULL, "%s", tried);
	}

	if (saved)
		setenv("CAI_CUDA_LIBRARY", saved, 1);
	free(saved);
	CHECK(fchdir(cwd) == 0);
	close(cwd);
	unlink(build_file);
	rmdir(build_dir);
	unlink(file);
	rmdir(dir);
}
