#!/usr/bin/env python3
"""fetch_url.py — downloads one GGUF model file by URL into a folder, resumably, and verifies it.

    fetch_url.py SOURCE DEST_DIR [SHA256]

SOURCE is `hf:OWNER/REPO/FILE.gguf` (a Hugging Face file; `hf:OWNER/REPO@REVISION/PATH/FILE.gguf`
for another revision than main or a file in a folder) or an https URL.  Plain http is accepted
only for loopback hosts (a local mirror, the tests).  Only the Python standard library is used.

- The checksum: the SHA256 argument; for an hf: file without one, the sha256 the hub states for
  the file (its X-Linked-Etag / ETag header, which is the file's sha256 for large files) — printed
  so that it can be pinned.  An https URL without a SHA256 is refused: nothing unverified is kept.
- Resumable: bytes go to DEST_DIR/.FILE.partial; a later run asks for the rest with a Range
  request (and starts over when the server ignores it).  The file moves into place only once its
  sha256 matches.
- Refused before the rest is downloaded: a file whose first bytes are not a GGUF header
  (magic "GGUF", version 2 or 3) — an HTML error page, say.
- Capped before its checksum is checked: a download larger than FETCH_MODEL_MAX_BYTES (default
  64 GiB), or than the size the hub states for an hf: file (X-Linked-Size, else the HEAD's
  Content-Length), is refused when the server announces it and stopped when it grows past it;
  nothing of it is kept.
- Environment: HF_ENDPOINT (default https://huggingface.co) and HF_TOKEN (sent as a bearer token,
  for gated repositories).
Exit status 0 when DEST_DIR/FILE is present and verified, 1 on any failure (one line says why).
"""
import hashlib
import ipaddress
import os
import re
import struct
import sys
import urllib.error
import urllib.parse
import urllib.request

CHUNK = 1 << 20
HEX64 = re.compile(r"^[0-9a-f]{64}$")
DEFAULT_MAX_BYTES = 64 << 30


class FetchError(Exception):
    pass


class NotGGUF(FetchError):
    """The file is not one the engine reads: final, unlike a cut download."""


class TooLarge(FetchError):
    """The download outgrew its cap: final, nothing of it is kept."""


def max_bytes_setting():
    """FETCH_MODEL_MAX_BYTES (a positive number of bytes), or the default."""
    raw = os.environ.get("FETCH_MODEL_MAX_BYTES", "").strip()
    if not raw:
        return DEFAULT_MAX_BYTES
    if not raw.isdigit() or int(raw) <= 0:
        raise FetchError("FETCH_MODEL_MAX_BYTES must be a positive number of bytes, not %r" % raw)
    return int(raw)


def say(msg):
    print("fetch-model: " + msg, flush=True)


def resolve(source):
    """(url, file name, whether the hub may state the checksum) for SOURCE."""
    if source.startswith("hf:"):
        m = re.fullmatch(r"hf:([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+)(?:@([A-Za-z0-9_./-]+?))?/(.+\.gguf)",
                         source)
        if not m or ".." in m.group(4).split("/"):
            raise FetchError("an hf: source is hf:OWNER/REPO/FILE.gguf or "
                             "hf:OWNER/REPO@REVISION/PATH/FILE.gguf, not %r" % source)
        owner, repo, revision, path = m.group(1), m.group(2), m.group(3) or "main", m.group(4)
        endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
        url = "%s/%s/%s/resolve/%s/%s" % (endpoint, owner, repo, urllib.parse.quote(revision, safe=""),
                                          urllib.parse.quote(path))
        return url, path.rsplit("/", 1)[-1], True
    parsed = urllib.parse.urlsplit(source)
    if parsed.scheme not in ("https", "http") or not parsed.hostname:
        raise FetchError("not a model source: %r (expected hf:OWNER/REPO/FILE.gguf or an https URL)"
                         % source)
    if parsed.scheme == "http" and not is_loopback(parsed.hostname):
        raise FetchError("plain http is accepted only from this machine (localhost); use https")
    name = urllib.parse.unquote(parsed.path.rsplit("/", 1)[-1])
    if not name.endswith(".gguf") or "/" in name or name.startswith("."):
        raise FetchError("the URL's last path segment must be a file name ending in .gguf: %r" % name)
    return source, name, False


def is_loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def request(url, method="GET", offset=0):
    req = urllib.request.Request(url, method=method)
    req.add_header("User-Agent", "pg_cai-fetch-model")
    if offset:
        req.add_header("Range", "bytes=%d-" % offset)
    token = os.environ.get("HF_TOKEN")
    if token and url.startswith(os.environ.get("HF_ENDPOINT", "https://huggingface.co")):
        req.add_header("Authorization", "Bearer " + token)
    try:
        return urllib.request.urlopen(req, timeout=60)
    except urllib.error.HTTPError as e:
        if e.code == 416 and offset:
            return e  # the partial file is already whole (or longer than the file): see caller
        raise FetchError("%s %s: HTTP %d %s" % (method, url, e.code, e.reason))
    except (urllib.error.URLError, OSError) as e:
        raise FetchError("%s %s: %s" % (method, url, getattr(e, "reason", e)))


