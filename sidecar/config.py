"""Configuration: one YAML file plus environment variables, validated by pydantic.

Sources, in order of precedence (DESIGN "Configuration"):

- ``LOOPSTOP_STORE``: the store URL (default ``sqlite:///./loopstop.db``);
  the file may also carry ``store:``, the environment wins;
- ``LOOPSTOP_CONFIG``: the YAML file (default ``./loopstop.yaml``; optional
  when that default is absent, an error when named and missing);
- ``LOOPSTOP_SECRET`` / ``LOOPSTOP_SECRET_PREVIOUS`` and each token's own
  variable: secrets never sit in the file.

Every section is optional; unknown keys are errors, so a typo in a limit
name is caught by ``loopstop check-config`` instead of being ignored.
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import jmespath
import yaml
from jmespath.exceptions import JMESPathError
from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from sidecar.config_sections import (
    SECTION_CONFIG,
    CheckConfig,
    CombinedCheck,
    Count,
    PositiveInt,
    Repeats,
    Seconds,
)
from sidecar.core.chains import ChainLimits
from sidecar.core.gate_writes import (
    parse_input_templates,
    parse_template,
    require_operation_id_template,
)
from sidecar.core.operations import DEFAULT_LEASE_S, OperationPolicy
from sidecar.core.tasks.limits import TaskLimits
from sidecar.errors import ConfigError

DEFAULT_STORE_URL = "sqlite:///./loopstop.db"
DEFAULT_CONFIG_PATH = "./loopstop.yaml"
#: The shortest token value accepted (a guessable token is no authentication).
MIN_TOKEN_CHARS = 16


class _Section(BaseModel):
    model_config = SECTION_CONFIG


class TokenConfig(_Section):
    """A bearer token: its name (logged), the variable holding its value, its scope.

    ``workflows`` is required (``["*"]`` for all): a scope is never implied.
    """

    name: Annotated[str, Field(min_length=1, max_length=100)]
    env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
    workflows: Annotated[list[str], Field(min_length=1)]
    admin: bool = False


_TASK = TaskLimits()
_CHAIN = ChainLimits()
_LEDGER = OperationPolicy()
MaxRetries = Annotated[int, Field(ge=0, le=1000)]
MaxTokens = Annotated[int, Field(ge=1, le=10**10)]
Ratio = Annotated[float, Field(gt=0, le=1)]
Money = Annotated[float, Field(gt=0, le=1e9)]


class Limits(_Section):
    """Task-wide limits (DESIGN §3). The defaults are the core's
    (:class:`sidecar.core.tasks.TaskLimits`); this section validates into it."""

    max_model_calls: Count = _TASK.max_model_calls
    max_tool_calls: Count = _TASK.max_tool_calls
    per_tool: dict[str, Count] = {}
    max_same_call: Count = _TASK.max_same_call
    max_idle: Count = _TASK.max_idle
    max_cycle_repeats: Repeats = _TASK.max_cycle_repeats
    max_polls: Count = _TASK.max_polls
    max_unchanged_polls: Count = _TASK.max_unchanged_polls
    max_retries: MaxRetries = _TASK.max_retries
    deadline_s: Seconds = _TASK.deadline_s
    poll_deadline_s: Seconds = _TASK.poll_deadline_s
    max_tokens: MaxTokens = _TASK.max_tokens
    max_cost: Money | None = _TASK.max_cost
    wrap_up_ratio: Ratio = _TASK.wrap_up_ratio

    def to_core(self) -> TaskLimits:
        """These limits as the core's :class:`~sidecar.core.tasks.TaskLimits`."""
        return TaskLimits.from_doc(self.model_dump())


class LimitsOverride(_Section):
    """A partial :class:`Limits`: only the fields given override the defaults."""

    max_model_calls: Count | None = None
    max_tool_calls: Count | None = None
    per_tool: dict[str, Count] | None = None
    max_same_call: Count | None = None
    max_idle: Count | None = None
    max_cycle_repeats: Repeats | None = None
    max_polls: Count | None = None
    max_unchanged_polls: Count | None = None
    max_retries: MaxRetries | None = None
    deadline_s: Seconds | None = None
    poll_deadline_s: Seconds | None = None
    max_tokens: MaxTokens | None = None
    max_cost: Money | None = None
    wrap_up_ratio: Ratio | None = None


