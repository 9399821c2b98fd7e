"""The folder picker beside data_url and train_url, in a real Chromium against a real object store: SeaweedFS,
started here on 127.0.0.1 as `make run` starts it (the object_store fixture would bring the local cluster
up for it), registered as the storage "local", with two objects in the signed-in user's bucket."""

import pytest
from playwright.sync_api import expect

from console import services
from jobs import localstore
from jobs.management.commands.localstore import register
from jobs.object_store.client import ObjectStore
from tests.browser.helpers import log_in
from tests.browser.page_jobs import viewer
from tests.conftest import RUN_ID
from tests.integration.helpers import TEST_OUTPUT

ADDRESS = "127.0.0.1"
# The S3 gateway; the master, volume and filer take the next three ports, each with its port + 10000 for gRPC.
# Its own ports (the integration tests' store is on 19000 + 10 x RUN_ID); each also takes its port + 10000.
BASE_PORT = 16000 + 10 * RUN_ID
@pytest.fixture(scope="module")
def seaweedfs(tmp_path_factory):
    state = tmp_path_factory.mktemp("data-browser-store")
    localstore.keys(state)
    TEST_OUTPUT.mkdir(parents=True, exist_ok=True)
    process = services.start_object_store(localstore.server_argv(state, ADDRESS, BASE_PORT), ADDRESS, BASE_PORT,
                                          TEST_OUTPUT / f"objectstore-browser-{RUN_ID}.log")
    yield {"endpoint": localstore.endpoint(ADDRESS, BASE_PORT), "state": state}
    services.stop(process, timeout=30)


@pytest.fixture
def stored(transactional_db, seaweedfs):
    """The user alice, the local store registered, and in her bucket datasets/mnist/ with two objects."""
    user = viewer("alice")
    storage = register(seaweedfs["endpoint"], seaweedfs["state"])
    bucket = storage.user_bucket(user.pk, user.username)
    store = ObjectStore(storage.access())
    store.create_bucket(bucket)
    store.client.put_object(Bucket=bucket, Key="datasets/mnist/train.bin", Body=b"x" * 2048)
    store.client.put_object(Bucket=bucket, Key="datasets/mnist/labels.txt", Body=b"0123456789\n")
    return {"user": user, "bucket": f"s3://{bucket}/"}


def open_picker(page, field: str):
    page.click(f'[data-browse-for="id_{field}"]')
    picker = page.locator("#data-browser")
    expect(picker).to_be_visible()
    return picker


def test_browse_goes_into_a_folder_and_fills_data_url_with_it(asgi_page, stored, screenshots):
    page = asgi_page
    log_in(page, "alice")
    page.goto("/jobs/new")
    picker = open_picker(page, "data_url")

    bucket = picker.locator(".data-browser-entry", has_text=stored["bucket"])
    expect(bucket).to_contain_text("local")
    bucket.click()
    expect(picker.locator("#data-browser-url")).to_have_value(stored["bucket"])
    # By keyboard: the list has the focus on "..", the arrow goes down to datasets/ and Enter goes in.
    expect(picker.get_by_role("button", name="Up one folder")).to_be_focused()
    page.keyboard.press("ArrowDown")
    expect(picker.get_by_role("button", name="datasets/")).to_be_focused()
    page.keyboard.press("Enter")
    expect(picker.locator("#data-browser-url")).to_have_value(stored["bucket"] + "datasets/")
    picker.get_by_role("button", name="mnist/").click()

    objects = picker.locator(".data-browser-object")
    expect(objects).to_have_count(2)
    expect(objects.filter(has_text="train.bin")).to_contain_text("2 KB")
    expect(objects.filter(has_text="labels.txt")).to_contain_text("11 B")
    expect(picker.locator("[data-browse-crumbs] [aria-current]")).to_have_text("mnist")
    page.screenshot(path=screenshots / "data-browser.png")

    # Up by "..", and in again, before using it.
    picker.get_by_role("button", name="Up one folder").click()
    expect(picker.locator("#data-browser-url")).to_have_value(stored["bucket"] + "datasets/")
    picker.get_by_role("button", name="mnist/").click()
    expect(objects).to_have_count(2)
    picker.get_by_role("button", name="Use this folder").click()

    expect(picker).to_be_hidden()
    expect(page.locator("#id_data_url")).to_have_value(stored["bucket"] + "datasets/mnist/")
    expect(page.locator('[data-browse-for="id_data_url"]')).to_be_focused()


