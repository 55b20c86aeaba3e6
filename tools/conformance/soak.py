"""A bounded soak of a running `kev serve` on loopback: for DURATION seconds (at most 30 minutes) a mix of
clients runs at once, then it stops by itself and prints one summary.

Clients (each a thread, closed loop): short valid decisions, long states (about 30,000 and 60,000 tokens in
turn; under four saturating short loops a 60,000-token state may run past the 300 s request timeout, so
408 is an expected answer for it), bursts (40 short requests at once every 20 s), malformed bodies (not JSON, schema errors), oversized
work (20,000 questions; a body over the size limit; a 6 MB state in a tiny gzip body), slow bodies (headers,
then a byte every half second: 408 from the rate floor), large bodies refused before they are read (4 MB
multipart: 415, which must arrive whole, not as a reset), and disconnecting clients (a request sent and the
socket closed before the answer; a slow client that sends half its headers and stops).

Round three (issue 56) adds: batches (valid and invalid entries mixed, and batches refused whole for their
own bad `x_logits`), pins (a state pinned, used by `x_state_id` from requests and batch entries, read,
unpinned; pin requests whose client hangs up before the answer, which must leave nothing), deep states of
about 15,000 words beside the saturating short load (their time is printed against the lane's share), two
API keys (with `--key NAME=SECRET` twice: every client sends one of them, and each key keeps its share of the
pin budget), HTTP/2 clients that open a stream with a flow-control window of 0 and never read (the server must
close each within the header-read timeout plus a margin), HTTP/1.1 clients that pipeline requests and never
read (likewise), and bodies that stall after a 480 KB burst (408 within 5 s).

Operations (issue 57), always: a high-priority client (`x_priority: high`, its own p50/p99), a low-priority
client, and a deadline client (`x_deadline_ms` 40 beside the long states: 200 or 408, never computed late).
With `--admin-key` and `--churn NAME=DIR` (the server started from the release files with `--adapter`, and an
admin key): every 30 s each churned adapter is added (`POST /v1/adapters`) or removed (`DELETE`) in turn while
a client keeps sending it requests (200, or the typed 404 while it is out); `--steady NAME` adapters are served
from the start and never touched: a client asks each the same requests throughout, and every answer must be
byte-equal (latency aside) to its first. Churned adapters' answers must equal their first too, each time they
come back. The admin requests carry the admin key; every other request carries one of the `--key` keys.

Printed: sent / answered / shed (429, 529) / lost (sent, not answered: must be 0) / 5xx other than 529
(must be 0) / unexpected statuses / p50 and p99 of the short decisions and of the high-priority ones / the
deadline 408s / adapter changes made, the 404s of removed adapters, answers that changed (must be 0) / the
deep states' times / how soon the non-reading clients were closed / pins at the end and the most pinned bytes
seen / the server's RSS at start, peak, end. Exits 1 if anything was lost, any 5xx was answered, a status was
not the expected one, an adapter's answer changed, a non-reading client was held longer than its bound, an
abandoned pin was left, the server is not ready at the end, or (with RSS_ALLOWANCE_MIB) its RSS grew past
the allowance.

usage: python soak.py BASE_URL SERVER_PID [DURATION_S=300] [RSS_ALLOWANCE_MIB] [--key NAME=SECRET ...]
       [--idle-timeout-s 10] [--admin-key KEY --churn NAME=DIR ... --steady NAME ...]

Options take their value as the next argument and may come anywhere among the positional ones; --key,
--churn and --steady may be given more than once. --idle-timeout-s is the server's header-read timeout (the
bound on how long it may hold a client that does not read).

With RSS_ALLOWANCE_MIB, the server's peak RSS may exceed its RSS at the start by at most that much (start the
server with `--cache-bytes` and allow the cache budget plus the working memory of the requests in flight).
"""
import json
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import hostile


def usage(problem):
    print(f"soak.py: {problem}\n" + __doc__[__doc__.index("usage:"):], file=sys.stderr, end="")
    sys.exit(2)


