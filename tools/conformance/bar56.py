"""The bar of issue 56 ("serving under adversity, round three") against `kev serve --demo` on loopback, one
check at a time, each on a server of its own started with the flags the check names; prints one line per
check with its figure and the bar, and exits 1 if a bar is not met.

  A. --max-connections 16: 16 clients that never read their answers (8 HTTP/2 with a stream window of 0, 8
     HTTP/1.1 pipelining requests) hold every connection; a normal decision must be answered within 15 s.
     Run with --max-connections-per-ip 16 (all on loopback: the per-address cap cannot help, only the send
     timeout), then with the default per-address cap and the 16 clients at 127.0.0.2 (the cap answers them).
  B. 20 pin requests of a 20,000-word state, each abandoned 2 s after its body: kev_pinned_states must be 0.
  C. a pin with ttl_s 1 on a 30,000-word state: never a 5xx.
  D. --drain-timeout-s 5 with a long batch and deep states in flight: the process exits within 10 s of SIGTERM.
  E. a body that stalls after 480 KB: 408 within 5 s.
  F. (the lane's share, not a bar of its own) a 15,000-word state alone, then beside four clients sending short
     decisions back to back: its time under saturation against its solo time over the share (0.2); with the
     lane at SCHED_IDLE (--long-lane on) and at nice 10 (low).

usage: python3 tools/conformance/bar56.py KEV_BIN [--only ABCDEF]
"""
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import hostile

KEV = sys.argv[1]
ONLY = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else "ABCDEF"
failed = []


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Server:
    def __init__(self, *flags):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = open(f"/tmp/bar56-{self.port}.log", "w")
        self.proc = subprocess.Popen([KEV, "serve", "--demo", "--host", "127.0.0.1", "--port", str(self.port),
                                      *flags], stdout=self.log, stderr=self.log)
        t = time.monotonic()
        while time.monotonic() - t < 120:
            try:
                if urllib.request.urlopen(self.base + "/ready", timeout=5).status == 200:
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("kev serve never became ready")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def metrics(self):
        return hostile.metrics(self.base)


