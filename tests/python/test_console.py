"""The web console in a real browser: headless Chromium (Debian's `chromium` and `chromium-driver`)
driven over WebDriver by Selenium, against the real twinhub binary.

It walks what a new user does: open /console, sign in with the printed connection string, create a
device, create and delete its modules, open its twin, edit desired properties (and meet a conflict when someone else wrote first),
watch a reported change from the official device SDK appear live, run a query (and see a syntax
error with its position), look at the cluster page, and find a read-only policy unable to write.
"""

import json
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
import threading
import uuid

import pytest
from azure.iot.device import IoTHubDeviceClient
from azure.iot.hub import IoTHubRegistryManager
from azure.iot.hub.models import Twin, TwinProperties
from msrest.exceptions import HttpOperationError
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from conftest import assert_port_free, twinhub_binary

DEVICE_PORT = 8883  # the device SDK dials 8883 only
WAIT = 20


def _find(*names):
    for n in names:
        p = shutil.which(n)
        if p:
            return p
    pytest.fail(f"none of {names} is installed: the README's test command installs chromium and chromium-driver")


@pytest.fixture(scope="module")
def hub(make_hub):
    assert_port_free(DEVICE_PORT)
    return make_hub(["--mqtt-listen", f"127.0.0.1:{DEVICE_PORT}", "--http-listen", "127.0.0.1:0",
                     "--events-listen", "127.0.0.1:0"])


@pytest.fixture(scope="module")
def rm(hub):
    return IoTHubRegistryManager.from_connection_string(hub.connection_string)


@pytest.fixture(scope="module")
def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = _find("chromium", "chromium-browser")
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              # The hub's development CA is not in the browser's trust store.
              "--ignore-certificate-errors", "--window-size=1400,1000"):
        opts.add_argument(a)
    driver = webdriver.Chrome(service=Service(executable_path=_find("chromedriver")), options=opts)
    driver.set_page_load_timeout(WAIT)
    yield driver
    logs = []
    try:
        logs = driver.get_log("browser")
    except Exception:  # the log is a diagnostic only
        pass
    driver.quit()
    if logs:
        print("browser console:", json.dumps(logs, indent=1))


def wait_for(driver, what, cond, timeout=WAIT):
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda d: cond(d))
    except TimeoutException:
        msg = driver.find_element(By.ID, "message")
        shown = "" if not msg.is_displayed() else f"; the page says: {msg.text!r}"
        pytest.fail(f"timed out waiting for {what}{shown}")


def text(driver, element_id):
    return driver.find_element(By.ID, element_id).text


def visible(driver, element_id):
    return driver.find_element(By.ID, element_id).is_displayed()


def sign_in(driver, hub, connection_string, port=None):
    driver.get(f"https://localhost:{port or hub.http_port}/console")
    wait_for(driver, "the sign-in page", lambda d: visible(d, "page-signin"))
    box = driver.find_element(By.ID, "signin-cs")
    box.clear()
    box.send_keys(connection_string)
    driver.find_element(By.ID, "signin-submit").click()


def policy_connection_string(hub, name):
    policies = json.loads((hub.data_dir / "policies.json").read_text())["policies"]
    key = next(p["primary_key"] for p in policies if p["name"] == name)
    return f"HostName={hub.host_name};SharedAccessKeyName={name};SharedAccessKey={key}"


