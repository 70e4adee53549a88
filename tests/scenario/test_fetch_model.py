"""scripts/fetch-model.sh with an hf: source or a URL, against a local HTTP server on 127.0.0.1:
a verified download lands in the folder; a wrong checksum, a file that is not GGUF, a remote http
host and an https URL without a checksum are refused and leave nothing; a download cut midway
resumes with a Range request; an hf: source maps to the hub's resolve URL (HF_ENDPOINT) and takes
the checksum the hub states.  A download over FETCH_MODEL_MAX_BYTES, or over the size the hub
states, is refused or stopped before its checksum is checked, keeping nothing.  `make model`
passes MODEL and SHA256 as data: shell and make syntax in them runs nothing and is refused, a
URL with a query is refused, a plain one downloads.  Needs no PostgreSQL."""
import hashlib
import http.server
import os
import shutil
import struct
import subprocess
import tempfile
import threading

from pgtest import Checks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FETCH = os.path.join(ROOT, "scripts", "fetch-model.sh")
c = Checks()

# a GGUF-looking file (header, then 3 MB of bytes: the script checks the header and the sum)
GGUF = b"GGUF" + struct.pack("<I", 3) + bytes(range(256)) * (3 * 4096)
GGUF_SHA = hashlib.sha256(GGUF).hexdigest()
HTML = b"<!DOCTYPE html><html><body>404 Not Found</body></html>" * 100
files = {"/m/model.gguf": GGUF, "/m/page.gguf": HTML,
         "/m/nolength.gguf": GGUF,
         "/owner/repo/resolve/main/model.gguf": GGUF,
         "/owner/repo/resolve/main/liar.gguf": GGUF,
         "/owner/repo/resolve/v2/sub/model.gguf": GGUF}
# sent without a Content-Length (the body ends when the connection closes)
NO_LENGTH = {"/m/nolength.gguf", "/owner/repo/resolve/main/liar.gguf"}
# what the hub states as a file's size, when it is not the file's
STATED_SIZE = {"/owner/repo/resolve/main/liar.gguf": 1 << 20}
seen = []                 # (path, Range header) of every GET
cut_next = {"left": 0}    # > 0: the next GET sends this many bytes and drops the connection


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def headers_for(self, body):
        self.send_header("Content-Type", "application/octet-stream")
        if self.path.startswith("/owner/"):
            self.send_header("X-Linked-Etag", '"%s"' % hashlib.sha256(body).hexdigest())

    def do_HEAD(self):
        body = files.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.headers_for(body)
        self.send_header("Content-Length", str(len(body)))
        if self.path in STATED_SIZE:
            self.send_header("X-Linked-Size", str(STATED_SIZE[self.path]))
        self.end_headers()

    def do_GET(self):
        body = files.get(self.path)
        rng = self.headers.get("Range")
        seen.append((self.path, rng))
        if body is None:
            self.send_error(404)
            return
        start = int(rng[len("bytes="):].rstrip("-")) if rng else 0
        if start >= len(body):
            self.send_response(416)
            self.end_headers()
            return
        self.send_response(206 if rng else 200)
        self.headers_for(body)
        if self.path not in NO_LENGTH:
            self.send_header("Content-Length", str(len(body) - start))
        if rng:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(body) - 1, len(body)))
        self.end_headers()
        if cut_next["left"]:
            self.wfile.write(body[start:start + cut_next["left"]])
            cut_next["left"] = 0
            self.wfile.flush()
            self.connection.shutdown(2)
            return
        self.wfile.write(body[start:])


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
base = "http://127.0.0.1:%d" % server.server_address[1]
tmp = tempfile.mkdtemp(prefix="cai_fetch_")


def fetch(*args, env=None):
    e = dict(os.environ, MODEL_DIR=tmp)
    e.update(env or {})
    p = subprocess.run([FETCH] + list(args), capture_output=True, text=True, env=e, timeout=120)
    return p.returncode, p.stdout + p.stderr


def present():
    return sorted(os.listdir(tmp))


