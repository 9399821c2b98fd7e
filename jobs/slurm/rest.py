"""A small typed client of slurmrestd's OpenAPI v0.0.38 (Slurm 22.05).

slurmrestd changes its schema with every release (22.05 serves v0.0.36-v0.0.38; 23.02 and later v0.0.39 and
on, with other shapes), so the client reads which versions the server offers and refuses, in one sentence
the pool's page shows, a server that does not offer the one it speaks. Every request carries the Slurm user
and its JWT (X-SLURM-USER-NAME, X-SLURM-USER-TOKEN), as `AuthAltTypes=auth/jwt` expects.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any, NotRequired, TypedDict, cast

import requests

VERSION = "v0.0.38"
SLURM_RELEASE = "22.05"
# A slurmrestd that does not take the connection in this long is away; one that does has this long to answer.
CONNECT_TIMEOUT_S = 3.0
TIMEOUT_S = 10.0


class SlurmError(Exception):
    """Slurm answered, and said no (its own words), or answered what this client cannot read."""


class SlurmUnreachable(SlurmError):
    """No answer: slurmrestd is down, or the network between."""


class SlurmAuthRefused(SlurmError):
    """The token was refused: expired, signed with another key, or for another user."""


class UnsupportedVersion(SlurmError):
    def __init__(self, offered: list[str]):
        self.offered = offered
        listed = ", ".join(offered) or "no version the console knows"
        super().__init__(f"this Slurm's REST server offers {listed}; the console speaks {VERSION} "
                         f"(Slurm {SLURM_RELEASE}): point the pool at a slurmrestd that serves openapi/{VERSION}")


class JobDescription(TypedDict, total=False):
    """The fields of v0.0.38's job_properties the console sets."""

    name: str
    partition: str
    account: str
    qos: str
    nodes: int
    tasks: int
    tasks_per_node: int
    cpus_per_task: int
    memory_per_node: int
    gres: str
    time_limit: int
    requeue: bool
    signal: str
    environment: dict[str, str]
    current_working_directory: str
    standard_output: str
    standard_error: str


class SubmitRequest(TypedDict):
    job: JobDescription
    script: str


class JobRecord(TypedDict):
    """The parts of v0.0.38's job_response_properties the console reads."""

    job_id: int
    job_state: str
    state_reason: str
    name: NotRequired[str]
    state_description: NotRequired[str]
    exit_code: NotRequired[int]
    nodes: NotRequired[str]
    account: NotRequired[str]
    qos: NotRequired[str]
    partition: NotRequired[str]
    restart_cnt: NotRequired[int]
    submit_time: NotRequired[int]
    start_time: NotRequired[int]
    end_time: NotRequired[int]
    # Set while a preemption's grace runs (the job is still RUNNING; end_time is then when Slurm requeues it).
    preempt_time: NotRequired[int]
    time_limit: NotRequired[int]
    tres_alloc_str: NotRequired[str]
    batch_host: NotRequired[str]
    user_name: NotRequired[str]
    job_resources: NotRequired[dict[str, Any]]


class NodeRecord(TypedDict):
    name: str
    state: str
    reason: NotRequired[str]
    address: NotRequired[str]
    cpus: NotRequired[int]
    real_memory: NotRequired[int]
    gres: NotRequired[str]
    partitions: NotRequired[list[str]]


@dataclass(frozen=True)
class Credentials:
    user: str
    token: str


def offered_versions(paths: list[str]) -> list[str]:
    """The slurmctld API versions an OpenAPI document's paths offer, oldest first."""
    found = {match.group(1) for path in paths if (match := re.match(r"/slurm/(v\d+\.\d+\.\d+)/", path))}
    return sorted(found, key=lambda version: tuple(int(part) for part in version[1:].split(".")))


