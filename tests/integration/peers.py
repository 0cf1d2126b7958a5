"""Raw ZeroMQ peers that speak apsd's protocol by hand, as a stranger would from
docs/PROTOCOL.md and proto/aps.proto alone: they send whatever a test wants
(well-formed or not, from any routing id, on as many connections as it
likes) and read the replies. Also what a test reads off the daemon's process:
its open descriptors and its resident memory."""

import os
import socket
import struct
import time

import zmq

# MsgType of aps.proto
HELLO, WELCOME, REGISTER, REGISTERED, PUSH, RESULT, BROADCAST, BARRIER, HEARTBEAT, BYE, \
    ERROR, EXPONENTS, SCALES, PULL, WEIGHTS, AGAIN = range(1, 17)
TYPE_NAMES = {v: k for k, v in dict(
    HELLO=1, WELCOME=2, REGISTER=3, REGISTERED=4, PUSH=5, RESULT=6, BROADCAST=7,
    BARRIER=8, HEARTBEAT=9, BYE=10, ERROR=11, EXPONENTS=12, SCALES=13, PULL=14,
    WEIGHTS=15, AGAIN=16).items()}

# Field numbers and wire kinds of Envelope (aps.proto): u = varint, z = zigzag
# varint (sint32), s = string, b = bytes, f = fixed32.
FIELDS = {
    "version_major": (1, "u"), "version_minor": (2, "u"), "type": (3, "u"), "job": (4, "s"),
    "rank": (5, "u"), "world_size": (6, "u"), "tensor_id": (7, "u"), "tensor_name": (8, "s"),
    "step": (9, "u"), "chunk_offset": (10, "u"), "chunk_count": (11, "u"),
    "total_count": (12, "u"), "format": (13, "s"), "scale_exp": (14, "z"),
    "scaling": (15, "u"), "flags": (16, "u"), "payload_len": (17, "u"),
    "payload_crc32c": (18, "f"), "flushed": (19, "u"), "error_code": (20, "z"),
    "error_text": (21, "s"), "about_type": (26, "u"), "optimizer": (27, "s"),
    "session": (30, "b"), "job_token": (31, "s"), "max_message_bytes": (32, "u"),
    "keepalive_ms": (33, "u"), "block_size": (34, "u"), "retry_after_ms": (35, "u"),
}
BY_NUMBER = {num: (name, kind) for name, (num, kind) in FIELDS.items()}

FLAG_RESUME = 1 << 6
FLAG_ALIVE = 1 << 7
FLAG_NO_CRC = 1 << 8  # a job whose payloads carry no CRC32C (1.8)

# APS_E* codes (common/err.h)
ENOMEM, ERANGE, EPROTO, ETIMEDOUT, EBUSY, ENOSESSION, EACCES = -2, -4, -7, -8, -13, -16, -17


def _varint(n):
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def envelope(**fields):
    """The header frame of one message: an Envelope with these fields."""
    fields.setdefault("version_major", 1)
    fields.setdefault("version_minor", 6)
    out = b""
    for name, value in fields.items():
        num, kind = FIELDS[name]
        if kind == "u":
            out += _varint(num << 3) + _varint(value)
        elif kind == "z":
            out += _varint(num << 3) + _varint((value << 1) ^ (value >> 63))
        elif kind == "f":
            out += _varint(num << 3 | 5) + value.to_bytes(4, "little")
        else:
            data = value.encode() if kind == "s" else bytes(value)
            out += _varint(num << 3 | 2) + _varint(len(data)) + data
    return out


