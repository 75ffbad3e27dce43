"""The ``meshplan serve`` application (Starlette, an ASGI framework): the page, its assets and a JSON API.

API (every request body is JSON, at most ``Config.max_body_bytes``; every error is
``{"error": {"field", "message"}}`` with a 4xx status, never a trace):

- ``GET  /api/catalog``: models, accelerators, job options, the page's default scenario, limits, which
  optional panels exist.
- ``POST /api/plan`` ``{"scenario": {...}}``: the search and its explanation (web.compute.plan).
- ``POST /api/conditions`` ``{"scenario": {...}}``: the conditions of change (web.compute.conditions).
- ``POST /api/evaluate`` ``{"scenario": {...}, "plan": "tp=8,dp_shard=8"}``: one plan in detail.
- ``POST /api/spec`` ``{"kind": "model"|"job", "doc": {"format", "text", "name"}}``: an uploaded spec checked.
- ``POST /api/export`` ``{"scenario", "plan", "framework"}``: a plan as a framework's configuration, where
  ``meshplan.frameworks`` is installed.

Searches run in a bounded pool of worker processes (web.pool) with a time limit; identical requests share
one computation and its answer is cached (``Config.cache_entries``, least recently used).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from meshplan.errors import SpecError
from meshplan.web import extensions
from meshplan.web.pool import Pool, PoolBusy, TaskFailed, TaskTimeout
from meshplan.web.scenario import DEFAULTS, MAX_SPEC_CHARS, cache_key, normalise

log = logging.getLogger("meshplan.web")

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


@dataclass(slots=True)
class Config:
    workers: int = 2
    """Worker processes: searches that run at once."""
    time_limit_s: float = 60.0
    """A search (and a plan's detail) past this is stopped and answered 422."""
    conditions_time_limit_s: float = 300.0
    """The conditions of change (a series of searches) past this are stopped."""
    condition_workers: int = 1
    """Worker processes for the conditions of change, apart from the searches', so that a what-if's search
    never waits behind them."""
    max_waiting: int = 64
    """Requests that may wait for a worker; beyond, 503 at once."""
    cache_entries: int = 64
    """Answers kept for identical requests (least recently used dropped first)."""
    max_body_bytes: int = 256 * 1024
    allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS
    """Host headers answered (DNS rebinding: a web site cannot reach the local server under its own name);
    ('*',) where the server listens beyond loopback."""
    defaults: dict[str, Any] = field(default_factory=lambda: dict(DEFAULTS))
    """The scenario the page opens on (``meshplan serve``'s scenario flags)."""


# --- responses ----------------------------------------------------------------------------------------------

def _finite(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by None (strict JSON)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(_finite(obj), allow_nan=False, separators=(",", ":")).encode()


def _json(body: bytes, status: int = 200) -> Response:
    return Response(body, status_code=status, media_type="application/json")


def error(status: int, field_name: str, message: str) -> Response:
    return _json(_json_bytes({"error": {"field": field_name, "message": message}}), status)


class BadRequest(Exception):
    def __init__(self, status: int, field_name: str, message: str) -> None:
        super().__init__(message)
        self.status, self.field, self.message = status, field_name, message


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The request's JSON object, read up to ``limit`` bytes (413 beyond, whatever Content-Length says)."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise BadRequest(415, "content-type", "send the request body as application/json")
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise BadRequest(413, "body", f"the request is larger than the {limit // 1024:,} KiB this server accepts "
                                      f"(spec documents: at most {MAX_SPEC_CHARS // 1024} KiB each)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(413, "body", f"the request is larger than the {limit // 1024:,} KiB this server "
                                          "accepts")
        chunks.append(chunk)
    try:
        data = json.loads(b"".join(chunks).decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as exc:
        raise BadRequest(400, "body", f"the request body is not valid JSON: {str(exc)[:160]}") from None
    if not isinstance(data, dict):
        raise BadRequest(400, "body", "the request body must be a JSON object")
    return data


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


# --- the app's state -----------------------------------------------------------------------------------------

class Answers:
    """Cached answers by request key, and the computations under way (identical requests share one).

    A computation that may be abandoned (the conditions of change: a series of searches a what-if user
    has often moved past) is cancelled, and its worker freed, once no request waits for it any more."""

    def __init__(self, entries: int) -> None:
        self.entries = entries
        self._done: OrderedDict[str, bytes] = OrderedDict()
        self._running: dict[str, asyncio.Task[bytes]] = {}
        self._waiters: dict[str, int] = {}
        self.hits = 0

    async def get(self, key: str, compute: Callable[[], Awaitable[Any]], *, abandon: bool = False
                  ) -> tuple[bytes, str]:
        """The answer's JSON and how it came: 'hit' (cached), 'shared' (another request's computation under
        way) or 'miss' (computed for this request)."""
        if key in self._done:
            self._done.move_to_end(key)
            self.hits += 1
            return self._done[key], "hit"
        task = self._running.get(key)
        how = "shared" if task is not None else "miss"
        if task is None:
            async def run() -> bytes:
                try:
                    body = _json_bytes(await compute())
                finally:
                    self._running.pop(key, None)
                if self.entries:
                    self._done[key] = body
                    while len(self._done) > self.entries:
                        self._done.popitem(last=False)
                return body
            task = self._running[key] = asyncio.ensure_future(run())
        self._waiters[key] = self._waiters.get(key, 0) + 1
        try:
            # shielded: a client that goes away does not cancel the others' computation
            return await asyncio.shield(task), how
        finally:
            self._waiters[key] -= 1
            if not self._waiters[key]:
                del self._waiters[key]
                if abandon and not task.done():
                    task.cancel()


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone away (closed the connection: a page that moved on aborts its fetch)."""
    while not await request.is_disconnected():
        await asyncio.sleep(0.25)


class State:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.pool = Pool(config.workers, max_waiting=config.max_waiting)
        self.slow_pool = Pool(config.condition_workers, max_waiting=config.max_waiting)
        self.answers = Answers(config.cache_entries)
        self.assets = _load_assets()
        self.catalog: bytes | None = None


ASSETS = {
    "/": ("meshplan.web", "static/index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("meshplan.web", "static/app.js", "text/javascript; charset=utf-8"),
    "/static/app.css": ("meshplan.web", "static/app.css", "text/css; charset=utf-8"),
    "/static/favicon.svg": ("meshplan.web", "static/favicon.svg", "image/svg+xml"),
    "/static/charts.js": ("meshplan.report", "assets/charts.js", "text/javascript; charset=utf-8"),
    "/static/echarts.min.js": ("meshplan.report", "assets/echarts.min.js", "text/javascript; charset=utf-8"),
    "/static/ECHARTS-LICENSE.txt": ("meshplan.report", "assets/ECHARTS-LICENSE.txt", "text/plain; charset=utf-8"),
    "/static/ECHARTS-NOTICE.txt": ("meshplan.report", "assets/ECHARTS-NOTICE.txt", "text/plain; charset=utf-8"),
}
"""Every file the server sends, from the package itself (nothing is fetched from elsewhere): a fixed
list, so no request names a path."""


def _load_assets() -> dict[str, tuple[bytes, str, str]]:
    out = {}
    for route, (package, name, ctype) in ASSETS.items():
        data = resources.files(package).joinpath(name).read_bytes()
        out[route] = (data, ctype, '"' + hashlib.sha256(data).hexdigest()[:20] + '"')
    return out


def _state(request: Request) -> State:
    return request.app.state.meshplan


# --- endpoints -----------------------------------------------------------------------------------------------

async def asset(request: Request) -> Response:
    data, ctype, etag = _state(request).assets[request.url.path]
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    return Response(data, media_type=ctype, headers=headers)


async def catalog(request: Request) -> Response:
    from meshplan.catalog import list_accelerators, list_models, load_cluster, load_model
    from meshplan.cost.params import param_counts
    from meshplan.specs.job import OPTIMIZERS, PRECISIONS, SOFTWARE

    st = _state(request)
    if st.catalog is None:
        models = []
        for name in list_models():
            m = load_model(name)
            pc = param_counts(m)
            models.append({"name": name, "params": pc.total, "active_params": pc.active, "moe": m.is_moe,
                           "n_layers": m.n_layers})
        accels = []
        for name in list_accelerators():
            c = load_cluster(name)
            accels.append({"name": name, "description": c.accelerator.description,
                           "gpus_per_node": c.gpus_per_node, "hbm_capacity_bytes": c.accelerator.hbm_capacity_bytes,
                           "inter_node_bytes_per_s": c.inter.nic_bytes_per_s,
                           "bf16_flop_per_s": c.accelerator.bf16_flop_per_s})
        st.catalog = _json_bytes({
            "models": models, "accelerators": accels, "optimizers": list(OPTIMIZERS),
            "precisions": list(PRECISIONS), "software": list(SOFTWARE), "spaces": ["full", "dp-tp"],
            "defaults": st.config.defaults, "panels": extensions.available(),
            "limits": {"time_limit_s": st.config.time_limit_s,
                       "conditions_time_limit_s": st.config.conditions_time_limit_s,
                       "max_spec_chars": MAX_SPEC_CHARS, "max_body_bytes": st.config.max_body_bytes,
                       "workers": st.config.workers},
        })
    return _json(st.catalog)


async def _scenario(body: dict[str, Any]) -> dict[str, Any]:
    """The body's normalised scenario, its specs built once here so that bad input is answered at once,
    without waiting for a worker."""
    from meshplan.web.scenario import build

    s = normalise(body.get("scenario", {}))
    await asyncio.to_thread(build, s)
    return s


def _api(handler: Callable[[Request, dict[str, Any]], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """An API endpoint: its body read and checked, and every failure answered as JSON with its status."""

    async def endpoint(request: Request) -> Response:
        st = _state(request)
        try:
            body = await read_json(request, st.config.max_body_bytes)
            return await handler(request, body)
        except BadRequest as exc:
            return error(exc.status, exc.field, exc.message)
        except SpecError as exc:
            return error(422, exc.field, exc.message)
        except PoolBusy:
            return error(503, "server", f"all {st.config.workers} workers are busy and "
                                        f"{st.config.max_waiting} requests are waiting; try again shortly")
        except TaskTimeout:
            return error(422, "scenario", "the computation took longer than this server's limit "
                                          f"({st.config.time_limit_s:.0f} s for a search, "
                                          f"{st.config.conditions_time_limit_s:.0f} s for the conditions of "
                                          "change); run it with `meshplan plan` on the command line, or ask "
                                          "for a smaller space (dp-tp) or fewer GPUs")
        except TaskFailed as exc:
            return error(500, "server", str(exc))

    return endpoint


async def _computed(request: Request, kind: str, args: tuple[Any, ...], key: str, limit_s: float, *,
                    slow: bool = False) -> Response:
    """The answer to a request computed in a worker, or cached. A slow computation (the conditions of
    change) runs in its own pool and is abandoned when its client goes away and no other waits for it."""
    st = _state(request)
    pool = st.slow_pool if slow else st.pool
    answer = asyncio.ensure_future(st.answers.get(f"{kind}:{key}", lambda: pool.run(kind, args, limit_s),
                                                  abandon=slow))
    if not slow:
        return _answer(*(await answer))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not answer.done():
        answer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await answer
        return Response(status_code=499)  # nobody reads it
    return _answer(*answer.result())


def _answer(body: bytes, how: str) -> Response:
    response = _json(body)
    response.headers["x-meshplan-cache"] = how
    return response


async def plan(request: Request, body: dict[str, Any]) -> Response:
    s = await _scenario(body)
    return await _computed(request, "plan", (s,), cache_key(s), _state(request).config.time_limit_s)


async def conditions(request: Request, body: dict[str, Any]) -> Response:
    s = await _scenario(body)
    return await _computed(request, "conditions", (s,), cache_key(s), _state(request).config.conditions_time_limit_s,
                           slow=True)


def _plan_string(body: dict[str, Any]) -> str:
    p = body.get("plan")
    if not isinstance(p, str) or not 0 < len(p) <= 2000:
        raise SpecError("plan", "must be a plan string of at most 2,000 characters, e.g. tp=8,dp_shard=8")
    return p


async def evaluate(request: Request, body: dict[str, Any]) -> Response:
    s = await _scenario(body)
    p = _plan_string(body)
    return await _computed(request, "evaluate", (s, p), f"{p}|{cache_key(s)}", _state(request).config.time_limit_s)


async def spec(request: Request, body: dict[str, Any]) -> Response:
    from meshplan.web.compute import inspect_spec

    if set(body) - {"kind", "doc"}:
        raise SpecError("body", "expected keys kind and doc")
    return _json(_json_bytes(await asyncio.to_thread(inspect_spec, body.get("kind"), body.get("doc"))))


async def export(request: Request, body: dict[str, Any]) -> Response:
    s = await _scenario(body)
    p = _plan_string(body)
    fw = body.get("framework")
    if not isinstance(fw, str):
        raise SpecError("framework", f"must be one of {', '.join(extensions.export_frameworks()) or '(none)'}")
    return await _computed(request, "export", (s, p, fw), f"{fw}|{p}|{cache_key(s)}",
                           _state(request).config.time_limit_s)


async def health(request: Request) -> Response:
    st = _state(request)
    return _json(_json_bytes({"status": "ok", "searches": st.pool.load, "conditions": st.slow_pool.load,
                              "cache_hits": st.answers.hits}))


# --- errors and headers ---------------------------------------------------------------------------------------

async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = {404: "no such page", 405: "method not allowed"}.get(exc.status_code, str(exc.detail))
    if request.url.path.startswith("/api/"):
        return error(exc.status_code, "path", f"{message}: {request.method} {request.url.path[:100]}")
    return Response(f"{exc.status_code}: {message}\n", status_code=exc.status_code, media_type="text/plain")


async def server_error(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return error(500, "server", "unexpected error; the server's log has the details")


SECURITY_HEADERS = [
    (b"content-security-policy",
     b"default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
     b"connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]
"""Sent with every response: the page runs only the scripts the package serves (ECharts draws inline
styles in its tooltips, hence 'unsafe-inline' for styles alone) and is never framed."""


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


def host_name(header: str) -> str:
    """The name of a Host header without its port: 'localhost:8765' -> 'localhost', '[::1]:8765' -> '::1'."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class HostCheck:
    """Answers only requests whose Host header names one of ``allowed`` ('*': any): with the server on
    loopback, a web page whose domain is made to resolve to 127.0.0.1 (DNS rebinding) is refused."""

    def __init__(self, app: ASGIApp, allowed: tuple[str, ...]) -> None:
        self.app = app
        self.any = "*" in allowed
        self.allowed = {host_name(h) for h in allowed}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.any:
            host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), "")
            if host_name(host) not in self.allowed:
                await Response("400: this server answers only requests to "
                               f"{', '.join(sorted(self.allowed))}\n", status_code=400,
                               media_type="text/plain")(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(config: Config | None = None) -> Starlette:
    config = config or Config()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        st = app.state.meshplan
        await asyncio.gather(st.pool.start(), st.slow_pool.start())
        try:
            yield
        finally:
            await asyncio.gather(st.pool.close(), st.slow_pool.close())

    routes = [Route(path, asset, methods=["GET", "HEAD"]) for path in ASSETS]
    routes += [
        Route("/api/catalog", catalog, methods=["GET"]),
        Route("/api/health", health, methods=["GET"]),
        Route("/api/plan", _api(plan), methods=["POST"]),
        Route("/api/conditions", _api(conditions), methods=["POST"]),
        Route("/api/evaluate", _api(evaluate), methods=["POST"]),
        Route("/api/spec", _api(spec), methods=["POST"]),
        Route("/api/export", _api(export), methods=["POST"]),
    ]
    middleware = [Middleware(SecurityHeaders),
                  Middleware(HostCheck, allowed=config.allowed_hosts),
                  Middleware(GZipMiddleware, minimum_size=1024, compresslevel=6)]
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                    exception_handlers={HTTPException: http_error, Exception: server_error})
    app.state.meshplan = State(config)
    return app
