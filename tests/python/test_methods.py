"""Direct methods with the official, unmodified SDKs: the service SDK's `invoke_device_method` /
`invoke_device_module_method` reach the device SDK's `on_method_request_received` handler, and the
handler's `MethodResponse` comes back as the call's result. Offline devices and devices that do not
answer fail the way IoT Hub fails them (404 DeviceNotOnline, 504 GatewayTimeout).

The device SDK dials port 8883, so the server binds it (as in test_device_sdk.py)."""

import threading
import time

import pytest
from msrest.exceptions import HttpOperationError

from conftest import assert_port_free
from test_device_sdk import DEVICE_PORT, WAIT, _uid, clients, new_device, within  # noqa: F401 (clients is a fixture)

from azure.iot.device import MethodResponse
from azure.iot.hub.models import CloudToDeviceMethod

pytestmark = pytest.mark.filterwarnings("ignore:ssl.PROTOCOL_TLSv1_2 is deprecated:DeprecationWarning")


@pytest.fixture(scope="module")
def hub(make_hub):
    assert_port_free(DEVICE_PORT)
    h = make_hub(["--mqtt-listen", f"127.0.0.1:{DEVICE_PORT}", "--http-listen", "127.0.0.1:0",
                  "--events-listen", "127.0.0.1:0"])
    assert h.mqtt_port == DEVICE_PORT
    return h


def answering(client, calls, status=200, answer=None):
    """Installs a handler that records each call and answers with `status` and `answer(request)`."""

    def handler(request):
        calls.append((request.name, request.payload))
        payload = answer(request) if answer else {"echo": request.payload, "method": request.name}
        client.send_method_response(MethodResponse.create_from_method_request(request, status, payload))

    def set_it():
        client.on_method_request_received = handler

    within(WAIT, set_it, what="setting on_method_request_received")


def call(rm, device_id, name, payload=None, module_id=None, **timeouts):
    method = CloudToDeviceMethod(method_name=name, payload=payload,
                                 response_timeout_in_seconds=timeouts.get("response", 30),
                                 connect_timeout_in_seconds=timeouts.get("connect", 0))
    if module_id is None:
        return within(WAIT + 40, rm.invoke_device_method, device_id, method)
    return within(WAIT + 40, rm.invoke_device_module_method, device_id, module_id, method)


def status_of(exc_info):
    return exc_info.value.response.status_code


def test_invoke_device_method_reaches_the_handler_and_returns_its_payload(hub, rm, clients):
    dev, key = new_device(rm)
    c = clients.device(dev, key)
    within(WAIT, c.connect)
    calls = []
    answering(c, calls)
    r = call(rm, dev, "reboot", {"delay": 5, "why": "update"})
    assert r.status == 200, r
    assert r.payload == {"echo": {"delay": 5, "why": "update"}, "method": "reboot"}, r.payload
    assert calls == [("reboot", {"delay": 5, "why": "update"})]

    # Any status the device picks comes back as is. (The service SDK turns a missing payload into "".)
    calls.clear()
    answering(c, calls, status=404, answer=lambda req: "no such thing")
    r = call(rm, dev, "odd name/with?chars")
    assert (r.status, r.payload) == (404, "no such thing"), r
    assert calls == [("odd name/with?chars", "")]
    rm.delete_device(dev)


def test_invoke_module_method_reaches_only_that_module(hub, rm, clients):
    dev = _uid("pymm")
    d = rm.create_device_with_sas(dev, None, None, "enabled")
    m = rm.create_module_with_sas(dev, "m1", None, None, None)
    dc = clients.device(dev, d.authentication.symmetric_key.primary_key)
    mc = clients.module(dev, "m1", m.authentication.symmetric_key.primary_key,
                        server_verification_cert=hub.ca_pem)
    within(WAIT, dc.connect)
    within(WAIT, mc.connect)
    device_calls, module_calls = [], []
    answering(dc, device_calls, answer=lambda req: "device")
    answering(mc, module_calls, answer=lambda req: "module")
    r = call(rm, dev, "whoami", {"n": 1}, module_id="m1")
    assert (r.status, r.payload) == (200, "module"), r
    r = call(rm, dev, "whoami", {"n": 2})
    assert (r.status, r.payload) == (200, "device"), r
    assert module_calls == [("whoami", {"n": 1})] and device_calls == [("whoami", {"n": 2})]
    rm.delete_device(dev)