def token_expiry(token: str) -> int | None:
    """The `exp` of a JWT, read without checking its signature (slurmctld checks it), or None."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error):
        return None
    expiry = claims.get("exp") if isinstance(claims, dict) else None
    return expiry if isinstance(expiry, int) else None


class SlurmRest:
    def __init__(self, url: str, credentials: Credentials, timeout: float = TIMEOUT_S,
                 session: requests.Session | None = None):
        self.url = url.rstrip("/")
        self.credentials = credentials
        self.timeout = timeout
        self.session = session or requests.Session()

    def _request(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        expiry = token_expiry(self.credentials.token)
        if expiry is not None and expiry <= time.time():
            # slurmctld would only say "Unspecified error": the console can say which.
            raise SlurmAuthRefused(f"the Slurm token of {self.credentials.user} expired at "
                                   f"{datetime.fromtimestamp(expiry, UTC):%Y-%m-%d %H:%M} UTC")
        headers = {"X-SLURM-USER-NAME": self.credentials.user, "X-SLURM-USER-TOKEN": self.credentials.token}
        try:
            response = self.session.request(method, self.url + path, json=body, headers=headers,
                                                timeout=(min(CONNECT_TIMEOUT_S, self.timeout), self.timeout))
        except requests.RequestException as error:
            raise SlurmUnreachable(f"slurmrestd at {self.url} did not answer: {type(error).__name__}") from error
        if response.status_code in (401, 403):
            raise SlurmAuthRefused(f"slurmrestd at {self.url} refused the token of {self.credentials.user} "
                                   f"(HTTP {response.status_code}): it may have expired")
        try:
            answer = response.json()
        except ValueError:
            raise SlurmError(f"slurmrestd answered HTTP {response.status_code} with no JSON") from None
        if not isinstance(answer, dict):
            raise SlurmError(f"slurmrestd answered HTTP {response.status_code} with JSON that is not an object")
        errors = [error for error in answer.get("errors") or [] if isinstance(error, dict)]
        if any(error.get("source") == "slurm_load_ctl_conf" for error in errors):
            # What 22.05 answers both when slurmctld is away and when it refuses the token's signature.
            raise SlurmUnreachable(f"slurmrestd at {self.url} answered, but slurmctld did not: it is down, or it "
                                   f"refused the token of {self.credentials.user} (signed with another key?)")
        if errors or response.status_code >= 400:
            words = "; ".join(str(error.get("error") or error.get("description") or error) for error in errors)
            raise SlurmError(words or f"slurmrestd answered HTTP {response.status_code}")
        return answer

    def check_version(self) -> str:
        """The release of the Slurm behind the server; UnsupportedVersion when it does not speak v0.0.38."""
        document = self._request("GET", "/openapi/v3")
        offered = offered_versions(list(document.get("paths") or {}))
        if VERSION not in offered:
            raise UnsupportedVersion(offered)
        ping = self._request("GET", f"/slurm/{VERSION}/ping")
        release = (ping.get("meta") or {}).get("Slurm", {}).get("release")
        return str(release or SLURM_RELEASE)

    def submit(self, request: SubmitRequest) -> int:
        answer = self._request("POST", f"/slurm/{VERSION}/job/submit", request)
        job_id = answer.get("job_id")
        if not isinstance(job_id, int):
            raise SlurmError("slurmrestd accepted the job but gave no job id")
        return job_id

    def job(self, job_id: int) -> JobRecord | None:
        """The job as slurmctld knows it; None once it does not (ended longer ago than MinJobAge, or purged)."""
        try:
            answer = self._request("GET", f"/slurm/{VERSION}/job/{job_id}")
        except SlurmError as error:
            if re.search(r"invalid job id|Invalid job id", str(error)):
                return None
            raise
        jobs = answer.get("jobs") or []
        return cast(JobRecord, jobs[0]) if jobs else None

    def jobs(self) -> list[JobRecord]:
        """Every job slurmctld holds (its user's and others', as Slurm lets that user see them)."""
        return cast(list[JobRecord], self._request("GET", f"/slurm/{VERSION}/jobs").get("jobs") or [])

    def cancel(self, job_id: int) -> None:
        try:
            self._request("DELETE", f"/slurm/{VERSION}/job/{job_id}")
        except SlurmError as error:
            # Already over: what a cancel wanted.
            if not re.search(r"already completed|Job/step already completing or completed|Invalid job id", str(error)):
                raise

    def signal(self, job_id: int, signal: str) -> None:
        """Send a signal to every process of the job (its batch script traps the ones the console uses)."""
        if not re.fullmatch(r"SIG[A-Z0-9]+", signal):
            raise ValueError(f"not a signal name: {signal!r}")
        try:
            self._request("DELETE", f"/slurm/{VERSION}/job/{job_id}?signal={signal}")
        except SlurmError as error:
            # Already ending: what the signal was for.
            if not re.search(r"already completing or completed|already completed|Invalid job id", str(error)):
                raise

    def nodes(self) -> list[NodeRecord]:
        return cast(list[NodeRecord], self._request("GET", f"/slurm/{VERSION}/nodes").get("nodes") or [])

    def associations(self) -> list[dict[str, Any]]:
        """slurmdbd's associations: accounts (user None) and users in them, with their raw fair-share shares."""
        return cast(list[dict[str, Any]], self._request("GET", f"/slurmdb/{VERSION}/associations").get("associations") or [])

    def accounted_jobs(self, since: date) -> list[dict[str, Any]]:
        """slurmdbd's records of the jobs that ran since that day (steps left out)."""
        # 22.05 reads only its own date forms here (MMDDYY); an ISO time or an epoch is refused.
        query = f"start_time={since:%m%d%y}&skip_steps=true"
        return cast(list[dict[str, Any]], self._request("GET", f"/slurmdb/{VERSION}/jobs?{query}").get("jobs") or [])

    def accounting(self, job_id: int) -> dict[str, Any] | None:
        """slurmdbd's record of the job (account, QOS, TRES, times), or None while it has none yet."""
        try:
            answer = self._request("GET", f"/slurmdb/{VERSION}/job/{job_id}")
        except SlurmError as error:
            if "not found" in str(error).lower() or "no jobs" in str(error).lower():
                return None
            raise
        # A requeued job has a record per run: the last is the one that ended.
        jobs = answer.get("jobs") or []
        return cast(dict[str, Any], jobs[-1]) if jobs else None
