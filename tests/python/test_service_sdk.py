"""Conformance: the official, unmodified `azure-iot-hub` 2.7.0 service SDK against the real twinhub binary.

The binary is taken from $TWINHUB_BIN (default: target/debug/twinhub relative to the repository root).
It is started (conftest.py) on a temporary data directory with every listener on an ephemeral loopback
port; the SDK trusts the generated CA through REQUESTS_CA_BUNDLE.
A missing binary or SDK is a failure, never a skip.
"""

import base64
import uuid

import pytest

from azure.iot.hub import IoTHubRegistryManager
from azure.iot.hub.models import Twin, TwinProperties
from msrest.exceptions import HttpOperationError


@pytest.fixture(scope="module")
def hub(make_hub):
    # Nothing may bind the default device/event ports (8883/8884): the device-SDK suite needs 8883.
    return make_hub(["--mqtt-listen", "127.0.0.1:0", "--events-listen", "127.0.0.1:0"])


@pytest.fixture(scope="module")
def rm(hub):
    return IoTHubRegistryManager.from_connection_string(hub.connection_string)


def _status(exc_info):
    return exc_info.value.response.status_code


def _is_key(k):
    assert isinstance(k, str) and k, f"bad key {k!r}"
    assert len(base64.b64decode(k, validate=True)) >= 16
    return k


