"""X.509 device authentication with the official, unmodified `azure-iot-device` 2.14.0 SDK:
`create_from_x509_certificate` presents a TLS client certificate on port 8883 and no password.

- a `selfSigned` device registered by thumbprint (SHA-1 primary, or SHA-256 secondary) gets its twin
  and receives desired pushes; a module likewise;
- a `certificateAuthority` device whose certificate is signed by a CA uploaded through `/certificates`
  and verified by proof of possession gets its twin and receives desired pushes; before verification,
  and after the CA is deleted, it is refused;
- a wrong certificate, an expired one, a certificate for a SAS device are refused (CredentialError).

Certificates are made here with `cryptography`.
"""

import datetime
import urllib.parse

import pytest
import requests

from conftest import assert_port_free
from test_device_sdk import DEVICE_PORT, WAIT, Recorder, is_full_document, set_desired_handler, user_props, \
    within, _uid
import test_device_sdk

from azure.iot.device import IoTHubDeviceClient, IoTHubModuleClient, X509
from azure.iot.device.exceptions import CredentialError
from azure.iot.hub import IoTHubRegistryManager
from azure.iot.hub.auth import ConnectionStringAuthentication
from azure.iot.hub.models import Twin, TwinProperties
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

pytestmark = pytest.mark.filterwarnings("ignore:ssl.PROTOCOL_TLSv1_2 is deprecated:DeprecationWarning")

API = "api-version=2021-04-12"
NOW = datetime.datetime.now(datetime.timezone.utc)


@pytest.fixture(scope="module")
def hub(make_hub):
    assert_port_free(DEVICE_PORT)
    h = make_hub(["--mqtt-listen", f"127.0.0.1:{DEVICE_PORT}", "--http-listen", "127.0.0.1:0",
                  "--events-listen", "127.0.0.1:0"])
    assert h.mqtt_port == DEVICE_PORT, h.listen
    test_device_sdk._hub_for_messages = h
    return h


@pytest.fixture(scope="module")
def rm(hub):
    return IoTHubRegistryManager.from_connection_string(hub.connection_string)


@pytest.fixture
def clients(hub):
    made = []
    yield made
    for c in made:
        within(WAIT, c.shutdown, what="client.shutdown()")


class Cert:
    """A key and certificate, written as PEM files (the SDK takes file paths)."""

    def __init__(self, tmp_path, cn, issuer=None, ca=False, not_before=None, not_after=None):
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
        b = (x509.CertificateBuilder().subject_name(name)
             .issuer_name(issuer.cert.subject if issuer else name)
             .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(not_before or NOW - datetime.timedelta(hours=1))
             .not_valid_after(not_after or NOW + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if ca:
            b = b.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                              content_commitment=False, key_encipherment=False,
                                              data_encipherment=False, key_agreement=False,
                                              encipher_only=False, decipher_only=False), critical=True)
        self.cert = b.sign((issuer or self).key, hashes.SHA256())
        safe = cn.replace("/", "_")
        self.cert_file = tmp_path / f"{safe}-{self.cert.serial_number}.pem"
        self.key_file = tmp_path / f"{safe}-{self.cert.serial_number}.key"
        self.cert_file.write_bytes(self.pem())
        self.key_file.write_bytes(self.key.private_bytes(serialization.Encoding.PEM,
                                                         serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))

    def pem(self):
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def sha1(self):
        return self.cert.fingerprint(hashes.SHA1()).hex().upper()

    def sha256(self):
        return self.cert.fingerprint(hashes.SHA256()).hex()  # lower case: IoT Hub ignores case


def device_client(hub, clients, cert, device_id, module_id=None):
    kwargs = dict(x509=X509(str(cert.cert_file), str(cert.key_file)), hostname="localhost",
                  device_id=device_id, server_verification_cert=hub.ca_pem, connection_retry=False)
    if module_id is None:
        c = IoTHubDeviceClient.create_from_x509_certificate(**kwargs)
    else:
        c = IoTHubModuleClient.create_from_x509_certificate(module_id=module_id, **kwargs)
    clients.append(c)
    return c


def assert_twin_and_desired_push(rm, c, device_id, module_id=None):
    """Connects, reads the twin, and receives a desired push made through the service SDK."""
    update = (lambda t: rm.update_module_twin(device_id, module_id, t, "*")) if module_id else \
        (lambda t: rm.update_twin(device_id, t, "*"))
    update(Twin(properties=TwinProperties(desired={"rate": 1})))
    patches = Recorder("desired handler (X.509)")
    set_desired_handler(c, patches)
    within(WAIT, c.connect)
    assert c.connected
    first = patches.wait_for(is_full_document, "full-document patch after connect")
    assert user_props(first) == {"rate": 1}, first
    twin = within(WAIT, c.get_twin)
    assert twin["desired"]["rate"] == 1, twin
    m = patches.mark()
    update(Twin(properties=TwinProperties(desired={"rate": 7})))
    got = patches.wait_for(lambda p: p.get("rate") == 7, "desired push", start=m)
    assert user_props(got) == {"rate": 7}, got


def assert_refused(hub, clients, cert, device_id, module_id=None):
    c = device_client(hub, clients, cert, device_id, module_id)
    with pytest.raises(CredentialError):
        within(WAIT, c.connect)
    assert not c.connected


