"""Clients that do not read, for `soak.py` and `bar56.py`: an HTTP/2 connection whose stream window is 0 (it
answers the server's pings, so it looks alive), and an HTTP/1.1 connection that pipelines requests and reads
none of the answers; and the server's `/metrics` as a dict."""
import select
import socket
import threading
import urllib.request


def connect(port, src="127.0.0.1", host="127.0.0.1", timeout=10):
    s = socket.socket()
    s.settimeout(timeout)
    s.bind((src, 0))
    s.connect((host, port))
    return s


def h2_frame(kind, flags, stream, payload=b""):
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def hpack_literal(index, value):
    """A header field, its name indexed in the static table, its value a literal (never indexed)."""
    v = value.encode() if isinstance(value, str) else value
    assert len(v) < 127
    if index < 15:
        return bytes([0x10 | index, len(v)]) + v
    return bytes([0x1f, index - 15, len(v)]) + v


def h2_nonreading(port, src="127.0.0.1", host="127.0.0.1", path="/openapi.json", authorization=None):
    """Open the connection, ask for `path` with SETTINGS_INITIAL_WINDOW_SIZE 0, answer SETTINGS and PINGs on a
    thread of its own (never a WINDOW_UPDATE). Returns (socket, thread): the thread ends when the server closes."""
    s = connect(port, src, host)
    headers = bytes([0x82, 0x86]) + hpack_literal(4, path) + hpack_literal(1, "x")
    if authorization:
        headers += hpack_literal(23, authorization)  # static 23: authorization
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2_frame(4, 0, 0, (4).to_bytes(2, "big") + (0).to_bytes(4, "big"))
              + h2_frame(1, 0x5, 1, headers))  # HEADERS, END_STREAM | END_HEADERS
    s.settimeout(None)

    def pump():
        buf = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    return
                buf += chunk
                while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                    n = int.from_bytes(buf[:3], "big")
                    kind, flags, payload = buf[3], buf[4], buf[9:9 + n]
                    buf = buf[9 + n:]
                    if kind == 4 and not flags & 1:
                        s.sendall(h2_frame(4, 1, 0))  # SETTINGS ACK
                    elif kind == 6 and not flags & 1:
                        s.sendall(h2_frame(6, 1, 0, payload))  # PING ACK
        except OSError:
            return
    t = threading.Thread(target=pump, daemon=True)
    t.start()
    return s, t


def h1_pipelining(port, src="127.0.0.1", host="127.0.0.1", n=200):
    """Open the connection with a small receive buffer and pipeline `n` requests for the API document,
    reading none of the answers. Returns the socket."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.bind((src, 0))
    s.connect((host, port))
    s.setblocking(False)
    try:
        s.send(b"GET /openapi.json HTTP/1.1\r\nhost: x\r\n\r\n" * n)
    except OSError:
        pass
    return s


def wait_closed(s, timeout_s):
    """Wait until the server closes `s` (its FIN or reset), never reading what it sent; False on timeout."""
    poller = select.poll()
    poller.register(s, select.POLLRDHUP | select.POLLERR | select.POLLHUP)
    return bool(poller.poll(timeout_s * 1000))


def metrics(base):
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, _, value = line.partition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out
