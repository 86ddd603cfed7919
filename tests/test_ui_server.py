"""`make ui`'s server (sweeplab.tracking.ui_server, MLflow's plugin `mlflow server --app-name sweeplab`): its index page
makes the training mode the browser's default unless the browser holds a choice; nothing else changes (issue 38)."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import mlflow.server
import pytest
import tomllib

from sweeplab import ui
from sweeplab.tracking import ui_server

ROOT = Path(__file__).resolve().parents[1]
BUILD = Path(mlflow.server.__file__).parent / "js" / "build"  # MLflow's UI: index.html and static/
MAIN_JS = re.compile(rb'<script defer="defer" src="static-files/(static/js/main\.[0-9a-f]+\.js)">')


def declared_entry_point() -> str:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["entry-points"]["mlflow.app"][ui.APP_NAME]


@dataclass
class Served:
    host: str
    port: int


@pytest.fixture(scope="module")
def served(tmp_path_factory, _empty_mlflow_db):
    """The server as `make ui` starts it (sweeplab.ui.start_server), with 2 workers (a larger machine's size)."""
    root = tmp_path_factory.mktemp("ui_server")
    shutil.copy(_empty_mlflow_db, root / "mlflow.db")
    # the entry point as pyproject.toml declares it, found by `mlflow server` even where the installed sweeplab's
    # metadata predates it (an editable install made before it)
    dist = root / "entry" / "sweeplab_ui_check-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sweeplab-ui-check\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(f"[mlflow.app]\n{ui.APP_NAME} = {declared_entry_point()}\n")
    with mock.patch.dict("os.environ", {"PYTHONPATH": f"{dist.parent}:{ROOT / 'src'}"}), \
            mock.patch.object(ui, "server_workers", lambda: 2), mock.patch.object(ui, "app_installed", lambda: True):
        port = free_port()
        server = ui.start_server(f"sqlite:///{root / 'mlflow.db'}", "127.0.0.1", port, output=subprocess.DEVNULL)
    try:
        assert ui.wait_until_answering(server, f"http://127.0.0.1:{port}", timeout_s=300), "the server did not start"
        yield Served("127.0.0.1", port)
    finally:
        ui._stop(server)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fetch(served: Served, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection(served.host, served.port, timeout=60)
    try:
        connection.request("GET", path, headers=headers or {})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def test_the_index_holds_the_script_once_before_the_uis_bundle(served):
    status, headers, page = fetch(served, "/")
    original = (BUILD / "index.html").read_bytes()
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert page.count(ui_server.SCRIPT) == 1
    assert page.index(ui_server.SCRIPT) < MAIN_JS.search(page).start()
    assert page.replace(ui_server.SCRIPT, b"") == original  # nothing else changed
    assert int(headers["content-length"]) == len(page)


def test_assets_health_and_the_api_pass_untouched(served):
    bundle = MAIN_JS.search((BUILD / "index.html").read_bytes()).group(1).decode()
    status, headers, body = fetch(served, f"/static-files/{bundle}")
    assert status == 200 and body == (BUILD / bundle).read_bytes()
    assert int(headers["content-length"]) == len(body)
    assert fetch(served, "/health")[::2] == (200, b"OK")
    status, headers, body = fetch(served, "/api/2.0/mlflow/experiments/search?max_results=5")
    assert status == 200 and headers["content-type"].startswith("application/json")
    assert [e["name"] for e in json.loads(body)["experiments"]] == ["Default"]
    status, _, body = fetch(served, "/static-files/index.html")  # the same page at another path: MLflow's, as it is
    assert ui_server.SCRIPT not in body


def test_a_browsers_cached_index_is_revalidated_to_the_page_with_the_script(served):
    _, headers, _ = fetch(served, "/")
    etag = headers["etag"]
    assert ui_server.ETAG_SUFFIX.decode() in etag
    status, again, body = fetch(served, "/", {"If-None-Match": etag})
    assert (status, again["etag"], body) == (304, etag, b"")
    # a copy cached from a plain `mlflow server` at this address (its ETag, its date) or asked for in part
    for stale in ({"If-None-Match": etag.replace(ui_server.ETAG_SUFFIX.decode(), "")},
                  {"If-Modified-Since": "Fri, 01 Jan 2100 00:00:00 GMT"}, {"Range": "bytes=0-99"}):
        status, _, page = fetch(served, "/", stale)
        assert status == 200 and page.count(ui_server.SCRIPT) == 1, stale


NODE_CHECK = """
const [script, cases] = [process.argv[1], JSON.parse(process.argv[2])];
const out = cases.map(([stored, throws]) => {
  const store = new Map(stored === null ? [] : [[KEY, stored]]);
  globalThis.localStorage = {
    getItem: k => { if (throws) throw new Error('denied'); return store.has(k) ? store.get(k) : null; },
    setItem: (k, v) => { if (throws) throw new Error('denied'); store.set(k, String(v)); },
  };
  new Function(script)();
  const kept = store.has(KEY) ? store.get(KEY) : null;
  return [kept, kept ? JSON.parse(kept) : 'genai'];  // the value, then the mode as the UI's bundle reads it
});
console.log(JSON.stringify(out));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the script (its text: the test below)")
def test_the_script_stores_the_training_mode_only_where_no_choice_is_stored():
    script = ui_server.SCRIPT.decode().removeprefix("<script>").removesuffix("</script>")
    cases = [[None, False], ['"genai"', False], ['"machine_learning"', False], ["", False], [None, True]]
    check = NODE_CHECK.replace("KEY", json.dumps(ui_server.STORAGE_KEY))
    result = subprocess.run(["node", "-e", check, script, json.dumps(cases)], capture_output=True, text=True,
                            timeout=60, check=True)
    assert json.loads(result.stdout) == [
        ['"machine_learning"', "machine_learning"],  # a fresh browser: the training mode
        ['"genai"', "genai"],  # the user chose GenAI: kept
        ['"machine_learning"', "machine_learning"],
        ['"machine_learning"', "machine_learning"],  # "" reads as nothing stored in the bundle too
        [None, "genai"],  # storage denied: no error, the UI's default
    ]


def test_the_script_writes_only_where_nothing_is_stored():
    assert ui_server.SCRIPT == (b'<script>try{if(!localStorage.getItem("mlflow.workflowType_v1"))'
                                b'localStorage.setItem("mlflow.workflowType_v1",JSON.stringify("machine_learning"));'
                                b'if(!localStorage.getItem("mlflow.assistant.fab.autoOpenedOnFirstLoad_v1"))'
                                b'localStorage.setItem("mlflow.assistant.fab.autoOpenedOnFirstLoad_v1",'
                                b'JSON.stringify(true));}catch(e){}</script>')


def test_mlflows_ui_opens_its_assistant_once_under_the_key_the_script_notes():
    (bundle,) = (BUILD / "static" / "js").glob("main.*.js")
    text = bundle.read_text()
    assert '{key:"mlflow.assistant.fab.autoOpenedOnFirstLoad",version:1,initialValue:!1}' in text
    assert '{key:"mlflow.assistant.panelOpen",version:1,initialValue:!1}' in text


def test_mlflows_ui_reads_its_mode_where_the_script_writes_it():
    """MLflow 3.17's bundle: the mode's useLocalStorage key and version, its `${key}_v${version}` storage name and
    JSON values; a new MLflow that changes them fails here."""
    (bundle,) = (BUILD / "static" / "js").glob("main.*.js")
    text = bundle.read_text()
    assert 'e.GENAI="genai",e.MACHINE_LEARNING="machine_learning"' in text
    assert '{key:"mlflow.workflowType",version:1,initialValue:c}' in text
    assert "const o=(e,t)=>`${e}_v${t}`;const i=(e,t,n,r)=>{const i=o(e,t);try{const e=window.localStorage." \
           "getItem(i);return e?JSON.parse(e):r}" in text


def test_the_entry_point_is_a_factory_mlflow_runs_with_uvicorn_factory():
    assert declared_entry_point() == "sweeplab.tracking.ui_server:create_app"
    assert mlflow.server._is_factory(declared_entry_point())  # `mlflow server` then passes --factory to uvicorn


def test_a_page_in_chunks_gets_the_script_and_its_length():
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/html; charset=utf-8"), (b"content-length", b"47"),
                                (b"etag", b'"abc"')]})
        await send({"type": "http.response.body", "body": b"<html><head><script src=", "more_body": True})
        await send({"type": "http.response.body", "body": b"'main.js'></script></head>", "more_body": False})

    sent = asyncio.run(call(ui_server.TrainingModeIndex(app), "GET", "/"))
    start, body = sent
    page = b"<html><head>" + ui_server.SCRIPT + b"<script src='main.js'></script></head>"
    assert body == {"type": "http.response.body", "body": page, "more_body": False}
    assert dict(start["headers"]) == {b"content-type": b"text/html; charset=utf-8",
                                      b"content-length": str(len(page)).encode(),
                                      b"etag": b'"abc' + ui_server.ETAG_SUFFIX + b'"'}
    for method, path in (("POST", "/"), ("GET", "/index.html"), ("HEAD", "/")):
        assert asyncio.run(call(ui_server.TrainingModeIndex(app), method, path))[1]["more_body"] is True


def test_health_answers_with_the_token_make_ui_gave_the_server_and_nothing_else_changes():
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"OK", "more_body": False})

    from sweeplab.core import channels

    start, body = asyncio.run(call(ui_server.TrainingModeIndex(app, token="t0ken"), "GET", "/health"))
    assert start["headers"] == [(b"content-length", b"2"), (channels.UI_TOKEN_HEADER.lower().encode(), b"t0ken")]
    assert body["body"] == b"OK"
    assert asyncio.run(call(ui_server.TrainingModeIndex(app), "GET", "/health"))[0]["headers"] == [
        (b"content-length", b"2")]  # no token given: MLflow's answer as it is
    assert len(asyncio.run(call(ui_server.TrainingModeIndex(app, token="t0ken"), "GET", "/api/x"))[0]["headers"]) == 1


async def call(app, method: str, path: str) -> list[dict]:
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    await app({"type": "http", "method": method, "path": path, "headers": []}, receive, send)
    return sent


def test_an_install_without_the_entry_point_serves_mlflows_app_and_says_so(monkeypatch, tmp_path, capsys,
                                                                          _empty_mlflow_db):
    started = []

    class Server:
        pid = 0

        def poll(self):
            return 0

    monkeypatch.setattr(ui, "app_installed", lambda: False)
    monkeypatch.setattr(ui.subprocess, "Popen", lambda command, **kwargs: started.append(command) or Server())
    monkeypatch.setattr(ui, "wait_until_answering", lambda server, base, **kwargs: True)
    monkeypatch.setattr(ui, "serve_until_stopped", lambda server: 0)
    monkeypatch.setattr(ui, "_stop", lambda server: None)
    shutil.copy(_empty_mlflow_db, tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert ui.main(["--port", str(free_port())]) == 0
    servers = [command for command in started if command[1:2] == ["server"]]  # not the reaper of each (orphans)
    assert len(servers) == 1 and "--app-name" not in servers[0]
    assert "not installed" in capsys.readouterr().out.splitlines()[-1]
    monkeypatch.setattr(ui, "app_installed", lambda: True)
    ui.start_server("sqlite:///mlflow.db", "127.0.0.1", 5999)
    assert [command for command in started if command[1:2] == ["server"]][1][-2:] == ["--app-name", "sweeplab"]
