"""The I/O threads of a Client: one starts queued calls in order, the other
waits for the ones that finish later, and the handles report the outcome.

The C client is not thread-safe and keeps its last error per thread, so every
call that starts something runs on the starter thread, one after the other,
and a failure's message is read on the thread that saw it. ctypes releases
the GIL during a foreign call, so a call blocked on the network lets Python
compute meanwhile.

A queued function may return Deferred(early, finish): what it started is in
flight (the C client sends it) and finish() ends it. The starter hands
finish() to the waiter thread and goes on with the next call, so that a
bucket of gradients is sent while the previous one is still being reduced.
finish() runs on the waiter thread in start order. Calls queued with
overlap=False (barrier, broadcast, register, close) first wait until nothing
is in flight, as if every earlier call had completed.
"""

import concurrent.futures
import queue
import threading

from aps._args import SECONDS, check_float

_STOP = object()


class Deferred:
    """Returned by a queued function whose outcome comes later: early is known
    now (handle.started() returns it), finish() returns the final result."""

    def __init__(self, early, finish):
        self.early = early
        self.finish = finish


class Handle:
    """The pending outcome of an asynchronous call (allreduce_async, ...)."""

    def __init__(self, future, started, what):
        self._future = future
        self._started = started
        self._what = what

    def done(self):
        """True once the call has finished, successfully or not."""
        return self._future.done()

    def wait(self, timeout=None):
        """Blocks until the call has finished and returns its result (for an
        all-reduce, the reduced tensor); raises the call's error. timeout in
        seconds (None: as long as it takes; the C call has its own deadline)."""
        if timeout is not None:
            timeout = check_float(timeout, "timeout", SECONDS)
        try:
            return self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"{self._what} has not finished after {timeout} s") from None

    def started(self):
        """What the call knew once it was started (for a batch of all-reduces:
        the tensors sent as zeros); raises the call's error if starting failed.
        Blocks until the call has been started."""
        return self._started.result()

    def add_done_callback(self, fn):
        """Calls fn(handle) when the call finishes (on an I/O thread, or now if
        it already has). fn must not block."""
        self._future.add_done_callback(lambda _f: fn(self))

    def __repr__(self):
        state = "done" if self.done() else "pending"
        return f"<aps.Handle {self._what} {state}>"


def _settle(future, fn):
    """Sets future to fn()'s result or exception; returns that result (None on
    an exception)."""
    try:
        result = fn()
    except BaseException as exc:  # delivered to whoever waits on the handle
        future.set_exception(exc)
        return None
    if not isinstance(result, Deferred):
        future.set_result(result)
    return result


class IOThread:
    """A starter thread that runs submitted functions in submission order, and
    a waiter thread that finishes the deferred ones in the same order."""

    def __init__(self, name):
        self._queue = queue.SimpleQueue()
        self._pending = queue.SimpleQueue()
        self._idle = threading.Condition()
        self._in_flight = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._waiter = threading.Thread(target=self._wait_loop, name=name + "-wait",
                                        daemon=True)
        self._waiter.start()
        self._thread.start()

    def submit(self, fn, what, overlap=False):
        """Queues fn() and returns a Handle of its result. With overlap, fn may
        start while earlier deferred calls are still in flight."""
        future = concurrent.futures.Future()
        started = concurrent.futures.Future()
        self._queue.put((future, started, fn, overlap))
        return Handle(future, started, what)

    def drain(self):
        """Blocks until no deferred call is in flight (starter thread only)."""
        with self._idle:
            self._idle.wait_for(lambda: self._in_flight == 0)

    def stop(self):
        """Lets the queued calls finish, then ends both threads (idempotent)."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            if threading.current_thread() not in (self._thread, self._waiter):
                self._thread.join()
                self._waiter.join()

    def _run(self):
        while True:
            item = self._queue.get()
            if item is _STOP:
                self.drain()
                self._pending.put(_STOP)
                return
            future, started, fn, overlap = item
            if not future.set_running_or_notify_cancel():
                started.cancel()
                continue
            if not overlap:
                self.drain()
            result = _settle(future, fn)
            if future.done():
                if future.exception() is not None:
                    started.set_exception(future.exception())
                else:
                    started.set_result(result)
                continue
            started.set_result(result.early)
            with self._idle:
                self._in_flight += 1
            self._pending.put((future, result.finish))

    def _wait_loop(self):
        while True:
            item = self._pending.get()
            if item is _STOP:
                return
            future, finish = item
            _settle(future, finish)
            with self._idle:
                self._in_flight -= 1
                self._idle.notify_all()
