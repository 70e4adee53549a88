"""Prepared weights survive the engine process (pg_cai.weights_cache): after kill -9 of the engine,
the next engine maps its weights from the cache file under the data directory (the log says
"weights: mapped from cache", the process maps the file) and answers exactly as before, for the
int8 path and for pg_cai.weights = file.  A corrupt cache file is refused with the reason and
rebuilt; the directory keeps one file for the model; an empty setting converts and writes
nothing; the setting names a path, so only a superuser may see or change it.  The files: a link
planted at the cache file's name is refused and replaced (its target untouched), a FIFO there
does not hang the load, a cache directory that others can write or another user owns is not
used (the log says why, the engine serves without it), and `cai run` writes its file
exclusively, never through a link at the final or the temporary name."""
import os
import shutil
import signal
import subprocess
import tempfile

from pgtest import Checks, ensure_database, log_text, psql, stat, value, wait_for

c = Checks()
ensure_database()
CACHE = os.path.join(os.environ["PG_CAI_TEST_DATA"], "pg_cai", "pgsql_tmp")
ASK = ("SELECT cai_complete('The capital of France is', "
       "'{\"max_tokens\": 8, \"temperature\": 0, \"ignore_eos\": true}')")
READY = "pg_cai engine worker ready"


def cache_files():
    """This model's cache files (other tests on the same cluster leave their models' files)."""
    model = os.path.basename(value("SHOW pg_cai.model"))
    try:
        return sorted(f for f in os.listdir(CACHE) if f.startswith(model + "-") and f.endswith(".caiw"))
    except OSError:
        return []


def wait_ready(mark):
    """Waits until the worker says an engine is ready after log offset mark, and when that engine
    converted, until it says how writing the cache file ended (it writes while it serves); the
    log since."""
    wait_for(lambda: READY in log_text()[mark:], 180, 0.2)
    if "caching to" in log_text()[mark:]:
        wait_for(lambda: "cached to" in log_text()[mark:], 180, 0.2)
    return log_text()[mark:]


def kill_engine():
    """kill -9 of the engine; returns the log the next engine wrote until it was ready."""
    mark = len(log_text())
    os.kill(int(stat("engine_pid")), signal.SIGKILL)
    return wait_ready(mark)


def reload_with(name, setting):
    """ALTER SYSTEM (None: RESET) and a reload: a new engine starts with it; the log since."""
    mark = len(log_text())
    if setting is None:
        value("ALTER SYSTEM RESET %s" % name, db="postgres")
    else:
        value("ALTER SYSTEM SET %s = '%s'" % (name, setting), db="postgres")
    value("SELECT pg_reload_conf()", db="postgres")
    return wait_ready(mark)


def engine_holds(path):
    """Whether the running engine process holds path's image in memory of its own: it does not
    map the file (whose 4 KiB pages would slow decoding), and its anonymous resident memory is at
    least the file's size."""
    try:
        pid = stat("engine_pid")
        with open("/proc/%s/maps" % pid) as f:
            if path in f.read():
                return False
        with open("/proc/%s/status" % pid) as f:
            anon_kb = [int(l.split()[1]) for l in f if l.startswith("RssAnon:")]
        return bool(anon_kb) and anon_kb[0] * 1024 >= os.path.getsize(path)
    except (OSError, ValueError):
        return False


def weights_lines(log):
    return [l for l in log.splitlines() if "weights:" in l]


def check_survives(label):
    """A first kill leaves a cache file; after a second the engine maps it and answers the same."""
    before = value(ASK)
    log = kill_engine()
    files = cache_files()
    c.check("%s: the engine keeps one cache file for the model" % label, len(files) == 1,
            "%r %r" % (files, weights_lines(log)))
    log = kill_engine()
    path = os.path.join(CACHE, files[0]) if files else "?"
    c.check("%s: after kill -9 the new engine says it mapped the weights" % label,
            "weights: mapped from cache %s" % path in log and "weights: converted" not in log,
            repr(weights_lines(log)))
    c.check("%s: the engine holds the cache file's image in its own memory" % label,
            engine_holds(path), path)
    c.check("%s: it answers exactly as before" % label, value(ASK) == before, before)
    return path


path = check_survives("int8")

