"""Conformance: the official, unmodified `azure-iot-device` 2.14.0 device SDK (sync `IoTHubDeviceClient` /
`IoTHubModuleClient`, MQTT 3.1.1 over TLS 1.2) together with the `azure-iot-hub` 2.7.0 service SDK, against
the real twinhub binary.

The device SDK always dials port 8883 (docs/iothub-protocol.md §1.1), so the server is started with
`--mqtt-listen 127.0.0.1:8883 --hostname localhost` (every other listener on an ephemeral port) and
8883 must be free. Devices trust the generated CA through `server_verification_cert=<PEM contents>` (or
`SSL_CERT_FILE`, see the module test); the service SDK through REQUESTS_CA_BUNDLE (conftest.py).

Every SDK call runs under a timeout (a server that never answers must fail the test, not hang it); every
test shuts its clients down. A missing SDK or binary is a failure, never a skip.
"""

import base64
import os
import subprocess
import threading
import time
import uuid

import pytest

from conftest import assert_port_free

try:
    from azure.iot.device import IoTHubDeviceClient, IoTHubModuleClient
    from azure.iot.device.exceptions import CredentialError
except ImportError as e:  # pragma: no cover - a broken environment must fail, not skip
    pytest.fail(f"azure-iot-device 2.14.0 is not importable ({e}): run scripts/test.sh to set up .venv",
                pytrace=False)

from azure.iot.hub import IoTHubRegistryManager
from azure.iot.hub.models import Twin, TwinProperties

# The SDK pins ssl.PROTOCOL_TLSv1_2, which Python 3.11 reports as deprecated on every client: noise here.
pytestmark = pytest.mark.filterwarnings("ignore:ssl.PROTOCOL_TLSv1_2 is deprecated:DeprecationWarning")

DEVICE_PORT = 8883  # hard-coded in the device SDK
WAIT = 60  # seconds for any one expected behaviour (these are behaviour checks, not timings)


# ---------------------------------------------------------------------------------------------------
# fixtures and helpers


@pytest.fixture(scope="module")
def hub(make_hub):
    assert_port_free(DEVICE_PORT)
    h = make_hub(["--mqtt-listen", f"127.0.0.1:{DEVICE_PORT}", "--http-listen", "127.0.0.1:0",
                  "--events-listen", "127.0.0.1:0"])
    assert h.mqtt_port == DEVICE_PORT, f"listen.json says MQTT/TLS is on {h.listen.get('mqtt')}"
    return h


@pytest.fixture(scope="module")
def rm(hub):
    return IoTHubRegistryManager.from_connection_string(hub.connection_string)


_hub_for_messages = None


