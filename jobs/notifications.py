"""Telling a user that a job of theirs ended: a signed POST to their webhook, and an e-mail where one is configured.

A job's end is recorded with an outbox flag (`TrainingJob.end_notice_pending`, set in the same update as
the final state). `notify_job_ended` listens to the models' `job_state_changed` and only queues the Celery
task (jobs.tasks.notify_job_ended) by name; a broker that is away then leaves the flag set, and the
periodic `sweep_end_notices` queues it again. The task calls `deliver_end_notice`, which claims the flag
(so a notice queued twice is delivered once) and runs `deliver_job_ended`, which never raises: a receiver
that is down, slow or wrong is written on the webhook's last result and nothing else.

Webhook calls go to addresses checked first (jobs.notifications.check_url): http or https only, and, unless
WEBHOOK_ALLOW_PRIVATE, no loopback, private, link-local or otherwise non-public address among any the host
resolves to. The connection is then made to the very addresses that were checked, so a name that resolves
to something else a moment later (DNS rebinding) cannot move the call inside.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import ipaddress
import json
import logging
import secrets
import socket
import ssl
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from django.conf import settings
from django.utils import timezone
from django.utils.translation import gettext as _

if TYPE_CHECKING:
    from jobs.models import TrainingJob, Webhook

logger = logging.getLogger(__name__)

EVENT_JOB_ENDED = "job.ended"
EVENT_TEST = "webhook.test"
SECRET_PREFIX = "whsec_"
URL_SAFE = "/%:@!$&'()*+,;=~"


class WebhookRefused(ValueError):
    """A URL the console will not call; the message says why, in words fit for the user."""


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    path: str
    addresses: tuple[str, ...]


@dataclass(frozen=True)
class Delivery:
    ok: bool
    result: str
    attempts: int


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def signature_of(body: bytes, secret: str) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


# IPv6 prefixes whose last 32 bits are an IPv4 address that a translator or the host itself may reach:
# IPv4-compatible (::a.b.c.d, deprecated but still routed by some stacks) and the NAT64 prefixes (RFC 6052,
# RFC 8215), which `is_global` calls global whatever IPv4 address they carry.
IPV4_EMBEDDING_PREFIXES = tuple(ipaddress.ip_network(prefix) for prefix in ("::/96", "64:ff9b::/96", "64:ff9b:1::/48"))


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address reaches in the end, where it carries one."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if any(address in prefix for prefix in IPV4_EMBEDDING_PREFIXES) and int(address) & 0xFFFFFFFF:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _is_public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address):
        # ::ffff:127.0.0.1, ::127.0.0.1, 64:ff9b::7f00:1 and the like reach the IPv4 address they carry.
        carried = embedded_ipv4(address)
        if carried is not None:
            return _is_public(carried)
    return address.is_global and not address.is_multicast


def check_url(url: str, *, allow_private: bool | None = None) -> Target:
    """Where `url` would be called, or WebhookRefused; resolves the host and checks every address it has."""
    allow_private = settings.WEBHOOK_ALLOW_PRIVATE if allow_private is None else allow_private
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise WebhookRefused(_("the URL cannot be read")) from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise WebhookRefused(_("only http and https URLs are called"))
    if parts.username is not None or parts.password is not None:
        raise WebhookRefused(_("a URL with a user name or password in it is not called"))
    host = parts.hostname
    if not host:
        raise WebhookRefused(_("the URL has no host"))
    port = port or (443 if scheme == "https" else 80)
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise WebhookRefused(_("the host %(host)s cannot be resolved") % {"host": host}) from None
    addresses: list[str] = []
    for _family, _type, _proto, _name, sockaddr in found:
        text = str(sockaddr[0]).split("%", 1)[0]
        if not allow_private and not _is_public(ipaddress.ip_address(text)):
            raise WebhookRefused(_("%(host)s resolves to %(address)s, a private, loopback or reserved address")
                                 % {"host": host, "address": text})
        if text not in addresses:
            addresses.append(text)
    if not addresses:
        raise WebhookRefused(_("the host %(host)s cannot be resolved") % {"host": host})
    # http.client sends the path as it is given, and refuses what is not ASCII: it goes percent-encoded.
    path = quote(parts.path or "/", safe=URL_SAFE) + (f"?{quote(parts.query, safe=URL_SAFE + '?')}" if parts.query else "")
    return Target(scheme, host, port, path, tuple(addresses))


def _connect(addresses: tuple[str, ...], port: int, timeout: float | None) -> socket.socket:
    error: OSError | None = None
    for address in addresses:
        try:
            return socket.create_connection((address, port), timeout=timeout)
        except OSError as failure:
            error = failure
    raise error or OSError("no address to connect to")


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """Sends Host as the URL names it, but connects only to the addresses that were checked."""

    def __init__(self, target: Target, timeout: float):
        super().__init__(target.host, target.port, timeout=timeout)
        self._addresses = target.addresses

    def connect(self) -> None:
        self.sock = _connect(self._addresses, self.port, self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, target: Target, timeout: float):
        self._tls = ssl.create_default_context()
        super().__init__(target.host, target.port, timeout=timeout, context=self._tls)
        self._addresses = target.addresses

    def connect(self) -> None:
        # The certificate is checked against the URL's host name, not the address connected to.
        self.sock = self._tls.wrap_socket(_connect(self._addresses, self.port, self.timeout), server_hostname=self.host)


class _Deadline:
    def __init__(self, connection: http.client.HTTPConnection, seconds: float):
        self.connection, self.passed = connection, False
        self.timer = threading.Timer(seconds, self._cut)
        self.timer.daemon = True
        self.timer.start()

    def _cut(self) -> None:
        self.passed = True
        sock = self.connection.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cancel(self) -> None:
        self.timer.cancel()


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def post_signed(url: str, event: str, payload: dict[str, Any], secret: str, *, retries: int | None = None) -> Delivery:
    """POST `payload` to `url`, signed with `secret`; retried on a connection error or a 5xx, never raises.

    Every attempt sends the same body and delivery id, so a receiver can tell a retry from a new event.
    """
    retries = settings.WEBHOOK_RETRIES if retries is None else retries
    timeout = float(settings.WEBHOOK_TIMEOUT_SECONDS)
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "training-console-webhook/1",
        "X-Console-Event": event,
        "X-Console-Delivery": str(uuid.uuid4()),
        "X-Console-Signature": signature_of(body, secret),
    }
    try:
        target = check_url(url)
    except WebhookRefused as refusal:
        return Delivery(False, _short(f"not called: {refusal}"), 0)
    attempts = 0
    result = ""
    while True:
        attempts += 1
        retry = False
        connection_class = _PinnedHTTPSConnection if target.scheme == "https" else _PinnedHTTPConnection
        connection = connection_class(target, timeout)
        # The socket's timeout bounds each read; this bounds the whole attempt, against a receiver that
        # answers a byte at a time.
        deadline = _Deadline(connection, timeout)
        try:
            connection.request("POST", target.path, body=body, headers=headers)
            # Only the status counts: the body is not read, the connection is closed below.
            answer = connection.getresponse()
            if deadline.passed:
                # The cut socket reads as the end of the headers: what came before it is no answer.
                raise TimeoutError("timed out")
            status = answer.status
            if 200 <= status < 300:
                return Delivery(True, _short(f"HTTP {status} {answer.reason}".strip()), attempts)
            if 300 <= status < 400:
                # A redirect could point anywhere, inside too: it is reported, never followed.
                result = f"HTTP {status}: redirects are not followed"
            else:
                result = f"HTTP {status} {answer.reason}".strip()
                retry = status >= 500
        except (OSError, http.client.HTTPException) as failure:
            if deadline.passed:
                result = f"cannot be reached: timed out after {timeout:g} s"
            else:
                result = f"cannot be reached: {failure.__class__.__name__} {failure}".strip()
            retry = True
        finally:
            deadline.cancel()
            connection.close()
        if not retry or attempts > retries:
            suffix = f" (after {attempts} attempts)" if attempts > 1 else ""
            return Delivery(False, _short(result + suffix), attempts)
        time.sleep(settings.WEBHOOK_RETRY_BACKOFF_SECONDS * 2 ** (attempts - 1))


def _absolute(path: str) -> str:
    return settings.CONSOLE_PUBLIC_URL.rstrip("/") + path


def job_payload(job: TrainingJob) -> dict[str, Any]:
    from django.urls import reverse

    return {
        "id": job.pk,
        "name": job.name,
        "status": job.status,
        "status_message": job.status_message,
        "exit_code": job.exit_code,
        "started_at": job.started_at.isoformat() if job.started_at else None,
        "ended_at": job.ended_at.isoformat() if job.ended_at else None,
        "url": _absolute(reverse("job-detail", args=[job.pk])),
        "api_url": _absolute(reverse("api-job", args=[job.pk])),
    }


def event_body(event: str, job: TrainingJob | None) -> dict[str, Any]:
    return {"event": event, "job": job_payload(job) if job is not None else None, "sent_at": timezone.now().isoformat()}


def wants(webhook: Webhook, status: str) -> bool:
    from jobs.models import JobStatus

    return status in (JobStatus.FAILED, JobStatus.ABNORMAL) or not webhook.on_failure_only


def call_webhook(webhook: Webhook, event: str, job: TrainingJob | None, *, retries: int | None = None) -> Delivery:
    """Calls the webhook and writes what came of it on the record; never raises."""
    try:
        from .secret_box import open_secret

        delivery = post_signed(webhook.url, event, event_body(event, job), open_secret(webhook.sealed_secret),
                               retries=retries)
    except Exception as failure:  # a notification must never break what called it
        logger.warning("webhook %s of %s could not be called", webhook.pk, webhook.user_id, exc_info=True)
        delivery = Delivery(False, _short(f"not called: {failure.__class__.__name__}"), 0)
    now = timezone.now()
    # An update of these two fields only: the owner may be changing the URL on the page meanwhile.
    type(webhook).objects.filter(pk=webhook.pk).update(last_called_at=now, last_result=delivery.result)
    webhook.last_called_at, webhook.last_result = now, delivery.result
    return delivery


def email_text(job: TrainingJob) -> tuple[str, str]:
    data = job_payload(job)
    # A header: no line break of the name's may reach it.
    subject = " ".join(f"Training job {job.name} (#{job.pk}): {job.status}".split())
    lines = [
        f"Your training job {job.name} (#{job.pk}) ended: {job.status}.",
        "",
        f"Status message: {job.status_message or '-'}",
        f"Exit code: {job.exit_code if job.exit_code is not None else '-'}",
        f"Started: {data['started_at'] or '-'}",
        f"Ended: {data['ended_at'] or '-'}",
        "",
        f"Job page: {data['url']}",
        f"API: {data['api_url']}",
    ]
    return subject, "\n".join(lines) + "\n"


def send_email(job: TrainingJob, webhook: Webhook | None) -> bool:
    """Mails the owner, where EMAIL_HOST is set and they have an address; a webhook's on_failure_only applies."""
    address = job.owner.email
    if not settings.EMAIL_HOST or not address or (webhook is not None and not wants(webhook, job.status)):
        return False
    from django.core.mail import send_mail

    subject, text = email_text(job)
    try:
        send_mail(subject, text, settings.DEFAULT_FROM_EMAIL, [address])
    except Exception:  # a mail server that is away must not fail the notification task
        logger.warning("the end of job %s could not be mailed", job.pk, exc_info=True)
        return False
    return True


