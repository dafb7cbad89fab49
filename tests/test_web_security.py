"""The playground server's guards: an API key (chargpt serve --api-key, or one it makes when it listens beyond this
machine) asked of every request but the page's own files, as OpenAI's clients send it; requests that change
something refused when a page on another site sends them (a form post, in a real browser too); no server paths in
replies; training from the page off by default beyond this machine."""

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import pytest
from helpers import CHROMIUM, CORPUS_TEXT, fake_training, launch_chromium, need, sigterms, train_tiny

from chargpt.errors import ChargptError

need("starlette")
need("uvicorn")
need("httpx2" if sys.version_info >= (3, 11) else "httpx")
from starlette.testclient import TestClient  # noqa: E402

from chargpt.web import server as serve  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
HERE = "http://127.0.0.1"
KEY = "k3y-for-tests_only"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("guarded")
    train_tiny(root)
    return root


def keyed(served, key=KEY, **kw):
    return TestClient(serve.create_app(served, device="cpu", api_key=key, **kw), base_url=HERE)


def bearer(key):
    return {"Authorization": f"Bearer {key}"}


# --- the API key ------------------------------------------------------------------------------------------------
def test_with_a_key_every_endpoint_but_the_pages_files_needs_it(served):
    client = keyed(served)
    for path in ("/", "/static/main.js", "/static/api.js"):  # the page loads before it can send the key
        assert client.get(path).status_code == 200, path
    for path in ("/api/runs", "/api/runs/tiny", "/api/status", "/api/train", "/api/corpora", "/v1/models"):
        for headers in ({}, bearer("wrong"), {"Authorization": KEY}, bearer(KEY[:-1]), bearer(KEY + "x")):
            r = client.get(path, headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", (path, headers, r.text)
            error = r.json()["error"]
            message = error["message"] if path.startswith("/v1/") else error  # OpenAI's shape under /v1
            assert "\n" not in message and "Authorization: Bearer KEY" in message and KEY not in r.text
        assert client.get(path, headers=bearer(KEY)).status_code == 200, path
    r = client.post("/api/generate", json={"run": "tiny", "max_new_tokens": 3, "seed": 1})
    assert r.status_code == 401
    assert client.post("/api/generate", json={"run": "tiny", "max_new_tokens": 3, "seed": 1},
                       headers=bearer(KEY)).status_code == 200


def test_the_openai_client_works_with_the_key_and_gets_401_without(served):
    openai = need("openai")
    app = serve.create_app(served, device="cpu", api_key=KEY)

    def client(key):
        return openai.OpenAI(base_url="http://localhost/v1", api_key=key, max_retries=0,
                             http_client=TestClient(app, base_url="http://localhost"))
    good = client(KEY)
    assert [m.id for m in good.models.list()] == ["tiny"]
    done = good.completions.create(model="tiny", prompt="ROMEO:", max_tokens=5, seed=1, temperature=0)
    assert len(done.choices[0].text) == 5
    for wrong in ("wrong", KEY.upper()):
        with pytest.raises(openai.AuthenticationError) as refused:
            client(wrong).completions.create(model="tiny", prompt="ROMEO:", max_tokens=5)
        assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"


def test_the_key_comes_from_the_flag_or_the_environment_and_off_loopback_one_is_made():
    assert serve.api_key_for("given", local=True) == ("given", False)
    assert serve.api_key_for(None, local=False, environ={"CHARGPT_API_KEY": "from-env"}) == ("from-env", False)
    assert serve.api_key_for(None, local=True, environ={}) == (None, False)  # this machine only: none needed
    made, was_made = serve.api_key_for(None, local=False, environ={})
    assert was_made and len(made) >= 32 and made != serve.api_key_for(None, local=False, environ={})[0]
    assert serve.api_key_for(None, local=False, auth=False, environ={}) == (None, False)  # --no-auth
    with pytest.raises(ChargptError, match="contradict"):
        serve.api_key_for("k", local=False, auth=False, environ={})
    for bad in ("", "two words", "x" * 300, "caf\u00e9", "line\nbreak"):
        with pytest.raises(ChargptError, match="printable ASCII"):
            serve.api_key_for(bad, local=False, environ={})


def start_serving(served, *flags, env=None):
    proc = subprocess.Popen([sys.executable, "-m", "chargpt.serve", "--checkpoints", str(served), "--port", "0",
                             "--device", "cpu", *flags], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    return proc


def read_until_serving(proc):
    """The lines the command printed before it served: up to its last start-up line."""
    lines = [proc.stderr.readline()]
    assert lines[0].startswith("chargpt playground: http://127.0.0.1:"), lines
    url = lines[0].split()[2]
    deadline = time.monotonic() + 30
    while True:  # its start-up lines are all out before it answers
        try:
            status_of(url, path="/static/api.js")
            break
        except OSError:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
    return url, lines


def status_of(url, key=None, path="/api/runs"):
    request = urllib.request.Request(url + path, headers=bearer(key) if key else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_serving_beyond_this_machine_makes_a_key_prints_it_once_and_does_not_train(served):
    proc = start_serving(served, "--host", "0.0.0.0", env={"CHARGPT_API_KEY": ""})
    try:
        url, _ = read_until_serving(proc)
        said = proc.stderr.readline()
        assert said.startswith(f"this server asks every request for a key, made for this session: open {url}/?token=")
        key = said.split("?token=")[1].split()[0]
        assert status_of(url)[0] == 401 and status_of(url, "wrong")[0] == 401
        ok, listed = status_of(url, key)
        assert ok == 200 and '"tiny"' in listed
        off, body = status_of(url, key, "/api/train")  # the page says why it does not train, and what allows it
        assert off == 403 and "listens on 0.0.0.0" in body and "chargpt serve --training" in body
        assert proc.stderr.readline().startswith("training from the page is off")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert key not in proc.stderr.read()  # printed once


def test_no_auth_is_the_explicit_way_to_serve_the_network_without_a_key(served):
    proc = start_serving(served, "--host", "0.0.0.0", "--no-auth", "--training", env={"CHARGPT_API_KEY": ""})
    try:
        url, _ = read_until_serving(proc)
        assert proc.stderr.readline().startswith("warning: serving on 0.0.0.0 with --no-auth: anyone who can reach")
        assert status_of(url)[0] == 200 and status_of(url, path="/api/train")[0] == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# --- no server paths in replies -----------------------------------------------------------------------------------
def test_replies_name_runs_and_texts_without_the_servers_paths(served, tmp_path):
    data = tmp_path / "texts"
    data.mkdir()
    (data / "poems.txt").write_text(CORPUS_TEXT, encoding="utf-8")
    client = TestClient(serve.create_app(served, device="cpu", data_dir=data), base_url=HERE)
    runs, corpora, details = client.get("/api/runs"), client.get("/api/corpora"), client.get("/api/runs/tiny")
    assert runs.json()["folder"] == served.name and corpora.json()["data_dir"] == "texts"
    assert [c["name"] for c in corpora.json()["data"]] == ["poems.txt"]
    for reply in (runs, corpora, details):
        assert str(served) not in reply.text and str(tmp_path) not in reply.text and str(Path.home()) not in reply.text
    assert details.json()["train_config"]["out_dir"] == "tiny"


# --- requests from another site -------------------------------------------------------------------------------------
def changing_routes(app):
    """(method, path) of every route that takes a method that may change something, path parameters filled in."""
    found = []
    for route in app.routes:
        for method in sorted(getattr(route, "methods", None) or ()):
            if method not in ("GET", "HEAD", "OPTIONS"):
                found.append((method, route.path.replace("{rest:path}", "completions").replace("{name}", "tiny")
                              .replace("{id}", "tiny")))
    return found


@pytest.fixture
def training_app(served, tmp_path):
    app = serve.create_app(tmp_path / "checkpoints", device="cpu", data_dir=None)
    proc, signals = fake_training(app, tmp_path)
    yield app, proc, signals
    proc.kill()
    proc.wait()


def test_a_cross_site_form_post_to_every_changing_endpoint_is_refused_and_does_nothing(training_app):
    app, proc, signals = training_app
    client = TestClient(app, base_url="http://127.0.0.1:8000")
    routes = changing_routes(app)
    assert {p for _, p in routes} >= {"/api/generate", "/api/stop", "/api/inside", "/api/novelty", "/api/train",
                                      "/api/train/upload", "/api/train/stop", "/api/train/resume", "/v1/completions"}
    for method, path in routes:
        for headers in ({"Origin": "http://evil.example"}, {"Origin": "null"},
                        {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
                        {"Sec-Fetch-Site": "cross-site"},
                        {"Origin": "http://127.0.0.1:9000", "Sec-Fetch-Site": "same-site"}):  # another port
            r = client.request(method, path, content=b"run=tiny", headers={**FORM, **headers})
            assert r.status_code == 403, (method, path, headers, r.text)
            error = r.json()["error"]
            message = error["message"] if path.startswith("/v1/") else error
            assert "another site" in message and "\n" not in message
    assert proc.poll() is None and sigterms(signals) == 0  # the training runs on
    assert not (app.state.trainings.home / "uploads").exists()  # nothing was uploaded

    # the page's own requests, and clients that are not browsers, pass
    for headers in ({"Origin": "http://127.0.0.1:8000", "Sec-Fetch-Site": "same-origin"},
                    {"Origin": "http://127.0.0.1:8000"}, {}):
        r = client.post("/api/generate", json={"run": "nothing"}, headers=headers)
        assert r.status_code == 404, (headers, r.text)  # the endpoint answered
    assert client.post("/api/train/stop", headers={"Sec-Fetch-Site": "same-origin"}).status_code == 200
    assert sigterms(signals, at_least=1) == 1


def test_a_page_on_a_second_origin_cannot_stop_the_training_in_a_browser(served, tmp_path):
    if not CHROMIUM:
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    sync_api = need("playwright.sync_api")
    app = serve.create_app(tmp_path / "checkpoints", device="cpu")
    proc, signals = fake_training(app, tmp_path)
    try:
        with serve.running(app) as url:
            attack = (f'<!doctype html><form id="f" method="post" action="{url}/api/train/stop">'
                      f'<input name="x" value="1"></form><script>document.getElementById("f").submit()</script>')

            class Page(BaseHTTPRequestHandler):
                def do_GET(self):
                    body = attack.encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

                def log_message(self, *args):
                    pass
            other = ThreadingHTTPServer(("127.0.0.1", 0), Page)  # another port: another origin, the same site
            Thread(target=other.serve_forever, daemon=True).start()
            try:
                with sync_api.sync_playwright() as p:
                    browser = launch_chromium(p)
                    page = browser.new_page()
                    with page.expect_response(lambda r: r.url.endswith("/api/train/stop")) as answer:
                        page.goto(f"http://127.0.0.1:{other.server_address[1]}/")
                    assert answer.value.status == 403 and "another site" in answer.value.text()
                    browser.close()
            finally:
                other.shutdown()
                other.server_close()
        assert proc.poll() is None and sigterms(signals) == 0
    finally:
        proc.kill()
        proc.wait()


def test_the_page_keeps_the_key_from_its_address_and_takes_it_out_of_the_address_bar(served):
    if not CHROMIUM:
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    sync_api = need("playwright.sync_api")
    with serve.running(serve.create_app(served, device="cpu", api_key=KEY)) as url, \
            sync_api.sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page()
        page.goto(f"{url}/?token={KEY}#write")
        page.wait_for_selector("body[data-ready='1']", timeout=60_000)
        assert "token" not in page.url and KEY not in page.url and page.url.endswith("/#write")
        assert page.eval_on_selector("#run", "s => Array.from(s.options, o => o.value)") == ["tiny"]
        page.reload()  # the key lasts for the tab
        page.wait_for_selector("body[data-ready='1']", timeout=60_000)
        other = browser.new_page()  # a tab without it is told how to open the page
        other.goto(url)
        # a function, not an expression: polling an expression evals it in the page, which its CSP forbids (this
        # failed whenever the page was slow enough to need a second look)
        other.wait_for_function("() => document.getElementById('no-runs').textContent.includes('?token=KEY')",
                                timeout=60_000)
        browser.close()
