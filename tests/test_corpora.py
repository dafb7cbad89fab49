"""chargpt data: downloads against a local HTTP server started here (never the internet): checksum, resume
with Range requests after a dropped connection, servers that ignore Range, offline and HTTP errors."""

import hashlib
import json
import os
import socket

import pytest
from click.testing import CliRunner
from helpers import BODY, GOOD, Server

import chargpt.data.corpora as corpora
from chargpt.cli import data_cli
from chargpt.data import tang
from chargpt.data.corpora import Corpus, get
from chargpt.errors import DataError


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setitem(corpora.CORPORA, GOOD.name, GOOD)
    monkeypatch.setattr(corpora.time, "sleep", lambda s: None)  # no back-off waits in tests
    s = Server()
    yield s
    s.close()


def fetch(server, tmp_path, **kw):
    said = []
    path = get(GOOD.name, tmp_path / "data", base_url=server.url, log=said.append, progress=False, **kw)
    return path, said


def leftovers(tmp_path):
    return sorted(p.name for p in (tmp_path / "data").iterdir())


def test_download_checks_and_installs(server, tmp_path):
    path, said = fetch(server, tmp_path)
    assert path.read_bytes() == BODY and leftovers(tmp_path) == ["test.txt"]
    assert server.requests == [None] and "checksum verified" in said[-1]
    path, said = fetch(server, tmp_path)  # already there: nothing downloaded again
    assert server.requests == [None] and "already here" in said[-1]


def test_dropped_connection_resumes_with_a_range_request(server, tmp_path):
    server.drops = 1
    path, said = fetch(server, tmp_path)
    assert path.read_bytes() == BODY and leftovers(tmp_path) == ["test.txt"]
    assert server.requests == [None, "bytes=50000-"] and "resuming" in said[0]


def test_a_partial_file_from_an_earlier_run_is_continued(server, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / ".test.txt.part").write_bytes(BODY[:120_000])
    path, _ = fetch(server, tmp_path)
    assert path.read_bytes() == BODY and server.requests == ["bytes=120000-"]


def test_a_server_that_ignores_range_sends_the_whole_file_again(server, tmp_path):
    server.drops, server.ranges = 1, False
    path, _ = fetch(server, tmp_path)
    assert path.read_bytes() == BODY and server.requests == [None, "bytes=50000-"]


def test_a_partial_file_the_server_cannot_continue_is_started_again(server, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / ".test.txt.part").write_bytes(b"stale")
    server.refuse_ranges = True
    path, _ = fetch(server, tmp_path)
    assert path.read_bytes() == BODY and server.requests == ["bytes=5-", None]


def test_connection_that_keeps_dropping_keeps_the_partial_for_next_time(server, tmp_path):
    server.drops = corpora.ATTEMPTS
    with pytest.raises(DataError, match="run the same command again to resume"):
        fetch(server, tmp_path)
    assert leftovers(tmp_path) == [".test.txt.part"]
    assert (tmp_path / "data" / ".test.txt.part").read_bytes() == BODY[:corpora.ATTEMPTS * 50_000]
    path, _ = fetch(server, tmp_path)  # the next run finishes it
    assert path.read_bytes() == BODY


def test_checksum_mismatch_keeps_nothing(server, tmp_path, monkeypatch):
    """The real tinyshakespeare entry, served a file of the right size but other bytes."""
    server.body = b"x" * corpora.CORPORA["tinyshakespeare"].size
    with pytest.raises(DataError, match="not the published tinyshakespeare") as e:
        get("tinyshakespeare", tmp_path / "data", base_url=server.url, log=lambda m: None, progress=False)
    assert "\n" not in str(e.value) and leftovers(tmp_path) == []


def test_offline_is_one_clear_error(server, tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DataError, match="cannot reach 127.0.0.1.*check the internet connection"):
        get(GOOD.name, tmp_path / "data", base_url=f"http://127.0.0.1:{port}", progress=False)
    assert leftovers(tmp_path) == []


def test_http_error_names_the_status(server, tmp_path):
    server.status = 404
    with pytest.raises(DataError, match="answered HTTP 404"):
        fetch(server, tmp_path)


def test_an_existing_different_file_is_never_overwritten(server, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "test.txt").write_text("my own notes")
    with pytest.raises(DataError, match="exists but is not the published testcorpus"):
        fetch(server, tmp_path)
    assert (tmp_path / "data" / "test.txt").read_text() == "my own notes" and server.requests == []


def test_data_commands(server, tmp_path, monkeypatch):
    monkeypatch.setenv(corpora.BASE_URL_ENV, server.url)  # the override a user (or a mirror) sets
    r = CliRunner().invoke(data_cli, ["list"])
    assert r.exit_code == 0 and "tinyshakespeare" in r.stdout and "not downloaded" in r.stdout
    r = CliRunner().invoke(data_cli, ["get", "testcorpus"])
    assert r.exit_code == 0, r.stderr
    assert (tmp_path / "data" / "test.txt").read_bytes() == BODY and "chargpt train --data" in r.stderr
    r = CliRunner().invoke(data_cli, ["list"])
    assert "downloaded: data" + os.sep + "test.txt" in r.stdout
    r = CliRunner().invoke(data_cli, ["get", "tinyshakspeare"])
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 1 and len(lines) == 1 and "did you mean tinyshakespeare?" in lines[0]


