"""A local apsd for launchers, demos and tests: find the binary, tell whether
something listens at an endpoint, start one and stop it.

    with aps.daemon.LocalDaemon("tcp://127.0.0.1:5555") as d:
        ...                     # d.endpoint serves workers until the block ends
"""

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse

from aps._args import SECONDS, check_float, check_str

_REPO = pathlib.Path(__file__).resolve().parents[3]
_PR_SET_PDEATHSIG = 1
LOG_LEVELS = ("error", "warn", "info", "debug")  # apsd's --log_level


def find_apsd():
    """Path of the apsd binary: $APSD, else the build tree's build/server/apsd,
    else `apsd` on PATH. Raises FileNotFoundError naming what was tried."""
    env = os.environ.get("APSD")
    if env:
        if not os.access(env, os.X_OK):
            raise FileNotFoundError(f"APSD={env} is not an executable")
        return env
    built = _REPO / "build" / "server" / "apsd"
    if os.access(built, os.X_OK):
        return str(built)
    found = shutil.which("apsd")
    if found:
        return found
    raise FileNotFoundError(f"no apsd: set APSD, run 'make build' (for {built}) or install "
                            "apsd on PATH")


def free_endpoint(host="127.0.0.1"):
    """A tcp:// endpoint on a port that was free a moment ago (host: an IPv4 or
    IPv6 address; an IPv6 one comes in brackets, tcp://[::1]:PORT)."""
    check_str(host, "host")
    if not host:
        raise ValueError("host is empty: give an address, e.g. 127.0.0.1 or ::1")
    ipv6 = ":" in host
    with socket.socket(socket.AF_INET6 if ipv6 else socket.AF_INET) as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    return f"tcp://[{host}]:{port}" if ipv6 else f"tcp://{host}:{port}"


def _tcp_address(endpoint):
    try:
        url = urllib.parse.urlsplit(endpoint)
        port = url.port
    except ValueError as exc:  # a port beyond 65535, an unclosed [IPv6 address
        raise ValueError(f"endpoint {endpoint!r}: {exc}") from None
    if url.hostname is None or port is None:
        raise ValueError(f"endpoint {endpoint!r} has no host:port")
    if port == 0:
        raise ValueError(f"endpoint {endpoint!r}: port 0 is not in 1..65535")
    return url.hostname, port


def _check_endpoint(endpoint):
    """endpoint, if it is tcp://HOST:PORT or ipc://PATH (what is_listening probes)."""
    check_str(endpoint, "endpoint")
    if endpoint.startswith("tcp://"):
        _tcp_address(endpoint)
    elif not endpoint.startswith("ipc://") or endpoint == "ipc://":
        raise ValueError(f"endpoint {endpoint!r} is not tcp://HOST:PORT or ipc://PATH")
    return endpoint


def is_local(endpoint):
    """True if a daemon for endpoint would run on this machine (ipc://, or tcp://
    on a loopback address or localhost)."""
    check_str(endpoint, "endpoint")
    if endpoint.startswith("ipc://"):
        return True
    if not endpoint.startswith("tcp://"):
        return False
    host, _ = _tcp_address(endpoint)
    return host in ("localhost", "127.0.0.1", "::1", "*", "0.0.0.0", "::")


def is_listening(endpoint, timeout=0.5):
    """True if something accepts connections at a tcp:// or ipc:// endpoint
    within timeout seconds (> 0: 0 would not wait for the connection)."""
    if check_float(timeout, "timeout", SECONDS) == 0:
        raise ValueError("timeout 0 would not wait for the connection: give seconds > 0")
    check_str(endpoint, "endpoint")
    if endpoint.startswith("ipc://"):
        family, address = socket.AF_UNIX, endpoint[len("ipc://"):]
    elif endpoint.startswith("tcp://"):
        host, port = _tcp_address(endpoint)
        host = {"*": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        address = (host, port)
    else:
        raise ValueError(f"cannot probe endpoint {endpoint!r}: tcp:// or ipc:// only")
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect(address)
        except OSError:
            return False
    return True


def _die_with_parent():
    """In the child before exec: get SIGTERM when the parent dies (Linux)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


class LocalDaemon:
    """An apsd child process serving endpoint (default: a free tcp port).

    Its output goes to stderr (a file object may be given instead). start()
    returns once the endpoint accepts connections; stop() sends SIGTERM and
    returns the exit status. The daemon also gets SIGTERM if this process dies.
    """

    def __init__(self, endpoint=None, binary=None, log_level="warn", output=None,
                 extra_args=()):
        self.endpoint = _check_endpoint(endpoint) if endpoint else free_endpoint()
        if log_level not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {LOG_LEVELS}, not {log_level!r}")
        if isinstance(extra_args, (str, bytes)):
            raise TypeError(f"extra_args must be a list of arguments, not a string "
                            f"({extra_args!r} would pass each character)")
        self.args = [binary or find_apsd(), "--listen", self.endpoint,
                     "--log_level", log_level, *extra_args]
        self.output = output
        self.proc = None

    def start(self, timeout=10):
        check_float(timeout, "timeout", SECONDS)
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=self.output,
                                     stderr=self.output, start_new_session=True,
                                     preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout
        while not is_listening(self.endpoint):
            if self.proc.poll() is not None:
                raise RuntimeError(f"apsd exited with status {self.proc.returncode} before "
                                   f"listening at {self.endpoint}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"apsd did not listen at {self.endpoint} within {timeout} s")
            time.sleep(0.02)
        return self

    def stop(self, timeout=10):
        """SIGTERM, then SIGKILL after timeout seconds; returns the exit status."""
        check_float(timeout, "timeout", SECONDS)
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
