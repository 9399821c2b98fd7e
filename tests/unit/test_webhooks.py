"""Notifications on a job's end: a signed POST to the owner's webhook (a real HTTP server here, in a thread, is
the receiver), retried on 5xx and lost connections only, never at private addresses unless allowed, and the
self-service page where only its owner sees and changes it."""

import hashlib
import hmac
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core import mail

from jobs import notifications
from jobs.models import JobStatus, TrainingJob, Webhook
from jobs.secret_box import open_secret, seal_secret

pytestmark = pytest.mark.django_db

SECRET = "whsec_test-secret"


class Receiver:
    """An HTTP server that records every request and answers with the next of `answers` (then 200)."""

    def __init__(self):
        self.requests: list[dict] = []
        self.answers: list[int | tuple[int, dict]] = []
        self.delay = 0.0
        self.trickle = False
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                if receiver.delay:
                    time.sleep(receiver.delay)
                if receiver.trickle:
                    # A status line, then a header a byte at a time: each read is quick, the answer never ends.
                    self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                    for byte in b"X-Slow: " + b"a" * 1000:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(0.05)
                    return
                answer = receiver.answers.pop(0) if receiver.answers else 200
                status, headers = answer if isinstance(answer, tuple) else (answer, {})
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass  # a client that gave up (the timeout test, a refused certificate) is what those tests want

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook?from=console"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(settings):
    # The receiver is on loopback: allowed here, and refused by default (see the SSRF tests).
    settings.WEBHOOK_ALLOW_PRIVATE = True
    settings.WEBHOOK_RETRY_BACKOFF_SECONDS = 0
    settings.CONSOLE_PUBLIC_URL = "https://console.example.org"
    server = Receiver()
    yield server
    server.stop()


def hook_of(user, url: str, *, on_failure_only: bool = False, secret: str = SECRET) -> Webhook:
    return Webhook.objects.create(user=user, url=url, sealed_secret=seal_secret(secret), on_failure_only=on_failure_only)


def ended_job(make_job, status=JobStatus.FAILED, **traits):
    job = make_job(name="resnet", status=JobStatus.CREATING, **traits)
    job.transition(JobStatus.RUNNING)
    if status == JobStatus.COMPLETED:
        job.finish(0)
    elif status == JobStatus.FAILED:
        job.finish(3)
    elif status == JobStatus.ABNORMAL:
        job.mark_abnormal("node lost")
    else:
        job.transition(JobStatus.TERMINATING)
        job.mark_terminated()
    return job


def test_a_final_job_is_posted_signed_with_the_owners_secret(receiver, owner, make_job):
    hook_of(owner, receiver.url)
    job = ended_job(make_job, JobStatus.FAILED)
    notifications.deliver_job_ended(job.pk)

    [call] = receiver.requests
    assert call["path"] == "/hook?from=console"
    body, headers = call["body"], call["headers"]
    expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(headers["X-Console-Signature"], expected)
    assert headers["X-Console-Event"] == "job.ended" and len(headers["X-Console-Delivery"]) >= 32
    assert headers["Content-Type"] == "application/json"
    event = json.loads(body)
    assert event["event"] == "job.ended" and event["sent_at"]
    assert event["job"] == {
        "id": job.pk, "name": "resnet", "status": "Failed", "status_message": "Training end with return code: 3",
        "exit_code": 3, "started_at": job.started_at.isoformat(), "ended_at": job.ended_at.isoformat(),
        "url": f"https://console.example.org/jobs/{job.pk}",
        "api_url": f"https://console.example.org/api/v1/training-jobs/{job.pk}"}
    webhook = Webhook.objects.get(user=owner)
    assert webhook.last_called_at is not None and webhook.last_result == "HTTP 200 OK"


def test_a_signature_made_with_another_secret_does_not_verify(receiver, owner, make_job):
    hook_of(owner, receiver.url, secret="whsec_the-real-one")
    notifications.deliver_job_ended(ended_job(make_job).pk)
    [call] = receiver.requests
    forged = "sha256=" + hmac.new(b"whsec_a-guess", call["body"], hashlib.sha256).hexdigest()
    assert call["headers"]["X-Console-Signature"] != forged
    assert call["headers"]["X-Console-Signature"] == notifications.signature_of(call["body"], "whsec_the-real-one")