def options(argv):
    """Positional arguments, and the `--name value` options (repeatable ones as lists; `--key NAME=SECRET` as
    (NAME, SECRET) pairs, `--churn NAME=DIR` as (NAME, DIR) pairs)."""
    pos, opts, i = [], {"churn": [], "steady": [], "key": []}, 1
    single = {"admin_key", "idle_timeout_s"}
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            print(__doc__)
            sys.exit(0)
        if a.startswith("--"):
            key = a[2:].replace("-", "_")
            if key not in opts and key not in single:
                usage(f"unknown option {a}")
            if i + 1 >= len(argv):
                usage(f"{a} needs a value")
            value = argv[i + 1]
            if key in ("key", "churn"):
                name, eq, rest = value.partition("=")
                if not eq or not name:
                    usage(f"{a} takes NAME={'SECRET' if key == 'key' else 'DIR'}, not {value!r}")
                value = (name, rest)
            if isinstance(opts.get(key), list):
                opts[key].append(value)
            else:
                opts[key] = value
            i += 2
        else:
            pos.append(a)
            i += 1
    if not 2 <= len(pos) <= 4:
        usage("BASE_URL and SERVER_PID are required, DURATION_S and RSS_ALLOWANCE_MIB optional")
    if opts["churn"] and "admin_key" not in opts:
        usage("--churn needs --admin-key (adapters are added and removed through the admin routes)")
    return pos, opts


args, opts = options(sys.argv)
base, pid = args[0], int(args[1])
duration = min(float(args[2]) if len(args) > 2 else 300.0, 1800.0)
rss_allowance_mib = float(args[3]) if len(args) > 3 else None
keys = opts["key"]
idle_timeout_s = float(opts.get("idle_timeout_s", 10.0))
admin_key = opts.get("admin_key")
churned = opts["churn"]
steady = opts["steady"]
host = urllib.parse.urlparse(base)
assert host.hostname in ("127.0.0.1", "localhost", "::1"), "loopback only"

lock = threading.Lock()
counts = {"sent": 0, "answered": 0, "shed": 0, "lost": 0, "5xx": 0, "unexpected": 0, "disconnected": 0,
          "mismatch": 0, "adapter_changes": 0, "removed_404": 0, "deadline_408": 0}
statuses = {}
short_ms = []
high_ms = []
deep_s = []
closed_after = {"h2": [], "h1": []}
held_too_long = []
pin_figures = {"pinned": 0, "abandoned": 0, "max_bytes": 0.0, "max_entries": 0.0}
kept_until = []  # when each pin a pin client kept (did not unpin) expires
unexpected = []
stop_at = time.monotonic() + duration
key_cycle = [0]


def auth_headers(k=None):
    """The bearer header of key `k` (an index), or of the next key in turn; none without keys."""
    if not keys:
        return {}
    if k is None:
        with lock:
            key_cycle[0] += 1
            k = key_cycle[0]
    return {"authorization": "Bearer " + keys[k % len(keys)][1]}


def auth_line(k=None):
    h = auth_headers(k)
    return "".join(f"{name}: {v}\r\n" for name, v in h.items()).encode()


def rss_kib():
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def post(body, headers=None, timeout=900, path="/v1/systemone", method=None):
    h = {"content-type": "application/json"}
    h.update(auth_headers())
    h.update(headers or {})
    req = urllib.request.Request(base + path, data=body, headers=h, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def record(kind, expected, fn, count=True):
    if count:
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
        if kind == "high" and status == 200:
            high_ms.append(ms)
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
                          + auth_line() + f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode())
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
        # every other one sends half the headers, then silence
        hang_up("/v1/systemone", body if i % 2 else None)
        time.sleep(0.2)


