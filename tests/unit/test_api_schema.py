"""The OpenAPI schema: generated without a warning, every API route in it, every field described, the error
shape a component each route answers with, and the docs page served from this origin."""

import re

import pytest
import yaml
from django.core.management import call_command
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def schema(django_db_blocker):
    with django_db_blocker.unblock():
        answer = APIClient().get("/api/v1/schema", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert answer.status_code == 200, answer.content
    return answer.json()


def api_routes() -> set[str]:
    """Every route under /api/v1/ Django knows, written as the schema writes paths."""
    routes = set()

    def walk(patterns, prefix: str) -> None:
        for pattern in patterns:
            text = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, text)
            elif isinstance(pattern, URLPattern) and text.startswith("api/v1/"):
                routes.add("/" + re.sub(r"<(?:\w+:)?(\w+)>", lambda m: "{id}" if m[1] == "pk" else f"{{{m[1]}}}", text))

    walk(get_resolver().url_patterns, "")
    return routes - {"/api/v1/schema", "/api/v1/docs"}


def test_the_schema_builds_and_validates_without_a_single_warning(tmp_path):
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))
    assert yaml.safe_load(out.read_text())["openapi"].startswith("3.")


def test_every_api_route_is_in_the_schema(schema):
    routes = api_routes()
    assert len(routes) >= 18
    assert routes <= set(schema["paths"]), routes - set(schema["paths"])


def test_every_operation_has_a_summary_and_answers_errors_with_the_error_component(schema):
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            assert operation.get("summary"), (method, path)
            for code in ("401", "404"):
                body = operation["responses"][code]["content"]["application/json"]["schema"]
                assert body == {"$ref": "#/components/schemas/ApiError"}, (method, path, code)
    assert "additionalProperties" in schema["components"]["schemas"]["ApiError"]


def _properties(component: dict, schemas: dict):
    yield from component.get("properties", {}).items()
    for part in component.get("allOf", []):
        if "$ref" in part:
            yield from _properties(schemas[part["$ref"].rsplit("/", 1)[1]], schemas)


def test_every_field_of_every_component_is_described(schema):
    schemas = schema["components"]["schemas"]
    undescribed = []
    for component_name, component in schemas.items():
        if component.get("enum"):
            continue
        for name, field in _properties(component, schemas):
            if not field.get("description") and "$ref" not in field and "allOf" not in field:
                undescribed.append(f"{component_name}.{name}")
    assert undescribed == []


def test_every_query_parameter_is_described(schema):
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            for parameter in operation.get("parameters", []):
                assert parameter.get("description"), (method, path, parameter["name"])


def test_the_submission_body_is_the_jobs_detail_without_its_read_only_fields(schema):
    schemas = schema["components"]["schemas"]
    detail = schemas["TrainingJob"]["properties"]
    writable = {name for name, field in detail.items() if not field.get("readOnly")}
    assert writable == set(schemas["TrainingJobRequest"]["properties"])
    assert {"engine", "engine_version", "code_dir", "spec", "pool", "parameters", "env", "metrics"} <= writable
    assert set(schemas["TrainingJobRequest"]["required"]) == {"name", "engine", "code_dir", "boot_file", "spec"}


def test_the_docs_page_loads_swagger_ui_from_this_origin_without_inline_script(client):
    page = client.get("/api/v1/docs")
    assert page.status_code == 200
    html = page.content.decode()
    scripts = re.findall(r'<script src="([^"]+)"', html)
    assert scripts and all(src.startswith("/") and not src.startswith("//") for src in scripts), scripts
    assert "<script>" not in html
    assert "script-src 'self'" in page["Content-Security-Policy"]
    assert client.get(scripts[-1]).status_code == 200  # the page's own init script
    bundle = next(src for src in scripts if "swagger-ui-bundle" in src)
    assert bundle.startswith("/static/drf_spectacular_sidecar/")
