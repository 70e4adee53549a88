"""The engine loads the CUDA backend library by absolute path only.  A libcai_cuda.so dropped in
the data directory (the engine's working directory), or in its build/, is never loaded with
pg_cai.device = auto; cai_model_info() names the absolute path that was tried (the install's
library directory); a relative CAI_CUDA_LIBRARY is refused with a reason.  The library put there
is a small shared object whose constructor creates a marker file, so loading it would show; an
absolute CAI_CUDA_LIBRARY naming the same file loads it (the marker appears), which shows the
marker works and that an explicit absolute path is honoured."""
import os
import shutil
import subprocess
import tempfile

from pgtest import Checks, Cluster, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.environ.get("PG_CAI_TEST_MODEL") or os.path.join(
    ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
PKGLIBDIR = subprocess.run(["pg_config", "--pkglibdir"], capture_output=True,
                           text=True).stdout.strip()
INSTALLED = os.path.join(PKGLIBDIR, "libcai_cuda.so")

JUNK_SOURCE = r"""
#include <fcntl.h>
#include <unistd.h>

__attribute__((constructor)) static void
mark_loaded(void)
{
	int fd = open(MARKER, O_WRONLY | O_CREAT, 0666);

	if (fd >= 0)
		close(fd);
}
"""

c = Checks()
work = tempfile.mkdtemp(prefix="pg_cai_cuda_library.")
os.chmod(work, 0o777)  # the server's OS user writes the marker here
marker = os.path.join(work, "loaded")
junk = os.path.join(work, "junk.so")
with open(os.path.join(work, "junk.c"), "w") as f:
    f.write(JUNK_SOURCE)
r = subprocess.run(["cc", "-shared", "-fPIC", "-DMARKER=\"%s\"" % marker, "-o", junk,
                    os.path.join(work, "junk.c")], capture_output=True, text=True)
c.check("a marker library is compiled", r.returncode == 0, r.stderr)

cluster = Cluster({"shared_preload_libraries": "'pg_cai'", "pg_cai.model": "'%s'" % MODEL,
                   "pg_cai.device": "'auto'", "pg_cai.threads": "1"})
planted = []
for sub in ("", "build"):
    d = os.path.join(cluster.data, sub)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "libcai_cuda.so")
    shutil.copy(junk, path)
    os.chmod(path, 0o755)
    planted.append(path)
    if os.geteuid() == 0:
        shutil.chown(d, "postgres", "postgres")
        shutil.chown(path, "postgres", "postgres")


def start_with(env_value):
    """Starts the cluster with CAI_CUDA_LIBRARY set to env_value (None: unset); returns
    (device, device_reason) once the engine is ready, or None."""
    if env_value is None:
        os.environ.pop("CAI_CUDA_LIBRARY", None)
    else:
        os.environ["CAI_CUDA_LIBRARY"] = env_value
    try:
        if not cluster.start():
            return None
    finally:
        os.environ.pop("CAI_CUDA_LIBRARY", None)
    cluster.psql("CREATE EXTENSION IF NOT EXISTS pg_cai")
    if not wait_for(lambda: cluster.psql("SELECT status FROM pg_stat_cai").out == "ready", 180, 0.2):
        return None
    r = cluster.psql("SELECT cai_model_info()->>'device', cai_model_info()->>'device_reason'")
    print("CAI_CUDA_LIBRARY=%s: %s" % (env_value, r.out), flush=True)
    return tuple(r.out.split("|", 1)) if r.rc == 0 and "|" in r.out else None


try:
    # ---- 1. the default: the install's library directory, nothing from the data directory ----
    info = start_with(None)
    c.check("the engine serves with a libcai_cuda.so in the data directory", info is not None,
            cluster.log)
    device, reason = info or ("", "")
    c.check("the library in the data directory (or its build/) is not loaded",
            not os.path.exists(marker), "marker %s exists; device_reason %r" % (marker, reason))
    c.check("cai_model_info names the absolute path tried, in the install's library directory",
            INSTALLED in reason, repr(reason))
    c.check("no path in the data directory is tried", cluster.data not in reason
            and "./libcai_cuda.so" not in reason and " libcai_cuda.so" not in reason, repr(reason))
    if not os.path.exists(INSTALLED):
        c.check("without an installed library the reason says not found and the CPU serves",
                device.startswith("cpu") and "not found" in reason, repr(info))
    cluster.stop()

    # ---- 2. a relative CAI_CUDA_LIBRARY is refused -------------------------------------------
    info = start_with("libcai_cuda.so")
    device, reason = info or ("", "")
    c.check("with a relative CAI_CUDA_LIBRARY the CPU serves and the reason says why",
            device.startswith("cpu") and "CAI_CUDA_LIBRARY must be an absolute path" in reason,
            repr(info))
    c.check("the relative name loads nothing from the data directory", not os.path.exists(marker),
            repr(reason))
    cluster.stop()

    # ---- 3. an absolute CAI_CUDA_LIBRARY is what it says: the marker library loads ------------
    info = start_with(planted[0])
    device, reason = info or ("", "")
    c.check("an absolute CAI_CUDA_LIBRARY is loaded (the marker appears)",
            os.path.exists(marker), repr(info))
    c.check("a library without the backend's entry points leaves the CPU serving, saying so",
            device.startswith("cpu") and planted[0] in reason and "entry point is missing" in reason,
            repr(info))
finally:
    os.environ.pop("CAI_CUDA_LIBRARY", None)
    cluster.stop()
    if c.failed == 0:
        cluster.remove()
        shutil.rmtree(work, ignore_errors=True)
    else:
        print("kept %s and %s" % (cluster.dir, work))
c.done()