@pytest.mark.parametrize("status, called", [
    (JobStatus.COMPLETED, False), (JobStatus.TERMINATED, False), (JobStatus.FAILED, True), (JobStatus.ABNORMAL, True)])
def test_on_failure_only_calls_for_failed_and_abnormal_only(receiver, owner, make_job, status, called):
    hook_of(owner, receiver.url, on_failure_only=True)
    notifications.deliver_job_ended(ended_job(make_job, status).pk)
    assert bool(receiver.requests) is called


@pytest.mark.parametrize("status", [JobStatus.COMPLETED, JobStatus.TERMINATED, JobStatus.FAILED, JobStatus.ABNORMAL])
def test_every_final_state_is_posted_without_on_failure_only(receiver, owner, make_job, status):
    hook_of(owner, receiver.url)
    notifications.deliver_job_ended(ended_job(make_job, status).pk)
    assert json.loads(receiver.requests[0]["body"])["job"]["status"] == status


def test_a_job_that_has_not_ended_is_not_posted(receiver, owner, make_job):
    hook_of(owner, receiver.url)
    job = make_job(status=JobStatus.CREATING)
    job.transition(JobStatus.RUNNING)
    notifications.deliver_job_ended(job.pk)
    notifications.deliver_job_ended(987654)
    assert receiver.requests == []


def test_only_the_jobs_owner_is_called(receiver, owner, stranger, make_job):
    hook_of(stranger, receiver.url)
    notifications.deliver_job_ended(ended_job(make_job).pk)
    assert receiver.requests == []


def test_a_5xx_is_retried_with_the_same_body_and_delivery_id(receiver, owner, make_job, settings):
    settings.WEBHOOK_RETRIES = 3
    receiver.answers = [500, 502, 200]
    hook_of(owner, receiver.url)
    notifications.deliver_job_ended(ended_job(make_job).pk)
    assert len(receiver.requests) == 3
    assert len({call["body"] for call in receiver.requests}) == 1
    assert len({call["headers"]["X-Console-Delivery"] for call in receiver.requests}) == 1
    assert Webhook.objects.get(user=owner).last_result == "HTTP 200 OK"


def test_retries_end_after_three_and_the_last_answer_is_kept(receiver, owner, make_job, settings):
    settings.WEBHOOK_RETRIES = 3
    receiver.answers = [503] * 10
    hook_of(owner, receiver.url)
    notifications.deliver_job_ended(ended_job(make_job).pk)
    assert len(receiver.requests) == 4, "the first call and three retries"
    assert Webhook.objects.get(user=owner).last_result == "HTTP 503 Service Unavailable (after 4 attempts)"


@pytest.mark.parametrize("status", [400, 401, 404, 410])
def test_a_4xx_is_not_retried(receiver, owner, make_job, status):
    receiver.answers = [status, 200]
    hook_of(owner, receiver.url)
    notifications.deliver_job_ended(ended_job(make_job).pk)
    assert len(receiver.requests) == 1
    assert Webhook.objects.get(user=owner).last_result.startswith(f"HTTP {status}")


def test_a_redirect_is_not_followed(receiver, owner, make_job):
    receiver.answers = [(302, {"Location": receiver.url.replace("/hook", "/elsewhere")})]
    hook_of(owner, receiver.url)
    notifications.deliver_job_ended(ended_job(make_job).pk)
    assert [call["path"] for call in receiver.requests] == ["/hook?from=console"]
    assert Webhook.objects.get(user=owner).last_result == "HTTP 302: redirects are not followed"


def test_a_receiver_that_is_down_is_retried_and_never_raises(receiver, owner, make_job, settings):
    settings.WEBHOOK_RETRIES = 2
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    hook_of(owner, f"http://127.0.0.1:{port}/")
    notifications.deliver_job_ended(ended_job(make_job).pk)
    result = Webhook.objects.get(user=owner).last_result
    assert result.startswith("cannot be reached: ConnectionRefusedError") and result.endswith("(after 3 attempts)")


