"""The building blocks of the configuration's sections (:mod:`sidecar.config`),
and the sections of ``checks:`` (DESIGN §4): one class per check ``kind``.

Every section refuses unknown keys, NaN and Infinity (every setting ends up
in stored records and TTLs).
"""

from __future__ import annotations

import unicodedata
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

#: Every section's model config: unknown keys are errors, values frozen; NaN and
#: Infinity are refused (every setting ends up in stored records and TTLs).
SECTION_CONFIG = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Section(BaseModel):
    """A configuration section (:data:`SECTION_CONFIG`)."""

    model_config = SECTION_CONFIG


PositiveInt = Annotated[int, Field(ge=1)]
#: Counts and windows stay within what every store can hold as a TTL.
Count = Annotated[int, Field(ge=1, le=1_000_000)]
Seconds = Annotated[float, Field(gt=0, le=31_536_000)]  # a year
Repeats = Annotated[int, Field(ge=2, le=1000)]


def nfc_all(names: list[str]) -> list[str]:
    """Workflow names in Unicode NFC, as tokens' scopes and requests are compared."""
    return [unicodedata.normalize("NFC", n) for n in names]


class EnvHeader(Section):
    env: str
    prefix: str = ""


#: Which workflows may run a check: ``["*"]`` for every one. Absent, only a
#: token holding every workflow may (a scoped token gets 403): a check runs
#: with the system of record's credentials, so opening it is said in the file.
CheckWorkflows = Annotated[list[str], Field(min_length=1), AfterValidator(nfc_all)] | None


class HttpCheck(Section):
    kind: Literal["http"]
    workflows: CheckWorkflows = None
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


class JsonSchemaCheck(Section):
    kind: Literal["json_schema"]
    workflows: CheckWorkflows = None
    path: str | None = None
    schema_: Annotated[dict[str, Any], Field(alias="schema")]

    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False
    )


class CursorCheck(Section):
    kind: Literal["cursor"]
    workflows: CheckWorkflows = None
    cursor: str
    records: str


class OperationsCheck(Section):
    kind: Literal["operations"]
    workflows: CheckWorkflows = None
    operations: str


class CombinedCheck(Section):
    kind: Literal["all", "any"]
    workflows: CheckWorkflows = None
    of: Annotated[list[str], Field(min_length=1)]


CheckConfig = Annotated[
    HttpCheck | JsonSchemaCheck | CursorCheck | OperationsCheck | CombinedCheck,
    Field(discriminator="kind"),
]