def _uid(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_connection_string_shape(hub):
    parts = dict(p.split("=", 1) for p in hub.connection_string.split(";"))
    assert parts["HostName"].startswith("localhost:")
    assert int(parts["HostName"].split(":")[1]) > 0
    assert parts["SharedAccessKeyName"] == "iothubowner"
    base64.b64decode(parts["SharedAccessKey"], validate=True)


def test_device_with_generated_keys_twin_update_etag_replace_delete(rm):
    dev = _uid("pydev")
    d = rm.create_device_with_sas(dev, None, None, "enabled")
    assert d.device_id == dev
    assert d.status == "enabled"
    pk = _is_key(d.authentication.symmetric_key.primary_key)
    sk = _is_key(d.authentication.symmetric_key.secondary_key)
    assert pk != sk
    got = rm.get_device(dev)
    assert got.authentication.symmetric_key.primary_key == pk
    assert got.etag == d.etag

    # Duplicate create → 409.
    with pytest.raises(HttpOperationError) as e:
        rm.create_device_with_sas(dev, None, None, "enabled")
    assert _status(e) == 409

    t = rm.get_twin(dev)
    assert t.device_id == dev
    assert t.etag and t.etag != "*"
    assert t.properties.desired["$version"] == 1
    assert "$metadata" in t.properties.desired
    assert t.properties.reported["$version"] == 1

    patch = Twin(tags={"site": "b43"}, properties=TwinProperties(desired={"interval": 5}))
    t2 = rm.update_twin(dev, patch, t.etag)
    assert t2.tags == {"site": "b43"}
    assert t2.properties.desired["interval"] == 5
    assert t2.properties.desired["$version"] == 2
    assert t2.etag != t.etag

    # The old etag is stale now → 412, and nothing changes.
    with pytest.raises(HttpOperationError) as e:
        rm.update_twin(dev, Twin(tags={"x": 1}), t.etag)
    assert _status(e) == 412
    t3 = rm.get_twin(dev)
    assert t3.tags == {"site": "b43"}
    assert t3.etag == t2.etag

    # Without an etag the SDK sends "*".
    t4 = rm.update_twin(dev, Twin(properties=TwinProperties(desired={"interval": 7, "mode": "eco"})))
    assert t4.properties.desired["interval"] == 7
    assert t4.properties.desired["$version"] == 3

    r = rm.replace_twin(dev, Twin(tags={"only": True}, properties=TwinProperties(desired={"k": "v"})))
    assert r.tags == {"only": True}
    assert {k: v for k, v in r.properties.desired.items() if not k.startswith("$")} == {"k": "v"}
    assert r.properties.desired["$version"] == 4
    assert rm.get_twin(dev).etag == r.etag

    # replace with a stale etag → 412
    with pytest.raises(HttpOperationError) as e:
        rm.replace_twin(dev, Twin(tags={}), t.etag)
    assert _status(e) == 412

    rm.delete_device(dev)
    with pytest.raises(HttpOperationError) as e:
        rm.get_device(dev)
    assert _status(e) == 404
    with pytest.raises(HttpOperationError) as e:
        rm.get_twin(dev)
    assert _status(e) == 404


def test_module_and_module_twin(rm):
    dev = _uid("pymod")
    rm.create_device_with_sas(dev, None, None, "enabled")
    m = rm.create_module_with_sas(dev, "m1", None, None, None)
    assert m.module_id == "m1" and m.device_id == dev
    _is_key(m.authentication.symmetric_key.primary_key)
    got = rm.get_module(dev, "m1")
    assert got.module_id == "m1"
    assert got.authentication.symmetric_key.primary_key == m.authentication.symmetric_key.primary_key
    assert [x.module_id for x in rm.get_modules(dev)] == ["m1"]

    mt = rm.get_module_twin(dev, "m1")
    assert mt.module_id == "m1" and mt.device_id == dev
    mt2 = rm.update_module_twin(dev, "m1", Twin(properties=TwinProperties(desired={"rate": 3})), mt.etag)
    assert mt2.properties.desired["rate"] == 3
    assert mt2.properties.desired["$version"] == 2
    with pytest.raises(HttpOperationError) as e:
        rm.update_module_twin(dev, "m1", Twin(tags={"a": 1}), mt.etag)
    assert _status(e) == 412
    mt3 = rm.replace_module_twin(dev, "m1", Twin(tags={"t": 1}, properties=TwinProperties(desired={"z": 0})))
    assert mt3.tags == {"t": 1}
    assert mt3.properties.desired["z"] == 0
    assert "rate" not in mt3.properties.desired

    rm.delete_module(dev, "m1")
    with pytest.raises(HttpOperationError) as e:
        rm.get_module(dev, "m1")
    assert _status(e) == 404

    # Deleting the device deletes its modules.
    rm.create_module_with_sas(dev, "m2", None, None, None)
    rm.delete_device(dev)
    with pytest.raises(HttpOperationError) as e:
        rm.get_module_twin(dev, "m2")
    assert _status(e) == 404


def test_list_and_statistics(rm):
    ids = [_uid("pylist") for _ in range(3)]
    for i in ids:
        rm.create_device_with_sas(i, None, None, "enabled")
    listed = {d.device_id for d in rm.get_devices(1000)}
    assert set(ids) <= listed
    assert len(rm.get_devices(2)) == 2
    stats = rm.get_device_registry_statistics()
    assert stats.total_device_count >= 3
    assert stats.enabled_device_count >= 3
    for i in ids:
        rm.delete_device(i)


def test_query_iot_hub_filters_projects_and_pages(rm):
    from azure.iot.hub.models import QuerySpecification

    tag = _uid("qtag")
    devs = sorted(_uid("pyq") for _ in range(5))
    for i, dev in enumerate(devs):
        rm.create_device_with_sas(dev, None, None, "enabled")
        twin = rm.get_twin(dev)
        rm.update_twin(dev, Twin(tags={"q": tag, "i": i}), twin.etag)

    spec = QuerySpecification(query=f"SELECT * FROM devices WHERE tags.q = '{tag}'")
    result = rm.query_iot_hub(spec)
    assert result.type == "twin"
    assert not result.continuation_token
    assert sorted(t.device_id for t in result.items) == devs
    assert all(t.tags["q"] == tag for t in result.items)

    # Paging with the SDK's own continuation token.
    seen, token, pages = [], None, 0
    while True:
        page = rm.query_iot_hub(spec, token, 2)
        assert len(page.items) <= 2
        seen += [t.device_id for t in page.items]
        pages += 1
        token = page.continuation_token
        if not token:
            break
    assert seen == devs and pages == 3

    # Aggregates come back as raw items (the SDK deserializes every item as a Twin, which drops the
    # raw fields, so only the type and count are visible here; tests/query.rs checks the values).
    agg = rm.query_iot_hub(QuerySpecification(query=f"SELECT COUNT() AS n FROM devices WHERE tags.q = '{tag}' AND tags.i >= 2"))
    assert agg.type == "raw"
    assert len(agg.items) == 1

    # A syntax error is a 400 naming the position.
    with pytest.raises(HttpOperationError) as e:
        rm.query_iot_hub(QuerySpecification(query="SELECT * FROM devices WHERE"))
    assert _status(e) == 400
    assert "position" in e.value.response.text


def test_job_manager_create_get_cancel_query(hub, rm):
    import datetime
    import time

    from azure.iot.hub import IoTHubJobManager
    from azure.iot.hub.models import JobRequest

    jm = IoTHubJobManager.from_connection_string(hub.connection_string)
    tag = _uid("jobtag")
    devs = sorted(_uid("pyjob") for _ in range(3))
    for dev in devs:
        rm.create_device_with_sas(dev, None, None, "enabled")
        rm.update_twin(dev, Twin(tags={"j": tag}), "*")
    before = {d: rm.get_twin(d).properties.desired["$version"] for d in devs}

    # A job starting now runs to completion and updates every matching device once.
    job_id = _uid("job")
    req = JobRequest(
        job_id=job_id,
        type="scheduleUpdateTwin",
        start_time=datetime.datetime.now(datetime.timezone.utc).isoformat(),
        update_twin=Twin(etag="*", properties=TwinProperties(desired={"fw": "3.1"})),
        query_condition=f"tags.j = '{tag}'",
        max_execution_time_in_seconds=60,
    )
    created = jm.create_scheduled_job(job_id, req)
    assert created.job_id == job_id and created.type == "scheduleUpdateTwin"
    deadline = time.time() + 60
    while True:
        job = jm.get_scheduled_job(job_id)
        if job.status == "completed":
            break
        assert time.time() < deadline, f"job still {job.status}"
        time.sleep(0.5)
    assert job.device_job_statistics.device_count == 3
    assert job.device_job_statistics.succeeded_count == 3
    for d in devs:
        desired = rm.get_twin(d).properties.desired
        assert desired["fw"] == "3.1"
        assert desired["$version"] == before[d] + 1

    # A job scheduled in the future is queued until cancelled.
    later_id = _uid("later")
    later = JobRequest(
        job_id=later_id,
        type="scheduleUpdateTwin",
        start_time=(datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)).isoformat(),
        update_twin=Twin(etag="*", tags={"never": True}),
        query_condition=f"tags.j = '{tag}'",
        max_execution_time_in_seconds=60,
    )
    assert jm.create_scheduled_job(later_id, later).status == "queued"
    assert jm.cancel_scheduled_job(later_id).status == "cancelled"
    assert jm.get_scheduled_job(later_id).status == "cancelled"

    # Job queries by type and status.
    done = jm.query_scheduled_jobs("scheduleUpdateTwin", "completed")
    assert job_id in [j["jobId"] for j in done.items]
    cancelled = jm.query_scheduled_jobs(None, "cancelled")
    assert later_id in [j["jobId"] for j in cancelled.items]

    with pytest.raises(HttpOperationError) as e:
        jm.get_scheduled_job(_uid("missing"))
    assert _status(e) == 404