class PolicyConfig(_Section):
    """A named task policy: limits, the tools it allows (None: any), its exit check."""

    limits: LimitsOverride = LimitsOverride()
    tools: list[str] | None = None
    exit_check: str | None = None


class ToolReconcile(_Section):
    """How the model gate asks the system of record about a write whose output
    did not prove it (DESIGN §5.1): a check, and its input as templates over
    the call's arguments."""

    check: str
    input: dict[str, Any] = {}

    @model_validator(mode="after")
    def _templates(self) -> ToolReconcile:
        try:
            parse_input_templates(self.input)
        except ValueError as exc:
            raise ValueError(f"input: {exc}") from None
        return self


class ToolConfig(_Section):
    """A tool known to the task guard.

    With ``operation_id`` (a write), the model gate guards the tool's own n8n
    node (DESIGN §5.1): the template names the business operation from the
    call's arguments; ``lease_s`` is how long one execution holds it;
    ``committed_when`` (JMESPath over the tool's output) says when the output
    proves the write; ``reconcile`` asks the system of record when it does not.
    """

    kind: Literal["read", "write", "poll"] = "read"
    check: str | None = None
    max_calls: PositiveInt | None = None
    operation_id: str | None = None
    lease_s: Seconds | None = None
    committed_when: str | None = None
    reconcile: ToolReconcile | None = None

    @field_validator("operation_id")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        if value is not None:
            require_operation_id_template(parse_template(value))
        return value

    @field_validator("committed_when")
    @classmethod
    def _jmespath(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                jmespath.compile(value)
            except JMESPathError as exc:
                raise ValueError(f"not a JMESPath expression: {exc}") from None
        return value

    @model_validator(mode="after")
    def _gate_write(self) -> ToolConfig:
        gate_only = ("lease_s", "committed_when", "reconcile")
        if self.operation_id is None:
            given = [name for name in gate_only if getattr(self, name) is not None]
            if given:
                raise ValueError(f"{', '.join(given)} need operation_id (a write at the gate)")
        elif self.kind != "write":
            raise ValueError("operation_id is for a tool of kind write")
        return self


class ChainPolicy(_Section):
    """Chain limits for a workflow (DESIGN §2); windows in seconds. The defaults
    are the core's (:class:`sidecar.core.chains.ChainLimits`); this section
    validates into it."""

    max_depth: Annotated[int, Field(ge=0)] = _CHAIN.max_depth
    max_activations: PositiveInt = _CHAIN.max_activations
    rate_limit: PositiveInt = _CHAIN.rate_limit
    rate_window_s: Seconds = _CHAIN.rate_window_s
    workflow_rate_limit: PositiveInt = _CHAIN.workflow_rate_limit
    workflow_rate_window_s: Seconds = _CHAIN.workflow_rate_window_s
    dedupe_window_s: Seconds = _CHAIN.dedupe_window_s
    chain_ttl_s: Seconds = _CHAIN.chain_ttl_s

    def to_core(self) -> ChainLimits:
        """These limits as the core's :class:`~sidecar.core.chains.ChainLimits`."""
        return ChainLimits(**self.model_dump())


class ChainPolicyOverride(_Section):
    """A partial :class:`ChainPolicy` for one workflow."""

    max_depth: Annotated[int, Field(ge=0)] | None = None
    max_activations: PositiveInt | None = None
    rate_limit: PositiveInt | None = None
    rate_window_s: Seconds | None = None
    workflow_rate_limit: PositiveInt | None = None
    workflow_rate_window_s: Seconds | None = None
    dedupe_window_s: Seconds | None = None
    chain_ttl_s: Seconds | None = None


class ChainsConfig(_Section):
    default: ChainPolicy = ChainPolicy()
    #: Per-workflow overrides, keyed by workflow name in NFC.
    workflows: Annotated[
        dict[str, ChainPolicyOverride],
        AfterValidator(lambda ws: {unicodedata.normalize("NFC", k): v for k, v in ws.items()}),
    ] = {}

    def for_workflow(self, workflow: str | None) -> ChainPolicy:
        """The default chain policy with the workflow's overrides applied."""
        override = self.workflows.get(workflow or "")
        if override is None:
            return self.default
        return self.default.model_copy(update=override.model_dump(exclude_none=True))


class OperationsConfig(_Section):
    """Ledger settings: default lease, attempts before ``exhausted``, retention, and
    how many open operations (in progress or unknown) one workflow may hold
    before a new begin is refused (429). The defaults are the core's
    (:class:`sidecar.core.operations.OperationPolicy`); this section validates into it."""

    lease_s: Seconds = DEFAULT_LEASE_S
    max_attempts: Count = _LEDGER.max_attempts
    retention_s: Seconds = _LEDGER.retention_s
    max_open_per_workflow: Count = _LEDGER.max_open_per_workflow

    def to_core(self) -> OperationPolicy:
        """The ledger's policy (:class:`~sidecar.core.operations.OperationPolicy`)."""
        return OperationPolicy(self.max_attempts, self.retention_s, self.max_open_per_workflow)


class TasksConfig(_Section):
    retention_s: Seconds = 604_800


class ModelPrice(_Section):
    """A model's price per million tokens, in ``model_gate.currency``."""

    input_per_mtok: Annotated[float, Field(ge=0, le=1_000_000)]
    output_per_mtok: Annotated[float, Field(ge=0, le=1_000_000)]


EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class UpstreamConfig(_Section):
    """One API's real model: its base URL and the environment variable holding
    its key (none: the upstream gets no key, as a local Ollama wants)."""

    url: Annotated[str, Field(min_length=1)]
    api_key_env: EnvName | None = None

    @model_validator(mode="after")
    def _absolute(self) -> UpstreamConfig:
        from urllib.parse import urlsplit

        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("url must be an absolute http:// or https:// URL")
        if parts.query or parts.fragment:
            raise ValueError("url takes no query or fragment")
        return self


class UpstreamsConfig(_Section):
    """The real model of each API the gate speaks (DESIGN §5); an API without one
    answers its routes 503."""

    openai: UpstreamConfig | None = None
    anthropic: UpstreamConfig | None = None
    gemini: UpstreamConfig | None = None
    ollama: UpstreamConfig | None = None
    azure: UpstreamConfig | None = None


class ModelGateConfig(_Section):
    """The model gate (DESIGN §5): the real model behind each API, and what its tokens cost.

    ``upstream_url`` / ``api_key_env`` are the ``openai`` entry of
    ``upstreams`` as first written (setting both is a configuration error).
    ``max_output_tokens`` is the output limit of a priced model's turn whose
    request names none: reserved as its worst case, and sent upstream as its
    limit. ``max_answer_bytes`` bounds an upstream answer, decompressed
    (a bigger one is a ``502`` in the API's shape, or an error event).
    """

    upstream_url: str | None = None
    api_key_env: str | None = None
    upstreams: UpstreamsConfig = UpstreamsConfig()
    default_model: str | None = None
    timeout_s: Seconds = 60
    allow_untracked: bool = False
    currency: Annotated[str, Field(min_length=1, max_length=10)] = "USD"
    prices: dict[str, ModelPrice] = {}
    max_output_tokens: Annotated[int, Field(ge=1, le=10_000_000)] = 4096
    max_answer_bytes: Annotated[int, Field(ge=1024, le=1 << 30)] = 8 << 20

    def upstream(self, api: str) -> UpstreamConfig | None:
        """The upstream of ``api`` (an ``upstreams`` field name), None when it has none;
        ``openai`` falls back to ``upstream_url`` / ``api_key_env``."""
        found: UpstreamConfig | None = getattr(self.upstreams, api, None)
        if found is None and api == "openai" and self.upstream_url:
            return UpstreamConfig.model_construct(
                url=self.upstream_url, api_key_env=self.api_key_env
            )
        return found


class N8nConfig(_Section):
    """n8n's public REST API, which stops reach (DESIGN §6).

    ``api_url`` is the API's base, ``http(s)://<host>/api/v1``; the key
    (``X-N8N-API-KEY``) sits in the variable ``api_key_env`` names, with the
    scopes ``execution:list``, ``execution:read`` and ``execution:stop``.
    ``timeout_s`` bounds each request, ``confirm_s`` how long a stop waits
    for n8n to report the executions finished.
    """

    api_url: str
    api_key_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = "N8N_API_KEY"
    timeout_s: Annotated[float, Field(gt=0, le=300)] = 5
    confirm_s: Annotated[float, Field(ge=0, le=600)] = 20

    @model_validator(mode="after")
    def _absolute(self) -> N8nConfig:
        from urllib.parse import urlsplit

        parts = urlsplit(self.api_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("api_url must be an absolute http:// or https:// URL")
        if parts.query or parts.fragment:
            raise ValueError("api_url takes no query or fragment")
        return self


class OutliersConfig(_Section):
    """Runaway tasks (DESIGN §6): ``factor`` x the workflow's mean, after ``min_tasks``."""

    factor: Annotated[float, Field(gt=1, le=1000)] = 5
    min_tasks: Count = 20
    running_s: Seconds = 1800
    action: Literal["flag", "wrap_up", "stop"] = "flag"


class HttpConfig(_Section):
    """Serving limits.

    :ivar checks_concurrency: outside calls of checks (requests to systems of
        record) one worker runs at once; more wait ``checks_wait_s``, then 503.
    :ivar write_timeout_s: how long ``loopstop serve`` waits for a client to
        take each write of an answer once its buffers are full, before it cuts
        the connection (:mod:`sidecar.serving`).
    :ivar slow_writers: how many threads of a worker may wait so at once (a
        client that does not read, when they are all taken, is cut at once);
        0 means half of ``--threads``.
    """

    max_body_bytes: Annotated[int, Field(ge=1024)] = 262_144
    metrics_token_env: str | None = None
    checks_concurrency: Annotated[int, Field(ge=1, le=256)] = 4
    checks_wait_s: Annotated[float, Field(ge=0, le=60)] = 1.0
    write_timeout_s: Annotated[float, Field(ge=1, le=300)] = 10.0
    slow_writers: Annotated[int, Field(ge=0, le=256)] = 0


class RedisConfig(_Section):
    """Redis store settings (ignored by the other stores).

    :ivar wait_replicas: replicas that must acknowledge a write (``WAIT``)
        before it is answered; fewer in time is a 503.
    :ivar policy_check_s: seconds between checks of ``maxmemory-policy``.
    """

    wait_replicas: Annotated[int, Field(ge=0, le=16)] = 0
    policy_check_s: Annotated[float, Field(gt=0, le=3600)] = 5.0


class LoggingConfig(_Section):
    allowed_fields: list[str] = []


class Settings(_Section):
    """The whole validated configuration.

    Built by :func:`load_settings`; tests build it from a mapping with
    :meth:`from_mapping`.
    """

    store: str = DEFAULT_STORE_URL
    #: The deadline of one decision's store work, seconds (a hung store is a
    #: 503 at this point, never a wait that stacks retries on it).
    store_timeout_s: Annotated[float, Field(gt=0, le=60)] = 2.0
    redis: RedisConfig = RedisConfig()
    tokens: list[TokenConfig] = []
    limits: Limits = Limits()
    policies: dict[str, PolicyConfig] = {}
    tools: dict[str, ToolConfig] = {}
    chains: ChainsConfig = ChainsConfig()
    operations: OperationsConfig = OperationsConfig()
    tasks: TasksConfig = TasksConfig()
    model_gate: ModelGateConfig = ModelGateConfig()
    n8n: N8nConfig | None = None
    outliers: OutliersConfig = OutliersConfig()
    http: HttpConfig = HttpConfig()
    logging: LoggingConfig = LoggingConfig()
    checks: dict[str, CheckConfig] = {}

    @model_validator(mode="after")
    def _cross_references(self) -> Settings:
        problems: list[str] = []
        names = [t.name for t in self.tokens]
        for dup in sorted({n for n in names if names.count(n) > 1}):
            problems.append(f"tokens: the name {dup!r} is used twice")
        for name, policy in self.policies.items():
            if policy.exit_check and policy.exit_check not in self.checks:
                problems.append(f"policies.{name}.exit_check: no check named {policy.exit_check!r}")
        from sidecar.core.operations import asks_system_of_record

        shapes = {
            n: (c.kind, tuple(c.of) if isinstance(c, CombinedCheck) else ())
            for n, c in self.checks.items()
        }
        for name, tool in self.tools.items():
            if tool.reconcile is not None:
                ref = tool.reconcile.check
                if ref not in self.checks:
                    problems.append(f"tools.{name}.reconcile.check: no check named {ref!r}")
                elif not asks_system_of_record(ref, shapes):
                    problems.append(
                        f"tools.{name}.reconcile.check: {ref!r} does not ask the system of "
                        "record; only an http check (or all/any holding one) may settle a write"
                    )
            if tool.check and tool.check not in self.checks:
                problems.append(f"tools.{name}.check: no check named {tool.check!r}")
            elif (
                tool.check
                and tool.kind == "write"
                and not asks_system_of_record(tool.check, shapes)
            ):
                problems.append(
                    f"tools.{name}.check: {tool.check!r} does not ask the system of record; "
                    "a write's check settles whether it happened, so it must be an http "
                    "check (or all/any holding one)"
                )
        gate = self.model_gate
        if gate.upstreams.openai is not None and (gate.upstream_url or gate.api_key_env):
            problems.append(
                "model_gate.upstreams.openai: set model_gate.upstream_url/api_key_env or "
                "model_gate.upstreams.openai, not both (they name the same upstream)"
            )
        for name, check in self.checks.items():
            if isinstance(check, CombinedCheck):
                for i, ref in enumerate(check.of):
                    if ref not in self.checks:
                        problems.append(f"checks.{name}.of.{i}: no check named {ref!r}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Settings:
        """Validate a mapping shaped like the YAML file.

        :raises ConfigError: listing every error with its dotted path.
        """
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            raise ConfigError(_problems(exc)) from exc


def _problems(exc: ValidationError) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"])
        msg = err["msg"]
        if err["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
            if not err["loc"]:
                # Cross-reference errors of the whole file carry their own paths.
                for part in msg.split("; "):
                    where, _, what = part.partition(": ")
                    out.append((where, what))
                continue
        out.append((path, msg))
    return out


def read_config_file(environ: Mapping[str, str]) -> tuple[dict[str, Any], str | None]:
    """Read the YAML file named by ``LOOPSTOP_CONFIG`` (or the default path).

    :returns: the parsed mapping (empty when there is no file) and the path read.
    :raises ConfigError: when a named file is missing, unreadable, not YAML,
        or not a mapping at its top level.
    """
    named = environ.get("LOOPSTOP_CONFIG")
    path = Path(named or DEFAULT_CONFIG_PATH)
    if not path.exists():
        if named:
            raise ConfigError([("LOOPSTOP_CONFIG", f"file {path} does not exist")])
        return {}, None
    try:
        with path.open() as fh:
            data = yaml.safe_load(fh) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError([(str(path), f"cannot read YAML: {exc}")]) from exc
    if not isinstance(data, dict):
        raise ConfigError([(str(path), "the top level must be a mapping")])
    return data, str(path)


def load_settings(
    data: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Load and validate the configuration, including token variables.

    :param data: the file's content as a mapping; None reads the file
        named by the environment.
    :param environ: the environment (default ``os.environ``).
    :raises ConfigError: every problem found, each with its path.
    """
    env = os.environ if environ is None else environ
    raw = dict(read_config_file(env)[0] if data is None else data)
    if env.get("LOOPSTOP_STORE"):
        raw["store"] = env["LOOPSTOP_STORE"]
    settings = Settings.from_mapping(raw)
    missing = [
        (f"tokens.{i}.env", f"environment variable {t.env} is not set (token {t.name!r})")
        if not env.get(t.env)
        else (
            f"tokens.{i}.env",
            f"the value of {t.env} is shorter than {MIN_TOKEN_CHARS} characters (token {t.name!r})",
        )
        for i, t in enumerate(settings.tokens)
        if len(env.get(t.env, "").strip()) < MIN_TOKEN_CHARS
    ]
    if settings.n8n is not None and not env.get(settings.n8n.api_key_env, "").strip():
        missing.append(
            (
                "n8n.api_key_env",
                f"environment variable {settings.n8n.api_key_env} is not set (n8n API key)",
            )
        )
    if missing:
        raise ConfigError(missing)
    return settings
