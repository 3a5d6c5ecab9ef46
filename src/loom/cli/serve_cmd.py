"""``loom serve``: serve agents over HTTP with uvicorn (the ``server`` extra)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer

from loom.cli._console import say_error

KEEP_ALIVE_S = 65
"""Seconds ``loom serve`` keeps an idle HTTP connection open: longer than clients keep theirs
(httpx and uvicorn's default: 5 s; browsers about 60 s), so that the client, not the server,
closes an idle connection and never sends a request on one the server is closing."""

__all__ = ["serve"]


def serve(
    agents: Annotated[
        Path | None,
        typer.Option("--agents", help="A directory of AGENT.md / YAML agent definitions."),
    ] = None,
    app_spec: Annotated[
        str | None,
        typer.Option("--app", help="module:attr naming an AgentRegistry, an Agent or a list."),
    ] = None,
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", min=1, max=65535)] = 8000,
    store: Annotated[
        str | None,
        typer.Option(
            help="Where sessions live: a SQLite file (default .loom/loom.db), :memory:, or a "
            "PostgreSQL URL postgres://user@host/db (needed by --queue and a fleet)."
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn's log level.")] = "info",
    grpc_port: Annotated[
        int | None,
        typer.Option(
            "--grpc-port",
            help="Also serve Weave over gRPC on this port (same host).",
            min=1,
            max=65535,
        ),
    ] = None,
    keys: Annotated[
        Path | None,
        typer.Option(
            "--keys",
            help="YAML file of API keys: a list of {name, key | key_sha256, agents?, admin?}. "
            "LOOM_API_KEYS (comma-separated keys) adds more.",
        ),
    ] = None,
    max_body: Annotated[
        int, typer.Option("--max-body", help="Largest request body, in bytes (413 past it).")
    ] = 1 << 20,
    max_concurrent_runs: Annotated[
        int,
        typer.Option(
            "--max-concurrent-runs", help="Runs one API key may have at once (429 past it)."
        ),
    ] = 16,
    cors_origin: Annotated[
        list[str] | None,
        typer.Option("--cors-origin", help="Allow browser calls from this origin (repeatable)."),
    ] = None,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-host",
            help="A Host name clients use to reach this server (repeatable; NAME, NAME:PORT, "
            "*.DOMAIN or *). Loopback names and the bound address are always allowed; other "
            "hosts get 421 (DNS-rebinding guard). Needed when binding 0.0.0.0 or ::.",
        ),
    ] = None,
    allowed_origin: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-origin",
            help="A web page origin (https://app.example) allowed to call this server "
            "(repeatable; * for any). Loopback and same-host pages always are; others get 403.",
        ),
    ] = None,
    grace: Annotated[
        float,
        typer.Option(help="Seconds running turns get to finish on SIGTERM before cancellation."),
    ] = 10.0,
    log_format: Annotated[
        str,
        typer.Option(
            "--log-format", help="text (uvicorn's access log) or json (one JSON line a request)."
        ),
    ] = "text",
    queue: Annotated[
        bool,
        typer.Option(
            "--queue",
            help="Background runs go to the queue and `loom worker` processes run them "
            "(needs --store postgres://...).",
        ),
    ] = False,
    otlp_endpoint: Annotated[
        str | None,
        typer.Option(
            "--otlp-endpoint",
            help="Send OpenTelemetry traces and metrics over OTLP/HTTP to this collector "
            "(e.g. http://localhost:4318); OTEL_EXPORTER_OTLP_ENDPOINT does the same.",
        ),
    ] = None,
    webhook: Annotated[
        list[str] | None,
        typer.Option("--webhook", help="POST run ends and pending approvals here (repeatable)."),
    ] = None,
    webhook_secret: Annotated[
        str | None,
        typer.Option(
            "--webhook-secret",
            envvar="LOOM_WEBHOOK_SECRET",
            help="Sign webhook bodies with HMAC-SHA256 under this secret (X-Loom-Signature).",
        ),
    ] = None,
) -> None:
    """Serve agents over HTTP: a run API LangGraph's clients speak, OpenAI-compatible, Weave."""
    from loom.errors import ConfigurationError, LoomError, MissingDependencyError

    try:
        try:
            import uvicorn
        except ImportError:
            raise MissingDependencyError("uvicorn", "server", "loom serve") from None
        from loom.cli.run_cmd import open_store
        from loom.server import AgentRegistry, create_app
        from loom.server.app import server_runtime
        from loom.server.hosts import WILDCARD_BINDS, HostPolicy
        from loom.server.registry import load_registry
        from loom.server.security import SecurityConfig, env_keys, is_loopback, load_keys

        if (agents is None) == (app_spec is None):
            raise ConfigurationError(
                "give the agents to serve: --agents DIR (AGENT.md files) or --app module:attr"
            )
        if log_format not in ("text", "json"):
            raise ConfigurationError(f"--log-format is text or json, got {log_format!r}")
        if max_body < 1 or max_concurrent_runs < 1 or grace < 0:
            raise ConfigurationError(
                "--max-body and --max-concurrent-runs must be positive, --grace not negative"
            )
        security = SecurityConfig(
            keys=load_keys(keys, env_keys()),
            max_body=max_body,
            max_concurrent_runs=max_concurrent_runs,
            cors_origins=tuple(cors_origin or ()),
            hosts=HostPolicy(tuple(allowed_host or ()), tuple(allowed_origin or ())),
        )
        if not security.keys and not is_loopback(host):
            raise ConfigurationError(
                f"refusing to serve on {host} without API keys: anyone who reaches it could run "
                "your agents. Configure keys (--keys FILE, or LOOM_API_KEYS=key1,key2) or bind "
                "to 127.0.0.1"
            )
        if host.strip() in WILDCARD_BINDS and not allowed_host:
            raise ConfigurationError(
                f"binding {host or 'every interface'} needs the names clients use to reach "
                "this server: pass --allowed-host NAME for each (the host name or IP address in "
                "their URLs; requests for other hosts get 421, a guard against DNS rebinding), "
                "or --allowed-host '*' to answer any Host header"
            )
        if queue and not (store or "").startswith(("postgres://", "postgresql://")):
            raise ConfigurationError(
                f"--queue needs a PostgreSQL store shared with the workers, got --store "
                f"{store or '(default SQLite file)'}; pass --store postgres://user@host/db "
                "(or drop --queue to run background runs in this process)"
            )
        registry = (
            AgentRegistry.from_dir(agents) if agents is not None else load_registry(str(app_spec))
        )
        runtime = server_runtime(open_store(store), security)
        telemetry = _observe(runtime, otlp_endpoint, webhook or [], webhook_secret)
        app = create_app(registry, runtime, security)
        if queue:  # opened by the app's lifespan
            try:
                import procrastinate  # noqa: F401
            except ImportError:
                raise MissingDependencyError("procrastinate", "postgres", "--queue") from None
            from loom.server.queued import RunQueue

            app.state.loom.extra["run_queue"] = RunQueue(str(store))
        if grpc_port is not None:  # started by the Weave router's lifespan
            app.state.loom.extra.update(grpc_port=grpc_port, grpc_host=host)
    except LoomError as exc:
        say_error(exc)
        raise typer.Exit(2) from None
    if log_format == "json":
        _json_access_log()
    from loom.server.wire import json_http_protocol

    config = uvicorn.Config(
        app,
        http=json_http_protocol(),  # its own 400 for unparsable HTTP in the JSON error shape
        host=host,
        port=port,
        log_level=log_level,
        access_log=log_format == "text",
        timeout_graceful_shutdown=5,
        # longer than clients keep an idle connection (httpx: 5 s, uvicorn's own default):
        # with equal timeouts a client could send on a connection the server was closing at
        # that instant, and see the request fail with a reset (httpx.ReadError)
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    try:
        _draining_server(config, app.state.loom, grace).run()
    finally:
        if telemetry is not None:
            telemetry.shutdown()  # flush what is batched (bounded by the exporter's timeout)


def _observe(runtime: Any, otlp: str | None, hooks: list[str], secret: str | None) -> Any:
    """Add the tracing and webhook observers ``loom serve`` was asked for to ``runtime``."""
    import os

    telemetry = None
    if otlp or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        from loom.observability import configure

        telemetry = configure(otlp)
        runtime.observers = (*runtime.observers, telemetry.observer)
    if hooks:
        from loom.server.webhooks import Webhook, Webhooks

        observer = Webhooks([Webhook(url, secret) for url in hooks], runtime.capabilities.kv)
        runtime.observers = (*runtime.observers, observer)
    return telemetry


def _json_access_log() -> None:
    import logging
    import sys

    logger = logging.getLogger("loom.server.access")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def _draining_server(config: Any, state: Any, grace: float) -> Any:
    """uvicorn's server, draining first on SIGTERM / SIGINT: new runs get 503 and /readyz 503
    while the running turns get ``grace`` seconds to finish; the rest are cancelled with the
    reason "server shutting down" (their streams end with a final event), then uvicorn stops
    (exit status 0). A second signal stops at once."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        draining: asyncio.Task[None] | None = None

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.draining is not None or not self.started:
                super().handle_exit(sig, frame)
                if self.draining is not None:
                    self.force_exit = True
                return
            state.draining = True
            self.draining = asyncio.get_event_loop().create_task(self._drain())

        async def _drain(self) -> None:
            import logging

            from loom.server.lifecycle import drain

            try:
                cancelled = await drain(state.runtime, grace)
                if cancelled:
                    logging.getLogger("loom.server").warning(
                        "cancelled %d runs at shutdown: %s", len(cancelled), ", ".join(cancelled)
                    )
                await asyncio.sleep(0.1)  # let the streams of cancelled runs send their last event
            finally:
                state.hub.close()  # end session subscriptions (they would hold the shutdown)
                self.should_exit = True

    return DrainingServer(config)
