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
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sidecar.errors import ConfigError

DEFAULT_STORE_URL = "sqlite:///./loopstop.db"
DEFAULT_CONFIG_PATH = "./loopstop.yaml"
#: The shortest token value accepted (a guessable token is no authentication).
MIN_TOKEN_CHARS = 16


class _Section(BaseModel):
    # NaN and Infinity are refused: every setting ends up in stored records and TTLs.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


PositiveInt = Annotated[int, Field(ge=1)]
#: Counts and windows stay within what every store can hold as a TTL.
Count = Annotated[int, Field(ge=1, le=1_000_000)]
Seconds = Annotated[float, Field(gt=0, le=31_536_000)]  # a year
Repeats = Annotated[int, Field(ge=2, le=1000)]


class TokenConfig(_Section):
    """A bearer token: its name (logged), the variable holding its value, its scope.

    ``workflows`` is required (``["*"]`` for all): a scope is never implied.
    """

    name: Annotated[str, Field(min_length=1, max_length=100)]
    env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
    workflows: Annotated[list[str], Field(min_length=1)]
    admin: bool = False


class Limits(_Section):
    """Task-wide limits (DESIGN §3); every field optional in a policy or a task."""

    max_model_calls: Count = 20
    max_tool_calls: Count = 30
    per_tool: dict[str, Count] = {}
    max_same_call: Count = 2
    max_idle: Count = 3
    max_cycle_repeats: Repeats = 3
    max_polls: Count = 30
    max_unchanged_polls: Count = 5
    max_retries: Annotated[int, Field(ge=0, le=1000)] = 3
    deadline_s: Seconds = 900
    poll_deadline_s: Seconds = 600
    max_tokens: Annotated[int, Field(ge=1, le=10**10)] = 200_000
    wrap_up_ratio: Annotated[float, Field(gt=0, le=1)] = 0.8


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
    max_retries: Annotated[int, Field(ge=0, le=1000)] | None = None
    deadline_s: Seconds | None = None
    poll_deadline_s: Seconds | None = None
    max_tokens: Annotated[int, Field(ge=1, le=10**10)] | None = None
    wrap_up_ratio: Annotated[float, Field(gt=0, le=1)] | None = None


class PolicyConfig(_Section):
    """A named task policy: limits, the tools it allows (None: any), its exit check."""

    limits: LimitsOverride = LimitsOverride()
    tools: list[str] | None = None
    exit_check: str | None = None


class ToolConfig(_Section):
    """A tool known to the task guard."""

    kind: Literal["read", "write", "poll"] = "read"
    check: str | None = None
    max_calls: PositiveInt | None = None


class ChainPolicy(_Section):
    """Chain limits for a workflow (DESIGN §2); windows in seconds."""

    max_depth: Annotated[int, Field(ge=0)] = 3
    max_activations: PositiveInt = 20
    rate_limit: PositiveInt = 10
    rate_window_s: Seconds = 3600
    workflow_rate_limit: PositiveInt = 10_000
    workflow_rate_window_s: Seconds = 3600
    dedupe_window_s: Seconds = 3600
    chain_ttl_s: Seconds = 86_400


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
    workflows: dict[str, ChainPolicyOverride] = {}

    def for_workflow(self, workflow: str | None) -> ChainPolicy:
        """The default chain policy with the workflow's overrides applied."""
        override = self.workflows.get(workflow or "")
        if override is None:
            return self.default
        return self.default.model_copy(update=override.model_dump(exclude_none=True))


class OperationsConfig(_Section):
    """Ledger settings: default lease, attempts before ``exhausted``, retention."""

    lease_s: Seconds = 60
    max_attempts: Count = 3
    retention_s: Seconds = 604_800


class TasksConfig(_Section):
    retention_s: Seconds = 604_800


class ModelGateConfig(_Section):
    upstream_url: str | None = None
    api_key_env: str | None = None
    default_model: str | None = None
    timeout_s: Seconds = 60
    allow_untracked: bool = False


class HttpConfig(_Section):
    max_body_bytes: Annotated[int, Field(ge=1024)] = 262_144
    metrics_token_env: str | None = None


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


class EnvHeader(_Section):
    env: str
    prefix: str = ""


class HttpCheck(_Section):
    kind: Literal["http"]
    method: Literal["GET", "HEAD", "POST"] = "GET"
    url: str
    expect_status: list[int] = [200]
    assert_: Annotated[list[str], Field(alias="assert")] = []
    revision: str | None = None
    timeout_s: Seconds = 5
    headers: dict[str, str | EnvHeader] = {}

    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False
    )

    @model_validator(mode="after")
    def _fixed_host(self) -> HttpCheck:
        from urllib.parse import urlsplit

        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("url must be an absolute http:// or https:// URL")
        if "{" in parts.scheme + parts.netloc or parts.fragment:
            raise ValueError("placeholders may stand in the path and the query only")
        return self


class JsonSchemaCheck(_Section):
    kind: Literal["json_schema"]
    path: str | None = None
    schema_: Annotated[dict[str, Any], Field(alias="schema")]

    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False
    )


class CursorCheck(_Section):
    kind: Literal["cursor"]
    cursor: str
    records: str


class OperationsCheck(_Section):
    kind: Literal["operations"]
    operations: str


class CombinedCheck(_Section):
    kind: Literal["all", "any"]
    of: Annotated[list[str], Field(min_length=1)]


CheckConfig = Annotated[
    HttpCheck | JsonSchemaCheck | CursorCheck | OperationsCheck | CombinedCheck,
    Field(discriminator="kind"),
]


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
        for name, tool in self.tools.items():
            if tool.check and tool.check not in self.checks:
                problems.append(f"tools.{name}.check: no check named {tool.check!r}")
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
    if missing:
        raise ConfigError(missing)
    return settings