try:
    rc, out = fetch(base + "/m/model.gguf", GGUF_SHA)
    got = open(os.path.join(tmp, "model.gguf"), "rb").read() if rc == 0 else b""
    c.check("a URL with its sha256 downloads and verifies", rc == 0 and got == GGUF and "verified" in out,
            out)
    rc, out = fetch(base + "/m/model.gguf", GGUF_SHA)
    c.check("a present, verified file is kept without downloading again",
            rc == 0 and "present and verified" in out and len(seen) == 1, out)
    os.unlink(os.path.join(tmp, "model.gguf"))

    rc, out = fetch(base + "/m/model.gguf", "0" * 64)
    c.check("a wrong sha256 fails and keeps nothing",
            rc == 1 and "checksum mismatch" in out and present() == [], "%s %s" % (out, present()))

    rc, out = fetch(base + "/m/page.gguf", hashlib.sha256(HTML).hexdigest())
    c.check("a file that is not GGUF is refused at its header and kept nowhere",
            rc == 1 and "not a GGUF file" in out and present() == [], "%s %s" % (out, present()))

    rc, out = fetch(base + "/m/model.gguf")
    c.check("a URL without a sha256 is refused", rc == 1 and "needs its expected sha256" in out, out)
    rc, out = fetch("http://example.invalid/m/model.gguf", GGUF_SHA)
    c.check("plain http from another host is refused", rc == 1 and "plain http" in out, out)
    rc, out = fetch(base + "/m/model.gguf", "abc")
    c.check("a malformed sha256 is refused", rc == 1 and "64 hexadecimal" in out, out)

    # cut after 1 MB: the first run fails and keeps the part, the second resumes from it
    del seen[:]
    cut_next["left"] = 1 << 20
    rc1, out1 = fetch(base + "/m/model.gguf", GGUF_SHA)
    partial = os.path.join(tmp, ".model.gguf.partial")
    kept = os.path.getsize(partial) if os.path.exists(partial) else 0
    rc2, out2 = fetch(base + "/m/model.gguf", GGUF_SHA)
    got = open(os.path.join(tmp, "model.gguf"), "rb").read() if rc2 == 0 else b""
    c.check("a cut download fails, keeping its first part", rc1 == 1 and kept == 1 << 20,
            "%s kept %d" % (out1, kept))
    c.check("the next run resumes with a Range request and verifies the whole file",
            rc2 == 0 and got == GGUF and seen[-1] == ("/m/model.gguf", "bytes=%d-" % (1 << 20))
            and "resuming at byte" in out2, "%s %s" % (out2, seen))
    os.unlink(os.path.join(tmp, "model.gguf"))

    # hf: sources, with the hub on the local server
    del seen[:]
    rc, out = fetch("hf:owner/repo/model.gguf", env={"HF_ENDPOINT": base})
    c.check("hf:OWNER/REPO/FILE fetches the hub's resolve URL with the checksum the hub states",
            rc == 0 and seen == [("/owner/repo/resolve/main/model.gguf", None)]
            and GGUF_SHA in out and present() == ["model.gguf"], "%s %s" % (out, seen))
    os.unlink(os.path.join(tmp, "model.gguf"))
    rc, out = fetch("hf:owner/repo@v2/sub/model.gguf", GGUF_SHA, env={"HF_ENDPOINT": base})
    c.check("hf:OWNER/REPO@REVISION/PATH/FILE fetches that revision's file",
            rc == 0 and seen[-1] == ("/owner/repo/resolve/v2/sub/model.gguf", None), out)
    rc, out = fetch("hf:owner/repo/../../etc/passwd.gguf", env={"HF_ENDPOINT": base})
    c.check("an hf: path that climbs out is refused", rc == 1 and "hf: source is" in out, out)
    os.unlink(os.path.join(tmp, "model.gguf"))

    # the size cap, checked before the checksum: nothing of a refused download is kept
    rc, out = fetch(base + "/m/model.gguf", GGUF_SHA, env={"FETCH_MODEL_MAX_BYTES": "1000000"})
    c.check("a download the server announces over FETCH_MODEL_MAX_BYTES is refused, keeping nothing",
            rc == 1 and "over the cap of 1000000" in out and present() == [], "%s %s" % (out, present()))
    rc, out = fetch(base + "/m/nolength.gguf", GGUF_SHA, env={"FETCH_MODEL_MAX_BYTES": "1000000"})
    c.check("a download without a length is stopped once it grows past the cap, keeping nothing",
            rc == 1 and "grew past the cap of 1000000" in out and present() == [],
            "%s %s" % (out, present()))
    rc, out = fetch("hf:owner/repo/liar.gguf", env={"HF_ENDPOINT": base})
    c.check("an hf: download is capped at the size the hub states",
            rc == 1 and "grew past the cap of %d" % (1 << 20) in out and present() == [],
            "%s %s" % (out, present()))
    rc, out = fetch(base + "/m/model.gguf", GGUF_SHA, env={"FETCH_MODEL_MAX_BYTES": "lots"})
    c.check("a malformed FETCH_MODEL_MAX_BYTES is refused", rc == 1 and "FETCH_MODEL_MAX_BYTES" in out, out)
    rc, out = fetch(base + "/m/nolength.gguf", GGUF_SHA)
    c.check("under the default cap a download without a length completes",
            rc == 0 and present() == ["nolength.gguf"], out)
    os.unlink(os.path.join(tmp, "nolength.gguf"))

    # make model: what MODEL and SHA256 hold is data, never shell or make syntax
    mark = os.path.join(tmp, "injected")

    def make_model(**variables):
        e = dict(os.environ, MODEL_DIR=tmp, HF_ENDPOINT=base)
        p = subprocess.run(["make", "-s", "--no-print-directory", "-C", ROOT, "model"] +
                           ["%s=%s" % kv for kv in variables.items()],
                           capture_output=True, text=True, env=e, timeout=120)
        return p.returncode, p.stdout + p.stderr

    for label, variables in (
            ("a ';' in MODEL", {"MODEL": "hf:owner/repo/model.gguf;touch %s" % mark}),
            ("a command substitution in MODEL", {"MODEL": "hf:owner/repo/$(touch %s).gguf" % mark}),
            ("backquotes in MODEL", {"MODEL": "hf:owner/repo/`touch %s`.gguf" % mark}),
            ("a make function in MODEL", {"MODEL": "$(shell touch %s)" % mark}),
            ("a ';' in SHA256", {"MODEL": base + "/m/model.gguf", "SHA256": "%s;touch %s" % (GGUF_SHA, mark)})):
        rc, out = make_model(**variables)
        c.check("make model: %s runs nothing and is refused" % label,
                rc != 0 and not os.path.exists(mark) and "refusing" in out and present() == [],
                "rc=%d marker=%s %s %s" % (rc, os.path.exists(mark), out[-400:], present()))
        if os.path.exists(mark):
            os.unlink(mark)
    rc, out = fetch(base + "/m/model.gguf?download=1", GGUF_SHA)
    c.check("a URL with a query is refused as not of a plain shape",
            rc == 2 and "refusing model source" in out and present() == [], out)
    rc, out = make_model(MODEL=base + "/m/model.gguf", SHA256=GGUF_SHA)
    c.check("make model MODEL=URL SHA256=... downloads and verifies",
            rc == 0 and present() == ["model.gguf"] and "verified" in out, out[-400:])
finally:
    server.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)
c.done()
