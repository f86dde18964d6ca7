"""The console in a real headless Chromium (selenium): log in with the admin token, filter the jobs, open one,
cancel it, and visit the queues, clusters and usage pages, saving a screenshot of each page.

Screenshots go to pytest's temporary directory, or to $SLUICE_SCREENSHOTS when set (docs/images holds the
committed ones). Chromium and its driver are Debian's (`apt-get install chromium chromium-driver`, as .ci/run
does); selenium is given both paths and works offline, so nothing is ever downloaded.
"""
from __future__ import annotations

import base64
import hashlib
import os
import pathlib
import shutil
import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tests.integration.test_spine import job_doc, wait_final

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the test extra: pip install -e .[test]")
pytestmark = pytest.mark.skipif(
    not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)),
    reason="needs Chromium and its driver: apt-get install chromium chromium-driver (as .ci/run does)")
WAIT_S = 20.0
POLL_S = 2.0  # console.js POLL_MS: how often a page redraws


def spki_pin(certificate: pathlib.Path) -> str:
    """base64(sha256(SubjectPublicKeyInfo)) of a certificate: Chromium trusts that key alone, not every certificate."""
    key = x509.load_pem_x509_certificate(certificate.read_bytes()).public_key()
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


@pytest.fixture
def browser(system, tmp_path, monkeypatch):
    from selenium.webdriver.chrome.service import Service

    monkeypatch.setenv("SE_OFFLINE", "true")  # selenium-manager, were it ever asked, downloads nothing
    pin = spki_pin(system.settings.data_dir / "certs" / "dispatcher.crt")  # its key alone is trusted
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1280,900", "--no-first-run", "--disable-extensions",
                 f"--user-data-dir={tmp_path / 'chromium'}",
                 f"--ignore-certificate-errors-spki-list={pin}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(WAIT_S)
    yield driver
    driver.quit()


@pytest.fixture
def shots(tmp_path) -> pathlib.Path:
    directory = pathlib.Path(os.environ.get("SLUICE_SCREENSHOTS") or tmp_path / "screenshots")
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def test_console_in_a_browser(system, browser, shots):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as seen
    from selenium.webdriver.support.ui import Select, WebDriverWait

    # Each page redraws every poll, so an element read between two redraws is looked up again, not failed on.
    wait = WebDriverWait(browser, WAIT_S, ignored_exceptions=(StaleElementReferenceException,))
    base = f"https://127.0.0.1:{system.dispatcher.metrics_port}"
    done = system.client.submit([job_doc(name=f"train-{n}", cpu="2") for n in range(3)]
                                + [job_doc(name="eval-1", exit_code="1")])
    wait_final(system.client, done)
    [long] = system.client.submit([job_doc(name="sweep-long", duration="600s", cpu="4")])
    system.client.submit([job_doc(name=f"sweep-{n}", duration="600s", cpu="8") for n in range(2)])

    def text_of(css: str) -> str:
        return browser.find_element(By.CSS_SELECTOR, css).text

    def click(css: str) -> None:  # found and clicked again when a redraw replaced it in between
        wait.until(lambda _: browser.find_element(By.CSS_SELECTOR, css).click() or True)

    def shot(name: str) -> None:
        browser.save_screenshot(str(shots / f"console-{name}.png"))

    browser.get(f"{base}/queues")  # no token yet: sent to log in first
    wait.until(seen.url_contains("/login"))
    shot("login")
    browser.find_element(By.ID, "token").send_keys("sl_wrong")
    browser.find_element(By.ID, "login").click()
    wait.until(lambda _: "invalid, expired or revoked token" in text_of(".error"))
    token = browser.find_element(By.ID, "token")
    token.clear()
    token.send_keys(system.admin_token)
    browser.find_element(By.ID, "login").click()
    wait.until(seen.url_to_be(f"{base}/queues"))

    browser.get(f"{base}/")
    wait.until(lambda _: len(browser.find_elements(By.CSS_SELECTOR, "#jobs-body tr[data-job]")) == 7)
    browser.find_element(By.ID, "filter-name").send_keys("sweep")
    Select(browser.find_element(By.ID, "filter-state")).select_by_value("RUNNING")
    browser.find_element(By.ID, "apply").click()
    wait.until(lambda _: "name=sweep" in browser.current_url)
    rows = lambda: browser.find_elements(By.CSS_SELECTOR, "#jobs-body tr[data-job]")  # noqa: E731
    wait.until(lambda _: rows() and all("sweep" in r.text and "RUNNING" in r.text for r in rows()))
    wait.until(lambda _: str(long) in {r.get_attribute("data-job") for r in rows()})
    shot("jobs")

    click(f'#jobs-body tr[data-job="{long}"] a')
    wait.until(lambda _: text_of("#job-state") == "RUNNING")
    wait.until(lambda _: "onprem" in text_of("#job"))
    assert "Pod sets" in text_of("#job") and "cpu: 4" in text_of("#job")
    wait.until(lambda _: "started on node-" in text_of("#log-lines"))  # read from the cluster that runs it
    assert f"[{long}-1-" in text_of("#log-lines")
    shot("job")
    cancel = browser.find_element(By.ID, "cancel")
    time.sleep(POLL_S + 0.5)  # the page redraws meanwhile; its buttons stay the same elements, so the click lands
    cancel.click()
    wait.until(seen.element_to_be_clickable((By.ID, "confirm-cancel"))).click()
    wait.until(lambda _: text_of("#job-state") == "CANCELLED")
    attempt = lambda: browser.find_element(By.CSS_SELECTOR, 'tr[data-attempt="1"]').text  # noqa: E731
    wait.until(lambda _: "onprem" in attempt() and "CANCELLED" in attempt())
    assert not browser.find_elements(By.ID, "cancel")  # a finished job offers no cancel
    assert system.client.get(long)["state"] == "CANCELLED"

    browser.find_element(By.LINK_TEXT, "Queues").click()
    wait.until(lambda _: browser.find_elements(By.CSS_SELECTOR, '#queues-body tr[data-queue="default"] .track'))
    shot("queues")
    browser.find_element(By.LINK_TEXT, "Clusters").click()
    wait.until(lambda _: len(browser.find_elements(By.CSS_SELECTOR, "#clusters-body tr[data-cluster]")) == 3)
    assert "cpu" in text_of('#clusters-body tr[data-cluster="cloud"]')
    shot("clusters")
    browser.find_element(By.LINK_TEXT, "Usage").click()
    wait.until(lambda _: "Chargeback by queue" in text_of("#usage") and "cloud-burst" in text_of("#usage"))
    shot("usage")

    browser.execute_script("sessionStorage.setItem('sluice.token', 'sl_revoked')")  # a token no longer good
    browser.get(f"{base}/clusters")
    wait.until(seen.url_contains("/login?next=%2Fclusters"))
    for name in ("login", "jobs", "job", "queues", "clusters", "usage"):
        assert (shots / f"console-{name}.png").stat().st_size > 1000