def test_a_new_user_signs_in_creates_a_device_edits_its_twin_and_sees_reported_changes_live(hub, rm, browser):
    d = browser
    # `serve` names the console's address (on stderr; stdout carries only the connection string).
    m = re.search(r"web console at (https://\S+/console)", hub.stderr())
    assert m, f"the node did not print its console address:\n{hub.stderr()}"
    assert m.group(1) == f"https://localhost:{hub.http_port}/console"
    # A wrong key is refused with the hub's reason, and nothing else is shown.
    bad = hub.connection_string.rsplit("=", 2)[0] + "=" + "A" * 43 + "="
    sign_in(d, hub, bad)
    wait_for(d, "the refusal", lambda d: visible(d, "message") and "refused" in text(d, "message").lower())
    assert visible(d, "page-signin") and not visible(d, "nav")

    sign_in(d, hub, hub.connection_string)
    wait_for(d, "the device list", lambda d: visible(d, "page-devices"))

    dev = f"web-{uuid.uuid4().hex[:8]}"
    d.find_element(By.ID, "device-create-id").send_keys(dev)
    d.find_element(By.ID, "device-create").click()
    wait_for(d, "the new device's page", lambda d: visible(d, "page-device") and text(d, "device-id") == dev)
    cs = wait_for(d, "its connection string", lambda d: d.find_elements(By.CSS_SELECTOR, "#device-keys .cs-primary"))[0].text
    assert cs.startswith(f"HostName=localhost;DeviceId={dev};SharedAccessKey=")
    assert rm.get_device(dev).authentication.symmetric_key.primary_key == cs.rsplit("SharedAccessKey=", 1)[1]

    # The twin: edit desired properties with the etag.
    d.find_element(By.ID, "device-twin-link").click()
    wait_for(d, "the twin page", lambda d: visible(d, "page-twin") and text(d, "twin-version") == "1")
    patch = d.find_element(By.ID, "twin-patch")
    patch.clear()
    patch.send_keys(json.dumps({"properties": {"desired": {"interval": 7}}}))
    d.find_element(By.ID, "twin-save").click()
    wait_for(d, "the saved desired property", lambda d: '"interval": 7' in text(d, "twin-desired"))
    assert "Twin updated to version 2" in text(d, "message")
    assert rm.get_twin(dev).properties.desired["interval"] == 7

    # Someone else writes first: the page shows the change live, and the operator's save is a conflict.
    rm.update_twin(dev, Twin(properties=TwinProperties(desired={"interval": 9})), "*")
    wait_for(d, "the other writer's change, live", lambda d: '"interval": 9' in text(d, "twin-desired"))
    assert visible(d, "twin-stale")
    patch = d.find_element(By.ID, "twin-patch")
    patch.clear()
    patch.send_keys(json.dumps({"properties": {"desired": {"interval": 11}}}))
    d.find_element(By.ID, "twin-save").click()
    wait_for(d, "the conflict", lambda d: visible(d, "message") and "Conflict" in text(d, "message"))
    assert rm.get_twin(dev).properties.desired["interval"] == 9, "a conflicting save must change nothing"
    # Applying it again, now based on the current version, writes it.
    d.find_element(By.ID, "twin-save").click()
    wait_for(d, "the second save", lambda d: '"interval": 11' in text(d, "twin-desired"))
    assert rm.get_twin(dev).properties.desired["interval"] == 11

    # The device reports: the page shows it without a reload.
    client = IoTHubDeviceClient.create_from_connection_string(cs, server_verification_cert=hub.ca_pem)
    try:
        client.connect()
        client.patch_twin_reported_properties({"temperature": 21.5})
        wait_for(d, "the reported change, live", lambda d: '"temperature": 21.5' in text(d, "twin-reported"))
    finally:
        client.shutdown()
    changes = d.find_elements(By.CSS_SELECTOR, "#twin-changes li")
    assert any("reported" in c.text for c in changes), [c.text for c in changes]


def test_modules_are_created_and_deleted_on_the_device_page_and_the_device_deleted_with_its_last_module(hub, rm, browser):
    d = browser
    d.get(f"https://localhost:{hub.http_port}/console")
    if visible(d, "sign-out"):
        d.find_element(By.ID, "sign-out").click()
    sign_in(d, hub, hub.connection_string)
    wait_for(d, "the device list", lambda d: visible(d, "page-devices"))
    dev = f"mod-{uuid.uuid4().hex[:8]}"
    rm.create_device_with_sas(dev, None, None, "enabled")
    d.get(f"https://localhost:{hub.http_port}/console#/device/{dev}")
    wait_for(d, "the device page", lambda d: visible(d, "page-device") and text(d, "device-id") == dev)
    wait_for(d, "an empty module list", lambda d: "No modules." in text(d, "module-table"))

    def row(mid):
        return d.find_elements(By.CSS_SELECTOR, f'#module-table tr[data-module="{mid}"]')

    for mid in ("sensor", "actuator"):
        d.find_element(By.ID, "module-create-id").send_keys(mid)
        d.find_element(By.CSS_SELECTOR, "#module-create-form button").click()
        wait_for(d, f"module {mid} in the list", lambda d: row(mid))
    assert sorted(m.module_id for m in rm.get_modules(dev)) == ["actuator", "sensor"]
    sensor = row("sensor")[0]
    key = rm.get_module(dev, "sensor").authentication.symmetric_key.primary_key
    assert f"DeviceId={dev};ModuleId=sensor;SharedAccessKey={key}" in sensor.text, sensor.text

    # Deleting one module asks first, removes it and its twin, and leaves the other.
    sensor.find_element(By.CSS_SELECTOR, "button.module-delete").click()
    d.switch_to.alert.accept()
    wait_for(d, "the deleted module gone from the list", lambda d: not row("sensor") and row("actuator"))
    assert [m.module_id for m in rm.get_modules(dev)] == ["actuator"]
    with pytest.raises(HttpOperationError) as e:
        rm.get_module_twin(dev, "sensor")
    assert e.value.response.status_code == 404

    # Deleting the device takes its remaining module with it.
    d.find_element(By.ID, "device-delete").click()
    d.switch_to.alert.accept()
    wait_for(d, "the device list after the delete", lambda d: visible(d, "page-devices"))
    for call in (lambda: rm.get_device(dev), lambda: rm.get_module(dev, "actuator")):
        with pytest.raises(HttpOperationError) as e:
            call()
        assert e.value.response.status_code == 404


