"""A TCP proxy on loopback that can cut every connection through it, as a
network blip does: the bytes in flight are lost and both ends see the
connection reset, while the proxy keeps listening, so that ZeroMQ reconnects."""

import select
import socket
import struct
import threading


class BlipProxy:
    def __init__(self, upstream_port):
        self.upstream = ("127.0.0.1", upstream_port)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.lock = threading.Lock()
        self.pairs = []
        self.cuts = 0
        self.silent = []  # server sides of connections cut on the client's side only
        self.accepted = 0
        self.running = True
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while self.running:
            ready, _, _ = select.select([self.listener], [], [], 0.1)
            if not ready:
                continue
            client, _ = self.listener.accept()
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.pairs.append((client, server))
                self.accepted += 1
            threading.Thread(target=self._pipe, args=(client, server), daemon=True).start()

    def _pipe(self, a, b):
        peers = {a: b, b: a}
        try:
            while self.running:
                ready, _, _ = select.select(list(peers), [], [], 0.1)
                for s in ready:
                    data = s.recv(1 << 16)
                    if not data:
                        return  # one end closed: so does the other (below)
                    peers[s].sendall(data)
        except (OSError, ValueError):
            return  # cut: the sockets were closed under us
        finally:
            with self.lock:
                if (a, b) in self.pairs:
                    self.pairs.remove((a, b))
                silent = b in self.silent
            for s in (a,) if silent else (a, b):
                try:
                    s.close()
                except OSError:
                    pass

    @staticmethod
    def _reset(s):
        # SO_LINGER 0: close sends a RST, and what was buffered is lost
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
        except OSError:
            pass

    def cut(self, server_sees_it=True):
        """Resets every connection through the proxy; returns how many. With
        server_sees_it=False only the client's side is reset: the server's
        stays open and silent (a path that died without a word), so that the
        server learns of it from its heartbeat timeout only."""
        with self.lock:
            pairs, self.pairs = self.pairs, []
            self.cuts += 1
            if not server_sees_it:
                # before the client's side goes: its pipe thread, woken by
                # the reset, must already know to leave the server's side open
                self.silent.extend(b for _, b in pairs)
        for a, b in pairs:
            self._reset(a)
            if server_sees_it:
                self._reset(b)
        return len(pairs)

    def close(self):
        self.running = False
        self.cut()
        for s in self.silent:
            self._reset(s)
        self.thread.join(timeout=2)
        self.listener.close()
