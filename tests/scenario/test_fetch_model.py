"""scripts/fetch-model.sh with an hf: source or a URL, against a local HTTP server on 127.0.0.1:
a verified download lands in the folder; a wrong checksum, a file that is not GGUF, a remote http
host and an https URL without a checksum are refused and leave nothing; a download cut midway
resumes with a Range request; an hf: source maps to the hub's resolve URL (HF_ENDPOINT) and takes
the checksum the hub states.  Needs no PostgreSQL."""
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
         "/owner/repo/resolve/main/model.gguf": GGUF,
         "/owner/repo/resolve/v2/sub/model.gguf": GGUF}
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
finally:
    server.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)
c.done()
