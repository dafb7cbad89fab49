"""Corpora for people who are online: `chargpt data list`, `chargpt data get tinyshakespeare`, `... get tang`.

A download goes to data/.NAME.part first and is renamed into place only once its size and SHA-256 match the
published file, so data/ never holds a half or a wrong file. The partial file survives a dropped connection
or Ctrl-C: the next attempt asks the server for the rest (an HTTP Range request) instead of starting over.
Standard library only (urllib). CHARGPT_DATA_URL replaces the servers: files are then fetched from
$CHARGPT_DATA_URL/<file name> (a mirror, or a local server in the tests).

A corpus published as several source files (the Tang poems: 58 JSON files) is built: each source file is
downloaded the same way into data/.NAME.parts/ and checked, then the text is built from them into the .part file
and checked against its own size and SHA-256 before it is renamed into place; the source files are then removed.
"""

import contextlib
import difflib
import hashlib
import http.client
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from chargpt.data import tang
from chargpt.errors import DataError

BASE_URL_ENV = "CHARGPT_DATA_URL"
DATA_DIR = "data"
CHUNK = 1 << 16
TIMEOUT_S = 30  # per blocking read: a stalled server is an error, not a hang
ATTEMPTS = 3  # a dropped connection is retried (resuming) this many times in all before giving up


@dataclass(frozen=True)
class Corpus:
    name: str
    filename: str
    url: str  # where it is downloaded from; for a built corpus, the page of its source
    sha256: str
    size: int
    about: str
    parts: tuple = ()  # a built corpus: its source files (Corpus each), downloaded and checked one by one
    build: object = None  # ... and how: a function (source file bytes) -> list of texts, joined by a blank line


def _tang():
    parts = tuple(Corpus(f"tang part {n}", f"poet.tang.{n}.json", tang.part_url(f"poet.tang.{n}.json"), sha, size,
                         "") for n, size, sha in tang.PARTS)
    return Corpus("tang", "tang_poems.txt", tang.PAGE, tang.SHA256, tang.SIZE,
                  "the Complete Tang Poems (全唐诗, 4.7M characters, 9,728 distinct; traditional characters), built "
                  "from chinese-poetry/chinese-poetry's 58 JSON files (25.6 MB to download)", parts, tang.poems_text)


CORPORA = {c.name: c for c in [
    Corpus("tinyshakespeare", "tinyshakespeare.txt",
           "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
           "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed", 1_115_394,
           "40,000 lines of Shakespeare's plays (65 distinct characters), the classic character-level benchmark "
           "(karpathy/char-rnn)"),
    _tang(),
]}