def test_calls_to_offline_unknown_and_silent_devices_fail_as_on_iot_hub(hub, rm, clients):
    dev, key = new_device(rm)
    # Never connected: 404 DeviceNotOnline, at once when connectTimeoutInSeconds is 0.
    with pytest.raises(HttpOperationError) as e:
        call(rm, dev, "ping")
    assert status_of(e) == 404 and "DeviceNotOnline" in e.value.response.text, e.value.response.text
    # No such device: 404 DeviceNotFound.
    with pytest.raises(HttpOperationError) as e:
        call(rm, _uid("nobody"), "ping")
    assert status_of(e) == 404 and "DeviceNotFound" in e.value.response.text, e.value.response.text
    # Connected but not subscribed to methods: not reachable either.
    c = clients.device(dev, key)
    within(WAIT, c.connect)
    with pytest.raises(HttpOperationError) as e:
        call(rm, dev, "ping")
    assert status_of(e) == 404 and "DeviceNotOnline" in e.value.response.text
    # Subscribed but never answering: 504 GatewayTimeout after responseTimeoutInSeconds.
    seen = []
    within(WAIT, setattr, c, "on_method_request_received", lambda req: seen.append(req.name))
    started = time.monotonic()
    with pytest.raises(HttpOperationError) as e:
        call(rm, dev, "hang", response=5)
    assert status_of(e) == 504 and "GatewayTimeout" in e.value.response.text, e.value.response.text
    assert time.monotonic() - started >= 4.5 and seen == ["hang"]
    # A bad call is a 400 naming the field.
    with pytest.raises(HttpOperationError) as e:
        call(rm, dev, "x", response=1)
    assert status_of(e) == 400 and "responseTimeoutInSeconds" in e.value.response.text
    rm.delete_device(dev)


def test_connect_timeout_waits_for_the_device_to_come_online(hub, rm, clients):
    dev, key = new_device(rm)
    result = {}

    def invoke():
        result["r"] = call(rm, dev, "late", {"x": 1}, connect=30)

    t = threading.Thread(target=invoke, daemon=True)
    t.start()
    time.sleep(1.5)
    assert t.is_alive(), "the call returned before the device connected"
    c = clients.device(dev, key)
    calls = []
    answering(c, calls)  # connects (auto_connect) and subscribes to methods
    t.join(WAIT)
    assert not t.is_alive()
    assert result["r"].status == 200 and calls == [("late", {"x": 1})], result
    rm.delete_device(dev)


def test_schedule_device_method_job_calls_each_matching_device_once(hub, rm, clients):
    import datetime

    from azure.iot.hub import IoTHubJobManager
    from azure.iot.hub.models import JobRequest, QuerySpecification, Twin

    jm = IoTHubJobManager.from_connection_string(hub.connection_string)
    tag = _uid("mjob")
    online, calls = [], {}
    for i in range(3):
        dev, key = new_device(rm)
        rm.update_twin(dev, Twin(tags={"mj": tag}), "*")
        c = clients.device(dev, key)
        calls[dev] = []
        answering(c, calls[dev], answer=lambda req, dev=dev: {"rebooted": dev})
        online.append(dev)
    offline, _ = new_device(rm)  # matches too, but never connects
    rm.update_twin(offline, Twin(tags={"mj": tag}), "*")
    outsider, okey = new_device(rm)  # connected and answering, but not matched
    oc = clients.device(outsider, okey)
    calls[outsider] = []
    answering(oc, calls[outsider])

    job_id = _uid("methodjob")
    req = JobRequest(
        job_id=job_id,
        type="scheduleDeviceMethod",
        start_time=datetime.datetime.now(datetime.timezone.utc).isoformat(),
        cloud_to_device_method=CloudToDeviceMethod(method_name="reboot", payload={"delay": 0},
                                                   response_timeout_in_seconds=10, connect_timeout_in_seconds=0),
        query_condition=f"tags.mj = '{tag}'",
        max_execution_time_in_seconds=120,
    )
    created = jm.create_scheduled_job(job_id, req)
    assert created.type == "scheduleDeviceMethod"
    assert created.cloud_to_device_method.method_name == "reboot"
    deadline = time.time() + 90
    while True:
        job = jm.get_scheduled_job(job_id)
        if job.status in ("completed", "failed"):
            break
        assert time.time() < deadline, f"job still {job.status}"
        time.sleep(0.5)
    assert job.status == "completed", job
    stats = job.device_job_statistics
    assert (stats.device_count, stats.succeeded_count, stats.failed_count) == (4, 3, 1), stats
    for dev in online:
        assert calls[dev] == [("reboot", {"delay": 0})], (dev, calls[dev])
    assert calls[outsider] == [], "a device outside the job's condition was called"

    # The SDK's query call types every row as a Twin; read the rows' JSON from its raw response.
    spec = QuerySpecification(query=f"SELECT * FROM devices.jobs WHERE devices.jobs.jobId = '{job_id}'")
    raw = rm.protocol.query.get_twins(spec, None, 100, None, True)
    assert raw.response.headers["x-ms-item-type"] == "deviceJob", raw.response.headers
    by_device = {r["deviceId"]: r for r in raw.response.json()}
    assert set(by_device) == set(online) | {offline}, by_device
    for dev in online:
        assert by_device[dev]["status"] == "completed"
        assert by_device[dev]["outcome"]["deviceMethodResponse"] == {"status": 200, "payload": {"rebooted": dev}}
    assert by_device[offline]["status"] == "failed"