def stated(url):
    """(sha256, size) the hub states for a file: X-Linked-Etag else ETag, X-Linked-Size else
    Content-Length; None for what it does not state."""
    resp = request(url, method="HEAD")
    sha256 = None
    for header in ("X-Linked-Etag", "ETag"):
        value = (resp.headers.get(header) or "").strip().strip('"').lower()
        if value.startswith("w/"):
            continue
        if HEX64.match(value):
            sha256 = value
            break
    size = None
    for header in ("X-Linked-Size", "Content-Length"):
        value = (resp.headers.get(header) or "").strip()
        if value.isdigit():
            size = int(value)
            break
    return sha256, size


def check_header(first):
    """Raises unless FIRST (at least 8 bytes) opens a GGUF file of a version the engine reads."""
    if len(first) < 8 or first[:4] != b"GGUF":
        raise NotGGUF("not a GGUF file (it starts with %r); refusing it" % bytes(first[:16]))
    version = struct.unpack("<I", first[4:8])[0]
    if version not in (2, 3):
        raise NotGGUF("GGUF version %d; the engine reads versions 2 and 3" % version)


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def download(url, partial, max_bytes):
    """Appends the rest of URL to PARTIAL, resuming from its size; TooLarge past max_bytes."""
    offset = os.path.getsize(partial) if os.path.exists(partial) else 0
    if offset > max_bytes:
        raise TooLarge("the partial download holds %d bytes, over the cap of %d" % (offset, max_bytes))
    resp = request(url, offset=offset)
    status = getattr(resp, "status", None) or resp.getcode()
    if status == 416:
        return
    if offset and status != 206:
        say("the server does not resume downloads; starting over")
        offset = 0
    elif offset:
        say("resuming at byte %d" % offset)
    total = resp.headers.get("Content-Length")
    total = int(total) + offset if total and total.isdigit() else None
    if total is not None and total > max_bytes:
        raise TooLarge("the server announces %d bytes, over the cap of %d (FETCH_MODEL_MAX_BYTES "
                       "or the size the hub states); refusing it" % (total, max_bytes))
    done = offset
    last_report = 0
    with open(partial, "r+b" if offset else "wb") as out:
        out.seek(offset)
        out.truncate()
        if offset >= 8:
            out.seek(0)
            check_header(out.read(8))
            out.seek(offset)
        head = b""
        while True:
            block = resp.read(CHUNK)
            if not block:
                break
            if done < 8:
                head += block[:8 - done]
                if len(head) == 8:
                    check_header(head)
            if done + len(block) > max_bytes:
                raise TooLarge("the download grew past the cap of %d bytes (FETCH_MODEL_MAX_BYTES "
                               "or the size the hub states); stopped and removed" % max_bytes)
            out.write(block)
            done += len(block)
            if total and done - last_report >= 64 * CHUNK:
                last_report = done
                say("%d of %d MB" % (done >> 20, total >> 20))
    if total is not None and done < total:
        raise FetchError("the download stopped at %d of %d bytes; run the command again to resume"
                         % (done, total))


def fetch(source, dest_dir, sha256=None):
    url, name, hub = resolve(source)
    if sha256 is not None:
        sha256 = sha256.lower()
        if not HEX64.match(sha256):
            raise FetchError("the expected sha256 must be 64 hexadecimal digits: %r" % sha256)
    target = os.path.join(dest_dir, name)
    partial = os.path.join(dest_dir, "." + name + ".partial")
    os.makedirs(dest_dir, exist_ok=True)
    max_bytes = max_bytes_setting()
    if hub:
        hub_sha256, hub_size = stated(url)
        if hub_size is not None and hub_size < max_bytes:
            max_bytes = hub_size
        if sha256 is None:
            if hub_sha256 is None:
                raise FetchError("the hub states no sha256 for %s; give one as the second argument"
                                 % source)
            sha256 = hub_sha256
            say("the hub states sha256 %s for %s (pass it as the second argument to pin it)"
                % (sha256, name))
    if sha256 is None:
        raise FetchError("an https URL needs its expected sha256 as the second argument")
    if os.path.exists(target):
        if file_sha256(target) == sha256:
            say("%s is present and verified" % target)
            return target
        raise FetchError("%s exists with another sha256; move it away first" % target)
    say("downloading %s" % url)
    try:
        download(url, partial, max_bytes)
        with open(partial, "rb") as f:
            check_header(f.read(8))
    except (NotGGUF, TooLarge):
        # final: keep nothing to resume from
        if os.path.exists(partial):
            os.unlink(partial)
        raise
    got = file_sha256(partial)
    if got != sha256:
        os.unlink(partial)
        raise FetchError("checksum mismatch for %s: got %s, expected %s (the download was removed)"
                         % (name, got, sha256))
    os.chmod(partial, 0o644)
    os.replace(partial, target)
    say("%s verified (sha256 %s)" % (target, sha256))
    return target


def main(argv):
    if len(argv) not in (3, 4):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        fetch(argv[1], argv[2], argv[3] if len(argv) == 4 else None)
    except FetchError as e:
        say(str(e))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
