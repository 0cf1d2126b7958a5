"""Children's output on the launcher's own stdout and stderr, in whole lines,
each line with its child's prefix ("[rank 3] "), so that ranks never meet
mid-line. A thread per pipe reads what is there, cuts it at newlines and
writes every complete line of it in one locked write: the lines a child wrote
together (a traceback) stay together. A last line without a newline gets one.
The launcher's own messages (say) take the same lock.
"""

import os
import sys
import threading
import time

CHUNK = 1 << 16  # bytes read from a pipe at once

_lock = threading.Lock()


def say(text):
    """One "[launch] " line on stderr."""
    with _lock:
        sys.stderr.write(f"[launch] {text}\n")
        sys.stderr.flush()


def _write(sink, prefix, lines):
    data = b"".join(prefix + line + b"\n" for line in lines)
    with _lock:
        sink.write(data)
        sink.flush()


def _pump(stream, sink, prefix):
    """Copies stream to sink in whole prefixed lines until end of file."""
    pending = bytearray()
    fd = stream.fileno()
    while True:
        chunk = os.read(fd, CHUNK)
        if not chunk:
            break
        pending += chunk
        cut = pending.rfind(b"\n")
        if cut >= 0:
            _write(sink, prefix, bytes(pending[:cut]).split(b"\n"))
            del pending[:cut + 1]
    if pending:
        _write(sink, prefix, [bytes(pending)])
    stream.close()


class Output:
    """The reader threads of the children whose output it follows."""

    def __init__(self):
        self._threads = {}  # pid -> the threads reading its stdout and stderr

    def follow(self, proc, prefix):
        """Copies proc's stdout and stderr pipes (those that are pipes) to ours."""
        threads = []
        for stream, sink in ((proc.stdout, sys.stdout.buffer), (proc.stderr, sys.stderr.buffer)):
            if stream is None:
                continue
            t = threading.Thread(target=_pump, args=(stream, sink, prefix.encode()),
                                 daemon=True)
            t.start()
            threads.append(t)
        self._threads[proc.pid] = threads

    def drain(self, proc, timeout):
        """Waits up to timeout seconds until all of proc's output is written
        (a grandchild that holds its pipes open may keep it longer)."""
        _join(self._threads.get(proc.pid, ()), timeout)

    def close(self, timeout):
        """As drain, for every child followed."""
        _join([t for threads in self._threads.values() for t in threads], timeout)


def _join(threads, timeout):
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
