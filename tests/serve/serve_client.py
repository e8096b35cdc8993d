"""A small HTTP client for the serve tests and tools/serve_load.py: starts
`activekv serve` on a free port, sends requests, reads server-sent events.
Standard library only, so CI needs nothing installed for it."""
import http.client
import json
import os
import signal
import subprocess
import threading
import time


def default_model():
    return os.path.join(os.environ.get("ACTIVEKV_MODEL_DIR", "models"), "SmolLM2-135M-Instruct.Q4_1.gguf")


class Server:
    """`activekv serve ARGS --port 0` as a child process; .port once it listens."""

    def __init__(self, binary, *args, model=None, threads=2, device="cpu"):
        # The tests run the CPU path unless they name a device (--device auto
        # takes a GPU where there is one); device=None leaves serve's default.
        dev = () if device is None or "--device" in args else ("--device", device)
        cmd = [binary, "serve", "-m", model or default_model(), "--port", "0", "-t", str(threads), *dev, *args]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        self.log = []
        self.port = None
        for line in self.proc.stderr:
            self.log.append(line)
            if "listening on http://" in line:
                self.port = int(line.rsplit(":", 1)[1])
                break
        if self.port is None:
            raise RuntimeError("serve did not start: " + "".join(self.log))
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def wait_ready(self, timeout=300):
        """Polls /health until 200; returns the statuses seen."""
        seen, t0 = [], time.time()
        while time.time() - t0 < timeout:
            status, _ = request(self.port, "GET", "/health")
            seen.append(status)
            if status == 200:
                return seen
            time.sleep(0.05)
        raise RuntimeError("serve not ready after %ds: %s" % (timeout, "".join(self.log)))

    def rss_bytes(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def stop(self):
        """SIGTERM; returns the exit code."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -9


def exchange(port, method, path, body=None, headers=None, timeout=600):
    """(status, response headers, body bytes); body may be a dict (sent as JSON), str or bytes."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    if isinstance(body, dict):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode()
    conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, r.headers, data


def request(port, method, path, body=None, headers=None, timeout=600):
    """(status, body bytes), as exchange."""
    status, _, data = exchange(port, method, path, body, headers, timeout)
    return status, data


def post_json(port, path, body, headers=None):
    status, data = request(port, "POST", path, body, headers)
    return status, json.loads(data) if data else None


def open_stream(port, path, body, headers=None, timeout=600):
    """POSTs `body` with stream: true; returns (connection, response) for read_event."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", path, body=json.dumps({**body, "stream": True}),
                 headers={"Content-Type": "application/json", **(headers or {})})
    return conn, conn.getresponse()


def read_event(r):
    """The next `data:` event of a stream: its JSON object, "[DONE]", or None
    when the connection ended (a stream cut without [DONE])."""
    while True:
        try:
            line = r.readline()
        except (http.client.IncompleteRead, ConnectionError):
            return None
        if not line:
            return None
        line = line.decode().rstrip("\n")
        if line == "data: [DONE]":
            return "[DONE]"
        if line.startswith("data: "):
            return json.loads(line[6:])


def stream(port, path, body, max_events=None, headers=None, timeout=600):
    """POSTs with stream: true. Returns (status, events, done, times): events
    are the parsed `data:` JSON objects, done whether `data: [DONE]` came,
    times the arrival time of each event. With max_events, closes the
    connection after that many events (a client that goes away)."""
    conn, r = open_stream(port, path, body, headers, timeout)
    if r.status != 200:
        data = r.read()
        conn.close()
        return r.status, [json.loads(data)], False, []
    events, times, done = [], [], False
    while True:
        e = read_event(r)
        if e is None:
            break
        if e == "[DONE]":
            done = True
            break
        events.append(e)
        times.append(time.time())
        if max_events is not None and len(events) >= max_events:
            break
    conn.close()
    return 200, events, done, times


def metric(port, name):
    """The value of `activekv:<name>` (first sample; labels ignored)."""
    _, data = request(port, "GET", "/metrics")
    for line in data.decode().splitlines():
        if line.startswith("activekv:" + name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def metric_text(port):
    return request(port, "GET", "/metrics")[1].decode()
