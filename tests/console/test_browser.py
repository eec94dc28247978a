"""The web console in headless Chromium (Debian's chromium and chromium-driver, driven by Selenium), as a person
uses it: create a topic with the form, browse records produced into it (text, JSON, hex), see a group's lag,
delete the topic through its confirmation page."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kbroker.testing import RunningBroker
from tests.console.conftest import ConsoleFactory
from tests.console.test_pages import commit, produce

CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if shutil.which(CHROMEDRIVER) is None or shutil.which(CHROMIUM) is None:
        reason = f"no headless Chromium here ({CHROMEDRIVER}, {CHROMIUM}: apt-get install chromium-driver)"
        print(reason)
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def cells(driver: Any, table_id: str) -> list[list[str]]:
    from selenium.webdriver.common.by import By

    rows = driver.find_elements(By.CSS_SELECTOR, f"#{table_id} tbody tr")
    return [[cell.text for cell in row.find_elements(By.TAG_NAME, "td")] for row in rows]


def click_and_load(driver: Any, element_id: str) -> None:
    """Click a link or button that loads a page, and wait until the new page is there."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    old_page = driver.find_element(By.TAG_NAME, "html")
    driver.find_element(By.ID, element_id).click()
    WebDriverWait(driver, 30).until(expected_conditions.staleness_of(old_page))
    WebDriverWait(driver, 30).until(lambda d: d.execute_script("return document.readyState") == "complete")


def choose(driver: Any, select_id: str, value: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element(By.ID, select_id)).select_by_value(value)


def test_console_in_chromium(browser: Any, broker: RunningBroker, console_factory: ConsoleFactory) -> None:
    from selenium.webdriver.common.by import By

    console = console_factory(broker.bootstrap)
    topic, group = f"orders-{uuid.uuid4().hex[:6]}", f"billing-{uuid.uuid4().hex[:6]}"

    browser.get(f"{console.url}/create-topic")
    browser.find_element(By.ID, "name").send_keys(topic)
    browser.find_element(By.ID, "partitions").send_keys("3")
    browser.find_element(By.ID, "configs").send_keys("retention.ms=86400000")
    click_and_load(browser, "create")
    assert browser.current_url == f"{console.url}/topics/{topic}"
    assert browser.find_element(By.ID, "topic-name").text == topic
    assert [row[0] for row in cells(browser, "partitions")] == ["0", "1", "2"]

    value = {"order": 42, "lines": [{"sku": "A-1", "qty": 2}]}
    produce(
        broker.bootstrap,
        topic,
        [(b"order-42", json.dumps(value).encode(), [("source", b"web")]), (b"order-43", b"<b>not json</b>", [])],
    )

    browser.refresh()
    assert cells(browser, "partitions")[0][4:7] == ["0", "2", "2"]  # start, end, messages ≈
    click_and_load(browser, "browse")
    assert [(row[0], row[2], row[3], row[4]) for row in cells(browser, "records")] == [
        ("0", "order-42", json.dumps(value), "source:\nweb"),
        ("1", "order-43", "<b>not json</b>", ""),
    ]

    choose(browser, "format", "json")
    click_and_load(browser, "show")
    assert "format=json" in browser.current_url
    assert cells(browser, "records")[0][3] == json.dumps(value, indent=2)
    assert cells(browser, "records")[1][3] == "<b>not json</b>\nnot JSON"

    choose(browser, "format", "hex")
    click_and_load(browser, "show")
    assert cells(browser, "records")[0][2] == "00000000  6f 72 64 65 72 2d 34 32" + " " * 24 + "  order-42"

    commit(broker.bootstrap, group, topic, 1)
    browser.get(f"{console.url}/groups")
    row = next(r for r in cells(browser, "groups") if r[0] == group)
    assert (row[1], row[4], row[5]) == ("Empty", "0", "1")  # state, members, lag
    browser.get(f"{console.url}/groups/{group}")
    assert cells(browser, "offsets") == [[topic, "0", "1", "2", "1", ""]]

    browser.get(f"{console.url}/topics/{topic}")
    click_and_load(browser, "delete")
    browser.find_element(By.ID, "confirm").send_keys(topic)
    click_and_load(browser, "confirm-delete")
    assert browser.find_element(By.ID, "notice").text == f"Deleted topic {topic}."
    assert topic not in [row[0] for row in cells(browser, "topics")]
