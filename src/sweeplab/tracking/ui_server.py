"""The MLflow server `make ui` runs: MLflow's own app, whose index page first makes the training mode the browser's
default unless the browser already holds a choice. Registered as MLflow's server plugin (entry point group
`mlflow.app`, name `sweeplab`): `mlflow server --app-name sweeplab` (sweeplab.ui.start_server).

MLflow 3.17's UI takes its mode from the address's `workflowType`, else from the browser's localStorage entry
`mlflow.workflowType_v1` (JSON: `"genai"` or `"machine_learning"`; written only when the user flips the sidebar's
switch), else GenAI. sweeplab's addresses carry `workflowType=machine_learning`, but MLflow's own links (a run in the
runs table, a run's parent) drop it, so on a browser that never touched the switch they open GenAI pages. Every
address of the UI loads the index page first (the UI routes after `#`), so a script there, run before the UI's
bundle, stores `"machine_learning"` when no choice is stored: a browser whose user picked GenAI keeps it.

`GET /health` answers as MLflow's does, with one header more: the token `make ui` gave this server
(channels.UI_TOKEN_ENV, as channels.UI_TOKEN_HEADER), by which sweeplab.ui tells its own server from another program
holding the port. Only the index (GET, 200, text/html) changes: the script goes in before its first `<script>`, Content-Length follows,
and its ETag gets a suffix naming the script, so a browser that cached the page from a plain `mlflow server` on the
same address revalidates to the page with the script; assets, the API, `/health` and everything else pass untouched.
"""

from __future__ import annotations

import hashlib
import json
import os

from sweeplab.core import channels

STORAGE_KEY = "mlflow.workflowType_v1"  # MLflow 3.17's useLocalStorage key: f"{key}_v{version}"
TRAINING_MODE = "machine_learning"
# MLflow 3.17 opens its Assistant panel (a GenAI chat, 330 px of a 1280 px screen) on a browser's first visit and
# notes it under this key: noted as done, the first screen has the width for the comparison's columns, the caveat
# among them (sweeplab.report.saved_view); the panel stays one click away, and a browser that opened it keeps it
ASSISTANT_OPENED_KEY = "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1"
FIRST_VISIT = {STORAGE_KEY: TRAINING_MODE, ASSISTANT_OPENED_KEY: True}
# storage that throws (blocked cookies, a sandboxed frame): the UI's own default, as without sweeplab
SCRIPT = ("<script>try{" + "".join(
    f"if(!localStorage.getItem({json.dumps(key)}))localStorage.setItem({json.dumps(key)},"
    f"JSON.stringify({json.dumps(value)}));" for key, value in FIRST_VISIT.items()) + "}catch(e){}</script>").encode()
ETAG_SUFFIX = f"-sweeplab-{hashlib.sha256(SCRIPT).hexdigest()[:8]}".encode()
# request headers that would let the inner app answer the index with part of it (Range) or with a 304 for a copy
# cached without the script (dates know nothing of the script; ETags are rewritten instead)
_DROPPED = (b"if-modified-since", b"range", b"if-range")


def create_app():
    """The ASGI app: MLflow's FastAPI app (`mlflow.server.fastapi_app:app`, what `mlflow server` runs without
    --app-name) behind TrainingModeIndex. A factory (uvicorn --factory, as `mlflow server` passes for a function), so
    the `mlflow server` process that only looks the entry point up does not build MLflow's app as well."""
    from mlflow.server.fastapi_app import app
    from mlflow.server.handlers import STATIC_PREFIX_ENV_VAR

    return TrainingModeIndex(app, index_path=os.environ.get(STATIC_PREFIX_ENV_VAR, "").rstrip("/") + "/",
                             token=os.environ.get(channels.UI_TOKEN_ENV, ""))


def inject(html: bytes) -> bytes | None:
    """The page with SCRIPT before its first `<script` (else before `</head>`); None where neither is found or the
    script is there already."""
    if SCRIPT in html:
        return None
    at = html.find(b"<script")
    if at < 0:
        at = html.find(b"</head>")
    return None if at < 0 else html[:at] + SCRIPT + html[at:]


class TrainingModeIndex:
    """Pure ASGI middleware (streaming, lifespan and websockets pass through): SCRIPT into the index page; the
    token (when given) as a header of `/health`'s answer."""

    def __init__(self, app, index_path: str = "/", token: str = ""):
        self.app = app
        self.index_path = index_path
        self.token = token.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.token and scope["path"] == self.index_path + "health":
            await self.app(scope, receive, _TokenSender(send, self.token))
            return
        if scope["type"] != "http" or scope["method"] != "GET" or scope["path"] != self.index_path:
            await self.app(scope, receive, send)
            return
        await self.app(_own_validators(scope), receive, _IndexSender(send))


def _own_validators(scope: dict) -> dict:
    """The request as the inner app should see it: If-None-Match holds only the ETags this middleware gave out (the
    suffix removed), and no date validators or ranges."""
    headers = []
    for name, value in scope["headers"]:
        if name in _DROPPED:
            continue
        if name == b"if-none-match":
            ours = [tag.strip().replace(ETAG_SUFFIX, b"") for tag in value.split(b",") if ETAG_SUFFIX in tag]
            if not ours:
                continue
            value = b", ".join(ours)
        headers.append((name, value))
    return {**scope, "headers": headers}


def _with_etag_suffix(headers: list) -> list:
    def suffixed(value: bytes) -> bytes:
        return value[:-1] + ETAG_SUFFIX + b'"' if value.endswith(b'"') else value + ETAG_SUFFIX

    return [(name, suffixed(value) if name.lower() == b"etag" else value) for name, value in headers]


class _TokenSender:
    """A response with the token header added to its start."""

    def __init__(self, send, token: bytes):
        self.send = send
        self.token = token

    async def __call__(self, message):
        if message["type"] == "http.response.start":
            header = (channels.UI_TOKEN_HEADER.lower().encode(), self.token)
            message = {**message, "headers": [*message.get("headers", []), header]}
        await self.send(message)


class _IndexSender:
    """The index's response: a 200 text/html page is held until its last chunk and sent with SCRIPT in it; a 304
    gets the ETag its 200 had; anything else passes as it came."""

    def __init__(self, send):
        self.send = send
        self.start: dict | None = None  # a held response start (the page's body is still coming)
        self.chunks: list[bytes] = []

    async def __call__(self, message):
        if message["type"] == "http.response.start":
            headers = {name.lower(): value for name, value in message.get("headers", [])}
            html = headers.get(b"content-type", b"").startswith(b"text/html") and b"content-encoding" not in headers
            if message["status"] == 200 and html:
                self.start = message
                return
            if message["status"] == 304:
                message = {**message, "headers": _with_etag_suffix(message.get("headers", []))}
            await self.send(message)
            return
        if message["type"] != "http.response.body" or self.start is None:
            await self.send(message)
            return
        self.chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        page = b"".join(self.chunks)
        injected = inject(page)
        headers = list(self.start.get("headers", []))
        if injected is not None:
            page = injected
            headers = [(name, str(len(page)).encode() if name.lower() == b"content-length" else value)
                       for name, value in _with_etag_suffix(headers)]
        await self.send({**self.start, "headers": headers})
        await self.send({"type": "http.response.body", "body": page, "more_body": False})