def test_query_page_shows_results_as_a_table_and_errors_with_their_position(hub, rm, browser):
    d = browser
    dev = f"q-{uuid.uuid4().hex[:8]}"
    rm.create_device_with_sas(dev, None, None, "enabled")
    rm.update_twin(dev, Twin(tags={"site": "b43"}), "*")
    d.get(f"https://localhost:{hub.http_port}/console#/query")
    wait_for(d, "the query page", lambda d: visible(d, "page-query"))
    q = d.find_element(By.ID, "query-text")
    q.clear()
    q.send_keys(f"SELECT deviceId, tags.site FROM devices WHERE deviceId = '{dev}'")
    d.find_element(By.ID, "query-run").click()
    wait_for(d, "the result row", lambda d: len(d.find_elements(By.CSS_SELECTOR, "#query-table tbody tr")) == 1)
    headers = [h.text for h in d.find_elements(By.CSS_SELECTOR, "#query-table thead th")]
    cells = [c.text for c in d.find_elements(By.CSS_SELECTOR, "#query-table tbody td")]
    assert headers == ["deviceId", "site"] and cells == [dev, "b43"], (headers, cells)

    q.clear()
    q.send_keys("SELECT * FROM devices WHERE")
    d.find_element(By.ID, "query-run").click()
    wait_for(d, "the syntax error", lambda d: visible(d, "query-error"))
    assert "position" in text(d, "query-error"), text(d, "query-error")


def test_cluster_page_shows_every_shard_its_leader_and_live_throughput(hub, rm, browser):
    d = browser
    d.get(f"https://localhost:{hub.http_port}/console#/cluster")
    wait_for(d, "the cluster page", lambda d: visible(d, "page-cluster") and text(d, "cluster-node") == "1")
    rows = wait_for(d, "the shard table", lambda d: d.find_elements(By.CSS_SELECTOR, "#cluster-shards tbody tr"))
    # Every shard of the node's data directory (the count it recorded when it was created).
    shards = int((hub.data_dir / "shard-count").read_text().strip())
    assert shards >= 1, shards
    assert len(rows) == shards, f"expected a row for each of the node's {shards} shards, got {len(rows)}"
    leaders = {r.find_element(By.CSS_SELECTOR, ".shard-leader").text for r in rows}
    assert leaders == {"1"}, leaders
    assert "ready" in text(d, "cluster-ready")
    # Live throughput: while a service client reads a twin in a loop, the rate chart (sampling /metrics
    # every 2 s) shows at least that many requests per second and draws its line.
    dev = f"chart-{uuid.uuid4().hex[:8]}"
    rm.create_device_with_sas(dev, None, None, "enabled")
    stop = threading.Event()
    reads, errors = [0], []

    def load():
        try:
            while not stop.is_set():
                rm.get_twin(dev)
                reads[0] += 1
        except Exception as e:  # reported by the wait below
            errors.append(e)

    def rate_shown(d):
        assert not errors, f"the reading client failed: {errors[0]!r}"
        chart = d.find_element(By.ID, "chart-rate")
        return (reads[0] >= 20 and int(chart.get_attribute("data-samples") or 0) >= 2
                and float(chart.get_attribute("data-now") or 0) >= 5)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    try:
        wait_for(d, "the rate chart to show the client's reads", rate_shown, timeout=30)
    finally:
        stop.set()
        worker.join(timeout=10)
    assert not errors, f"the reading client failed: {errors[0]!r}"
    assert "Requests per second: now" in d.find_element(By.ID, "chart-rate").get_attribute("aria-label")
    # And the line is drawn: pixels in the line's blue, antialiased or not (blue well above red).
    drawn = d.execute_script(
        "const c = document.getElementById('chart-rate');"
        "const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
        "let n = 0; for (let i = 0; i < px.length; i += 4) if (px[i+2] > px[i] + 80 && px[i+3] > 0) n++;"
        "return n;")
    assert drawn >= 50, f"only {drawn} pixels of the rate line drawn"
    p99 = d.find_element(By.ID, "chart-p99")
    assert float(p99.get_attribute("data-now") or -1) >= 0, p99.get_attribute("aria-label")