def test_a_slow_receiver_times_out(receiver, owner, make_job, settings):
    settings.WEBHOOK_TIMEOUT_SECONDS = 1
    settings.WEBHOOK_RETRIES = 0
    receiver.delay = 2
    hook_of(owner, receiver.url)
    started = time.monotonic()
    notifications.deliver_job_ended(ended_job(make_job).pk)
    assert time.monotonic() - started < 1.9
    assert "timed out" in Webhook.objects.get(user=owner).last_result


def test_a_receiver_that_answers_a_byte_at_a_time_is_cut_at_the_timeout(receiver, owner, make_job, settings):
    settings.WEBHOOK_TIMEOUT_SECONDS = 1
    settings.WEBHOOK_RETRIES = 0
    receiver.trickle = True
    hook_of(owner, receiver.url)
    started = time.monotonic()
    notifications.deliver_job_ended(ended_job(make_job).pk)
    assert time.monotonic() - started < 1.9
    assert Webhook.objects.get(user=owner).last_result == "cannot be reached: timed out after 1 s"


@pytest.mark.parametrize("url", [
    "http://127.0.0.1/hook", "http://localhost:8000/", "http://10.0.0.5/", "http://192.168.1.1/", "http://172.16.0.1/",
    "http://169.254.169.254/latest/meta-data/", "http://100.64.0.1/", "http://0.0.0.0/", "http://[::1]/",
    "http://[::ffff:127.0.0.1]/", "http://[fd00::1]/", "http://[fe80::1]/", "http://224.0.0.1/",
    "http://2130706433/", "http://0x7f000001/"])
def test_private_loopback_and_reserved_addresses_are_refused(settings, url):
    settings.WEBHOOK_ALLOW_PRIVATE = False
    with pytest.raises(notifications.WebhookRefused):
        notifications.check_url(url)


@pytest.mark.parametrize("url", ["ftp://example.org/", "file:///etc/passwd", "gopher://example.org/", "javascript:alert(1)",
                                 "http://user:pw@93.184.215.14/", "http:///nohost", "http://[::1"])
def test_urls_that_are_not_plain_http_or_https_are_refused(settings, url):
    settings.WEBHOOK_ALLOW_PRIVATE = True
    with pytest.raises(notifications.WebhookRefused):
        notifications.check_url(url)


