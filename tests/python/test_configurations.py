"""Automatic device configurations with the official, unmodified service SDK (`IoTHubConfigurationManager`):
a configuration's desired content reaches the twins its target condition selects — also a twin that
starts matching later — the higher priority wins where configurations overlap, and `systemMetrics` /
`metrics` count what they should. The server re-evaluates configurations every second here
(`--configuration-interval-secs 1`; the default is 30)."""

import time

import pytest
from msrest.exceptions import HttpOperationError

from azure.iot.hub import IoTHubConfigurationManager
from azure.iot.hub.models import (Configuration, ConfigurationContent, ConfigurationMetrics,
                                  ConfigurationQueriesTestInput, Twin, TwinProperties)

from test_device_sdk import _uid

WAIT = 60


@pytest.fixture(scope="module")
def hub(make_hub):
    return make_hub(["--mqtt-listen", "127.0.0.1:0", "--events-listen", "127.0.0.1:0",
                     "--configuration-interval-secs", "1"])


@pytest.fixture(scope="module")
def cm(hub):
    return IoTHubConfigurationManager.from_connection_string(hub.connection_string)


def raw_twin(rm, device_id):
    """The twin's JSON as the server sent it (the SDK's Twin model has no `configurations`)."""
    return rm.protocol.devices.get_twin(device_id, raw=True).response.json()


def eventually(what, fn, timeout=WAIT):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(0.25)
    pytest.fail(f"{what}: not within {timeout}s (last: {last!r})")


def configuration(cid, condition, priority, content, metrics=None):
    return Configuration(
        id=cid,
        schema_version="1.0",
        labels={"owner": "tests"},
        content=ConfigurationContent(device_content=content),
        target_condition=condition,
        priority=priority,
        metrics=ConfigurationMetrics(queries=metrics or {}),
    )


def test_configuration_reaches_matching_twins_with_priorities_and_metrics(hub, rm, cm):
    tag = _uid("site")
    devs = [_uid("cfgdev") for _ in range(3)]
    late, outsider = _uid("cfglate"), _uid("cfgout")
    for d in devs + [late, outsider]:
        rm.create_device_with_sas(d, None, None, "enabled")
    for d in devs:
        rm.update_twin(d, Twin(tags={"site": tag}), "*")
    rm.update_twin(outsider, Twin(tags={"site": "elsewhere"}), "*")

    low_id = _uid("low")
    created = cm.create_configuration(configuration(
        low_id, f"tags.site = '{tag}'", 1,
        {"properties.desired.fw": {"version": "2.0"}, "properties.desired.interval": 30},
        {"reportedFw2": "SELECT deviceId FROM devices WHERE properties.reported.fw = '2.0'"}))
    assert created.id == low_id and created.priority == 1 and created.etag
    assert created.content.device_content["properties.desired.interval"] == 30

    for d in devs:
        t = eventually(f"{d} gets the configuration's content",
                       lambda d=d: (lambda t: t if t.properties.desired.get("fw") else None)(rm.get_twin(d)))
        assert t.properties.desired["fw"] == {"version": "2.0"} and t.properties.desired["interval"] == 30
        assert raw_twin(rm, d)["configurations"] == {low_id: {"status": "Applied"}}
    assert "fw" not in rm.get_twin(outsider).properties.desired
    assert "configurations" not in raw_twin(rm, outsider)

    # A twin that starts matching later gets the content on a later pass.
    rm.update_twin(late, Twin(tags={"site": tag}), "*")
    eventually("the late twin gets the content", lambda: rm.get_twin(late).properties.desired.get("interval") == 30)

    # System metrics count targeted and applied twins; the user metric counts its query's rows (no
    # device has reported fw 2.0).
    got = eventually("systemMetrics count 4 targeted and applied", lambda: (lambda c: c if c.system_metrics.results
                     and c.system_metrics.results.get("appliedCount") == 4 else None)(cm.get_configuration(low_id)))
    assert got.system_metrics.results["targetedCount"] == 4, got.system_metrics.results
    assert got.metrics.results == {"reportedFw2": 0}, got.metrics.results

    # A higher-priority configuration over one device wins there; the other stays targeted.
    high_id = _uid("high")
    cm.create_configuration(configuration(high_id, f"deviceId = '{devs[0]}'", 10,
                                          {"properties.desired.fw": {"version": "3.0"}}))
    eventually("the higher priority wins", lambda: rm.get_twin(devs[0]).properties.desired["fw"] == {"version": "3.0"})
    eventually("marks show which applies", lambda: raw_twin(rm, devs[0]).get("configurations") ==
               {low_id: {"status": "Targeted"}, high_id: {"status": "Applied"}})
    assert rm.get_twin(devs[1]).properties.desired["fw"] == {"version": "2.0"}

    # Mutable fields change with the etag; content does not change; stale etags are refused.
    low = cm.get_configuration(low_id)
    low.priority = 20
    low.labels = {"owner": "tests", "stage": "2"}
    updated = cm.update_configuration(low, low.etag)
    assert updated.priority == 20 and updated.etag != low.etag
    with pytest.raises(HttpOperationError) as e:
        cm.update_configuration(low, low.etag)
    assert e.value.response.status_code == 412
    updated.content = ConfigurationContent(device_content={"properties.desired.fw": "other"})
    with pytest.raises(HttpOperationError) as e:
        cm.update_configuration(updated, updated.etag)
    assert e.value.response.status_code == 400 and "cannot be changed" in e.value.response.text
    # Now the low one has the higher priority and wins on devs[0] again (its content applies again).
    eventually("priority 20 wins back", lambda: rm.get_twin(devs[0]).properties.desired["fw"] == {"version": "2.0"})

    listed = cm.get_configurations(10)
    assert {low_id, high_id} <= {c.id for c in listed}

    cm.delete_configuration(high_id, "*")
    with pytest.raises(HttpOperationError) as e:
        cm.get_configuration(high_id)
    assert e.value.response.status_code == 404 and "ConfigurationNotFound" in e.value.response.text
    eventually("the deleted configuration's marks go", lambda: raw_twin(rm, devs[0]).get("configurations") ==
               {low_id: {"status": "Applied"}})
    cm.delete_configuration(low_id)


def test_bad_configurations_and_query_tests(hub, cm):
    with pytest.raises(HttpOperationError) as e:
        cm.create_configuration(configuration(_uid("bad"), "tags.x = ", 1, {"properties.desired.a": 1}))
    assert e.value.response.status_code == 400 and "targetCondition" in e.value.response.text
    with pytest.raises(HttpOperationError) as e:
        cm.create_configuration(configuration(_uid("bad"), "*", 1, {"tags.a": 1}))
    assert e.value.response.status_code == 400 and "properties.desired." in e.value.response.text
    cid = _uid("dup")
    cm.create_configuration(configuration(cid, "*", 0, {"properties.desired.a": 1}))
    with pytest.raises(HttpOperationError) as e:
        cm.create_configuration(configuration(cid, "*", 0, {"properties.desired.a": 1}))
    assert e.value.response.status_code == 409
    cm.delete_configuration(cid)

    r = cm.test_configuration_queries(ConfigurationQueriesTestInput(
        target_condition="tags.x = 'a'", custom_metric_queries={"ok": "SELECT deviceId FROM devices", "bad": "SELEC"}))
    assert r.target_condition_error == ""
    assert r.custom_metric_query_errors["ok"] == "" and r.custom_metric_query_errors["bad"] != ""
    r = cm.test_configuration_queries(ConfigurationQueriesTestInput(target_condition="tags.x = = 1"))
    assert r.target_condition_error != ""
