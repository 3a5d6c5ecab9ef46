"""Webhooks: tell other systems when a run ends or waits for a human.

``Webhooks`` is a ``Runtime`` observer. On every ``AGENT_FINISH`` it POSTs a JSON body to each
target: ``"type": "approval.pending"`` when the run stopped with calls waiting for approval
(``pending_approvals`` lists them), else ``"run.finished"`` (``stop_reason`` says how); on a
``BUDGET_WARNING`` (``loom.budgets``: a budget crossed its ``warn_at``, once per window) it POSTs
``"type": "budget.warning"`` with the limit (scope, window, subject, limit, spent). The
body is signed with HMAC-SHA256 under the target's secret, GitHub-style::

    X-Loom-Signature: sha256=<hex of HMAC-SHA256(secret, raw body)>
    X-Loom-Event: run.finished
    X-Loom-Delivery: whd_3f9a0c1b2d4e

(verify it with :func:`verify_signature`, over the raw bytes, before parsing). Delivery runs in
the background, never in the run: a timeout, a connection error or a 5xx / 429 is retried up to
``max_attempts`` times with doubling backoff; a 4xx is final. Every delivery is recorded with
its attempts in the store's key-value namespace ``webhook_deliveries`` (when the store has one)
and logged (``loom.webhooks``). ``loom serve --webhook URL --webhook-secret S`` sets one up.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from loom.errors import ConfigurationError
from loom.events import AgentEvent, AgentFinish, BudgetWarning
from loom.messages import new_id

__all__ = ["NAMESPACE", "Webhook", "Webhooks", "sign", "verify_signature"]

log = logging.getLogger("loom.webhooks")

NAMESPACE = "webhook_deliveries"
"""The store's key-value namespace where each delivery is recorded (key: the delivery id)."""

HEADER = "X-Loom-Signature"


def sign(secret: str, body: bytes) -> str:
    """The ``X-Loom-Signature`` value of ``body``: ``sha256=<hex HMAC>``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify_signature(secret: str, body: bytes, header: str | None) -> bool:
    """Whether ``header`` (``X-Loom-Signature``) is the signature of the raw ``body``."""
    return header is not None and hmac.compare_digest(sign(secret, body), header)


@dataclass(frozen=True, slots=True)
class Webhook:
    """One target: where to POST, the signing secret, and how hard to try."""

    url: str
    secret: str | None = None
    timeout: float = 5.0  # seconds per attempt
    max_attempts: int = 4
    backoff: float = 1.0  # seconds before the 2nd attempt; doubles after each failure

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ConfigurationError(f"a webhook URL is http:// or https://, got {self.url!r}")
        if self.max_attempts < 1 or self.timeout <= 0 or self.backoff < 0:
            raise ConfigurationError(
                "a webhook needs max_attempts >= 1, timeout > 0 and backoff >= 0"
            )


def payload_of(event: AgentFinish) -> dict[str, Any]:
    """The JSON a run's end sends (without the delivery's own id)."""
    kind = "approval.pending" if event.stop_reason == "awaiting_approval" else "run.finished"
    return {
        "type": kind,
        "created_at": event.timestamp,
        "session_id": event.session_id,
        "run_id": event.run_id,
        "parent_run_id": event.parent_run_id,
        "stop_reason": event.stop_reason,
        "output": event.output,
        "error": event.error,
        "usage": event.usage,
        "duration_ms": event.duration_ms,
        "pending_approvals": event.pending_approvals,
    }


def budget_payload_of(event: BudgetWarning) -> dict[str, Any]:
    """The JSON a budget warning sends (without the delivery's own id)."""
    return {
        "type": "budget.warning",
        "created_at": event.timestamp,
        "session_id": event.session_id,
        "run_id": event.run_id,
        "scope": event.scope,
        "window": event.window,
        "subject": event.subject,
        "window_start": event.window_start,
        "kind": event.kind,
        "limit": event.limit,
        "spent": event.spent,
        "warn_at": event.warn_at,
    }


class Webhooks:
    """A ``Runtime`` observer that delivers run ends to webhook targets (module docstring).

    Args:
        targets: Where to send.
        kv: Where to record deliveries: a store with key-value support
            (``runtime.capabilities.kv``); None logs them only.
    """

    def __init__(self, targets: Sequence[Webhook], kv: Any = None) -> None:
        self.targets = tuple(targets)
        self.kv = kv
        self.pending: set[asyncio.Task[dict[str, Any]]] = set()
        self._client: Any = None

    def __call__(self, event: AgentEvent) -> None:
        if not self.targets:
            return
        if type(event) is AgentFinish:
            body = payload_of(event)
        elif type(event) is BudgetWarning:
            body = budget_payload_of(event)
        else:
            return
        loop = asyncio.get_running_loop()  # observers run in the turn's task
        for target in self.targets:
            task = loop.create_task(self.deliver(target, body))
            self.pending.add(task)
            task.add_done_callback(self.pending.discard)

    def _http(self) -> Any:
        if self._client is None:
            import httpx

            self._client = httpx.AsyncClient()
        return self._client

    async def deliver(self, target: Webhook, payload: dict[str, Any]) -> dict[str, Any]:
        """POST ``payload`` to ``target`` with retries; returns (and records) the delivery."""
        import httpx

        delivery_id = new_id("whd")
        body = json.dumps({"id": delivery_id, **payload}, default=str).encode()
        headers = {
            "Content-Type": "application/json",
            "X-Loom-Event": payload["type"],
            "X-Loom-Delivery": delivery_id,
            "User-Agent": "loom-webhooks",
        }
        if target.secret:
            headers[HEADER] = sign(target.secret, body)
        record: dict[str, Any] = {
            "id": delivery_id,
            "url": target.url,
            "type": payload["type"],
            "run_id": payload["run_id"],
            "session_id": payload["session_id"],
            "delivered": False,
            "attempts": [],
        }
        delay = target.backoff
        for attempt in range(1, target.max_attempts + 1):
            started = time.time()
            try:
                r = await self._http().post(
                    target.url, content=body, headers=headers, timeout=target.timeout
                )
                outcome: dict[str, Any] = {"status": r.status_code}
                retry = r.status_code >= 500 or r.status_code == 429
                record["delivered"] = 200 <= r.status_code < 300
            except httpx.TimeoutException:
                outcome, retry = {"error": "timeout"}, True
            except httpx.TransportError as exc:  # refused, reset, DNS
                outcome, retry = {"error": f"{type(exc).__name__}: {exc}"}, True
            outcome.update(attempt=attempt, at=started, seconds=round(time.time() - started, 3))
            record["attempts"].append(outcome)
            if record["delivered"] or not retry or attempt == target.max_attempts:
                break
            await asyncio.sleep(delay)
            delay *= 2
        level = logging.INFO if record["delivered"] else logging.WARNING
        log.log(
            level,
            "webhook %s %s to %s: %s after %d attempt(s)",
            delivery_id,
            payload["type"],
            target.url,
            "delivered" if record["delivered"] else "FAILED",
            len(record["attempts"]),
        )
        if self.kv is not None:
            try:
                await self.kv.put_value(NAMESPACE, delivery_id, record)
            except Exception:  # recording must not lose the log line above
                log.exception("could not record webhook delivery %s", delivery_id)
        return record

    async def drain(self, wait: float | None = None) -> None:
        """Wait (at most ``wait`` seconds) for the deliveries under way, then close the HTTP
        client: at shutdown."""
        if self.pending:
            await asyncio.wait(set(self.pending), timeout=wait)
        if self._client is not None:
            await self._client.aclose()
            self._client = None