def post(base, path, body, timeout=600):
    req = urllib.request.Request(base + path, data=body, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def words(n, tag):
    line = f"{tag}: the order shipped late and the customer asks for a refund of the whole amount today.\n"
    per = len(line.split())
    return line * (n // per)


def decision(tag="bar"):
    return json.dumps({"state": f"{tag}: is this urgent?", "questions": {"q": {"type": "noul"}}}).encode()


def report(name, figure, bar, ok):
    print(f"{name}: {figure} (bar: {bar}) {'met' if ok else 'NOT MET'}", flush=True)
    if not ok:
        failed.append(name)


def connect(port, src="127.0.0.1"):
    return hostile.connect(port, src)


def check_a():
    for per_ip, src in (("16", "127.0.0.1"), (None, "127.0.0.2")):
        flags = ["--max-connections", "16"] + (["--max-connections-per-ip", per_ip] if per_ip else [])
        srv = Server(*flags)
        try:
            held = [hostile.h2_nonreading(srv.port, src)[0] for _ in range(8)]
            held += [hostile.h1_pipelining(srv.port, src) for _ in range(8)]
            time.sleep(1)
            t = time.monotonic()
            status, _ = post(srv.base, "/v1/systemone", decision(), timeout=60)
            took = time.monotonic() - t
            what = "per-address cap 16, all on loopback" if per_ip else "default per-address cap (4), clients at 127.0.0.2"
            report(f"A. 16 non-reading clients ({what})", f"normal decision {status} after {took:.1f} s",
                   "answered within 15 s", status == 200 and took < 15)
            for s in held:
                s.close()
        finally:
            srv.stop()


def check_b():
    srv = Server()
    try:
        rss0 = srv.metrics().get("kev_process_resident_bytes", 0)

        def abandon(i):
            body = json.dumps({"state": words(20000, f"abandoned {i}"), "ttl_s": 86400}).encode()
            s = connect(srv.port)
            s.sendall(b"POST /v1/systemone/states HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                      + f"content-length: {len(body)}\r\n\r\n".encode() + body)
            time.sleep(2)
            s.close()
        ts = [threading.Thread(target=abandon, args=(i,)) for i in range(20)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        t = time.monotonic()
        while time.monotonic() - t < 60 and srv.metrics().get("kev_engine_running", 0) > 0:
            time.sleep(0.5)
        m = srv.metrics()
        report("B. 20 abandoned pins of 20,000 words",
               f"kev_pinned_states {m.get('kev_pinned_states', 0):.0f}, bytes {m.get('kev_pinned_state_bytes', 0):.0f},"
               f" reserved {m.get('kev_pinned_state_reserved_bytes', 0):.0f}; RSS {rss0 / 2**20:.0f} -> "
               f"{m.get('kev_process_resident_bytes', 0) / 2**20:.0f} MiB",
               "0 pins", m.get("kev_pinned_states", 1) == 0 and m.get("kev_pinned_state_reserved_bytes", 1) == 0)
    finally:
        srv.stop()


def check_c():
    srv = Server()
    try:
        t = time.monotonic()
        status, body = post(srv.base, "/v1/systemone/states",
                            json.dumps({"state": words(30000, "short-lived"), "ttl_s": 1}).encode())
        took = time.monotonic() - t
        v = json.loads(body)
        report("C. ttl_s 1 on a 30,000-word state", f"{status} after {took:.1f} s ({v.get('tokens', '?')} tokens)",
               "never a 5xx", status < 500)
    finally:
        srv.stop()


def check_d():
    srv = Server("--drain-timeout-s", "5")
    try:
        batch = json.dumps({"requests": [{"state": words(15000, f"batch {i}"), "questions": {"q": {"type": "noul"}}}
                                         for i in range(8)]}).encode()
        answers = []

        def send(path, body):
            try:
                answers.append(post(srv.base, path, body, timeout=120)[0])
            except OSError as e:
                answers.append(type(e).__name__)
        ts = [threading.Thread(target=send, args=("/v1/systemone/batch", batch))]
        ts += [threading.Thread(target=send, args=("/v1/systemone", json.dumps(
            {"state": words(30000, f"deep {i}"), "questions": {"q": {"type": "noul"}}}).encode())) for i in range(2)]
        for t in ts:
            t.start()
        time.sleep(3)
        t = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        try:
            srv.proc.wait(60)
        except subprocess.TimeoutExpired:
            pass
        took = time.monotonic() - t
        for th in ts:
            th.join(60)
        report("D. --drain-timeout-s 5 with a batch of 8 x 15,000 words and 2 x 30,000 words in flight",
               f"exited {took:.1f} s after SIGTERM (code {srv.proc.returncode}); in flight answered {answers}",
               "exit within 10 s", took <= 10 and srv.proc.returncode is not None)
    finally:
        srv.stop()


def check_e():
    srv = Server()
    try:
        s = connect(srv.port)
        s.sendall(b"POST /v1/systemone HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"content-length: 1000000\r\n\r\n" + b" " * 480_000)
        t = time.monotonic()
        s.settimeout(60)
        data = s.recv(4096)
        took = time.monotonic() - t
        status = int(data[9:12]) if len(data) >= 12 else None
        report("E. a body that stalls after 480 KB", f"{status} after {took:.1f} s", "408 within 5 s",
               status == 408 and took < 5)
    finally:
        srv.stop()


def check_f():
    for lane in ("on", "low"):
        share_run(lane)


def share_run(lane):
    srv = Server("--long-lane", lane)
    try:
        deep = json.dumps({"state": words(15000, "share"), "questions": {"q": {"type": "noul"}}}).encode()
        post(srv.base, "/v1/systemone", decision("warm"))
        t = time.monotonic()
        post(srv.base, "/v1/systemone", deep)
        solo = time.monotonic() - t
        stop = [False]
        shorts = [0]

        def loop(k):
            i = 0
            while not stop[0]:
                i += 1
                body = json.dumps({"state": f"Ticket {k}-{i}: where is my order {i}?",
                                   "questions": {"q": {"type": "noul"}, "t": {"type": "score",
                                                 "criteria": ["calm", "annoyed", "angry"]}}}).encode()
                if post(srv.base, "/v1/systemone", body)[0] == 200:
                    shorts[0] += 1
        ts = [threading.Thread(target=loop, args=(k,)) for k in range(4)]
        for th in ts:
            th.start()
        time.sleep(2)
        deep2 = deep.replace(b"share:", b"share2:")
        t = time.monotonic()
        post(srv.base, "/v1/systemone", deep2)
        loaded = time.monotonic() - t
        stop[0] = True
        for th in ts:
            th.join()
        m = srv.metrics()
        report(f"F. a 15,000-word state beside 4 saturating short clients (--long-lane {lane})",
               f"{loaded:.1f} s against {solo:.1f} s alone ({loaded / solo:.1f}x; {shorts[0]} short answers; "
               f"short passes stepped aside {m.get('kev_long_lane_held_seconds', 0):.1f} s)",
               f"<= solo / share = {solo / 0.2:.1f} s", loaded <= solo / 0.2)
    finally:
        srv.stop()


for name, check in (("A", check_a), ("B", check_b), ("C", check_c), ("D", check_d), ("E", check_e), ("F", check_f)):
    if name in ONLY:
        check()
print("bar56:", "every bar met" if not failed else f"not met: {failed}")
sys.exit(1 if failed else 0)
