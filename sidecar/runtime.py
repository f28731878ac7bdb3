"""The per-process runtime: settings, store, metrics, fingerprinter, tokens, services.

Built once by :func:`sidecar.app.create_app` and kept in
``app.extensions["loopstop"]``; views reach it with :func:`runtime`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from flask import current_app

from sidecar.auth import TokenTable
from sidecar.canonical import Fingerprinter
from sidecar.config import Settings
from sidecar.metrics import Metrics
from sidecar.service.chains import ChainService
from sidecar.service.check_service import CheckService
from sidecar.service.model_gate import ModelGate
from sidecar.service.operations import OperationService
from sidecar.service.overview import Overview
from sidecar.service.sessions import SessionRevocations
from sidecar.service.stops import StopService
from sidecar.service.tasks import TaskService
from sidecar.store import Store


@dataclass
class Runtime:
    """Everything a request needs; shared by the threads of one worker."""

    settings: Settings
    store: Store
    metrics: Metrics
    fingerprinter: Fingerprinter
    tokens: TokenTable
    clock: Callable[[], float]
    environ: Mapping[str, str]
    operations: OperationService
    chains: ChainService
    tasks: TaskService
    checks: CheckService
    model_gate: ModelGate
    stops: StopService
    overview: Overview
    sessions: SessionRevocations


def runtime() -> Runtime:
    """The runtime of the current app."""
    rt: Runtime = current_app.extensions["loopstop"]
    return rt
