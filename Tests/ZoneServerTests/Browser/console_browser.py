#!/usr/bin/python3
"""Drives the operator's console in a real browser (Debian's chromium, headless, through
chromedriver and Selenium) for ConsoleBrowserTests: signs in, opens a zone, pages through every
record, opens one and sees it verified, sees a forged one marked, a refused save listed, and the
request chart move. Prints "ok <step>" per step; exits 1 with the reason at the first failure.
Screenshots go to the directory given."""
import sys
import time

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException, UnexpectedAlertPresentException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

base, token, zone, message, forged, refused, shots = sys.argv[1:8]
expected_records = int(sys.argv[8])


def fail(reason):
    print("FAILED " + reason, flush=True)
    sys.exit(1)


def check(condition, reason):
    if not condition:
        fail(reason)


def wait_for(condition, reason, seconds=30):
    """A form's answer or a link's page arrives after the click returns (on a busy machine,
    well after): wait for what it should show."""
    try:
        WebDriverWait(driver, seconds).until(lambda d: condition())
    except TimeoutException:
        fail("%s (at %s)" % (reason, driver.current_url))


options = webdriver.ChromeOptions()
for argument in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,1000"]:
    options.add_argument(argument)
options.binary_location = "/usr/bin/chromium"
driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
driver.set_page_load_timeout(30)


def is_stale(element):
    """Whether the page `element` was on has gone (the next one loaded)."""
    try:
        element.is_enabled()
        return False
    except StaleElementReferenceException:
        return True


def page_is_inert():
    """Nothing a record carried became markup: no image, no script but the console's own."""
    scripts = [s.get_attribute("src") for s in driver.find_elements(By.TAG_NAME, "script")]
    check(all(src and src.endswith("/console/static/console.js") for src in scripts), "a script that is not the console's: %r" % scripts)
    check(not driver.find_elements(By.TAG_NAME, "img"), "an image element appeared from record content")


try:
    # Without a session: the sign-in page.
    driver.get(base + "/console/zones")
    check("/console/sign-in" in driver.current_url, "not sent to sign in: " + driver.current_url)
    field = driver.find_element(By.ID, "token")
    field.send_keys("not the token" + Keys.ENTER)
    wait_for(lambda: "not the console's token" in driver.page_source, "a wrong token was not refused")
    driver.find_element(By.ID, "token").send_keys(token + Keys.ENTER)
    wait_for(lambda: driver.find_element(By.TAG_NAME, "h1").text == "Overview", "no overview after signing in")
    driver.save_screenshot(shots + "/1-overview.png")
    print("ok signed in", flush=True)

    # Keyboard: Tab reaches the navigation's links.
    driver.find_element(By.TAG_NAME, "body").send_keys(Keys.TAB)
    check(driver.switch_to.active_element.tag_name == "a", "Tab does not reach a link")

    driver.find_element(By.LINK_TEXT, "Zones").click()
    wait_for(lambda: driver.find_elements(By.LINK_TEXT, zone), "the zone is not listed")
    driver.find_element(By.LINK_TEXT, zone).click()
    # A zone is counted in the background: the page says so until the count is in.
    def zone_counted():
        if "Counting its records" in driver.page_source:
            driver.refresh()
            return False
        return ("%d records" % expected_records) in driver.page_source
    wait_for(zone_counted, "the zone's count is not %d" % expected_records)
    driver.save_screenshot(shots + "/2-zone.png")
    print("ok zone opened", flush=True)

    # Every record, page after page (500 a page).
    driver.get(base + "/console/zones/" + zone + "?limit=500")
    seen, pages = 0, 0
    while True:
        rows = driver.find_elements(By.XPATH, "//table[starts-with(caption, 'Records')]/tbody/tr")
        seen += len(rows)
        pages += 1
        page_is_inert()
        links = driver.find_elements(By.LINK_TEXT, "Next records →")
        if not links:
            break
        links[0].click()
        wait_for(lambda: is_stale(links[0]), "the next page of records did not load")
    check(seen == expected_records, "paged through %d records in %d pages, not %d" % (seen, pages, expected_records))
    print("ok paged through %d records in %d pages" % (seen, pages), flush=True)

    # One record, verified; its hostile text shown as text.
    driver.get(base + "/console/zones/" + zone + "/records/" + message)
    page_is_inert()
    check("verified" in driver.find_element(By.TAG_NAME, "table").text, "the message is not shown verified")
    check("<script>alert(1)</script>" in driver.find_element(By.TAG_NAME, "table").text, "the hostile text is not shown as text")
    driver.save_screenshot(shots + "/3-record.png")
    print("ok record verified, hostile text inert", flush=True)

    driver.get(base + "/console/zones/" + zone + "/records/" + forged)
    check("FORGED OR BROKEN" in driver.page_source, "the forged record is not marked")
    driver.save_screenshot(shots + "/4-forged.png")
    print("ok forged record marked", flush=True)

    driver.find_element(By.LINK_TEXT, "Refused saves").click()
    wait_for(lambda: refused in driver.page_source, "the refused save is not listed")
    driver.save_screenshot(shots + "/5-refused.png")
    print("ok refused save listed", flush=True)

    # The request chart moves while a client syncs (the test drives one meanwhile).
    driver.find_element(By.LINK_TEXT, "Metrics").click()
    wait_for(lambda: driver.find_elements(By.ID, "chart-requests"), "no request chart")
    deadline = time.time() + 30
    moved = False
    while time.time() < deadline and not moved:
        chart = driver.find_element(By.ID, "chart-requests")
        points = int(chart.get_attribute("data-points") or "0")
        last = float(chart.get_attribute("data-last") or "0")
        moved = points >= 2 and last > 0
        time.sleep(0.5)
    check(moved, "the request chart did not move")
    driver.save_screenshot(shots + "/6-metrics.png")
    print("ok request chart moved", flush=True)

    # Signing out ends the session.
    # The click only starts the form's POST: wait for its answer (the sign-in page) before the next
    # navigation, which would otherwise abort a POST still in flight on a busy machine.
    driver.find_element(By.XPATH, "//button[text()='Sign out']").click()
    wait_for(lambda: "/console/sign-in" in driver.current_url, "signing out did not lead to the sign-in page")
    driver.get(base + "/console/zones")
    check("/console/sign-in" in driver.current_url, "still signed in after signing out")
    print("ok signed out", flush=True)
except UnexpectedAlertPresentException as alert:
    fail("a script from record content ran: %s" % alert)
finally:
    driver.quit()