def test_browse_for_train_url_appends_a_new_sub_folder_on_a_390_px_screen(browser, asgi_server, stored, screenshots):
    context = browser.new_context(base_url=asgi_server.url, locale="en-US", viewport={"width": 390, "height": 844})
    context.set_default_timeout(20_000)
    try:
        page = context.new_page()
        log_in(page, "alice")
        page.goto("/jobs/new")
        page.fill("#id_train_url", stored["bucket"] + "datasets")
        picker = open_picker(page, "train_url")

        # It opens where the field points.
        expect(picker.locator("#data-browser-url")).to_have_value(stored["bucket"] + "datasets/")
        expect(picker.get_by_role("button", name="mnist/")).to_be_visible()
        box = picker.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= 390, box
        assert picker.evaluate("dialog => dialog.scrollWidth <= dialog.clientWidth"), "nothing in it wider than it"
        page.screenshot(path=screenshots / "data-browser-390.png")

        picker.get_by_label("New sub-folder (optional)").fill("../up")
        picker.get_by_role("button", name="Use this folder").click()
        expect(picker.locator("[data-browse-error]")).to_contain_text("may not have empty, . or .. parts")
        expect(page.locator("#id_train_url")).to_have_value(stored["bucket"] + "datasets")

        picker.get_by_label("New sub-folder (optional)").fill("runs/run-1/")
        picker.get_by_role("button", name="Use this folder").click()
        expect(picker).to_be_hidden()
        expect(page.locator("#id_train_url")).to_have_value(stored["bucket"] + "datasets/runs/run-1/")
    finally:
        context.close()


def test_a_parameter_named_as_a_further_input_offers_browse_and_takes_the_folder_chosen(asgi_page, stored, screenshots):
    page = asgi_page
    log_in(page, "alice")
    page.goto("/jobs/new")
    page.click('[data-add-row="param"]')
    row = page.locator('[data-rows="param"] tr.row-item').last
    browse = row.locator("[data-browse-row]")
    expect(browse).to_be_hidden()
    row.locator('input[name="param_name"]').fill("data_url_1")
    expect(browse).to_be_visible()

    browse.click()
    picker = page.locator("#data-browser")
    expect(picker).to_be_visible()
    expect(picker.locator("[data-browse-field]")).to_have_text("data_url_1")
    picker.locator(".data-browser-entry", has_text=stored["bucket"]).click()
    picker.get_by_role("button", name="datasets/").click()
    picker.get_by_role("button", name="Use this folder").click()

    expect(picker).to_be_hidden()
    expect(row.locator('input[name="param_value"]')).to_have_value(stored["bucket"] + "datasets/")
    page.locator("#section-parameters").screenshot(path=screenshots / "data-browser-further-input.png")
    row.locator('input[name="param_name"]').fill("data_url_10")
    expect(browse).to_be_hidden()


def test_another_users_bucket_typed_in_the_picker_shows_the_apis_refusal(asgi_page, stored):
    page = asgi_page
    log_in(page, "alice")
    page.goto("/jobs/new")
    page.fill("#id_data_url", "/cache/data")
    picker = open_picker(page, "data_url")
    expect(picker.locator(".data-browser-entry", has_text=stored["bucket"])).to_be_visible()

    picker.locator("#data-browser-url").fill("s3://user-999-mallory/secrets/")
    picker.locator("#data-browser-url").press("Enter")

    error = picker.locator("[data-browse-error]")
    expect(error).to_be_visible()
    expect(error).to_contain_text("Bucket user-999-mallory is not yours")
    expect(error).to_contain_text(stored["bucket"])
    expect(picker.get_by_role("button", name="Use this folder")).to_be_disabled()
    # The buckets are a step back up.
    picker.locator("[data-browse-crumbs] button", has_text="Buckets").click()
    expect(error).to_be_hidden()
    expect(picker.locator(".data-browser-entry", has_text=stored["bucket"])).to_be_visible()
    page.keyboard.press("Escape")
    expect(picker).to_be_hidden()
    expect(page.locator("#id_data_url")).to_have_value("/cache/data")


def test_without_an_object_store_the_picker_says_none_is_configured(asgi_page):
    viewer("alice")
    log_in(asgi_page, "alice")
    asgi_page.goto("/jobs/new")
    picker = open_picker(asgi_page, "data_url")
    expect(picker.locator("[data-browse-status]")).to_have_text("No object store is configured.")
    expect(picker.locator(".data-browser-entry")).to_have_count(0)
    expect(picker.get_by_role("button", name="Use this folder")).to_be_disabled()
