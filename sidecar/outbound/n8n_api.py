"""A client of n8n's public REST API: list, read and stop executions (DESIGN §6).

The paths and fields are n8n 2.41.1's (``packages/cli`` public API,
``ExecutionsPublicController``), authenticated by the ``X-N8N-API-KEY``
header:

=====================================  ======================  =================
request                                key scope               answer
=====================================  ======================  =================
``GET /executions?workflowId&status``  ``execution:list``      ``{data, nextCursor}``
``GET /executions/{id}``               ``execution:read``      the execution
``GET /executions/{id}?includeData``   ``execution:read``      with its ``data``
``POST /executions/{id}/stop``         ``execution:stop``      ``{status, ...}``
=====================================  ======================  =================

An execution carries ``id``, ``workflowId``, ``mode`` (``manual`` from the
editor; ``trigger``, ``webhook``, ... otherwise), ``status`` (``new``,
``running``, ``waiting``, ``success``, ``error``, ``crashed``, ``canceled``,
``unknown``) and ``finished``. Read with ``includeData=true`` it carries its
``data`` (n8n-workflow ``IRunExecutionData``), whose ``parentExecution``
(``RelatedExecution {executionId, workflowId}``) names the execution that
started a sub-workflow's; loopstop asks for it with
``redactExecutionData=true`` (n8n then clears every item's data, which
loopstop never reads: no scope beyond ``execution:read`` is needed for that)
and keeps only that parent. Past ``EXECUTIONS_DATA_MAX_DISPLAY_SIZE`` n8n
answers empty data with ``dataTooLargeToDisplay: true``. A listing is paginated by an opaque
``cursor``. A stop answers 404 for an execution n8n does not know and 409
when it cannot be stopped (it ended meanwhile).

Every call has one total deadline (its own ``timeout_s``, or the earlier
``deadline`` a caller gives, such as a stop's): requests' ``timeout`` bounds
each socket read, so an n8n that trickles its answer a byte at a time would
otherwise hold the caller for as long as it likes. The body is read as it
arrives (:mod:`sidecar.outbound.bounded_read`) and the call ends ``timeout``
once the deadline passes (a read in flight then ends within its own read
timeout, itself capped by what was left, and ends ``timeout`` too); a body
that breaks off ends it ``unreachable``.

This is I/O: it is called outside every store transaction.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import requests

from sidecar.outbound.bounded_read import (
    BodyBroken,
    BodyTooLarge,
    BodyTooSlow,
    read_body,
    send_unread,
)
from sidecar.urls import redact_url

#: How many pages of executions one listing reads at most (250 per page).
MAX_PAGES = 20
PAGE_SIZE = 250
#: The largest answer loopstop reads from n8n (a page of 250 executions is far less).
MAX_BODY_BYTES = 8 * 1024 * 1024


class N8nError(Exception):
    """Raised when n8n's API cannot answer the question asked.

    :ivar reason: ``unreachable``, ``timeout``, ``key_refused`` (401/403),
        ``bad_response`` (any other status, or a body that is not the
        expected JSON).
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Execution:
    """What loopstop reads of an n8n execution.

    :ivar data_read: it was read with its data (``includeData``).
    :ivar parent_id: n8n's ``data.parentExecution.executionId`` (None: none).
    :ivar data_withheld: n8n answered without data (``dataTooLargeToDisplay``).
    """

    execution_id: str
    workflow_id: str | None
    mode: str | None
    status: str | None
    data_read: bool = False
    parent_id: str | None = None
    data_withheld: bool = False

    @classmethod
    def of(cls, doc: Any, data_read: bool = False) -> Execution:
        if not isinstance(doc, dict) or doc.get("id") is None:
            raise N8nError("bad_response", "an execution without an id")
        status = doc.get("status")
        data = doc.get("data")
        parent = data.get("parentExecution") if isinstance(data, dict) else None
        parent_id = parent.get("executionId") if isinstance(parent, dict) else None
        return cls(
            execution_id=str(doc["id"]),
            workflow_id=None if doc.get("workflowId") is None else str(doc["workflowId"]),
            mode=doc.get("mode") if isinstance(doc.get("mode"), str) else None,
            status=status if isinstance(status, str) else None,
            data_read=data_read,
            parent_id=str(parent_id) if isinstance(parent_id, (str, int)) else None,
            data_withheld=data_read
            and (doc.get("dataTooLargeToDisplay") is True or not isinstance(data, dict)),
        )


