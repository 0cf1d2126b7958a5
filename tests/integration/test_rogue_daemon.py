"""The client against a daemon that lies: a stand-in apsd written by hand
(peers.py's envelopes on a ROUTER socket) welcomes the client, registers its
tensor and then answers each step's chunks with a result that does not fit
them: another format, a chunk cut short, a payload of the wrong length. Each
call fails with an error that says so (or its deadline), never a crash or a
write past the caller's buffers; an honest answer from the same stand-in is
taken, so the lies are what fails. A daemon that says it reads the job's
checkpoint (protocol 1.11) keeps a joining client waiting only while the read
goes on."""

import threading
import time

import numpy as np
import pytest
import zmq

import aps
from conftest import free_port
from peers import (AGAIN, FLAG_ALIVE, HEARTBEAT, HELLO, PUSH, REGISTER, REGISTERED, RESULT,
                   WELCOME, crc32c, decode, envelope)

N, CHUNK = 3000, 1024  # three chunks, the last of 952


class RogueDaemon:
    """Answers HELLO, REGISTER and PUSH; each step's results come from
    self.answer(chunk index, offset, count, payload) -> (fields, payload)."""

    def __init__(self):
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(self.endpoint)
        self.answer = honest
        self.ask_again = 0  # AGAINs for the first chunk before each step's results
        self.pushes = []    # the chunk offset of every PUSH read
        self.reading = ()   # how far a read is, said to a HELLO every 150 ms, before the WELCOME
        self.welcome = True
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def send(self, peer, payload=None, **fields):
        fields.setdefault("version_major", 1)
        fields.setdefault("version_minor", 8)
        if payload is None:
            self.sock.send_multipart([peer, envelope(**fields)])
        else:
            fields.setdefault("payload_len", len(payload))
            fields.setdefault("payload_crc32c", crc32c(payload))
            self.sock.send_multipart([peer, envelope(**fields), payload])

    def run(self):
        pushed = {}
        while not self.stop.is_set():
            if not self.sock.poll(50):
                continue
            peer, *frames = self.sock.recv_multipart()
            m = decode(frames[0])
            ident = {k: m[k] for k in ("job", "rank", "world_size") if k in m}
            if m["type"] == HELLO:
                for kib in self.reading:  # KiB read, or (of this file, of every read)
                    read, every = kib if isinstance(kib, tuple) else (kib, 0)
                    self.send(peer, type=HEARTBEAT, flags=FLAG_ALIVE, total_count=4096,
                              chunk_offset=read, step=every, version_minor=11, **ident)
                    time.sleep(0.15)
                if self.welcome:
                    self.send(peer, type=WELCOME, keepalive_ms=60000,
                              session=m.get("session", b""), **ident)
            elif m["type"] == REGISTER:
                self.send(peer, type=REGISTERED, tensor_id=0, tensor_name=m["tensor_name"],
                          total_count=N, chunk_count=CHUNK, format=m.get("format", "e4m3"),
                          step=0, **ident)
            elif m["type"] == PUSH:
                self.pushes.append(m.get("chunk_offset", 0))
                pushed[m.get("chunk_offset", 0)] = (m, frames[1])
                if len(pushed) < -(-N // CHUNK):
                    continue
                for _ in range(self.ask_again):
                    self.send(peer, type=AGAIN, version_minor=10, tensor_id=0,
                              step=m.get("step", 0), total_count=N, chunk_offset=0,
                              chunk_count=CHUNK, **ident)
                if self.ask_again:
                    time.sleep(0.3)  # the chunk sent again, once, arrives meanwhile
                    while self.sock.poll(0):
                        _, *again = self.sock.recv_multipart()
                        self.pushes.append(decode(again[0]).get("chunk_offset", 0))
                for i, off in enumerate(sorted(pushed)):
                    push, data = pushed[off]
                    fields = dict(type=RESULT, tensor_id=0, step=push.get("step", 0),
                                  total_count=N, chunk_offset=off,
                                  chunk_count=push["chunk_count"], format=push["format"],
                                  scale_exp=push.get("scale_exp", 0), **ident)
                    fields, payload = self.answer(i, fields, data)
                    self.send(peer, payload, **fields)
                pushed.clear()

    def close(self):
        self.stop.set()
        self.thread.join(5)
        self.sock.close()
        self.ctx.term()


def honest(_i, fields, data):
    return fields, data  # one rank: the mean is the push itself


@pytest.fixture
def rogue():
    d = RogueDaemon()
    try:
        yield d
    finally:
        d.close()


def codes_call(c, x):
    [(send, result)] = c.codes_layouts([("t", N)])
    k = aps.aps_exponent(x, "e4m3", mode="local")
    codes = aps.quantize(x, "e4m3", scale_exp=k)
    out = np.full(result.bytes + 64, 0xAB, np.uint8)  # 64 guard bytes past the result
    exps = np.zeros(result.chunks + 4, np.int32)
    handle = c.allreduce_codes_async([("t", "e4m3", codes, k, out[:result.bytes], exps)])
    return handle, codes, out, k


def lie_format(i, fields, data):
    if i == 1:
        fields["format"] = "e5m2"
    return fields, data


def lie_short(i, fields, data):
    if i == 0:  # the first chunk, half of it
        fields["chunk_count"] = CHUNK // 2
        data = data[:CHUNK // 2]
    return fields, data


def lie_length(i, fields, data):
    if i == 2:
        data = data + b"\0" * 16
    return fields, data


@pytest.mark.parametrize("lie,says", [(lie_format, "does not fit"),
                                      (lie_short, "does not match its tensor"),
                                      (lie_length, None)])
def test_a_lying_result_fails_the_codes_call(rogue, lie, says):
    x = np.linspace(-1, 1, N).astype(np.float32)
    with aps.Client(rogue.endpoint, 0, 1, format="e4m3", job="rogue", timeout_ms=1500) as c:
        handle, codes, out, _ = codes_call(c, x)
        assert handle.wait() == []
        assert np.array_equal(out[:len(codes)], codes)  # the honest answer is taken
        rogue.answer = lie
        handle, _, out, _ = codes_call(c, x)
        with pytest.raises(aps.Error) as e:
            handle.wait()
        assert e.value.name in ("APS_EPROTO", "APS_ETIMEDOUT"), e.value
        if says is not None:
            assert says in str(e.value) and e.value.name == "APS_EPROTO"
        assert np.all(out[-64:] == 0xAB)  # nothing written past the result


def test_a_short_chunk_fails_the_float_call(rogue):
    rogue.answer = lie_short
    with aps.Client(rogue.endpoint, 0, 1, format="e4m3", job="rogue", timeout_ms=1500) as c:
        with pytest.raises(aps.Error, match="does not match its tensor") as e:
            c.allreduce("t", np.ones(N, np.float32))
        assert e.value.name == "APS_EPROTO"


def test_a_daemon_that_asks_for_a_chunk_again_and_again_gets_it_once(rogue):
    """AGAIN (protocol 1.10) asks for a push apsd declined; apsd takes a push
    whose turn has come, so it asks once. A daemon that asks 50 times gets the
    chunk once more, not 50 times, and the call still takes its result."""
    x = np.linspace(-1, 1, N).astype(np.float32)
    with aps.Client(rogue.endpoint, 0, 1, format="e4m3", job="rogue", timeout_ms=3000) as c:
        honest_y = x.copy()
        c.allreduce("t", honest_y)
        rogue.pushes.clear()
        rogue.ask_again = 50
        y = x.copy()
        c.allreduce("t", y)
    assert sorted(rogue.pushes) == [0, 0, CHUNK, 2 * CHUNK], rogue.pushes
    assert np.array_equal(y, honest_y)


def test_a_checkpoint_read_longer_than_timeout_ms_is_waited_for(rogue, caplog):
    rogue.reading = range(0, 4096, 256)  # 16 steps of 150 ms: 2.4 s
    t0 = time.monotonic()
    with caplog.at_level("INFO", logger="aps.client"):
        with aps.Client(rogue.endpoint, 0, 1, format="e4m3", job="rogue", timeout_ms=500):
            pass
    assert time.monotonic() - t0 > 2.0
    assert ("apsd reads the checkpoint of job 'rogue' before it lets rank 0 in: 0.0 of "
            "4.0 MiB read") in caplog.text


def test_a_checkpoint_read_that_waits_its_turn_is_waited_for(rogue):
    # (found by helper-34) 2 reads run at once: a third job's read said 0 KiB
    # read until its turn came, and its clients of timeout_ms 600 failed while
    # the reads ahead of it went on. Now the KiB of every read count too.
    rogue.reading = [(0, every) for every in range(0, 40960, 4096)] + [2048, 4096]
    t0 = time.monotonic()
    aps.Client(rogue.endpoint, 0, 1, format="e4m3", job="rogue", timeout_ms=500).close()
    assert time.monotonic() - t0 > 1.6


def test_a_checkpoint_read_that_stalls_fails_the_join_within_timeout_ms(rogue):
    # a disk that hangs, or a daemon that says the same forever: 4 s of it.
    # A join waits 1 s at least (apsd says how far every 250 ms: a timeout_ms of
    # 200 failed a read that went on)
    rogue.reading, rogue.welcome = [0, 256] + [512] * 25, False
    t0 = time.monotonic()
    with pytest.raises(aps.Error, match=r"reads the checkpoint of job 'rogue' \(0.5 of 4.0 MiB "
                       r"read\), and neither it nor the reads ahead of it went on within "
                       r"timeout_ms = 200 \(1000 at least\)") as e:
        aps.Client(rogue.endpoint, 0, 1, format="e4m3", job="rogue", timeout_ms=200)
    took = time.monotonic() - t0
    assert e.value.name == "APS_ETIMEDOUT"
    assert 1.2 < took < 2.0, took  # 1000 ms after the last KiB that came, at 300 ms
