"""What the browser tests do often: log in, fill rows of name/value."""

PASSWORD = "browser-password"


def log_in(page, username: str) -> None:
    page.goto("/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url("**/")


def add_rows(page, prefix: str, rows: list[tuple[str, str]]) -> None:
    """Add and fill rows of the hyperparameter (`param`) or environment variable (`env`) table."""
    table = page.locator(f'[data-rows="{prefix}"] tbody')
    for name, value in rows:
        page.click(f'[data-add-row="{prefix}"]')
        row = table.locator("tr").last
        row.locator(f'input[name="{prefix}_name"]').fill(name)
        row.locator(f'input[name="{prefix}_value"]').fill(value)


def row_values(page, prefix: str) -> list[tuple[str, str]]:
    rows = page.locator(f'[data-rows="{prefix}"] tbody tr')
    return [(rows.nth(i).locator(f'input[name="{prefix}_name"]').input_value(),
             rows.nth(i).locator(f'input[name="{prefix}_value"]').input_value()) for i in range(rows.count())]