def decode(frame):
    """An Envelope as a dict of the fields above (unknown fields are skipped)."""
    msg, pos = {}, 0

    def varint():
        nonlocal pos
        shift = value = 0
        while True:
            byte = frame[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    while pos < len(frame):
        key = varint()
        num, wire = key >> 3, key & 7
        if wire == 0:
            value = varint()
        elif wire == 2:
            n = varint()
            value, pos = frame[pos:pos + n], pos + n
        elif wire == 5:
            value, pos = int.from_bytes(frame[pos:pos + 4], "little"), pos + 4
        else:
            value, pos = int.from_bytes(frame[pos:pos + 8], "little"), pos + 8
        name, kind = BY_NUMBER.get(num, (None, None))
        if kind == "z":
            value = (value >> 1) ^ -(value & 1)
        elif kind == "s":
            value = value.decode(errors="replace")
        if name is not None:
            msg[name] = value
    msg.setdefault("type", 0)
    msg["type_name"] = TYPE_NAMES.get(msg["type"], str(msg["type"]))
    return msg


class Peer:
    """One DEALER socket (one connection) with the routing id it is given."""

    def __init__(self, endpoint, routing_id=None, ctx=None, linger_ms=0, sndhwm=None,
                 rcvhwm=None, rcvbuf=None, curve=None):
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        if routing_id is not None:
            self.sock.setsockopt(zmq.ROUTING_ID, routing_id)
        self.sock.setsockopt(zmq.LINGER, linger_ms)
        if sndhwm is not None:
            self.sock.setsockopt(zmq.SNDHWM, sndhwm)
        if rcvhwm is not None:
            self.sock.setsockopt(zmq.RCVHWM, rcvhwm)
        if rcvbuf is not None:
            self.sock.setsockopt(zmq.RCVBUF, rcvbuf)
        if curve is not None:
            server_key, public, secret = curve
            self.sock.curve_serverkey = server_key
            self.sock.curve_publickey = public
            self.sock.curve_secretkey = secret
        self.sock.connect(endpoint)

    def send(self, payload=None, **fields):
        """Sends one message (with its payload's length and CRC when it has one)."""
        if payload is not None:
            fields.setdefault("payload_len", len(payload))
            if "payload_crc32c" not in fields:  # a setdefault would take it anyway: slow
                fields["payload_crc32c"] = crc32c(payload)
            self.sock.send_multipart([envelope(**fields), payload])
        else:
            self.sock.send(envelope(**fields))

    def send_raw(self, *frames, flags=0):
        self.sock.send_multipart(list(frames), flags=flags)

    def recv(self, timeout_ms=5000):
        """The next reply decoded, or None when none came within timeout_ms."""
        if not self.sock.poll(timeout_ms):
            return None
        frames = self.sock.recv_multipart()
        msg = decode(frames[0])
        msg["payload"] = frames[1] if len(frames) > 1 else None
        return msg

    def recv_type(self, type_, timeout_ms=5000):
        """Replies until one of type_ (returned) or the timeout (None)."""
        deadline = time.monotonic() + timeout_ms / 1000
        while (left := deadline - time.monotonic()) > 0:
            msg = self.recv(int(left * 1000) + 1)
            if msg is None:
                return None
            if msg["type"] == type_:
                return msg
        return None

    def hello(self, job, rank, world_size, **fields):
        """HELLO; returns the reply (WELCOME or ERROR), or None."""
        self.send(type=HELLO, job=job, rank=rank, world_size=world_size, **fields)
        return self.recv()

    def close(self):
        self.sock.close(linger=0)


def keep_alive(peers, job, reader):
    """One HEARTBEAT flagged ALIVE from every rank (peers by rank), then every reply
    waiting at `reader` read: a flooding rank stays a live rank with room to receive."""
    for r, p in enumerate(peers):
        p.send(type=HEARTBEAT, job=job, rank=r, world_size=len(peers), flags=FLAG_ALIVE)
    while reader.recv(0) is not None:
        pass


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def settle(measure, target, timeout=10.0, slack=0):
    """Waits until measure() <= target + slack; returns the last value."""
    deadline = time.monotonic() + timeout
    value = measure()
    while value > target + slack and time.monotonic() < deadline:
        time.sleep(0.1)
        value = measure()
    return value


# ZMTP 3.0's greeting of a peer of the NULL mechanism, not the server of it
NULL_GREETING = b"\xff" + bytes(8) + b"\x7f\x03\x00" + b"NULL".ljust(20, b"\x00") + bytes(32)


def zmtp_frame(body, more=False, command=False):
    flags = (1 if more else 0) | (4 if command else 0)
    if len(body) > 255:
        return bytes([flags | 2]) + struct.pack(">Q", len(body)) + body
    return bytes([flags, len(body)]) + body


def zmtp_read_frame(s):
    """(flags, body) of the next ZMTP frame on the socket s; EOFError when it closed."""
    def exact(n):
        got = b""
        while len(got) < n:
            more = s.recv(n - len(got))
            if not more:
                raise EOFError
            got += more
        return got
    flags = exact(1)[0]
    n = struct.unpack(">Q", exact(8))[0] if flags & 2 else exact(1)[0]
    return flags, exact(n)


def ready_bomb(endpoint, source, hello=True):
    """A connection from source whose handshake's READY carries 500000 properties
    (4 MB), then a HELLO; True when apsd closed it within 5 s."""
    props = b"".join(b"\x03" + struct.pack(">I", i)[1:] + bytes(4) for i in range(1, 500000))
    ready = b"\x05READY\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER" + props
    host, port = endpoint[len("tcp://"):].rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0))
    began, got, closed = time.monotonic(), b"", False
    try:  # (closed at accept, or cut off while it is sent) the daemon's READY, a HELLO
        s.sendall(NULL_GREETING)
        closed = len(s.recv(64, socket.MSG_WAITALL)) < 64
        if not closed:
            s.sendall(zmtp_frame(ready, command=True))
        while b"READY" not in got and not closed:
            more = s.recv(4096)
            got, closed = got + more, more == b""
        if not closed and hello:
            s.sendall(zmtp_frame(envelope(type=HELLO, job="meta", rank=0, world_size=2)))
        while time.monotonic() - began < 5 and not closed:
            closed = s.recv(4096) == b""
    except (ConnectionResetError, BrokenPipeError):
        closed = True
    s.close()
    return closed