# a corrupt file is refused, converted and written again, then mapped
with open(path, "r+b") as f:
    f.seek(os.path.getsize(path) // 2)
    b = f.read(1)
    f.seek(-1, 1)
    f.write(bytes([b[0] ^ 0x5A]))
before = value(ASK)
log = kill_engine()
c.check("a corrupt cache file is refused with the reason and rebuilt",
        "refused, rebuilt" in log and "checksum" in log and "cached to %s" % path in log,
        repr(weights_lines(log)))
c.check("the engine with the rebuilt weights answers as before", value(ASK) == before)
log = kill_engine()
c.check("the rebuilt file is mapped at the next start", "mapped from cache %s" % path in log,
        repr(weights_lines(log)))

# the file path's repacked blocks: another key, another file (the int8 one goes)
log = reload_with("pg_cai.weights", "file")
c.check("weights = file: the first engine converts and caches",
        "weights: converted" in log and "cached to" in log, repr(weights_lines(log)))
file_path = check_survives("file")
c.check("weights = file: its file is not the int8 path's", file_path != path and not os.path.exists(path),
        "%s %s" % (file_path, path))

# no cache: converted, nothing written
reload_with("pg_cai.weights", None)
log = reload_with("pg_cai.weights_cache", "")
files = cache_files()
log += kill_engine()
c.check("an empty pg_cai.weights_cache converts and writes nothing",
        weights_lines(log) == [] and cache_files() == files, repr(weights_lines(log)))
reload_with("pg_cai.weights_cache", None)

# files the server finds in its cache directory are never followed or blocked on (see README
# "Files"): a link at the file's name is refused and replaced, its target untouched; a FIFO there
# does not hang the load
DATA = os.environ["PG_CAI_TEST_DATA"]
victim = os.path.join(DATA, "pg_cai_test_victim")
with open(victim, "w") as f:
    f.write("the server's own file\n")
if os.geteuid() == 0:
    shutil.chown(victim, "postgres", "postgres")
path = os.path.join(CACHE, cache_files()[0]) if cache_files() else path
before = value(ASK)
if os.path.lexists(path):
    os.unlink(path)
os.symlink(victim, path)
log = kill_engine()
c.check("a link at the cache file's name is refused, saying so, and replaced by the file",
        "refused, rebuilt" in log and "symbolic link" in log and "cached to %s" % path in log
        and os.path.isfile(path) and not os.path.islink(path), repr(weights_lines(log)))
c.check("the link's target is untouched", open(victim).read() == "the server's own file\n")
os.unlink(path)
os.mkfifo(path, 0o600)
if os.geteuid() == 0:
    shutil.chown(path, "postgres", "postgres")
log = kill_engine()
c.check("a FIFO at the cache file's name does not hang the load: refused, saying so, replaced",
        "refused, rebuilt" in log and "not a regular file" in log and "cached to %s" % path in log
        and os.path.isfile(path), repr(weights_lines(log)))
c.check("the engine with a FIFO in its cache serves as before", value(ASK) == before)


def unsafe_dir(mode, owner):
    """A cache directory of that mode and owner, holding a copy of the valid cache file."""
    d = tempfile.mkdtemp(prefix="pg_cai_unsafe_cache.")
    shutil.copy(path, os.path.join(d, os.path.basename(path)))
    if os.geteuid() == 0:
        for p in (d, os.path.join(d, os.path.basename(path))):
            shutil.chown(p, owner, owner)
    os.chmod(d, mode)
    return d


for mode, owner, why in ((0o770, "postgres", "writable by group or others"),
                         (0o700, "root", "is owned by user id 0")):
    if owner == "root" and os.geteuid() != 0:
        continue
    d = unsafe_dir(mode, owner)
    log = reload_with("pg_cai.weights_cache", d)
    c.check("a cache directory %s is refused: the log says why, nothing is mapped or written" % why,
            "not cached to" in log and why in log and "mapped from cache" not in log
            and os.listdir(d) == [os.path.basename(path)], repr(weights_lines(log)))
    c.check("the engine without its unsafe cache serves as before (%s)" % why, value(ASK) == before)
    shutil.rmtree(d, ignore_errors=True)
reload_with("pg_cai.weights_cache", None)
os.unlink(victim)

# a path the server writes: hidden from and closed to ordinary roles
value("DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'cai_wc_user') THEN "
      "CREATE ROLE cai_wc_user LOGIN; END IF; END $$", db="postgres")
r = psql("SHOW pg_cai.weights_cache", db="postgres", env={"PGUSER": "cai_wc_user"})
c.check("an ordinary role cannot read pg_cai.weights_cache", r.rc != 0, repr(r))
r = psql("ALTER SYSTEM SET pg_cai.weights_cache = '/tmp/x'", db="postgres",
         env={"PGUSER": "cai_wc_user"})
c.check("an ordinary role cannot set pg_cai.weights_cache", r.rc != 0, repr(r))
value("DROP ROLE cai_wc_user", db="postgres")

# the command line: off unless --weights-cache is given; the second run maps and prints the same
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
model = os.environ.get("PG_CAI_TEST_MODEL",
                       os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
with tempfile.TemporaryDirectory() as tmp:
    cache = os.path.join(tmp, "wc")
    cmd = [os.path.join(ROOT, "cai"), "run", "-m", model, "-p", "The capital of France is",
           "--temp", "0", "--max-tokens", "8", "--threads", "2"]
    runs = [subprocess.run(cmd + extra, capture_output=True, text=True, timeout=300)
            for extra in ([], ["--weights-cache", cache], ["--weights-cache", cache])]
    c.check("cai run: no cache unless asked", "weights:" not in runs[0].stderr, runs[0].stderr[-300:])
    c.check("cai run --weights-cache: the first run converts and caches, the second maps",
            "cached to %s/" % cache in runs[1].stderr and
            "mapped from cache %s/" % cache in runs[2].stderr, runs[1].stderr[-300:] + runs[2].stderr[-300:])
    c.check("cai run --weights-cache: the same reply each time",
            all(r.returncode == 0 and r.stdout == runs[0].stdout for r in runs), repr(runs[2].stdout))

    # links planted at the final name and at the temporary name a writer with this pid would
    # have used before (NAME.PID.tmp): the file is written exclusively, under a name of its own
    name = sorted(os.listdir(cache))[0]
    cache2 = os.path.join(tmp, "wc2")
    os.mkdir(cache2, 0o700)
    target = os.path.join(tmp, "precious")
    with open(target, "w") as f:
        f.write("precious\n")
    os.symlink(target, os.path.join(cache2, name))

    def plant():
        os.symlink(target, os.path.join(cache2, "%s.%d.tmp" % (name, os.getpid())))

    r = subprocess.run(cmd + ["--weights-cache", cache2], capture_output=True, text=True,
                       timeout=300, preexec_fn=plant)
    final = os.path.join(cache2, name)
    c.check("cai run: links at the cache file's names leave their target untouched",
            open(target).read() == "precious\n", open(target, "rb").read()[:64])
    c.check("cai run: the cache file replaces the link at its name and is written",
            r.returncode == 0 and "cached to %s" % final in r.stderr and os.path.isfile(final)
            and not os.path.islink(final), r.stderr[-400:])
c.done()
