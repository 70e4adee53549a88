/*
 * engine_process.c — starting, speaking to and stopping the engine process (engine_process.h).
 *
 * The child side of the fork runs only async-signal-safe calls until the exec: the worker is a
 * PostgreSQL process, and nothing of PostgreSQL's may run in the copy.  An exec that fails is
 * reported through a close-on-exec pipe, so the worker tells "could not execute" from a crash.
 */
#include "postgres.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "port.h"

#include "engine_process.h"

/* The engine's socket and the exec-failure pipe in the child, before the exec */
#define CHILD_SOCKET_FD 3
#define CHILD_ERROR_FD 4

/* How long an engine asked to stop may take to see its socket closed, then to obey SIGTERM */
#define CLOSE_WAIT_MS 1000
#define STOP_WAIT_MS 5000

/* Input is read in pieces of this size */
#define READ_CHUNK (64 * 1024)

extern char **environ;

void
CaiEngineProcessInit(CaiEngineProcess *engine)
{
	memset(engine, 0, sizeof(*engine));
	engine->sock = -1;
	cai_wbuf_init(&engine->out, NULL);
}

/*
 * The child, between fork and exec: only async-signal-safe calls.  Never returns.
 */
static void
exec_child(int sock, int error_pipe, pid_t parent, const char *path, char *const *args,
		   int max_fd)
{
	struct sigaction dfl;
	sigset_t	none;
	int			devnull;
	int			e;

	/* its own process group: a terminal's ^C for the postmaster is not for the engine */
	(void) setpgid(0, 0);

	/* die with the worker; the worker may already be gone */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
		_exit(126);

	/* no handler of PostgreSQL's survives; ignored signals would stay ignored across exec */
	memset(&dfl, 0, sizeof(dfl));
	dfl.sa_handler = SIG_DFL;
	for (int sig = 1; sig < NSIG; sig++)
		if (sig != SIGKILL && sig != SIGSTOP)
			(void) sigaction(sig, &dfl, NULL);
	sigemptyset(&none);
	(void) sigprocmask(SIG_SETMASK, &none, NULL);

	/* fd 3 = the socket (no close-on-exec), fd 4 = the error pipe (close-on-exec), no others */
	sock = fcntl(sock, F_DUPFD_CLOEXEC, 10);
	error_pipe = fcntl(error_pipe, F_DUPFD_CLOEXEC, 10);
	if (sock < 0 || error_pipe < 0 ||
		dup2(sock, CHILD_SOCKET_FD) < 0 ||
		dup3(error_pipe, CHILD_ERROR_FD, O_CLOEXEC) < 0)
		_exit(126);
	devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (devnull < 0 || dup2(devnull, STDIN_FILENO) < 0)
		_exit(126);
	/* stray output goes where the server log goes */
	(void) dup2(STDERR_FILENO, STDOUT_FILENO);
#ifdef SYS_close_range
	if (syscall(SYS_close_range, CHILD_ERROR_FD + 1, ~0U, 0) != 0)
#endif
		for (int fd = CHILD_ERROR_FD + 1; fd < max_fd; fd++)
			(void) close(fd);

	execve(path, args, environ);
	e = errno;
	if (write(CHILD_ERROR_FD, &e, sizeof(e)) < 0)
		_exit(126);
	_exit(127);
}

bool
CaiEngineProcessStart(CaiEngineProcess *engine, const char *path, char *const *args,
					  char *reason, size_t reason_size)
{
	int			sv[2];
	int			error_pipe[2];
	pid_t		parent = getpid();
	pid_t		pid;
	int			max_fd = (int) sysconf(_SC_OPEN_MAX);
	int			exec_errno = 0;
	ssize_t		n;

	if (max_fd <= 0 || max_fd > 65536)
		max_fd = 65536;
	if (access(path, X_OK) != 0)
	{
		snprintf(reason, reason_size, "the engine binary \"%s\" cannot be executed: %m", path);
		return false;
	}
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
	{
		snprintf(reason, reason_size, "could not create the engine's socket: %m");
		return false;
	}
	if (pipe2(error_pipe, O_CLOEXEC) != 0)
	{
		snprintf(reason, reason_size, "could not create a pipe: %m");
		close(sv[0]);
		close(sv[1]);
		return false;
	}

	fflush(NULL);
	pid = fork();
	if (pid == 0)
	{
		close(sv[0]);
		close(error_pipe[0]);
		exec_child(sv[1], error_pipe[1], parent, path, args, max_fd);
	}
	close(sv[1]);
	close(error_pipe[1]);
	if (pid < 0)
	{
		snprintf(reason, reason_size, "could not fork the engine process: %m");
		close(sv[0]);
		close(error_pipe[0]);
		return false;
	}

	/* the pipe reaches end of file when the exec succeeds, or brings its errno */
	do
		n = read(error_pipe[0], &exec_errno, sizeof(exec_errno));
	while (n < 0 && errno == EINTR);
	close(error_pipe[0]);
	if (n > 0)
	{
		int			status;

		(void) waitpid(pid, &status, 0);
		close(sv[0]);
		errno = exec_errno;
		snprintf(reason, reason_size, "could not execute the engine binary \"%s\": %m", path);
		return false;
	}

	(void) fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
	engine->pid = pid;
	engine->sock = sv[0];
	engine->closed = false;
	engine->broken = false;
	engine->in_len = engine->in_pos = 0;
	cai_wbuf_reset(&engine->out);
	engine->out_sent = 0;
	return true;
}

