"""MQTT over WebSockets with the official, unmodified `azure-iot-device` 2.14.0 SDK: `websockets=True`
makes the SDK dial `wss://{HostName}:443/$iothub/websocket` (the port is fixed), so this module starts
the server with its HTTPS port on 127.0.0.1:443 and its MQTT/TLS port on an ephemeral port — nothing
here can reach port 8883. 443 must be free.
"""

import pytest

from conftest import assert_port_free
from test_device_sdk import WAIT, Recorder, clients, is_full_document, new_device, set_desired_handler, \
    user_props, within  # noqa: F401 (clients is a fixture)

from azure.iot.device.exceptions import CredentialError
from azure.iot.hub.models import Twin, TwinProperties

pytestmark = pytest.mark.filterwarnings("ignore:ssl.PROTOCOL_TLSv1_2 is deprecated:DeprecationWarning")

WSS_PORT = 443  # hard-coded in the device SDK for websockets=True


@pytest.fixture(scope="module")
def hub(make_hub):
    assert_port_free(WSS_PORT)
    h = make_hub(["--http-listen", f"127.0.0.1:{WSS_PORT}", "--mqtt-listen", "127.0.0.1:0",
                  "--events-listen", "127.0.0.1:0"])
    assert h.http_port == WSS_PORT and h.mqtt_port != 8883, h.listen
    return h


def test_websocket_device_gets_twin_patches_reported_and_receives_desired(hub, rm, clients):
    dev, key = new_device(rm)
    rm.update_twin(dev, Twin(properties=TwinProperties(desired={"interval": 1})))  # desired $version 2
    c = clients.device(dev, key, websockets=True)
    patches = Recorder("desired handler over websockets")
    set_desired_handler(c, patches)
    within(WAIT, c.connect)
    assert c.connected
    first = patches.wait_for(is_full_document, "synthetic full-document patch after connect")
    assert first["$version"] == 2 and user_props(first) == {"interval": 1}, first

    twin = within(WAIT, c.get_twin)
    assert twin["desired"]["$version"] == 2 and twin["desired"]["interval"] == 1, twin

    within(WAIT, c.patch_twin_reported_properties, {"fw": "2.0", "transport": "wss"})
    t = rm.get_twin(dev)
    assert t.properties.reported["fw"] == "2.0" and t.properties.reported["transport"] == "wss"
    assert t.properties.reported["$version"] == 2
    assert t.connection_state == "Connected", "a WebSocket device is a connected device"

    m = patches.mark()
    rm.update_twin(dev, Twin(properties=TwinProperties(desired={"interval": 9})))
    got = patches.wait_for(lambda p: p.get("$version") == 3, "desired push over websockets", start=m)
    assert got == {"interval": 9, "$version": 3}, got
    rm.delete_device(dev)


def test_websocket_device_with_a_wrong_key_is_refused(hub, rm, clients):
    dev, _key = new_device(rm)
    c = clients.device(dev, "d3JvbmcgICBrZXkgICAgIGZvciAgdGhpcyBkZXZpY2U=", websockets=True,
                       connection_retry=False)
    with pytest.raises(CredentialError):
        within(WAIT, c.connect)
    assert not c.connected
    rm.delete_device(dev)


def test_websocket_devices_are_isolated(hub, rm, clients):
    """Two devices over WebSockets: a desired push to one never reaches the other."""
    a, ka = new_device(rm)
    b, kb = new_device(rm)
    ca, cb = clients.device(a, ka, websockets=True), clients.device(b, kb, websockets=True)
    pa, pb = Recorder("device a"), Recorder("device b")
    set_desired_handler(ca, pa)
    set_desired_handler(cb, pb)
    within(WAIT, ca.connect)
    within(WAIT, cb.connect)
    pa.wait_for(is_full_document, "a's synthetic patch")
    pb.wait_for(is_full_document, "b's synthetic patch")
    mb = pb.mark()
    rm.update_twin(a, Twin(properties=TwinProperties(desired={"only": "a"})))
    pa.wait_for(lambda p: p.get("only") == "a", "a's push")
    rm.update_twin(b, Twin(properties=TwinProperties(desired={"only": "b"})))
    pb.wait_for(lambda p: p.get("only") == "b", "b's push", start=mb)
    assert all(p.get("only") != "a" for p in pb.since(0)), pb.since(0)
    rm.delete_device(a)
    rm.delete_device(b)
