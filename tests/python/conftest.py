"""Shared harness for the Python SDK conformance suites: starts the real twinhub binary.

The binary is taken from $TWINHUB_BIN (default: target/debug/twinhub relative to the repository root) and
started on a temporary data directory with the listen flags each suite asks for. A missing binary, a
server that does not come up, or a port that is taken is a failure, never a skip.
"""

import json
import os
import pathlib
import select
import signal
import socket
import subprocess
import tempfile
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
START_TIMEOUT = 90
STOP_TIMEOUT = 30


def twinhub_binary():
    b = pathlib.Path(os.environ.get("TWINHUB_BIN", REPO / "target" / "debug" / "twinhub"))
    if not b.is_absolute():
        b = REPO / b
    if not b.exists():
        pytest.fail(f"twinhub binary not found at {b}: run `cargo build` first or set TWINHUB_BIN")
    return b


def _flag_value(args, flag):
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def _port_of(addr):
    return int(addr.rsplit(":", 1)[1]) if addr else 0


def assert_port_free(port, host="127.0.0.1"):
    """Fails (not skips) when something already listens on host:port."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
    except OSError as e:
        pytest.fail(f"{host}:{port} is taken ({e}); the device SDK can only dial port {port}, "
                    "so this suite needs it free")
    finally:
        s.close()


class Hub:
    """`twinhub serve` as a child process on its own temporary data directory.

    `extra_args` are passed after the fixed `--data-dir DIR --hostname localhost`; unless they name
    `--http-listen`, the HTTPS API binds 127.0.0.1:0. `restart()` starts the server again on the same
    data directory and the same bound ports (so connection strings stay valid)."""

    def __init__(self, extra_args):
        self.tmp = tempfile.TemporaryDirectory(prefix="twinhub-py-")
        self.data_dir = pathlib.Path(self.tmp.name) / "data"
        self.log_path = pathlib.Path(self.tmp.name) / "server.log"
        self.extra_args = list(extra_args)
        self.proc = None
        self.listen = {}
        self._spawn(self.extra_args)
        self.ca = self.data_dir / "tls" / "ca.pem"
        if not self.ca.exists():
            self.stop()
            pytest.fail(f"server did not write its CA to {self.ca}")
        self.ca_pem = self.ca.read_text()

    # -- process -----------------------------------------------------------------------------------

    def _spawn(self, extra_args):
        args = [str(twinhub_binary()), "serve", "--data-dir", str(self.data_dir), "--hostname", "localhost"]
        if _flag_value(extra_args, "--http-listen") is None:
            args += ["--http-listen", "127.0.0.1:0"]
        args += extra_args
        env = {k: v for k, v in os.environ.items() if not k.startswith("TWINHUB_")}
        env.setdefault("RUST_LOG", "info,openraft=warn")
        env["NO_COLOR"] = "1"
        self.args = args
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== {' '.join(args)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=log, env=env)
        self.connection_string = self._read_line()
        listen_json = self.data_dir / "listen.json"
        try:
            self.listen = json.loads(listen_json.read_text())
        except (OSError, ValueError) as e:
            self.stop()
            pytest.fail(f"server printed its connection string but {listen_json} is unreadable: {e}")
        parts = dict(p.split("=", 1) for p in self.connection_string.split(";"))
        self.host_name = parts["HostName"]
        self.http_port = _port_of(self.host_name)
        self.owner_key = parts["SharedAccessKey"]
        self.mqtt_port = _port_of(self.listen.get("mqtt"))
        self.mqtt_plain_port = _port_of(self.listen.get("mqtt_plain"))
        self.events_port = _port_of(self.listen.get("events"))

    def _read_line(self):
        deadline = time.time() + START_TIMEOUT
        buf = b""
        fd = self.proc.stdout.fileno()
        while time.time() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"twinhub exited with {self.proc.returncode} before printing its connection "
                            f"string:\n{self.stderr()}")
            r, _, _ = select.select([fd], [], [], 0.2)
            if not r:
                continue
            chunk = os.read(fd, 4096)
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                line = line.decode().strip()
                if line.startswith("HostName="):
                    return line
        self.stop()
        pytest.fail(f"twinhub printed no connection string within {START_TIMEOUT}s:\n{self.stderr()}")

    def stderr(self):
        try:
            return self.log_path.read_text(errors="replace")[-8000:]
        except OSError:
            return ""

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def terminate(self):
        """SIGTERM and wait for the exit (the data directory stays)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self.proc.stdout.close()
                self.proc = None
                pytest.fail(f"twinhub did not exit within {STOP_TIMEOUT}s of SIGTERM:\n{self.stderr()}")
        self.proc.stdout.close()
        self.proc = None

    def restart(self):
        """SIGTERM, then start again on the same data directory and the same ports."""
        self.terminate()
        args = [a for a in self.extra_args]
        pinned = {"--http-listen": f"127.0.0.1:{self.http_port}"}
        for flag, key in (("--mqtt-listen", "mqtt"), ("--mqtt-plain-listen", "mqtt_plain"),
                          ("--events-listen", "events")):
            if self.listen.get(key):
                pinned[flag] = self.listen[key]
        out = []
        skip = False
        for i, a in enumerate(args):
            if skip:
                skip = False
                continue
            if a in pinned:
                skip = True
                continue
            out.append(a)
        for flag, value in pinned.items():
            out += [flag, value]
        old_cs = self.connection_string
        self._spawn(out)
        if self.connection_string != old_cs:
            pytest.fail(f"restart changed the connection string: {old_cs} -> {self.connection_string}")

    def stop(self):
        try:
            self.terminate()
        finally:
            self.tmp.cleanup()


@pytest.fixture(scope="module")
def rm(hub):
    """The service SDK's registry manager for the module's `hub` (each suite defines `hub`)."""
    from azure.iot.hub import IoTHubRegistryManager
    return IoTHubRegistryManager.from_connection_string(hub.connection_string)


@pytest.fixture(scope="module")
def make_hub():
    """Factory: `make_hub(extra_args)` starts a Hub, points the service SDK (REQUESTS_CA_BUNDLE) at its
    CA, and stops it (and restores the environment) when the module's tests are done."""
    hubs = []
    old = os.environ.get("REQUESTS_CA_BUNDLE")

    def make(extra_args):
        h = Hub(extra_args)
        hubs.append(h)
        os.environ["REQUESTS_CA_BUNDLE"] = str(h.ca)
        return h

    try:
        yield make
    finally:
        if old is None:
            os.environ.pop("REQUESTS_CA_BUNDLE", None)
        else:
            os.environ["REQUESTS_CA_BUNDLE"] = old
        for h in hubs:
            h.stop()