def hang_up(path, body):
    """POST `body` to `path` (None: half the headers only), wait 0.3 s and close without reading the answer."""
    s = socket.create_connection((host.hostname, host.port), timeout=10)
    try:
        head = f"POST {path} HTTP/1.1\r\nhost: x\r\n".encode()
        if body is None:
            s.sendall(head)
        else:
            s.sendall(head + b"content-type: application/json\r\n" + auth_line()
                      + f"content-length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(0.3)
    finally:
        s.close()
    with lock:
        counts["disconnected"] += 1


def timeless(body):
    v = json.loads(body)
    v.pop("x_latency_ms", None)
    return json.dumps(v, sort_keys=True)


def compare(first, key, body):
    """The answer for `key` must stay what it was the first time (latency aside)."""
    got = timeless(body)
    with lock:
        want = first.setdefault(key, got)
        if want != got:
            counts["mismatch"] += 1
            unexpected.append(f"{key}: answer changed: {got[:200]} != {want[:200]}")


def priority_client(priority):
    i = 0
    while time.monotonic() < stop_at:
        i += 1
        body = json.dumps({"state": f"Priority {priority} {i}: is the invoice paid?", "x_priority": priority,
                           "questions": {"paid": {"type": "noul"}}}).encode()
        record(priority, (200,), lambda: post(body))
        time.sleep(0.05)


def deadline_client():
    i = 0
    while time.monotonic() < stop_at:
        i += 1
        body = json.dumps({"state": f"Deadline {i}: " + "the order shipped late. " * 40, "x_deadline_ms": 40,
                           "questions": {"late": {"type": "noul"}, "refund": {"type": "noul"}}}).encode()

        def one():
            status, data = post(body)
            if status == 408:
                with lock:
                    counts["deadline_408"] += 1
            return status, data
        record("deadline", (200, 408), one)
        time.sleep(0.1)


def adapter_bodies(name):
    return [json.dumps({"model": name, "state": f"Adapter check {k}: the parcel to Lyon is two weeks late.",
                        "questions": {"refund": {"type": "noul"},
                                      "team": {"type": "choice", "criteria": {"Billing": None, "Shipping": None}}}}
                       ).encode() for k in range(4)]


first_answers = {}


def steady_client(name):
    bodies = adapter_bodies(name)
    i = 0
    while time.monotonic() < stop_at:
        k = i % len(bodies)
        i += 1

        def one():
            status, data = post(bodies[k])
            if status == 200:
                compare(first_answers, (name, k), data)
            return status, data
        record("steady " + name, (200,), one)
        time.sleep(0.02)


first_added = {name: threading.Event() for name, _ in churned}


def churn_traffic(name):
    bodies = adapter_bodies(name)
    # Before its first add the name is nobody's: Kev 1.0 answers any name with the default adapter.
    if not first_added[name].wait(max(0.0, stop_at - time.monotonic())):
        return  # never added (a soak of 30 s or less): nothing to ask it
    i = 0
    while time.monotonic() < stop_at:
        k = i % len(bodies)
        i += 1

        def one():
            status, data = post(bodies[k])
            if status == 200:
                compare(first_answers, (name, k), data)
            elif status == 404:
                with lock:
                    counts["removed_404"] += 1
            return status, data
        record("churned " + name, (200, 404), one)
        time.sleep(0.02)


def churn_admin():
    """Every 30 s, each churned adapter in turn added or removed."""
    auth = {"authorization": f"Bearer {admin_key}"}
    served = {name: False for name, _ in churned}
    turn = 0
    while time.monotonic() + 30 < stop_at:
        name, path = churned[turn % len(churned)]
        turn += 1
        if served[name]:
            record("admin remove", (200,), lambda: post(b"", auth, path=f"/v1/adapters/{name}", method="DELETE"))
        else:
            body = json.dumps({"name": name, "dir": path}).encode()
            record("admin add", (200,), lambda: post(body, auth, path="/v1/adapters"))
            first_added[name].set()
        served[name] = not served[name]
        with lock:
            counts["adapter_changes"] += 1
        time.sleep(30)



def deep_client():
    """States of about 15,000 words beside the saturating short load: their time against the lane's share."""
    i = 0
    while time.monotonic() < stop_at - 60:
        i += 1
        state = "".join(f"Deep {i}-{k}: the shipment left the depot late and the customer asks for a refund.\n"
                        for k in range(1100))  # about 15,000 words
        body = json.dumps({"state": state, "questions": {"q": {"type": "noul"}}}).encode()
        t = time.monotonic()
        record("deep", (200, 408), lambda: post(body))
        with lock:
            deep_s.append(time.monotonic() - t)


def batch_client():
    valid = {"state": "A batch entry: the invoice is wrong.", "questions": {"q": {"type": "noul"}}}
    invalid = {"state": "x", "questions": {"q": {"type": "maybe"}}}
    i = 0
    while time.monotonic() < stop_at:
        i += 1
        if i % 10 == 0:
            b = json.dumps({"requests": [valid], "x_logits": "1"}).encode()
            record("batch: bad x_logits", (422,), lambda: post(b, path="/v1/systemone/batch"))
            continue
        entries = [valid if k % 3 else invalid for k in range(2 + i % 6)]
        b = json.dumps({"requests": entries, "x_logits": i % 2 == 0}).encode()

        def one():
            status, data = post(b, path="/v1/systemone/batch")
            if status == 200:
                got = [r.get("status", 200) for r in json.loads(data)["results"]]
                want = [200 if e is valid else 422 for e in entries]
                if got != want:
                    return 599, f"batch entries {got}, expected {want}".encode()
            return status, data
        record("batch", (200,), one)
        time.sleep(0.1)


def pin_client(k):
    """Pin a state under key `k`, use it (plain, batch entry), read it, unpin it; 429 when the share is full."""
    i = 0
    while time.monotonic() < stop_at:
        i += 1
        state = "".join(f"Pinned {k}-{i}-{n}: a contract clause about delivery and refunds.\n" for n in range(150))
        body = json.dumps({"state": state, "ttl_s": 30 + i % 90}).encode()
        status, data = post(body, headers=auth_headers(k), path="/v1/systemone/states")
        record_status("pin", (200, 429), status, data)
        if status != 200:
            time.sleep(1)
            continue
        pid_ = json.loads(data)["id"]
        expires = time.monotonic() + 30 + i % 90
        with lock:
            pin_figures["pinned"] += 1
            if i % 2 == 0:  # kept until it expires
                kept_until.append(time.monotonic() + 30 + i % 90 + 1)
        q = json.dumps({"x_state_id": pid_, "questions": {"refund": {"type": "noul"}}}).encode()
        record("pinned use", (200,), lambda: post(q, headers=auth_headers(k)))
        bq = json.dumps({"requests": [{"x_state_id": pid_, "questions": {"q": {"type": "noul"}}},
                                      {"x_state_id": "no-such-pin", "questions": {"q": {"type": "noul"}}}]}).encode()
        record("pinned batch", (200,), lambda: post(bq, headers=auth_headers(k), path="/v1/systemone/batch"))
        if i % 2:
            # On a loaded machine its uses may outlast a short TTL: past it, the pin is gone (404).
            late = time.monotonic() > expires - 2
            record("unpin", (200, 404) if late else (200,),
                   lambda: post(None, headers=auth_headers(k), path=f"/v1/systemone/states/{pid_}", method="DELETE"))
        time.sleep(0.5)


def record_status(kind, expected, status, body):
    with lock:
        counts["sent"] += 1
    record(kind, expected, lambda: (status, body), count=False)


def pin_hangup_client():
    """Pin requests whose client hangs up before the answer: they must leave nothing pinned."""
    i = 0
    while time.monotonic() < stop_at:
        i += 1
        state = "".join(f"Abandoned {i}-{n}: the parcel was lost and nobody answers the phone.\n" for n in range(900))
        body = json.dumps({"state": state, "ttl_s": 86400}).encode()
        hang_up("/v1/systemone/states", body)
        with lock:
            pin_figures["abandoned"] += 1
        time.sleep(2)


def h2_nonreading_client():
    """HTTP/2 with a stream window of 0: ask for the API document, answer pings, never read the answer."""
    while time.monotonic() < stop_at - 2 * idle_timeout_s:
        t = time.monotonic()
        try:
            auth = auth_headers().get("authorization")
            s, pump = hostile.h2_nonreading(host.port, host=host.hostname, authorization=auth)
            pump.join(3 * idle_timeout_s + 10)
            s.close()
        except OSError:
            pass
        closed("h2", time.monotonic() - t)
        time.sleep(1)


def h1_pipelining_client():
    """HTTP/1.1: 200 requests for the API document pipelined, none of the answers read."""
    while time.monotonic() < stop_at - 2 * idle_timeout_s:
        t = time.monotonic()
        try:
            s = hostile.h1_pipelining(host.port, host=host.hostname)
            hostile.wait_closed(s, 3 * idle_timeout_s + 10)
            s.close()
        except OSError:
            pass
        closed("h1", time.monotonic() - t)
        time.sleep(1)


def closed(proto, took):
    with lock:
        closed_after[proto].append(took)
        counts["disconnected"] += 1
        if took > 2 * idle_timeout_s + 5:
            held_too_long.append(f"{proto} non-reading client held {took:.1f} s")


def stalled_burst_client():
    """480 KB of a body at once, then nothing: 408 within 5 s."""
    while time.monotonic() < stop_at:
        def one():
            s = socket.create_connection((host.hostname, host.port), timeout=30)
            try:
                s.sendall(b"POST /v1/systemone HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                          + auth_line() + b"content-length: 1000000\r\nconnection: close\r\n\r\n" + b" " * 480_000)
                t = time.monotonic()
                status, data = raw_status(s)
                if status is None:
                    raise ConnectionError("closed without an answer")
                if time.monotonic() - t > 5:
                    return 599, f"a stalled body was cut after {time.monotonic() - t:.1f} s".encode()
                return status, data
            finally:
                s.close()
        record("stalled burst", (408,), one)
        time.sleep(2)


def pin_watch():
    """The most pinned bytes and pins seen, from /metrics."""
    while time.monotonic() < stop_at:
        try:
            m = metrics()
            with lock:
                pin_figures["max_bytes"] = max(pin_figures["max_bytes"], m.get("kev_pinned_state_bytes", 0))
                pin_figures["max_entries"] = max(pin_figures["max_entries"], m.get("kev_pinned_states", 0))
        except OSError:
            pass
        time.sleep(5)


def metrics():
    return hostile.metrics(base)

rss_start = rss_kib()
rss_peak = rss_start
threads = [threading.Thread(target=short_client, args=(k,)) for k in range(4)]
threads += [threading.Thread(target=long_client), threading.Thread(target=malformed_client),
            threading.Thread(target=oversized_client), threading.Thread(target=disconnect_client),
            threading.Thread(target=slow_body_client), threading.Thread(target=refused_big_client),
            threading.Thread(target=burst_client), threading.Thread(target=deep_client),
            threading.Thread(target=batch_client), threading.Thread(target=pin_hangup_client),
            threading.Thread(target=h2_nonreading_client), threading.Thread(target=h2_nonreading_client),
            threading.Thread(target=h1_pipelining_client), threading.Thread(target=stalled_burst_client),
            threading.Thread(target=pin_watch)]
threads += [threading.Thread(target=pin_client, args=(k,)) for k in range(max(1, len(keys)))]
threads += [threading.Thread(target=priority_client, args=(p,)) for p in ("high", "low")]
threads += [threading.Thread(target=deadline_client)]
threads += [threading.Thread(target=steady_client, args=(n,)) for n in steady]
if admin_key and churned:
    threads += [threading.Thread(target=churn_admin)]
    threads += [threading.Thread(target=churn_traffic, args=(n,)) for n, _ in churned]
t0 = time.monotonic()
for t in threads:
    t.start()
while any(t.is_alive() for t in threads):
    rss_peak = max(rss_peak, rss_kib())
    time.sleep(1)
wall = time.monotonic() - t0
rss_end = rss_kib()
ready = urllib.request.urlopen(base + "/ready", timeout=60).status
# Abandoned pins leave nothing: what is pinned at the end is what the pin clients kept (at most one each,
# unpinned every other time, or expiring within two minutes).
time.sleep(2)
end = metrics()


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
print(f"high priority: {len(high_ms)} answered, p50 {pct(high_ms, 50):.0f} ms, p99 {pct(high_ms, 99):.0f} ms; "
      f"deadline 408s {counts['deadline_408']}")
print(f"adapters: {counts['adapter_changes']} changes, {counts['removed_404']} requests answered 404 while out, "
      f"{counts['mismatch']} answers that changed (must be 0)")
print(f"server RSS: start {rss_start / 1024:.0f} MiB, peak {rss_peak / 1024:.0f} MiB, end {rss_end / 1024:.0f} MiB")
if deep_s:
    print(f"deep states (~15,000 words): {len(deep_s)}, p50 {pct(deep_s, 50):.1f} s, max {max(deep_s):.1f} s")
for proto, took in closed_after.items():
    if took:
        print(f"{proto} non-reading clients: {len(took)}, closed after p50 {pct(took, 50):.1f} s, max {max(took):.1f} s")
print(f"pins: {pin_figures['pinned']} pinned, {pin_figures['abandoned']} abandoned by their clients; most seen "
      f"{pin_figures['max_entries']:.0f} pins / {pin_figures['max_bytes'] / 2**20:.0f} MiB; at the end "
      f"{end.get('kev_pinned_states', 0):.0f} pins, {end.get('kev_pinned_state_bytes', 0) / 2**20:.1f} MiB, "
      f"{end.get('kev_pinned_state_reserved_bytes', 0):.0f} bytes reserved")
print(f"long lane: share {end.get('kev_long_lane_share', float('nan'))}, short passes stepped aside "
      f"{end.get('kev_long_lane_held_seconds', 0):.0f} s in {end.get('kev_long_lane_holds_total', 0):.0f} holds")
print(f"ready at the end: {ready}")
for u in held_too_long[:20]:
    print("  " + u)
for u in unexpected[:20]:
    print("  " + u)
alive = sum(1 for t in kept_until if t > time.monotonic() - 2)
pins_left = end.get("kev_pinned_states", 0) > alive or end.get("kev_pinned_state_reserved_bytes", 0) > 0
print(f"pins the clients kept that may still live: {alive}")
if pins_left:
    print("pins left behind at the end")
ok = (counts["lost"] == 0 and counts["5xx"] == 0 and counts["unexpected"] == 0 and counts["mismatch"] == 0
      and ready == 200 and not held_too_long and not pins_left)
if rss_allowance_mib is not None:
    grew = (rss_peak - rss_start) / 1024
    print(f"RSS growth {grew:.0f} MiB (allowance {rss_allowance_mib:.0f} MiB)")
    ok = ok and grew <= rss_allowance_mib
sys.exit(0 if ok else 1)