void
CaiEngineProcessRead(CaiEngineProcess *engine)
{
	if (engine->sock < 0 || engine->closed)
		return;
	/* drop the frames already taken before reading more */
	if (engine->in_pos > 0)
	{
		memmove(engine->in, engine->in + engine->in_pos, engine->in_len - engine->in_pos);
		engine->in_len -= engine->in_pos;
		engine->in_pos = 0;
	}
	for (;;)
	{
		ssize_t		n;

		if (engine->in_cap - engine->in_len < READ_CHUNK)
		{
			size_t		cap = engine->in_cap ? engine->in_cap * 2 : 2 * READ_CHUNK;
			char	   *in;

			/* a whole frame fits; the rest can wait for the next read */
			if (cap > 2 * (size_t) CAI_FRAME_MAX_BODY + READ_CHUNK)
				return;
			in = realloc(engine->in, cap);
			if (!in)
				return;
			engine->in = in;
			engine->in_cap = cap;
		}
		n = read(engine->sock, engine->in + engine->in_len, engine->in_cap - engine->in_len);
		if (n > 0)
			engine->in_len += (size_t) n;
		else if (n < 0 && errno == EINTR)
			continue;
		else
		{
			if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
				engine->closed = true;
			return;
		}
	}
}

bool
CaiEngineProcessNextFrame(CaiEngineProcess *engine, cai_frame_header *header, const char **body)
{
	int			r;

	if (engine->broken)
		return false;
	r = cai_frame_parse(engine->in + engine->in_pos, engine->in_len - engine->in_pos, header);
	if (r < 0)
		engine->broken = true;
	if (r <= 0)
		return false;
	*body = engine->in + engine->in_pos + CAI_FRAME_HEADER_SIZE;
	engine->in_pos += CAI_FRAME_HEADER_SIZE + header->body_len;
	return true;
}

bool
CaiEngineProcessWrite(CaiEngineProcess *engine)
{
	if (engine->sock < 0 || engine->closed)
	{
		cai_wbuf_reset(&engine->out);
		engine->out_sent = 0;
		return true;
	}
	while (engine->out_sent < engine->out.len)
	{
		ssize_t		n = send(engine->sock, engine->out.data + engine->out_sent,
							 engine->out.len - engine->out_sent, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (n > 0)
			engine->out_sent += (size_t) n;
		else if (n < 0 && errno == EINTR)
			continue;
		else
		{
			if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
				engine->closed = true;
			return false;
		}
	}
	cai_wbuf_reset(&engine->out);
	engine->out_sent = 0;
	return true;
}

/* Waits up to ms for the process to exit; true with its status when it did. */
static bool
wait_exit(pid_t pid, int ms, int *status)
{
	for (int waited = 0;; waited += 10)
	{
		pid_t		r = waitpid(pid, status, WNOHANG);

		if (r == pid || (r < 0 && errno == ECHILD))
			return true;
		if (waited >= ms)
			return false;
		pg_usleep(10 * 1000L);
	}
}

int
CaiEngineProcessStop(CaiEngineProcess *engine, bool terminate, char *exit_text,
					 size_t exit_text_size)
{
	int			status = 0;

	if (engine->sock >= 0)
		close(engine->sock);
	engine->sock = -1;
	engine->closed = true;
	if (engine->pid > 0)
	{
		/*
		 * With its socket closed, a healthy engine exits by itself after its current step; one
		 * that is asked to go and does not is told by SIGTERM, then killed.
		 */
		bool		exited = wait_exit(engine->pid, terminate ? CLOSE_WAIT_MS : STOP_WAIT_MS,
									   &status);

		if (!exited && terminate)
		{
			(void) kill(engine->pid, SIGTERM);
			exited = wait_exit(engine->pid, STOP_WAIT_MS, &status);
		}
		if (!exited)
		{
			(void) kill(engine->pid, SIGKILL);
			(void) wait_exit(engine->pid, STOP_WAIT_MS, &status);
		}
		if (WIFSIGNALED(status))
			snprintf(exit_text, exit_text_size, "terminated by signal %d: %s",
					 WTERMSIG(status), pg_strsignal(WTERMSIG(status)));
		else
			snprintf(exit_text, exit_text_size, "exited with status %d", WEXITSTATUS(status));
	}
	engine->pid = 0;
	engine->in_len = engine->in_pos = 0;
	cai_wbuf_reset(&engine->out);
	engine->out_sent = 0;
	return status;
}
