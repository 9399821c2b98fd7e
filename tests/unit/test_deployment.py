"""Deployment settings: safe local defaults, one CONSOLE_HTTPS switch for TLS, `check --deploy` clean with it,
the console's own checks, the Content-Security-Policy the pages keep to, and where `make run` listens."""

import json
import os
import re
import secrets
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from django.test import Client, override_settings

from console.checks import FORMER_EMBEDDED_KEY, check_production_secrets
from jobs.management.commands.runconsole import Command as RunConsole
from jobs.management.commands.runconsole import local_address

ROOT = Path(__file__).resolve().parents[2]
SHOWN = ("DEBUG", "ALLOWED_HOSTS", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SECURE_SSL_REDIRECT",
         "SECURE_HSTS_SECONDS", "SECURE_HSTS_INCLUDE_SUBDOMAINS", "SECURE_HSTS_PRELOAD", "SECURE_PROXY_SSL_HEADER",
         "X_FRAME_OPTIONS", "CONSOLE_BIND", "CONTENT_SECURITY_POLICY")
PRINT_SETTINGS = ("import json, django; from console.state import prepare; prepare(); django.setup(); "
                  "from django.conf import settings; "
                  f"print(json.dumps({{name: getattr(settings, name) for name in {SHOWN!r}}}))")
# What the environment may already say about the settings under test is left out of each run.
CLEARED = {"DEBUG", "ALLOWED_HOSTS", "SECRET_KEY", "CONSOLE_HTTPS", "CONSOLE_BIND", "X_FRAME_OPTIONS",
           "CONTENT_SECURITY_POLICY", "CONSOLE_PROXY_SSL_HEADER", *SHOWN}


def run_with(tmp_path, args, **environment) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in CLEARED}
    env.update(DJANGO_SETTINGS_MODULE="console.settings", CONSOLE_VAR_DIR=str(tmp_path / "var"), **environment)
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def settings_with(tmp_path, **environment) -> dict:
    done = run_with(tmp_path, ["-c", PRINT_SETTINGS], **environment)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_local_defaults_are_safe_for_plain_http_on_this_machine(tmp_path):
    shown = settings_with(tmp_path)
    assert shown["DEBUG"] is False
    assert shown["ALLOWED_HOSTS"] == ["127.0.0.1", "localhost"]
    assert shown["CONSOLE_BIND"] == "127.0.0.1"
    assert not any(shown[name] for name in ("SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SECURE_SSL_REDIRECT",
                                             "SECURE_HSTS_SECONDS", "SECURE_HSTS_PRELOAD", "SECURE_PROXY_SSL_HEADER"))
    assert shown["X_FRAME_OPTIONS"] == "DENY"
    assert "default-src 'self'" in shown["CONTENT_SECURITY_POLICY"] and "unsafe" not in shown["CONTENT_SECURITY_POLICY"]
    assert shown["CONTENT_SECURITY_POLICY"].endswith("frame-ancestors 'none'")