def test_bulk_create_update_delete_with_a_failing_entry(rm):
    """`bulk_create_or_update_devices` sends `POST /devices`: good entries apply, a bad one fails alone."""
    from azure.iot.hub.protocol.models import AuthenticationMechanism, ExportImportDevice, SymmetricKey

    prefix = _uid("bulk")
    ids = [f"{prefix}-{i}" for i in range(5)]

    def entry(dev, mode, **kw):
        auth = AuthenticationMechanism(type="sas", symmetric_key=SymmetricKey(primary_key=None, secondary_key=None))
        return ExportImportDevice(id=dev, import_mode=mode, status="enabled", authentication=auth, **kw)

    res = rm.bulk_create_or_update_devices([entry(d, "create", tags={"batch": prefix}) for d in ids])
    assert res.is_successful, res.errors
    assert not res.errors
    twin = rm.get_twin(ids[3])
    assert twin.tags["batch"] == prefix
    assert _is_key(rm.get_device(ids[3]).authentication.symmetric_key.primary_key)

    # One duplicate create among good updates and a delete: only the duplicate fails.
    res = rm.bulk_create_or_update_devices(
        [
            entry(ids[0], "create"),
            entry(ids[1], "update", status_reason="maintenance"),
            entry(ids[2], "delete"),
            entry(ids[4], "updateTwin", tags={"batch": "moved"}),
        ]
    )
    assert res.is_successful is False
    assert [(e.device_id, e.error_code) for e in res.errors] == [(ids[0], "DeviceAlreadyExists")]
    assert rm.get_device(ids[1]).status_reason == "maintenance"
    with pytest.raises(HttpOperationError) as e:
        rm.get_device(ids[2])
    assert _status(e) == 404
    assert rm.get_twin(ids[4]).tags == {"batch": "moved"}
