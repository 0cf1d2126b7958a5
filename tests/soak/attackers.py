"""Attacks of issue 15 for the soak test, from outside, as a stranger would:
raw ZeroMQ peers (tests/integration/peers.py) that never join a job.

- takeovers: a connection speaks, a second one with the same routing id
  speaks, the first speaks again and closes (libzmq 4.3 aborted apsd on its
  next ZMTP heartbeat, or leaked the first one's descriptor); now and then the
  second one floods its parked pipe before it closes;
- slow readers: connections that send thousands of requests, never read a
  reply, and close (libzmq aborted apsd too).
Each round is one of them; run() loops until stopped and counts them."""

import os
import random
import time

from peers import HEARTBEAT, Peer


def _rid(rng):
    return bytes([0x80 | rng.randrange(128)]) + rng.randbytes(15)


def _speak(peer):
    peer.send(type=HEARTBEAT, job="stranger", rank=0, world_size=2)


def takeovers(endpoint, rng, n=20):
    for _ in range(n):
        x = _rid(rng)
        old = Peer(endpoint, x)
        _speak(old)
        new = Peer(endpoint, x, sndhwm=0, linger_ms=200)
        _speak(new)
        time.sleep(0.002)
        _speak(old)
        old.close()
        if rng.random() < 0.2:  # flood the parked one, then go
            for _ in range(400):
                new.send_raw(b"\x00" * 512)
        new.close()


def slow_readers(endpoint, rng, n=4, requests=3000):
    peers = [Peer(endpoint, _rid(rng), sndhwm=0) for _ in range(n)]
    for p in peers:
        for _ in range(requests):
            _speak(p)
    time.sleep(0.2 + rng.random() * 0.5)
    for p in peers:
        p.close()


def run(endpoint, seed, stop, counts):
    """Attacks until stop is set; counts[kind] += 1 for each round."""
    rng = random.Random(seed)
    while not stop.is_set():
        kind = rng.choice(("takeovers", "slow_readers"))
        try:
            (takeovers if kind == "takeovers" else slow_readers)(endpoint, rng)
            counts[kind] = counts.get(kind, 0) + 1
        except Exception as e:  # noqa: BLE001 (a daemon restart mid-round)
            counts["failed"] = counts.get("failed", 0) + 1
            counts["last_error"] = repr(e)[:200]
        stop.wait(0.5 + rng.random())


if __name__ == "__main__":
    import sys
    import threading
    stop = threading.Event()
    threading.Timer(float(sys.argv[2]), stop.set).start()
    counts = {}
    run(sys.argv[1], int(os.environ.get("SEED", "1")), stop, counts)
    print(counts)