class N8nClient:
    """n8n's public API at ``api_url`` (``.../api/v1``) with one API key.

    :param session: a ``requests`` session (no proxy from the environment).
    :param timeout_s: the total bound of every call (connect, headers and body).
    :param monotonic: the clock deadlines are read on.
    """

    def __init__(
        self,
        api_url: str,
        api_key: str,
        session: requests.Session,
        timeout_s: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base = api_url.rstrip("/")
        self.shown = redact_url(self.base)  # what messages say: never the URL's password
        self.key = api_key
        self.session = session
        self.timeout_s = timeout_s
        self.monotonic = monotonic

    def _call(
        self,
        method: str,
        path: str,
        params: dict[str, Any] | None = None,
        deadline: float | None = None,
    ) -> tuple[int, Any]:
        """One request: ``(status, JSON body or None)``, over by ``timeout_s`` or
        ``deadline`` (monotonic seconds), whichever comes first.

        :raises N8nError: unreachable, timed out, or the key was refused.
        """
        until = self.monotonic() + self.timeout_s
        if deadline is not None:
            until = min(until, deadline)
        left = until - self.monotonic()
        if left <= 0:
            raise N8nError("timeout", "no time left to ask n8n (the stop's deadline passed)")
        try:
            resp = send_unread(  # the body is read below, under the same deadline
                self.session,
                method,
                self.base + path,
                {"X-N8N-API-KEY": self.key, "Accept": "application/json"},
                left,
                params=params,
            )
            with resp:
                raw = read_body(resp, until, MAX_BODY_BYTES, self.monotonic)
        except (requests.Timeout, BodyTooSlow) as exc:
            raise self._late() from exc
        except BodyTooLarge as exc:
            raise N8nError("bad_response", f"n8n's answer is over {MAX_BODY_BYTES} bytes") from exc
        except BodyBroken as exc:
            if exc.timed_out:
                raise self._late() from exc
            raise N8nError("unreachable", f"{exc.error} at {self.shown}") from exc
        except requests.RequestException as exc:
            raise N8nError("unreachable", f"{type(exc).__name__} at {self.shown}") from exc
        if resp.status_code in (401, 403):
            raise N8nError(
                "key_refused",
                f"n8n answered {resp.status_code} to the API key (check the key and its "
                "scopes execution:list, execution:read, execution:stop)",
            )
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        return resp.status_code, body

    def _late(self) -> N8nError:
        return N8nError("timeout", f"n8n did not answer within {self.timeout_s} s")

    def ping(self, deadline: float | None = None) -> None:
        """Check the API answers and accepts the key (a one-item listing).

        :raises N8nError: when it does not.
        """
        status, _ = self._call("GET", "/executions", {"limit": 1}, deadline)
        if status != 200:
            raise N8nError("bad_response", f"n8n answered {status} to a listing")

    def list_executions(
        self, workflow_id: str, status: str, deadline: float | None = None
    ) -> list[Execution]:
        """The workflow's executions with ``status`` (every page, up to :data:`MAX_PAGES`),
        every page read by ``deadline``.

        :raises N8nError: unreachable, key refused, or a bad answer.
        """
        out: list[Execution] = []
        params: dict[str, Any] = {"workflowId": workflow_id, "status": status, "limit": PAGE_SIZE}
        for _ in range(MAX_PAGES):
            code, body = self._call("GET", "/executions", params, deadline)
            if code != 200 or not isinstance(body, dict) or not isinstance(body.get("data"), list):
                raise N8nError("bad_response", f"n8n answered {code} to a listing")
            out += [Execution.of(d) for d in body["data"]]
            cursor = body.get("nextCursor")
            if not cursor or not body["data"]:
                break
            params = {**params, "cursor": cursor}
        return out

    def get(
        self, execution_id: str, deadline: float | None = None, with_data: bool = False
    ) -> Execution | None:
        """The execution, or None when n8n does not know it (404); ``with_data``
        reads its data too, for the parent execution n8n names in it.

        :raises N8nError: unreachable, key refused, or a bad answer.
        """
        params = {"includeData": "true", "redactExecutionData": "true"} if with_data else None
        code, body = self._call(
            "GET", f"/executions/{quote(execution_id, safe='')}", params, deadline
        )
        if code == 404:
            return None
        if code != 200:
            raise N8nError("bad_response", f"n8n answered {code} reading execution {execution_id}")
        return Execution.of(body, data_read=with_data)

    def stop(self, execution_id: str, deadline: float | None = None) -> tuple[int, str | None]:
        """Ask n8n to stop one execution.

        :returns: n8n's HTTP status (200 stopped, 404 unknown, 409 not
            stoppable: it ended meanwhile) and the status it answered, if any.
        :raises N8nError: unreachable, key refused, or an unexpected status.
        """
        code, body = self._call(
            "POST", f"/executions/{quote(execution_id, safe='')}/stop", deadline=deadline
        )
        if code not in (200, 404, 409):
            raise N8nError("bad_response", f"n8n answered {code} stopping {execution_id}")
        status = body.get("status") if isinstance(body, dict) else None
        return code, status if isinstance(status, str) else None
