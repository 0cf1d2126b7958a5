"""A stand-in apsd that floods its client (run as a process of its own, so that
the flood is not slowed by the test's interpreter): it welcomes the client,
registers its tensor and, on the first step's PUSH, sends nothing the call waits
for but a flood for `seconds`: RESULTs of a step that is not the call's
("stale", each a valid message) or frames that are no message at all
("garbage"). Later steps are answered honestly (one rank: the result is the
push). Prints "flooding" when it starts and "flooded N" when it stops.

    python3 flood_daemon.py ENDPOINT stale|garbage SECONDS
"""

import sys
import time

import zmq

from peers import (HELLO, PUSH, REGISTER, REGISTERED, RESULT, WELCOME, crc32c, decode,
                   envelope)

N = 1024  # one chunk of e4m3 codes


def main(endpoint, mode, seconds):
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    # a full pipe blocks the send of an honest answer instead of dropping it
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.bind(endpoint)
    print("listening", flush=True)
    stale = bytes(i % 0x70 for i in range(N))  # finite e4m3 codes
    stale_crc = crc32c(stale)
    flooded = False
    end = time.monotonic() + 600  # never runs for ever
    while time.monotonic() < end:
        if not sock.poll(100):
            continue
        peer, *frames = sock.recv_multipart()
        m = decode(frames[0])
        ident = dict(version_major=1, version_minor=8,
                     **{k: m[k] for k in ("job", "rank", "world_size") if k in m})
        if m["type"] == HELLO:
            sock.send_multipart([peer, envelope(type=WELCOME, keepalive_ms=60000,
                                                session=m.get("session", b""), **ident)])
        elif m["type"] == REGISTER:
            sock.send_multipart([peer, envelope(
                type=REGISTERED, tensor_id=0, tensor_name=m["tensor_name"], total_count=N,
                chunk_count=N, format=m.get("format", "e4m3"), step=0, **ident)])
        elif m["type"] == PUSH and not flooded:
            flooded = True
            if mode == "stale":
                frame = envelope(type=RESULT, tensor_id=0, step=7777, total_count=N,
                                 chunk_offset=0, chunk_count=N, format="e4m3", scale_exp=0,
                                 payload_len=len(stale), payload_crc32c=stale_crc, **ident)
                message = [peer, frame, stale]
            else:
                message = [peer, b"\xff\x00 not a message \x00" * 8]
            print("flooding", flush=True)
            sent, stop = 0, time.monotonic() + seconds
            while time.monotonic() < stop:
                for _ in range(256):
                    try:
                        sock.send_multipart(message, zmq.NOBLOCK)
                        sent += 1
                    except zmq.Again:
                        break
                while sock.poll(0):  # the client's heartbeats
                    sock.recv_multipart()
            print("flooded", sent, flush=True)
        elif m["type"] == PUSH:
            sock.send_multipart([peer, envelope(
                type=RESULT, tensor_id=0, step=m.get("step", 0), total_count=N,
                chunk_offset=0, chunk_count=m["chunk_count"], format=m["format"],
                scale_exp=m.get("scale_exp", 0), payload_len=len(frames[1]),
                payload_crc32c=crc32c(frames[1]), **ident), frames[1]])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
