"""The one I/O thread of a Client: runs queued calls in order, and the handles
that report their outcome.

The blocking C client is not thread-safe and keeps its last error per thread,
so every foreign call of a Client runs on this thread, one after the other,
and a failure's message is read there. ctypes releases the GIL during a
foreign call, so a call blocked on the network lets Python compute meanwhile.
"""

import concurrent.futures
import queue
import threading

_STOP = object()


class Handle:
    """The pending outcome of an asynchronous call (allreduce_async, ...)."""

    def __init__(self, future, what):
        self._future = future
        self._what = what

    def done(self):
        """True once the call has finished, successfully or not."""
        return self._future.done()

    def wait(self, timeout=None):
        """Blocks until the call has finished and returns its result (for an
        all-reduce, the reduced tensor); raises the call's error. timeout in
        seconds (None: as long as it takes; the C call has its own deadline)."""
        try:
            return self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"{self._what} has not finished after {timeout} s") from None

    def add_done_callback(self, fn):
        """Calls fn(handle) when the call finishes (on the I/O thread, or now if
        it already has). fn must not block."""
        self._future.add_done_callback(lambda _f: fn(self))

    def __repr__(self):
        state = "done" if self.done() else "pending"
        return f"<aps.Handle {self._what} {state}>"


class IOThread:
    """A daemon thread that runs submitted functions in submission order."""

    def __init__(self, name):
        self._queue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn, what):
        """Queues fn() and returns a Handle of its result."""
        future = concurrent.futures.Future()
        self._queue.put((future, fn))
        return Handle(future, what)

    def stop(self):
        """Lets the queued calls finish, then ends the thread (idempotent)."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            if threading.current_thread() is not self._thread:
                self._thread.join()

    def _run(self):
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            future, fn = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn()
            except BaseException as exc:  # delivered to whoever waits on the handle
                future.set_exception(exc)
            else:
                future.set_result(result)