@pytest.mark.parametrize("url", ["http://[zz", "http://host:port", "http://host:99999", "http://a host", "http://:80"])
def test_a_data_url_that_does_not_parse_is_one_line_naming_the_variable(server, tmp_path, monkeypatch, url):
    monkeypatch.setenv(corpora.BASE_URL_ENV, url)
    r = CliRunner().invoke(data_cli, ["get", "testcorpus"])
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 1 and not isinstance(r.exception, ValueError), r.exception
    assert len(lines) == 1 and lines[0].startswith(f"error: {corpora.BASE_URL_ENV}=") and "is not an http(s) URL" \
        in lines[0] and "unset it" in lines[0], lines
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir())



# --- a corpus built from several source files (the Tang poems) -------------------------------------------------
def poems_json(*poems):
    return json.dumps([{"title": t, "author": a, "paragraphs": lines, "id": "x"} for t, a, lines in poems],
                      ensure_ascii=False).encode("utf-8")


SOURCES = {"poet.tang.0.json": poems_json(("靜夜思", "李白", ["床前明月光，疑是地上霜。", "舉頭望明月，低頭思故鄉。"]),
                                          ("題", "韓氏", [])),  # a poem without lines keeps its blank line
           "poet.tang.1000.json": poems_json(("春曉", "孟浩然", ["春眠不覺曉，處處聞啼鳥。"]))}
BUILT = ("靜夜思\n李白\n床前明月光，疑是地上霜。\n舉頭望明月，低頭思故鄉。\n\n"  # title, author, lines; a blank line
         "題\n韓氏\n\n\n"
         "春曉\n孟浩然\n春眠不覺曉，處處聞啼鳥。\n")


def built_corpus(sources=SOURCES, text=BUILT):
    parts = tuple(Corpus(f"part {name}", name, f"http://unused.invalid/{name}", hashlib.sha256(body).hexdigest(),
                         len(body), "") for name, body in sources.items())
    body = text.encode("utf-8")
    return Corpus("testpoems", "poems.txt", "http://unused.invalid/", hashlib.sha256(body).hexdigest(), len(body),
                  "test poems", parts, tang.poems_text)


def test_a_built_corpus_is_downloaded_file_by_file_checked_and_built(server, tmp_path, monkeypatch):
    monkeypatch.setitem(corpora.CORPORA, "testpoems", built_corpus())
    server.files = dict(SOURCES)
    path = get("testpoems", tmp_path / "data", base_url=server.url, log=lambda m: None, progress=False)
    assert path.read_text(encoding="utf-8") == BUILT
    assert leftovers(tmp_path) == ["poems.txt"]  # the source files are gone once the text is built
    assert sorted(p.rsplit("/", 1)[-1] for p in server.paths) == sorted(SOURCES)


def test_a_built_corpus_keeps_the_checked_source_files_when_one_fails(server, tmp_path, monkeypatch):
    monkeypatch.setitem(corpora.CORPORA, "testpoems", built_corpus())
    server.files = {**SOURCES, "poet.tang.1000.json": b"x" * len(SOURCES["poet.tang.1000.json"])}  # not published
    with pytest.raises(DataError, match="not the published part poet.tang.1000.json"):
        get("testpoems", tmp_path / "data", base_url=server.url, log=lambda m: None, progress=False)
    assert leftovers(tmp_path) == [".poems.txt.parts"] and not (tmp_path / "data" / "poems.txt").exists()
    server.files, server.paths = dict(SOURCES), []
    path = get("testpoems", tmp_path / "data", base_url=server.url, log=lambda m: None, progress=False)
    assert path.read_text(encoding="utf-8") == BUILT
    assert [p.rsplit("/", 1)[-1] for p in server.paths] == ["poet.tang.1000.json"]  # the first was kept


def test_a_build_that_differs_from_the_published_text_keeps_nothing(server, tmp_path, monkeypatch):
    monkeypatch.setitem(corpora.CORPORA, "testpoems", built_corpus(text=BUILT + "extra"))
    server.files = dict(SOURCES)
    with pytest.raises(DataError, match="text built from the testpoems source files is not the published one"):
        get("testpoems", tmp_path / "data", base_url=server.url, log=lambda m: None, progress=False)
    assert not (tmp_path / "data" / "poems.txt").exists() and not (tmp_path / "data" / ".poems.txt.part").exists()


def test_the_tang_corpus_is_pinned_to_its_58_source_files():
    c = corpora.CORPORA["tang"]
    assert c.filename == "tang_poems.txt" and c.size == 13_137_854 and len(c.sha256) == 64
    assert [p.filename for p in c.parts] == [f"poet.tang.{n}.json" for n in range(0, 58_000, 1000)]
    assert all(tang.COMMIT in p.url and "%E5%85%A8%E5%94%90%E8%AF%97" in p.url for p in c.parts)  # 全唐诗, quoted
    assert len({p.sha256 for p in c.parts}) == 58 and all(0 < p.size < 1 << 20 for p in c.parts)
    r = CliRunner().invoke(data_cli, ["list"])
    assert r.exit_code == 0 and "tang " in r.stdout and "全唐诗" in r.stdout