def lookup(name):
    if name in CORPORA:
        return CORPORA[name]
    close = difflib.get_close_matches(name, CORPORA, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    raise DataError(f"unknown corpus {name!r}; {hint}available: {', '.join(CORPORA)} (chargpt data list)")


def list_corpora(data_dir=DATA_DIR):
    """-> [dict(name, size, about, url, path, downloaded)] for `chargpt data list`."""
    return [{"name": c.name, "size": c.size, "about": c.about, "url": c.url, "path": str(Path(data_dir) / c.filename),
             "downloaded": (Path(data_dir) / c.filename).is_file()} for c in CORPORA.values()]


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def source_url(corpus, base_url=None):
    base = base_url or os.environ.get(BASE_URL_ENV)
    if not base:
        return corpus.url
    if not _is_http_url(base):
        raise DataError(f"{BASE_URL_ENV}={base!r:.80} is not an http(s) URL; set it to a mirror such as "
                        f"https://example.org/corpora, or unset it to use the published servers")
    return f"{base.rstrip('/')}/{corpus.filename}"


def _is_http_url(url):
    """An http(s) URL urllib can open: it parses (a bad IPv6 host such as http://[zz does not), has a host, a
    numeric port if any, and no spaces or control characters (which urllib refuses only when it connects)."""
    if any(c.isspace() or not c.isprintable() for c in url):
        return False
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (reading it checks it: a non-numeric or out-of-range port raises ValueError)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def get(name, data_dir=DATA_DIR, base_url=None, log=print, progress=True):
    """Download corpus `name` into data_dir (resuming a partial download), check it, -> its path."""
    corpus = lookup(name)
    data_dir = Path(data_dir)
    dest, part = data_dir / corpus.filename, data_dir / f".{corpus.filename}.part"
    if dest.is_file():
        if sha256_of(dest) == corpus.sha256:
            log(f"{dest} is already here (checksum verified)")
            return dest
        raise DataError(f"{dest} exists but is not the published {name} (its checksum differs); move or delete it, "
                        f"then run again")
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create {data_dir} ({e.strerror}); run from a writable directory or pass --dir") \
            from None
    if corpus.parts:
        return _get_built(corpus, data_dir, dest, part, base_url, log, progress)
    url = source_url(corpus, base_url)
    _fetch_checked(url, part, dest, corpus, log, progress)
    log(f"downloaded {name} to {dest} ({corpus.size:,} bytes, checksum verified)")
    return dest


def _fetch_checked(url, part, dest, corpus, log, progress):
    """Download url to `part` (retrying and resuming), check it against `corpus`, rename it to `dest`. A download
    continued from a local .part that fails the check is fetched whole once more before the mirror is blamed: the
    bytes kept locally may be what is wrong (a damaged or foreign .part)."""
    kept = _partial_size(part, corpus.size)  # bytes left by an earlier attempt, which this one continues
    _fetch(url, part, corpus, progress, log)
    if kept and not _matches(part, corpus):
        log(f"the download continued from {kept:,} bytes kept in {part} does not match the published file; "
            f"deleting them and downloading it whole")
        part.unlink()
        _fetch(url, part, corpus, progress, log)
    _check_and_install(part, dest, corpus, url)


def _fetch(url, part, corpus, progress, log):
    """Download into `part`, resuming a dropped connection up to ATTEMPTS times in all."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return _download(url, part, part.with_name(corpus.filename), corpus.size, progress)
        except _Dropped as e:
            have = part.stat().st_size if part.exists() else 0
            if attempt == ATTEMPTS:
                raise DataError(f"the connection to {_host(url)} kept dropping ({e}); {have:,} of {corpus.size:,} "
                                f"bytes are kept in {part}; run the same command again to resume") from None
            log(f"connection dropped after {have:,} bytes ({e}); resuming (attempt {attempt + 1} of {ATTEMPTS})")
            time.sleep(0.5 * attempt)


def _get_built(corpus, data_dir, dest, part, base_url, log, progress):
    """Fetch every source file of a built corpus (each checked; those already here are kept), build the text into
    `part`, check it and rename it to `dest`; then the source files go."""
    parts_dir = data_dir / f".{corpus.filename}.parts"
    parts_dir.mkdir(exist_ok=True)
    files = []
    for i, source in enumerate(corpus.parts, 1):
        path = parts_dir / source.filename
        if not (path.is_file() and path.stat().st_size == source.size and sha256_of(path) == source.sha256):
            _fetch_checked(source_url(source, base_url), parts_dir / f".{source.filename}.part", path, source, log,
                           progress)
        files.append(path)
        if progress and i % 10 == 0:
            log(f"{i} of {len(corpus.parts)} source files of {corpus.name} downloaded and checked")
    with open(part, "w", encoding="utf-8", newline="\n") as out:
        first = True
        for path in files:
            for text in corpus.build(path.read_bytes()):
                out.write(text if first else "\n" + text)
                first = False
    got_size, got = part.stat().st_size, sha256_of(part)
    if got_size != corpus.size or got != corpus.sha256:  # checked sources built wrong: a bug here, not the network
        part.unlink()
        raise DataError(f"the text built from the {corpus.name} source files is not the published one ({got_size:,} "
                        f"bytes, sha256 {got[:16]}..., expected {corpus.size:,} bytes, {corpus.sha256[:16]}...); "
                        f"nothing was kept; please report it")
    os.replace(part, dest)
    for path in files:
        path.unlink()
    with contextlib.suppress(OSError):
        parts_dir.rmdir()
    log(f"built {corpus.name} into {dest} from {len(files)} source files ({corpus.size:,} bytes, checksum verified)")
    return dest


def _matches(part, corpus):
    return part.stat().st_size == corpus.size and sha256_of(part) == corpus.sha256


class _Dropped(Exception):
    """The connection broke mid-transfer: worth retrying from where it stopped."""


def _host(url):
    return urllib.request.urlparse(url).netloc or url


def _download(url, part, dest, size, progress):
    """Fetch url into `part`, continuing from its current length with a Range request when it has one."""
    have = _partial_size(part, size)
    if have == size:
        return  # complete already (checked next)
    response = _open(url, have, dest)
    if response is None:  # the server cannot continue this partial file: start again
        part.unlink()
        return _download(url, part, dest, size, progress)
    with response:
        start = _resume_offset(response, have)
        if start is None:  # a confused server or proxy: the next attempt starts from scratch
            part.unlink()
            raise _Dropped(f"the server resumed at the wrong place ({response.headers.get('Content-Range')!r})")
        _write_body(response, part, start, size, progress)
    if part.stat().st_size < size:  # the server closed the body early without an error
        raise _Dropped(f"{part.stat().st_size:,} of {size:,} bytes received")


def _partial_size(part, size):
    """Bytes already fetched; a partial file longer than the corpus cannot be right and is deleted."""
    have = part.stat().st_size if part.exists() else 0
    if have > size:
        part.unlink()
        return 0
    return have


def _open(url, have, dest):
    """-> the HTTP response (asking for the bytes from `have` on), or None when the server refuses that range."""
    headers = {"User-Agent": "chargpt", **({"Range": f"bytes={have}-"} if have else {})}
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # Range Not Satisfiable
            return None
        raise DataError(f"{url} answered HTTP {e.code} {e.reason}; try again later, or download it yourself as "
                        f"{dest}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", None) or getattr(e, "strerror", None) or e
        raise DataError(f"cannot reach {_host(url)} ({reason}); check the internet connection (or proxy), or "
                        f"download {url} yourself as {dest}") from None


def _write_body(response, part, start, size, progress):
    """Append the body to `part` (or rewrite it, for a body that is the whole file), with a progress bar."""
    try:
        with open(part, "ab" if start else "wb") as f, \
                tqdm(total=size, initial=start, unit="B", unit_scale=True, leave=False, desc="downloading",
                     disable=not progress, dynamic_ncols=True) as bar:
            while chunk := _read(response):
                f.write(chunk)
                bar.update(len(chunk))
    except OSError as e:
        raise DataError(f"cannot write {part} ({e.strerror}); free disk space or run from a writable "
                        f"directory") from None


def _resume_offset(response, have):
    """Where the body starts in the file: 0 for a whole file (200), `have` for the matching 206 Partial Content,
    None for a 206 that starts elsewhere."""
    if response.status != 206:
        return 0
    m = re.match(r"bytes (\d+)-", response.headers.get("Content-Range", ""))
    return have if m and int(m.group(1)) == have else None


def _read(response):
    try:
        return response.read(CHUNK)
    except (http.client.HTTPException, OSError) as e:  # IncompleteRead, a reset connection, a read timeout
        raise _Dropped(type(e).__name__) from None


def _check_and_install(part, dest, corpus, url):
    """Rename the partial file into place if it is exactly the published file; delete it if not."""
    got_size, got = part.stat().st_size, sha256_of(part)
    if got_size != corpus.size or got != corpus.sha256:
        with contextlib.suppress(OSError):
            part.unlink()  # resuming cannot repair a wrong file
        raise DataError(f"{url} sent a file that is not the published {corpus.name} ({got_size:,} bytes, sha256 "
                        f"{got[:16]}..., expected {corpus.size:,} bytes, {corpus.sha256[:16]}...); nothing was "
                        f"kept; try again later or use another mirror ({BASE_URL_ENV})")
    os.replace(part, dest)
