"""A bounded soak of a running `kev serve` on loopback: for DURATION seconds (at most 30 minutes) a mix of
clients runs at once, then it stops by itself and prints one summary.

Clients (each a thread, closed loop): short valid decisions, long states (about 30,000 and 60,000 tokens in
turn; under four saturating short loops a 60,000-token state may run past the 300 s request timeout, so
408 is an expected answer for it), bursts (40 short requests at once every 20 s), malformed bodies (not JSON, schema errors), oversized
work (20,000 questions; a body over the size limit; a 6 MB state in a tiny gzip body), slow bodies (headers,
then a byte every half second: 408 from the rate floor), large bodies refused before they are read (4 MB
multipart: 415, which must arrive whole, not as a reset), and disconnecting clients (a request sent and the
socket closed before the answer; a slow client that sends half its headers and stops).

Printed: sent / answered / shed (429, 529) / lost (sent, not answered: must be 0) / 5xx other than 529
(must be 0) / unexpected statuses / p50 and p99 of the short decisions / the server's RSS at start, peak,
end. Exits 1 if anything was lost, any 5xx was answered, a status was not the expected one, or the server is
not ready at the end.

usage: python soak.py BASE_URL SERVER_PID [DURATION_S=300] [RSS_ALLOWANCE_MIB]

With RSS_ALLOWANCE_MIB, the server's peak RSS may exceed its RSS at the start by at most that much (start the
server with `--cache-bytes` and allow the cache budget plus the working memory of the requests in flight).
"""
import json
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

base, pid = sys.argv[1], int(sys.argv[2])
duration = min(float(sys.argv[3]) if len(sys.argv) > 3 else 300.0, 1800.0)
rss_allowance_mib = float(sys.argv[4]) if len(sys.argv) > 4 else None
host = urllib.parse.urlparse(base)
assert host.hostname in ("127.0.0.1", "localhost", "::1"), "loopback only"

lock = threading.Lock()
counts = {"sent": 0, "answered": 0, "shed": 0, "lost": 0, "5xx": 0, "unexpected": 0, "disconnected": 0}
statuses = {}
short_ms = []
unexpected = []
stop_at = time.monotonic() + duration