def test_a_read_only_policy_can_look_but_not_write(hub, rm, browser):
    d = browser
    d.get(f"https://localhost:{hub.http_port}/console")
    if visible(d, "sign-out"):
        d.find_element(By.ID, "sign-out").click()
    sign_in(d, hub, policy_connection_string(hub, "registryRead"))
    wait_for(d, "the device list", lambda d: visible(d, "page-devices"))
    assert not visible(d, "device-create"), "a read-only sign-in must not offer writes"
    dev = f"ro-{uuid.uuid4().hex[:8]}"
    rm.create_device_with_sas(dev, None, None, "enabled")
    d.get(f"https://localhost:{hub.http_port}/console#/device/{dev}")
    wait_for(d, "the device page", lambda d: visible(d, "page-device") and text(d, "device-id") == dev)
    assert not visible(d, "device-delete")
    # Even a forced write from the page is refused by the hub, and the page says why.
    d.execute_script("document.body.classList.remove('read-only');")
    d.find_element(By.ID, "device-delete").click()
    d.switch_to.alert.accept()
    wait_for(d, "the refusal", lambda d: visible(d, "message") and "Unauthorized" in text(d, "message"))
    assert rm.get_device(dev).device_id == dev


def test_the_console_works_on_any_node_of_a_cluster(browser):
    """A 3-node cluster from `twinhub cluster up`: signed in on node 2, the cluster page lists the three
    nodes, every shard with its three replicas and a leader, and a twin written through node 3 opens."""
    d = browser
    with tempfile.TemporaryDirectory(prefix="twinhub-console-cluster-") as tmp:
        up = subprocess.run([str(twinhub_binary()), "cluster", "up", "--dir", tmp, "--nodes", "3", "--shard-count", "4"],
                            capture_output=True, text=True, timeout=300)
        assert up.returncode == 0, f"cluster up failed:\n{up.stderr[-4000:]}"
        try:
            cluster = json.loads((pathlib.Path(tmp) / "cluster.json").read_text())
            ports = {n["id"]: int(n["http"].rsplit(":", 1)[1]) for n in cluster["nodes"]}
            cs2 = f"HostName=localhost:{ports[2]};SharedAccessKeyName=iothubowner;SharedAccessKey={cluster['owner_key']}"
            d.get(f"https://localhost:{ports[2]}/console")
            if visible(d, "sign-out"):
                d.find_element(By.ID, "sign-out").click()
            sign_in(d, None, cs2, port=ports[2])
            wait_for(d, "the device list", lambda d: visible(d, "page-devices"))
            d.get(f"https://localhost:{ports[2]}/console#/cluster")
            wait_for(d, "the cluster page of node 2", lambda d: visible(d, "page-cluster") and text(d, "cluster-node") == "2")
            nodes = wait_for(d, "three nodes", lambda d: len(d.find_elements(By.CSS_SELECTOR, "#cluster-nodes tbody tr")) == 3
                             and d.find_elements(By.CSS_SELECTOR, "#cluster-nodes tbody tr"))
            assert [r.find_elements(By.TAG_NAME, "td")[0].text for r in nodes] == ["1", "2", "3"]
            rows = d.find_elements(By.CSS_SELECTOR, "#cluster-shards tbody tr")
            assert len(rows) == 4
            for r in rows:
                cells = [c.text for c in r.find_elements(By.TAG_NAME, "td")]
                assert cells[1] == "1, 2, 3", cells
                assert cells[2] in ("1", "2", "3"), f"every shard has a known leader: {cells}"
            # A device created through node 3 opens on node 2's console (its twin may live on any shard).
            cs3 = f"HostName=localhost:{ports[3]};SharedAccessKeyName=iothubowner;SharedAccessKey={cluster['owner_key']}"
            rm3 = IoTHubRegistryManager.from_connection_string(cs3)
            dev = f"cl-{uuid.uuid4().hex[:8]}"
            old = os.environ.get("REQUESTS_CA_BUNDLE")
            os.environ["REQUESTS_CA_BUNDLE"] = cluster["ca"]
            try:
                rm3.create_device_with_sas(dev, None, None, "enabled")
                rm3.update_twin(dev, Twin(tags={"via": "node3"}), "*")
            finally:
                if old is None:
                    os.environ.pop("REQUESTS_CA_BUNDLE", None)
                else:
                    os.environ["REQUESTS_CA_BUNDLE"] = old
            d.get(f"https://localhost:{ports[2]}/console#/twin/{dev}")
            wait_for(d, "the twin through node 2", lambda d: visible(d, "page-twin") and '"via": "node3"' in text(d, "twin-tags"))
        finally:
            subprocess.run([str(twinhub_binary()), "cluster", "down", "--dir", tmp], capture_output=True, timeout=120)