def test_a_host_with_one_private_address_among_public_ones_is_refused(settings, monkeypatch):
    settings.WEBHOOK_ALLOW_PRIVATE = False
    answers = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", 443)),
               (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.1.2.3", 443))]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: answers)
    with pytest.raises(notifications.WebhookRefused, match="10.1.2.3"):
        notifications.check_url("https://hooks.example.org/x")


def test_a_public_address_is_accepted_and_pinned(settings):
    settings.WEBHOOK_ALLOW_PRIVATE = False
    target = notifications.check_url("https://93.184.215.14:8443/in?a=1")
    assert (target.scheme, target.port, target.path, target.addresses) == ("https", 8443, "/in?a=1", ("93.184.215.14",))


def test_a_refused_address_is_never_called_and_says_why(receiver, owner, make_job, settings):
    hook_of(owner, receiver.url)
    settings.WEBHOOK_ALLOW_PRIVATE = False
    notifications.deliver_job_ended(ended_job(make_job).pk)
    assert receiver.requests == []
    assert "private, loopback or reserved" in Webhook.objects.get(user=owner).last_result


def test_the_end_is_mailed_when_email_is_configured(receiver, owner, make_job, settings):
    settings.EMAIL_HOST = "smtp.example.org"
    owner.email = "owner@example.org"
    owner.save()
    job = ended_job(make_job, JobStatus.COMPLETED)
    notifications.deliver_job_ended(job.pk)
    [message] = mail.outbox
    assert message.to == ["owner@example.org"] and "resnet" in message.subject and "Completed" in message.subject
    assert f"https://console.example.org/jobs/{job.pk}" in message.body


def test_no_mail_without_email_host_or_address_and_on_failure_only_applies(receiver, owner, make_job, settings):
    settings.EMAIL_HOST = ""
    owner.email = "owner@example.org"
    owner.save()
    notifications.deliver_job_ended(ended_job(make_job, JobStatus.FAILED).pk)
    assert mail.outbox == []
    settings.EMAIL_HOST = "smtp.example.org"
    hook_of(owner, receiver.url, on_failure_only=True)
    notifications.deliver_job_ended(ended_job(make_job, JobStatus.COMPLETED).pk)
    assert mail.outbox == []


def test_a_mail_server_that_is_away_does_not_stop_the_webhook(receiver, owner, make_job, settings):
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", port, 1
    owner.email = "owner@example.org"
    owner.save()
    hook_of(owner, receiver.url)
    job = ended_job(make_job)
    assert notifications.send_email(job, None) is False
    notifications.deliver_job_ended(job.pk)
    assert len(receiver.requests) == 1


@pytest.fixture
def queued(monkeypatch):
    from celery import current_app

    sent: list = []
    monkeypatch.setattr(current_app, "send_task", lambda name, **kwargs: sent.append((name, kwargs)))
    return sent


def test_an_end_is_queued_for_a_user_with_a_webhook_and_a_state_that_is_not_final_is_not(queued, owner, make_job):
    job = make_job()
    hook_of(owner, "https://hooks.example.org/in")
    notifications.notify_job_ended(job.pk, JobStatus.RUNNING)
    notifications.notify_job_ended(job.pk, JobStatus.FAILED)
    assert queued == [("jobs.tasks.notify_job_ended", {"args": (job.pk,), "retry": False})]


def test_nothing_is_queued_for_a_user_who_asked_for_nothing(queued, owner, stranger, make_job, settings):
    hook_of(stranger, "https://hooks.example.org/in")
    owner.email = "owner@example.org"
    owner.save()
    settings.EMAIL_HOST = ""
    notifications.notify_job_ended(make_job().pk, JobStatus.COMPLETED)
    assert queued == []
    settings.EMAIL_HOST = "smtp.example.org"
    notifications.notify_job_ended(make_job(name="other").pk, JobStatus.COMPLETED)
    assert len(queued) == 1, "mailed where e-mail is set up and the owner has an address"


def test_notify_never_raises_when_the_broker_is_away(monkeypatch, owner, make_job):
    from celery import current_app

    def away(*args, **kwargs):
        raise ConnectionError("broker away")

    monkeypatch.setattr(current_app, "send_task", away)
    hook_of(owner, "https://hooks.example.org/in")
    notifications.notify_job_ended(make_job().pk, JobStatus.FAILED)


def test_the_task_is_registered_under_the_name_notify_queues():
    from jobs import tasks

    assert tasks.notify_job_ended.name == "jobs.tasks.notify_job_ended"


# The page.

def test_the_owner_sets_a_webhook_and_sees_its_secret_once(client, owner, receiver):
    client.force_login(owner)
    answer = client.post("/webhook", {"url": receiver.url, "on_failure_only": "on"})
    secret = answer.context["new_secret"]
    assert answer.status_code == 200 and answer["Cache-Control"] == "no-store"
    assert secret.startswith("whsec_") and secret in answer.content.decode()
    webhook = Webhook.objects.get(user=owner)
    assert webhook.url == receiver.url and webhook.on_failure_only and open_secret(webhook.sealed_secret) == secret
    again = client.get("/webhook").content.decode()
    assert receiver.url.replace("&", "&amp;") in again and secret not in again, "shown once, never again"


def test_replacing_the_url_keeps_the_secret_and_rotating_makes_a_new_one(client, owner, receiver):
    client.force_login(owner)
    first = client.post("/webhook", {"url": receiver.url}).context["new_secret"]
    replaced = client.post("/webhook", {"url": receiver.url + "&v=2"})
    assert replaced.status_code == 302
    webhook = Webhook.objects.get(user=owner)
    assert webhook.url.endswith("&v=2") and not webhook.on_failure_only and open_secret(webhook.sealed_secret) == first
    rotated = client.post("/webhook/rotate")
    second = rotated.context["new_secret"]
    assert second != first and second in rotated.content.decode() and rotated["Cache-Control"] == "no-store"
    assert open_secret(Webhook.objects.get(user=owner).sealed_secret) == second


def test_the_test_button_calls_the_receiver_and_the_page_shows_the_result(client, owner, receiver):
    client.force_login(owner)
    secret = client.post("/webhook", {"url": receiver.url}).context["new_secret"]
    answer = client.post("/webhook/test", follow=True)
    [call] = receiver.requests
    assert call["headers"]["X-Console-Event"] == "webhook.test"
    assert call["headers"]["X-Console-Signature"] == notifications.signature_of(call["body"], secret)
    assert json.loads(call["body"])["job"] is None
    assert "HTTP 200 OK" in answer.content.decode()


def test_the_test_button_tries_once_even_on_a_5xx(client, owner, receiver, settings):
    settings.WEBHOOK_RETRIES = 3
    receiver.answers = [500, 500]
    hook_of(owner, receiver.url)
    client.force_login(owner)
    answer = client.post("/webhook/test", follow=True).content.decode()
    assert len(receiver.requests) == 1 and "HTTP 500" in answer


def test_the_owner_removes_the_webhook(client, owner, receiver):
    hook_of(owner, receiver.url)
    client.force_login(owner)
    assert client.post("/webhook/remove").status_code == 302
    assert not Webhook.objects.filter(user=owner).exists()


def test_a_stranger_neither_sees_nor_changes_the_owners_webhook(client, owner, stranger, receiver):
    hook_of(owner, receiver.url)
    client.force_login(stranger)
    page = client.get("/webhook").content.decode()
    assert "127.0.0.1" not in page
    for action in ("remove", "rotate", "test"):
        assert client.post(f"/webhook/{action}").status_code == 302
    assert receiver.requests == []
    webhook = Webhook.objects.get(user=owner)
    assert webhook.url == receiver.url and open_secret(webhook.sealed_secret) == SECRET
    client.post("/webhook", {"url": receiver.url + "&stranger=1"})
    assert Webhook.objects.get(user=owner).url == receiver.url
    assert Webhook.objects.get(user=stranger).url.endswith("&stranger=1"), "the stranger set their own"


def test_the_page_asks_a_visitor_to_log_in(client):
    assert client.get("/webhook").status_code == 302
    assert client.post("/webhook/remove").status_code == 302


def test_an_unknown_action_is_a_404_and_a_get_of_an_action_is_refused(client, owner):
    client.force_login(owner)
    assert client.post("/webhook/explode").status_code == 404
    assert client.get("/webhook/remove").status_code == 405


@pytest.mark.parametrize("url", [
    "", "not a url", "javascript:alert(1)", "ftp://example.org/x", "http://127.0.0.1/", "http://[::1", "http://\x00/",
    "http://exa mple.org/", "https://" + "a" * 600 + ".org/", "http://ü.invalid./", "http://[::ffff:10.0.0.1]/",
    "http://localhost:99999/"])
def test_bad_urls_are_form_errors_never_500(client, owner, settings, url):
    settings.WEBHOOK_ALLOW_PRIVATE = False
    client.force_login(owner)
    answer = client.post("/webhook", {"url": url})
    assert answer.status_code == 200 and answer.context["form"].errors.get("url")
    assert not Webhook.objects.filter(user=owner).exists()


def test_a_body_that_is_not_utf8_is_a_form_error_never_500(client, owner):
    client.force_login(owner)
    answer = client.post("/webhook", data=b"url=%ED%A0%80&on_failure_only=%FF",
                         content_type="application/x-www-form-urlencoded")
    assert answer.status_code == 200 and answer.context["form"].errors.get("url")


def test_the_page_has_nothing_inline_the_policy_blocks_and_speaks_portuguese(client, owner, receiver):
    from tests.unit.test_deployment import InlineFinder

    client.force_login(owner)
    made = client.post("/webhook", {"url": receiver.url}, HTTP_ACCEPT_LANGUAGE="pt-br")
    page = made.content.decode()
    finder = InlineFinder()
    finder.feed(page)
    assert finder.found == []
    assert "Notificações" in page and "Trocar o segredo" in page and "Rotate the secret" not in page
    assert 'href="/webhook"' in client.get("/tokens").content.decode(), "linked beside the tokens page"


def test_a_non_ascii_path_is_sent_percent_encoded(receiver, owner, make_job):
    hook_of(owner, receiver.url.replace("/hook", "/olá hook"))
    notifications.deliver_job_ended(ended_job(make_job).pk)
    assert receiver.requests[0]["path"] == "/ol%C3%A1%20hook?from=console"


@pytest.fixture
def tls_receiver(receiver, tmp_path):
    """The receiver behind TLS, with a certificate for the name `localhost` that no system trusts."""
    import datetime
    import ssl

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
                   .not_valid_after(now + datetime.timedelta(hours=1))
                   .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                   .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    receiver.server.socket = context.wrap_socket(receiver.server.socket, server_side=True)
    receiver.cert_file = cert_file
    receiver.url = f"https://localhost:{receiver.server.server_address[1]}/hook"
    return receiver


def test_https_checks_the_certificate_of_the_urls_host(tls_receiver, owner, make_job):
    hook_of(owner, tls_receiver.url)
    notifications.deliver_job_ended(ended_job(make_job).pk)
    assert tls_receiver.requests == []
    assert "SSLCertVerificationError" in Webhook.objects.get(user=owner).last_result


def test_https_reaches_a_trusted_receiver_by_name_at_the_checked_address(tls_receiver, owner, make_job, monkeypatch):
    import ssl

    trusting = ssl.create_default_context(cafile=str(tls_receiver.cert_file))
    monkeypatch.setattr(notifications.ssl, "create_default_context", lambda: trusting)
    hook_of(owner, tls_receiver.url)
    notifications.deliver_job_ended(ended_job(make_job).pk)
    [call] = tls_receiver.requests
    assert call["headers"]["Host"] == f"localhost:{tls_receiver.server.server_address[1]}"
    assert Webhook.objects.get(user=owner).last_result == "HTTP 200 OK"


# The outbox: an end whose notice could not be queued is queued again by the sweep, and delivered once.

def test_an_end_notice_the_broker_missed_is_queued_by_the_sweep_and_delivered_once(monkeypatch, receiver, owner,
                                                                                   make_job):
    from datetime import timedelta

    from celery import current_app
    from django.utils import timezone

    hook_of(owner, receiver.url)
    job = ended_job(make_job)

    def away(*args, **kwargs):
        raise ConnectionError("broker away")

    monkeypatch.setattr(current_app, "send_task", away)
    notifications.notify_job_ended(job.pk, JobStatus.FAILED)  # what the commit of the end ran
    assert TrainingJob.objects.get(pk=job.pk).end_notice_pending

    sent: list = []
    monkeypatch.setattr(current_app, "send_task", lambda name, **kwargs: sent.append(kwargs["args"][0]))
    assert notifications.sweep_end_notices() == [], "a fresh end is left to the notice queued on its commit"
    TrainingJob.objects.filter(pk=job.pk).update(ended_at=timezone.now() - timedelta(minutes=1))
    assert notifications.sweep_end_notices() == [job.pk] and sent == [job.pk]

    notifications.deliver_end_notice(job.pk)
    notifications.deliver_end_notice(job.pk)  # queued twice (the commit's and the sweep's): delivered once
    assert len(receiver.requests) == 1
    assert not TrainingJob.objects.get(pk=job.pk).end_notice_pending


def test_an_end_nobody_listens_to_is_not_left_pending(queued, owner, make_job):
    job = ended_job(make_job)
    notifications.notify_job_ended(job.pk, JobStatus.FAILED)
    assert queued == [] and not TrainingJob.objects.get(pk=job.pk).end_notice_pending