def rss_kib():
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def post(body, headers=None, timeout=900):
    h = {"content-type": "application/json"}
    h.update(headers or {})
    req = urllib.request.Request(base + "/v1/systemone", data=body, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def record(kind, expected, fn):
    with lock:
        counts["sent"] += 1
    t = time.monotonic()
    try:
        status, body = fn()
    except Exception as e:  # no HTTP answer at all
        with lock:
            counts["lost"] += 1
            unexpected.append(f"{kind}: no answer ({type(e).__name__}: {e})")
        return
    ms = (time.monotonic() - t) * 1000
    with lock:
        counts["answered"] += 1
        statuses[status] = statuses.get(status, 0) + 1
        if status in (429, 529):
            counts["shed"] += 1
        elif status >= 500:
            counts["5xx"] += 1
            unexpected.append(f"{kind}: {status} {body[:200]!r}")
        elif status not in expected:
            counts["unexpected"] += 1
            unexpected.append(f"{kind}: {status} (expected {expected}) {body[:200]!r}")
        if kind == "short" and status == 200:
            short_ms.append(ms)
        if status in (429, 529):
            time.sleep(0.2)


def short_client(k):
    i = 0
    while time.monotonic() < stop_at:
        i += 1
        body = json.dumps({
            "state": f"Ticket {k}-{i}: the customer asks where order {i} is and whether it can be cancelled.",
            "questions": {
                "cancel": {"type": "noul", "instructions": "Does the customer want to cancel?"},
                "team": {"type": "choice", "criteria": {"Billing": None, "Shipping": "delivery", "Sales": None}},
                "tone": {"type": "score", "criteria": ["calm", "annoyed", "angry"]},
            },
        }).encode()
        record("short", (200,), lambda: post(body))


def long_client():
    i = 0
    while time.monotonic() < stop_at:
        i += 1
        lines = 1500 if i % 2 else 2900  # about 30,000 and 60,000 tokens (under the 65,536-token limit)
        state = "".join(f"Line {i}-{k}: the order shipped late and the customer wants a refund.\n" for k in range(lines))
        body = json.dumps({"state": state, "questions": {"q": {"type": "noul"}}}).encode()
        record("long", (200, 408), lambda: post(body))


def malformed_client():
    bodies = [b"{not json", b'{"state": "x"}', b'{"state": "x", "questions": {"q": {"type": "maybe"}}}',
              b'{"state": "x", "questions": []}', b"", b'{"state": "x", "questions": {"q": {"type": "choice"}}}']
    i = 0
    while time.monotonic() < stop_at:
        b = bodies[i % len(bodies)]
        i += 1
        record("malformed", (422,), lambda: post(b))
        time.sleep(0.05)


def oversized_client():
    import zlib
    many = json.dumps({"state": "x", "questions": {f"q{i}": {"type": "noul"} for i in range(20000)}}).encode()
    huge = b'{"state": "' + b"a" * (9 << 20) + b'", "questions": {"q": {"type": "noul"}}}'
    giant_state = json.dumps({"state": "word " * 1200000, "questions": {"q": {"type": "noul"}}}).encode()
    gz = zlib.compressobj(9, zlib.DEFLATED, 31)
    packed = gz.compress(giant_state) + gz.flush()
    cases = [
        ("too many questions", (413,), lambda: post(many)),
        ("body over the limit", (413,), lambda: post(huge)),
        ("6 MB state, gzip", (422,), lambda: post(packed, {"content-encoding": "GZIP"})),
    ]
    i = 0
    while time.monotonic() < stop_at:
        name, expected, fn = cases[i % len(cases)]
        i += 1
        record("oversized: " + name, expected, fn)
        time.sleep(0.2)


def raw_status(s):
    """The status of the answer on socket `s` (None if the server closed without one)."""
    s.settimeout(30)
    data = b""
    while b"\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            return None, data
        data += chunk
    return int(data[9:12]), data


def slow_body_client():
    body = json.dumps({"state": "x" * 5000, "questions": {"q": {"type": "noul"}}}).encode()
    while time.monotonic() < stop_at:
        def one():
            s = socket.create_connection((host.hostname, host.port), timeout=30)
            try:
                s.sendall(b"POST /v1/systemone HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                          + f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode())
                for k in range(len(body)):
                    try:
                        s.sendall(body[k:k + 1])
                    except OSError:
                        break  # cut by the server: its answer is waiting
                    s.settimeout(0.5)
                    try:
                        if s.recv(1, socket.MSG_PEEK):
                            break
                    except (socket.timeout, BlockingIOError):
                        pass
                status, data = raw_status(s)
                if status is None:
                    raise ConnectionError("closed without an answer")
                return status, data
            finally:
                s.close()
        record("slow body", (408,), one)


def refused_big_client():
    big = b"--x\r\n" + b"a" * (4 << 20) + b"\r\n--x--\r\n"
    while time.monotonic() < stop_at:
        record("4 MB multipart", (415,), lambda: post(big, {"content-type": "multipart/form-data; boundary=x"}))
        time.sleep(0.5)


def burst_client():
    body = json.dumps({"state": "A burst: is this urgent?", "questions": {"q": {"type": "noul"}}}).encode()
    while time.monotonic() < stop_at:
        ts = [threading.Thread(target=record, args=("burst", (200,), lambda: post(body))) for _ in range(40)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        time.sleep(20)


def disconnect_client():
    body = json.dumps({"state": "A request whose client leaves before the answer.",
                       "questions": {"q": {"type": "noul"}}}).encode()
    i = 0
    while time.monotonic() < stop_at:
        i += 1
        s = socket.create_connection((host.hostname, host.port), timeout=10)
        try:
            if i % 2:
                s.sendall(b"POST /v1/systemone HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                          + f"content-length: {len(body)}\r\n\r\n".encode() + body)
            else:
                s.sendall(b"POST /v1/systemone HTTP/1.1\r\nhost: x\r\n")  # half the headers, then silence
            time.sleep(0.3)
        finally:
            s.close()
        with lock:
            counts["disconnected"] += 1
        time.sleep(0.2)


rss_start = rss_kib()
rss_peak = rss_start
threads = [threading.Thread(target=short_client, args=(k,)) for k in range(4)]
threads += [threading.Thread(target=long_client), threading.Thread(target=malformed_client),
            threading.Thread(target=oversized_client), threading.Thread(target=disconnect_client),
            threading.Thread(target=slow_body_client), threading.Thread(target=refused_big_client),
            threading.Thread(target=burst_client)]
t0 = time.monotonic()
for t in threads:
    t.start()
while any(t.is_alive() for t in threads):
    rss_peak = max(rss_peak, rss_kib())
    time.sleep(1)
wall = time.monotonic() - t0
rss_end = rss_kib()
ready = urllib.request.urlopen(base + "/ready", timeout=60).status


def pct(v, p):
    if not v:
        return float("nan")
    v = sorted(v)
    return v[max(0, min(len(v) - 1, int(round(p / 100 * len(v) + 0.5)) - 1))]


print(f"soak: {wall:.0f} s on loopback, {len(threads)} clients")
print(f"sent {counts['sent']}  answered {counts['answered']}  shed {counts['shed']}  lost {counts['lost']}  "
      f"5xx {counts['5xx']}  unexpected {counts['unexpected']}  disconnecting clients {counts['disconnected']}")
print(f"statuses {dict(sorted(statuses.items()))}")
print(f"short decisions: {len(short_ms)} answered, p50 {pct(short_ms, 50):.0f} ms, p99 {pct(short_ms, 99):.0f} ms")
print(f"server RSS: start {rss_start / 1024:.0f} MiB, peak {rss_peak / 1024:.0f} MiB, end {rss_end / 1024:.0f} MiB")
print(f"ready at the end: {ready}")
for u in unexpected[:20]:
    print("  " + u)
ok = counts["lost"] == 0 and counts["5xx"] == 0 and counts["unexpected"] == 0 and ready == 200
if rss_allowance_mib is not None:
    grew = (rss_peak - rss_start) / 1024
    print(f"RSS growth {grew:.0f} MiB (allowance {rss_allowance_mib:.0f} MiB)")
    ok = ok and grew <= rss_allowance_mib
sys.exit(0 if ok else 1)