def within(timeout, fn, *args, what=None, **kwargs):
    """Runs fn(*args, **kwargs) in a daemon thread; fails the test if it takes longer than `timeout` s.
    Exceptions are re-raised in the test's thread."""
    result = {}

    def run():
        try:
            result["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            result["error"] = e

    t = threading.Thread(target=run, daemon=True, name=f"within-{getattr(fn, '__name__', 'call')}")
    t.start()
    t.join(timeout)
    if t.is_alive():
        pytest.fail(f"{what or getattr(fn, '__qualname__', fn)} did not complete within {timeout}s"
                    f"{_server_tail()}")
    if "error" in result:
        raise result["error"]
    return result.get("value")


def _server_tail():
    if _hub_for_messages is None:
        return ""
    return "\n--- twinhub stderr (tail) ---\n" + _hub_for_messages.stderr()[-4000:]


class Recorder:
    """Collects what an SDK handler is called with; waits for an item matching a predicate."""

    def __init__(self, name):
        self.name = name
        self.items = []
        self.cv = threading.Condition()

    def __call__(self, item):
        with self.cv:
            self.items.append(item)
            self.cv.notify_all()

    def mark(self):
        with self.cv:
            return len(self.items)

    def since(self, mark):
        with self.cv:
            return list(self.items[mark:])

    def wait_for(self, pred, what, start=0, timeout=WAIT):
        deadline = time.monotonic() + timeout
        with self.cv:
            while True:
                for item in self.items[start:]:
                    if pred(item):
                        return item
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cv.wait(min(left, 0.5))
            seen = list(self.items[start:])
        pytest.fail(f"{self.name}: no {what} within {timeout}s; got {seen!r}{_server_tail()}")


def is_full_document(patch):
    """The SDK's synthetic patch after a (re)connect is the whole desired document, with `$metadata`."""
    return isinstance(patch, dict) and "$metadata" in patch


def user_props(doc):
    return {k: v for k, v in doc.items() if not k.startswith("$")}


def _uid(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class Clients:
    """Creates device/module clients for one test and shuts every one of them down afterwards."""

    def __init__(self, hub):
        self.hub = hub
        self.clients = []

    def device(self, device_id, key, **kwargs):
        kwargs.setdefault("server_verification_cert", self.hub.ca_pem)
        c = IoTHubDeviceClient.create_from_connection_string(
            f"HostName=localhost;DeviceId={device_id};SharedAccessKey={key}", **kwargs)
        self.clients.append(c)
        return c

    def module(self, device_id, module_id, key, **kwargs):
        c = IoTHubModuleClient.create_from_connection_string(
            f"HostName=localhost;DeviceId={device_id};ModuleId={module_id};SharedAccessKey={key}", **kwargs)
        self.clients.append(c)
        return c

    def shutdown_all(self):
        errors = []
        for c in self.clients:
            t = threading.Thread(target=c.shutdown, daemon=True)
            t.start()
            t.join(WAIT)
            if t.is_alive():
                errors.append("client.shutdown() hung")
        self.clients.clear()
        return errors


@pytest.fixture
def clients(hub):
    global _hub_for_messages
    _hub_for_messages = hub
    cl = Clients(hub)
    yield cl
    errors = cl.shutdown_all()
    assert not errors, errors


def new_device(rm):
    dev = _uid("pyd")
    d = rm.create_device_with_sas(dev, None, None, "enabled")
    return dev, d.authentication.symmetric_key.primary_key


def set_desired_handler(client, recorder):
    """Setting the handler subscribes (and, when not connected yet, auto-connects); it blocks until the
    SUBSCRIBE is acknowledged, so it runs under a timeout too."""

    def set_it():
        client.on_twin_desired_properties_patch_received = recorder

    within(WAIT, set_it, what="setting on_twin_desired_properties_patch_received")


def ss_kill_device_connections():
    """Destroys every TCP socket on this machine connected to 127.0.0.1:8883 (the device side of the
    MQTT connections) with `ss -K` (SOCK_DESTROY; needs root). Returns the killed sockets' lines."""
    r = subprocess.run(["ss", "-K", "-t", "-n", "dst", "127.0.0.1", "dport", "=", f":{DEVICE_PORT}"],
                       capture_output=True, text=True, timeout=30)
    killed = [l for l in r.stdout.splitlines()[1:] if f"127.0.0.1:{DEVICE_PORT}" in l]
    if not killed:
        pytest.fail(f"`ss -K` destroyed no connection to 127.0.0.1:{DEVICE_PORT} (rc {r.returncode}; it needs "
                    f"root and a kernel with SOCK_DESTROY):\nstdout: {r.stdout}\nstderr: {r.stderr}")
    return killed


# ---------------------------------------------------------------------------------------------------
# tests


def test_device_get_twin_and_patch_reported(hub, rm, clients):
    dev, key = new_device(rm)
    c = clients.device(dev, key)
    within(WAIT, c.connect)
    assert c.connected

    twin = within(WAIT, c.get_twin)
    assert set(twin) == {"desired", "reported"}, twin
    assert twin["desired"]["$version"] == 1, twin
    assert twin["reported"]["$version"] == 1, twin
    assert user_props(twin["desired"]) == {} and user_props(twin["reported"]) == {}

    within(WAIT, c.patch_twin_reported_properties, {"fw": "1.0", "nested": {"a": 1}})
    t = rm.get_twin(dev)
    assert t.properties.reported["fw"] == "1.0"
    assert t.properties.reported["nested"] == {"a": 1}
    assert t.properties.reported["$version"] == 2
    assert "fw" in t.properties.reported["$metadata"]

    twin = within(WAIT, c.get_twin)
    assert twin["reported"]["fw"] == "1.0" and twin["reported"]["$version"] == 2, twin

    # null removes a reported property; each accepted patch bumps reported $version by one.
    within(WAIT, c.patch_twin_reported_properties, {"fw": None, "battery": 55})
    t = rm.get_twin(dev)
    assert "fw" not in t.properties.reported
    assert t.properties.reported["battery"] == 55
    assert t.properties.reported["nested"] == {"a": 1}
    assert t.properties.reported["$version"] == 3
    assert t.properties.desired["$version"] == 1, "a reported patch must not touch desired"

    # Desired written by the service shows up in the device's GET.
    rm.update_twin(dev, Twin(properties=TwinProperties(desired={"interval": 5})))
    twin = within(WAIT, c.get_twin)
    assert twin["desired"]["interval"] == 5 and twin["desired"]["$version"] == 2, twin
    assert twin["reported"]["$version"] == 3, twin
    rm.delete_device(dev)


def test_desired_patches_reach_the_handler(hub, rm, clients):
    dev, key = new_device(rm)
    rm.update_twin(dev, Twin(properties=TwinProperties(desired={"interval": 1, "mode": "eco"})))  # $version 2
    c = clients.device(dev, key)
    patches = Recorder("desired handler")
    # Set before connecting (the usual order): the SDK auto-connects, GETs the twin and hands the whole
    # desired document to the handler once, as a synthetic patch (EnsureDesiredPropertiesStage).
    set_desired_handler(c, patches)
    within(WAIT, c.connect)
    first = patches.wait_for(is_full_document, "synthetic full-document patch after connect")
    assert first["$version"] == 2, first
    assert user_props(first) == {"interval": 1, "mode": "eco"}, first
    assert patches.since(0) == [first], "exactly one synthetic patch after connect"

    def expect(update, expected, what):
        m = patches.mark()
        update()
        got = patches.wait_for(lambda p: p.get("$version") == expected["$version"], what, start=m)
        assert got == expected, f"{what}: got {got!r}, expected {expected!r}"
        assert patches.since(m) == [got], f"{what}: unexpected extra patches {patches.since(m)!r}"

    # update_twin (PATCH): the device gets exactly the patch plus $version.
    expect(lambda: rm.update_twin(dev, Twin(properties=TwinProperties(desired={"interval": 5}))),
           {"interval": 5, "$version": 3}, "update_twin interval=5")
    expect(lambda: rm.update_twin(dev, Twin(properties=TwinProperties(desired={"mode": None}))),
           {"mode": None, "$version": 4}, "update_twin mode=None (removal)")
    expect(lambda: rm.update_twin(dev, Twin(properties=TwinProperties(desired={"cfg": {"a": 1, "b": {"c": 2}}}))),
           {"cfg": {"a": 1, "b": {"c": 2}}, "$version": 5}, "update_twin nested object")

    # A tags-only update does not change desired and pushes nothing: the next patch is the next desired one.
    rm.update_twin(dev, Twin(tags={"site": "b43"}))
    expect(lambda: rm.update_twin(dev, Twin(properties=TwinProperties(desired={"interval": 6}))),
           {"interval": 6, "$version": 6}, "update_twin after a tags-only update")

    # replace_twin (PUT): the difference, with None for removed keys.
    expect(lambda: rm.replace_twin(dev, Twin(tags={"site": "b43"},
                                             properties=TwinProperties(desired={"interval": 7, "k": "v"}))),
           {"interval": 7, "k": "v", "cfg": None, "$version": 7}, "replace_twin")

    t = rm.get_twin(dev)
    assert user_props(t.properties.desired) == {"interval": 7, "k": "v"}
    assert t.properties.desired["$version"] == 7
    twin = within(WAIT, c.get_twin)
    assert user_props(twin["desired"]) == {"interval": 7, "k": "v"} and twin["desired"]["$version"] == 7
    rm.delete_device(dev)


def test_module_client_get_patch_receive(hub, rm, clients, monkeypatch):
    dev = _uid("pym")
    rm.create_device_with_sas(dev, None, None, "enabled")
    m = rm.create_module_with_sas(dev, "m", None, None, None)
    key = m.authentication.symmetric_key.primary_key
    # This client trusts the CA through OpenSSL's default paths (SSL_CERT_FILE), not server_verification_cert.
    monkeypatch.setenv("SSL_CERT_FILE", str(hub.ca))
    c = clients.module(dev, "m", key)
    within(WAIT, c.connect)

    twin = within(WAIT, c.get_twin)
    assert twin["desired"]["$version"] == 1 and twin["reported"]["$version"] == 1, twin

    within(WAIT, c.patch_twin_reported_properties, {"state": "running", "temp": {"max": 70}})
    mt = rm.get_module_twin(dev, "m")
    assert mt.module_id == "m" and mt.device_id == dev
    assert mt.properties.reported["state"] == "running"
    assert mt.properties.reported["temp"] == {"max": 70}
    assert mt.properties.reported["$version"] == 2
    dt = rm.get_twin(dev)
    assert "state" not in dt.properties.reported, "the module's reported properties leaked into the device twin"
    assert dt.properties.reported["$version"] == 1

    patches = Recorder("module desired handler")
    set_desired_handler(c, patches)  # already connected: no synthetic patch until the next (re)connect
    m0 = patches.mark()
    rm.update_module_twin(dev, "m", Twin(properties=TwinProperties(desired={"rate": 3})))
    got = patches.wait_for(lambda p: p.get("$version") == 2 and not is_full_document(p), "module desired push",
                           start=m0)
    assert got == {"rate": 3, "$version": 2}, got

    # A change to the device twin is not pushed to the module.
    rm.update_twin(dev, Twin(properties=TwinProperties(desired={"device_only": True})))
    m1 = patches.mark()
    rm.replace_module_twin(dev, "m", Twin(properties=TwinProperties(desired={"rate": 4, "x": "y"})))
    got = patches.wait_for(lambda p: p.get("$version") == 3, "module desired push after replace", start=m1)
    assert got == {"rate": 4, "x": "y", "$version": 3}, got
    assert all("device_only" not in p for p in patches.since(0)), patches.since(0)

    twin = within(WAIT, c.get_twin)
    assert user_props(twin["desired"]) == {"rate": 4, "x": "y"}, twin
    assert twin["reported"]["state"] == "running"
    rm.delete_device(dev)


def test_forced_tcp_drop_reconnects_and_resyncs_desired(hub, rm, clients):
    dev, key = new_device(rm)
    rm.update_twin(dev, Twin(properties=TwinProperties(desired={"phase": "before"})))  # $version 2
    c = clients.device(dev, key)
    states = Recorder("connection state")
    c.on_connection_state_change = lambda: states(c.connected)
    patches = Recorder("desired handler")
    set_desired_handler(c, patches)
    within(WAIT, c.connect)
    first = patches.wait_for(is_full_document, "synthetic full-document patch after connect")
    assert first["$version"] == 2 and first["phase"] == "before", first
    states.wait_for(lambda s: s is True, "connected state")

    # Sever the TCP connection from outside the SDK, then change desired right away: the device either
    # gets the push after its reconnect, or (more likely) the SDK's reconnect GET finds a newer $version
    # and delivers the whole desired document. Either way the handler must end up with the new value.
    s0 = states.mark()
    p0 = patches.mark()
    ss_kill_device_connections()
    states.wait_for(lambda s: s is False, "disconnect after ss -K", start=s0)
    rm.update_twin(dev, Twin(properties=TwinProperties(desired={"phase": "after-drop"})))  # $version 3
    got = patches.wait_for(lambda p: p.get("phase") == "after-drop", "desired state after reconnect", start=p0)
    assert got["$version"] == 3, got
    states.wait_for(lambda s: s is True, "reconnect after ss -K", start=s0)
    assert c.connected
    assert all(p["$version"] <= 3 for p in patches.since(p0)), patches.since(p0)

    # The session (CleanSession=0) kept the desired subscription: the SDK does not re-subscribe after a
    # reconnect, yet the next update is pushed.
    p1 = patches.mark()
    rm.update_twin(dev, Twin(properties=TwinProperties(desired={"phase": "live"})))  # $version 4
    got = patches.wait_for(lambda p: p.get("$version") == 4, "push after reconnect", start=p1)
    assert got == {"phase": "live", "$version": 4}, got

    # Request/response still works on the new connection.
    within(WAIT, c.patch_twin_reported_properties, {"seen": 4})
    assert rm.get_twin(dev).properties.reported["seen"] == 4
    rm.delete_device(dev)


def test_wrong_key_is_a_credential_error(hub, rm, clients):
    dev, key = new_device(rm)
    wrong = base64.b64encode(os.urandom(32)).decode()
    c = clients.device(dev, wrong)
    with pytest.raises(CredentialError):
        within(WAIT, c.connect)
    assert not c.connected

    # An unknown device id is refused the same way.
    c2 = clients.device(_uid("pynobody"), key)
    with pytest.raises(CredentialError):
        within(WAIT, c2.connect)

    # The right key still works afterwards.
    ok = clients.device(dev, key)
    within(WAIT, ok.connect)
    assert within(WAIT, ok.get_twin)["desired"]["$version"] == 1
    rm.delete_device(dev)


def test_server_restart_device_resyncs_desired_with_reconnect_get(hub, rm, clients):
    """The other forced drop: SIGTERM the server and start it again on the same data directory and ports.
    The device's immediate reconnect is refused, so it retries after `connection_retry_interval`; the
    desired change made in between can only reach it through the SDK's reconnect GET (docs/iothub-protocol.md §1.6), which
    the server must answer even though the SDK sends it before (and without) any SUBSCRIBE."""
    dev, key = new_device(rm)
    rm.update_twin(dev, Twin(properties=TwinProperties(desired={"gen": 1})))  # $version 2
    c = clients.device(dev, key, connection_retry_interval=15)
    states = Recorder("connection state")
    c.on_connection_state_change = lambda: states(c.connected)
    patches = Recorder("desired handler")
    set_desired_handler(c, patches)
    within(WAIT, c.connect)
    first = patches.wait_for(is_full_document, "synthetic full-document patch after connect")
    assert first["$version"] == 2 and first["gen"] == 1, first

    s0 = states.mark()
    p0 = patches.mark()
    hub.restart()
    states.wait_for(lambda s: s is False, "disconnect when the server stops", start=s0)
    rm.update_twin(dev, Twin(properties=TwinProperties(desired={"gen": 2})))  # $version 3, durable
    got = patches.wait_for(lambda p: p.get("gen") == 2, "desired state after the server restart", start=p0,
                           timeout=WAIT + 15)
    assert got["$version"] == 3, got
    if is_full_document(got):
        assert user_props(got) == {"gen": 2}, got
    states.wait_for(lambda s: s is True, "reconnect after the restart", start=s0)
    twin = within(WAIT, c.get_twin)
    assert twin["desired"]["gen"] == 2 and twin["desired"]["$version"] == 3, twin
    rm.delete_device(dev)