class CertificatesApi:
    """`/certificates` over HTTPS with a hub-owner SAS token (the Python hub SDK does not wrap it)."""

    def __init__(self, hub):
        self.base = f"https://{hub.host_name}/certificates"
        self.session = ConnectionStringAuthentication(hub.connection_string).signed_session()
        self.session.verify = str(hub.ca)

    def call(self, method, path, etag=None, body=None, expect=200):
        headers = {"If-Match": f'"{etag}"'} if etag else {}
        r = self.session.request(method, f"{self.base}{path}?{API}", json=body, headers=headers, timeout=30)
        assert r.status_code == expect, f"{method} {path}: {r.status_code} {r.text}"
        return r.json() if r.content else None


# ---------------------------------------------------------------------------------------------------


def test_self_signed_device_by_sha1_thumbprint_gets_twin_and_desired_pushes(hub, rm, clients, tmp_path):
    dev = _uid("x5s")
    cert = Cert(tmp_path, dev)
    rm.create_device_with_x509(dev, cert.sha1(), None, "enabled")
    assert_twin_and_desired_push(rm, device_client(hub, clients, cert, dev), dev)
    rm.delete_device(dev)


def test_self_signed_device_by_sha256_secondary_thumbprint(hub, rm, clients, tmp_path):
    dev = _uid("x5s")
    cert = Cert(tmp_path, "any-subject")  # self-signed devices are matched by thumbprint, not by CN
    rm.create_device_with_x509(dev, Cert(tmp_path, "other").sha1(), cert.sha256(), "enabled")
    assert_twin_and_desired_push(rm, device_client(hub, clients, cert, dev), dev)
    rm.delete_device(dev)


def test_self_signed_module(hub, rm, clients, tmp_path):
    dev = _uid("x5m")
    rm.create_device_with_sas(dev, None, None, "enabled")
    cert = Cert(tmp_path, f"{dev}/m1")
    rm.create_module_with_x509(dev, "m1", None, cert.sha1(), None)
    assert_twin_and_desired_push(rm, device_client(hub, clients, cert, dev, "m1"), dev, "m1")
    rm.delete_device(dev)


def test_wrong_expired_and_misused_certificates_are_refused(hub, rm, clients, tmp_path):
    dev = _uid("x5w")
    good = Cert(tmp_path, dev)
    rm.create_device_with_x509(dev, good.sha1(), None, "enabled")
    # Another key pair and certificate with the same subject: its thumbprint is not registered.
    assert_refused(hub, clients, Cert(tmp_path, dev), dev)
    # The registered thumbprint, but the certificate has expired.
    old = _uid("x5e")
    expired = Cert(tmp_path, old, not_before=NOW - datetime.timedelta(days=3),
                   not_after=NOW - datetime.timedelta(days=1))
    rm.create_device_with_x509(old, expired.sha1(), None, "enabled")
    assert_refused(hub, clients, expired, old)
    # A SAS device does not log in with a certificate, even one whose thumbprint nobody registered.
    sas = _uid("x5sas")
    rm.create_device_with_sas(sas, None, None, "enabled")
    assert_refused(hub, clients, Cert(tmp_path, sas), sas)
    # The right certificate still works after all that.
    c = device_client(hub, clients, good, dev)
    within(WAIT, c.connect)
    assert c.connected
    for d in (dev, old, sas):
        rm.delete_device(d)


def test_ca_signed_device_after_proof_of_possession(hub, rm, clients, tmp_path):
    api = CertificatesApi(hub)
    ca = Cert(tmp_path, "twinhub test root", ca=True)
    name = _uid("ca")
    dev = _uid("x5ca")
    rm.create_device_with_certificate_authority(dev, "enabled")
    leaf = Cert(tmp_path, dev, issuer=ca)

    rec = api.call("PUT", f"/{name}", body={"properties": {"certificate": ca.pem().decode()}})
    assert rec["properties"]["isVerified"] is False and rec["properties"]["thumbprint"] == ca.sha1(), rec
    assert rec["properties"]["subject"] == "CN=twinhub test root", rec
    assert any(c["name"] == name for c in api.call("GET", "")["value"])
    # Uploaded but unverified: the CA vouches for nobody yet.
    assert_refused(hub, clients, leaf, dev)

    code = api.call("POST", f"/{name}/generateVerificationCode", etag=rec["etag"])
    vcode = code["properties"]["verificationCode"]
    assert vcode, code
    # A proof signed by another key, or naming another code, is refused.
    api.call("POST", f"/{name}/verify", etag=code["etag"],
             body={"certificate": Cert(tmp_path, vcode).pem().decode()}, expect=400)
    api.call("POST", f"/{name}/verify", etag=code["etag"],
             body={"certificate": Cert(tmp_path, "not-the-code", issuer=ca).pem().decode()}, expect=400)
    verified = api.call("POST", f"/{name}/verify", etag=code["etag"],
                        body={"certificate": Cert(tmp_path, vcode, issuer=ca).pem().decode()})
    assert verified["properties"]["isVerified"] is True, verified
    assert api.call("GET", f"/{name}")["properties"]["isVerified"] is True

    assert_twin_and_desired_push(rm, device_client(hub, clients, leaf, dev), dev)
    # A certificate from the same CA for another device id is refused (CN must be the device id).
    other = _uid("x5ca")
    rm.create_device_with_certificate_authority(other, "enabled")
    assert_refused(hub, clients, leaf, other)

    # Deleting the CA takes effect on the next connect.
    api.call("DELETE", f"/{name}", etag=verified["etag"])
    api.call("GET", f"/{name}", expect=404)
    for c in clients:
        within(WAIT, c.shutdown, what="client.shutdown()")
    clients.clear()
    assert_refused(hub, clients, leaf, dev)
    for d in (dev, other):
        rm.delete_device(d)