def test_one_switch_turns_on_everything_https_needs(tmp_path):
    shown = settings_with(tmp_path, CONSOLE_HTTPS="1", ALLOWED_HOSTS="console.example.org, other.example.org")
    assert shown["ALLOWED_HOSTS"] == ["console.example.org", "other.example.org"]
    assert shown["SESSION_COOKIE_SECURE"] and shown["CSRF_COOKIE_SECURE"] and shown["SECURE_SSL_REDIRECT"]
    assert shown["SECURE_HSTS_SECONDS"] == 31536000
    assert shown["SECURE_HSTS_INCLUDE_SUBDOMAINS"] and shown["SECURE_HSTS_PRELOAD"]
    assert shown["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]


def test_each_switch_can_still_be_set_on_its_own(tmp_path):
    shown = settings_with(tmp_path, CONSOLE_HTTPS="yes", SECURE_HSTS_SECONDS="3600", SECURE_HSTS_PRELOAD="0",
                          CONSOLE_PROXY_SSL_HEADER="", X_FRAME_OPTIONS="sameorigin", CONSOLE_BIND="0.0.0.0")
    assert shown["SECURE_HSTS_SECONDS"] == 3600 and shown["SECURE_HSTS_PRELOAD"] is False
    assert shown["SECURE_PROXY_SSL_HEADER"] is None
    assert shown["X_FRAME_OPTIONS"] == "SAMEORIGIN" and shown["CONSOLE_BIND"] == "0.0.0.0"
    assert shown["CONTENT_SECURITY_POLICY"].endswith("frame-ancestors 'self'")
    assert settings_with(tmp_path, CONSOLE_PROXY_SSL_HEADER="X-Scheme")["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_SCHEME", "https"]


@pytest.mark.parametrize("name, value", [("CONSOLE_HTTPS", "maybe"), ("SECURE_HSTS_SECONDS", "a year"),
                                         ("SECURE_HSTS_SECONDS", "-1"), ("X_FRAME_OPTIONS", "ALLOWALL"),
                                         ("LOG_STREAMS_PER_USER", "0"), ("LOGIN_FAILURE_LIMIT", "many"),
                                         ("LOCALCLUSTER_PREFIX", "tcw81"), ("LOCALCLUSTER_BRIDGE", "a-bridge-name-too-long")])
def test_a_value_that_cannot_be_read_stops_the_start_with_its_name(tmp_path, name, value):
    done = run_with(tmp_path, ["-c", PRINT_SETTINGS], **{name: value})
    assert done.returncode != 0 and name in done.stderr


def test_check_deploy_is_clean_with_the_production_variables(tmp_path):
    production = {"CONSOLE_HTTPS": "1", "ALLOWED_HOSTS": "console.example.org", "SECRET_KEY": secrets.token_urlsafe(50)}
    done = run_with(tmp_path, ["manage.py", "check", "--deploy", "--fail-level", "WARNING"], **production)
    assert done.returncode == 0, done.stderr
    assert "System check identified no issues" in done.stdout
    # Without them the same command names what is missing (the four warnings of before, for one).
    local = run_with(tmp_path, ["manage.py", "check", "--deploy", "--fail-level", "WARNING"])
    assert local.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in local.stderr


def test_the_makefile_check_runs_check_deploy_with_https_on():
    check = re.search(r"^check:.*?(?=^\S)", (ROOT / "Makefile").read_text(), re.M | re.S).group(0)
    line = next(line for line in check.splitlines() if "--deploy" in line)
    assert "CONSOLE_HTTPS=1" in line and "SECRET_KEY=" in line and "--fail-level WARNING" in line


# The console's own checks.

@pytest.mark.parametrize("key", [FORMER_EMBEDDED_KEY, "django-insecure-abc", ""])
def test_an_insecure_secret_key_with_debug_off_is_a_warning(key):
    with override_settings(DEBUG=False, SECRET_KEY=key, ALLOWED_HOSTS=["console.example.org"]):
        assert [warning.id for warning in check_production_secrets()] == ["console.W001"]


def test_an_old_insecure_key_among_the_fallbacks_is_a_warning_too():
    with override_settings(DEBUG=False, SECRET_KEY=secrets.token_urlsafe(50), SECRET_KEY_FALLBACKS=[FORMER_EMBEDDED_KEY]):
        assert [warning.id for warning in check_production_secrets()] == ["console.W001"]


def test_every_host_allowed_with_debug_off_is_a_warning():
    with override_settings(DEBUG=False, SECRET_KEY=secrets.token_urlsafe(50), ALLOWED_HOSTS=["console.example.org", "*"]):
        assert [warning.id for warning in check_production_secrets()] == ["console.W002"]


def test_with_debug_on_or_a_real_key_and_hosts_nothing_is_said():
    with override_settings(DEBUG=True, SECRET_KEY=FORMER_EMBEDDED_KEY, ALLOWED_HOSTS=["*"]):
        assert check_production_secrets() == []
    with override_settings(DEBUG=False, SECRET_KEY=secrets.token_urlsafe(50), ALLOWED_HOSTS=["console.example.org"]):
        assert check_production_secrets() == []


def test_the_checks_are_registered_with_django():
    from django.core import checks

    assert check_production_secrets in checks.registry.registry.get_checks(include_deployment_checks=True)


# What the switches do to answers.

@pytest.mark.django_db
def test_with_https_on_cookies_are_secure_http_is_redirected_and_hsts_sent(owner):
    https = {"SESSION_COOKIE_SECURE": True, "CSRF_COOKIE_SECURE": True, "SECURE_SSL_REDIRECT": True,
             "SECURE_HSTS_SECONDS": 31536000, "SECURE_HSTS_INCLUDE_SUBDOMAINS": True, "SECURE_HSTS_PRELOAD": True,
             "SECURE_PROXY_SSL_HEADER": ("HTTP_X_FORWARDED_PROTO", "https")}
    with override_settings(**https):
        client = Client()
        plain = client.get("/accounts/login/")
        assert plain.status_code == 301 and plain["Location"] == "https://testserver/accounts/login/"
        proxied = client.get("/accounts/login/", headers={"X-Forwarded-Proto": "https"})
        assert proxied.status_code == 200
        assert proxied["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains; preload"
        assert proxied.cookies["csrftoken"]["secure"]
        client.force_login(owner)
        assert client.cookies["sessionid"]["secure"]


@pytest.mark.django_db
def test_locally_nothing_redirects_and_cookies_work_over_plain_http(client):
    answer = client.get("/accounts/login/")
    assert answer.status_code == 200 and "Strict-Transport-Security" not in answer
    assert not answer.cookies["csrftoken"]["secure"]


# The Content-Security-Policy, and pages that keep to it.

class InlineFinder(HTMLParser):
    """What a policy without 'unsafe-inline' would block: inline scripts, style attributes and elements, handlers."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag, attrs):
        names = dict(attrs)
        if tag == "script" and "src" not in names and names.get("type") != "application/json":
            self.found.append(f"inline <script> {attrs}")
        if tag == "style":
            self.found.append("<style> element")
        for name, value in attrs:
            if name == "style" or name.startswith("on"):
                self.found.append(f"<{tag} {name}={value!r}>")
            if name in ("href", "src", "action") and (value or "").lower().startswith("javascript:"):
                self.found.append(f"<{tag} {name}={value!r}>")


@pytest.fixture
def pages(make_job, owner, staff):
    job = make_job(owner=owner)
    return [("/accounts/login/", None), ("/", owner), ("/jobs/new", owner), (f"/jobs/{job.pk}", owner),
            (f"/jobs/{job.pk}/rebuild", owner), ("/capacity", owner), ("/tokens", owner),
            ("/admin/login/", None), ("/admin/", staff)]


@pytest.mark.django_db
def test_every_page_has_the_policy_and_nothing_inline_it_would_block(pages):
    for path, user in pages:
        client = Client()
        if user is not None:
            client.force_login(user)
        answer = client.get(path)
        assert answer.status_code == 200, path
        assert answer["Content-Security-Policy"].startswith("default-src 'self'"), path
        assert answer["X-Frame-Options"] == "DENY"
        finder = InlineFinder()
        finder.feed(answer.content.decode())
        assert finder.found == [], (path, finder.found)


def test_the_static_scripts_use_nothing_the_policy_blocks():
    own = [script for script in (ROOT / "static").rglob("*.js") if "vendor" not in script.parts]
    assert own, "no scripts found"
    for script in own:
        text = script.read_text()
        for blocked in ("eval(", "new Function(", "setAttribute(\"style\"", "setAttribute('style'", ".innerHTML", "javascript:"):
            assert blocked not in text, (script.name, blocked)


def test_htmx_the_one_vendored_script_that_could_evaluate_code_is_told_not_to():
    # htmx evaluates hx-on and js: attributes with eval and runs inline scripts it swaps in, unless told not to.
    base = (ROOT / "templates" / "base.html").read_text()
    config = re.search(r'<meta name="htmx-config" content=\'([^\']+)\'>', base)
    assert config is not None
    assert json.loads(config.group(1)) | {"allowEval": False, "allowScriptTags": False} == json.loads(config.group(1))


@pytest.mark.django_db
def test_api_answers_carry_the_policy_too(owner):
    client = Client()
    client.force_login(owner)
    assert client.get("/api/v1/training-jobs")["Content-Security-Policy"].startswith("default-src 'self'")


# Where `make run` listens.

def test_runconsole_listens_on_127_0_0_1_unless_told_otherwise():
    parser = RunConsole().create_parser("manage.py", "runconsole")
    assert parser.parse_args([]).host == "127.0.0.1"
    assert parser.parse_args(["--host", "0.0.0.0"]).host == "0.0.0.0"
    with override_settings(CONSOLE_BIND="10.0.0.5"):
        assert RunConsole().create_parser("manage.py", "runconsole").parse_args([]).host == "10.0.0.5"


def test_runconsole_waits_for_the_server_where_it_listens():
    assert local_address("0.0.0.0") == "127.0.0.1"
    assert local_address("::") == "::1"
    assert local_address("10.0.0.5") == "10.0.0.5"


def test_a_celery_worker_started_without_a_thread_count_runs_as_many_runs_as_WORKER_THREADS_says(
        settings, monkeypatch, tmp_path):
    from console import services
    from console.celery import app

    assert app.conf.worker_concurrency == settings.WORKER_THREADS
    assert settings.RUN_SLOTS == settings.WORKER_THREADS  # one worker process, as `make run` starts
    started: list[list[str]] = []

    class Recorded:
        def __init__(self, command, **_options):
            started.append(command)

    monkeypatch.setattr(services.subprocess, "Popen", Recorded)
    services.start_celery_worker({}, tmp_path / "worker.log")
    assert "--concurrency" not in started[0]  # so the worker reads WORKER_THREADS itself