def deliver_job_ended(job_id: int) -> None:
    """What the Celery task runs: the webhook call and the e-mail for a job that reached a final state."""
    from jobs.models import FINAL_STATES, TrainingJob, Webhook

    try:
        job = TrainingJob.objects.select_related("owner").filter(pk=job_id).first()
        if job is None or job.status not in FINAL_STATES:
            return
        webhook = Webhook.objects.filter(user_id=job.owner_id).first()
        if webhook is not None and wants(webhook, job.status):
            call_webhook(webhook, EVENT_JOB_ENDED, job)
        send_email(job, webhook)
    except Exception:  # the job has ended whatever its notification does
        logger.warning("the end of job %s could not be notified", job_id, exc_info=True)


def _listened_to(job_id: int) -> bool:
    from jobs.models import TrainingJob, Webhook

    if Webhook.objects.filter(user__training_jobs__pk=job_id).exists():
        return True
    return bool(settings.EMAIL_HOST) and TrainingJob.objects.filter(pk=job_id).exclude(owner__email="").exists()


def notify_job_ended(job_id: int, status: str | None = None, **_signal: object) -> None:
    """Queues the notification of a job that ended; a `status` that is not final is ignored (the task checks again).

    Connected to jobs.models.job_state_changed (jobs.apps); the sweep calls it for what is still pending."""
    try:
        from celery import current_app

        from jobs.models import FINAL_STATES, TrainingJob

        if status is not None and status not in FINAL_STATES:
            return
        # Most users ask for nothing: their jobs' ends cost a query here, not a message through the broker.
        if not _listened_to(job_id):
            TrainingJob.objects.filter(pk=job_id).update(end_notice_pending=False)
            return
        # By name: importing jobs.tasks here would tie this stage to the runtime.
        current_app.send_task("jobs.tasks.notify_job_ended", args=(job_id,), retry=False)
    except Exception:  # a broker that is away must not fail a state change; the sweep comes back
        logger.warning("could not queue the notification of job %s", job_id, exc_info=True)


def deliver_end_notice(job_id: int) -> None:
    """What the Celery task runs: the notice of one ended job, once, however often it was queued."""
    from jobs.models import TrainingJob

    if TrainingJob.objects.filter(pk=job_id, end_notice_pending=True).update(end_notice_pending=False):
        deliver_job_ended(job_id)


# A notice queued on commit is normally delivered within a second: the sweep leaves it that long first.
SWEEP_GRACE_SECONDS = 15


def sweep_end_notices() -> list[int]:
    """Queue again the notices of jobs that ended a while ago and are still pending (the broker was away)."""
    from datetime import timedelta

    from django.utils import timezone

    from jobs.models import TrainingJob

    before = timezone.now() - timedelta(seconds=SWEEP_GRACE_SECONDS)
    pending = list(TrainingJob.objects.filter(end_notice_pending=True, ended_at__lt=before)
                   .order_by("ended_at").values_list("pk", flat=True)[:500])
    for job_id in pending:
        notify_job_ended(job_id)
    return pending
