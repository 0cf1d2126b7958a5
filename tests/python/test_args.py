"""Arguments the binding refuses before they reach libaps through ctypes, which
would pass them on silently: integers wrapped into a C type's range, strings
cut at a NUL, memory that must not be written (read-only arrays, tensors
autograd or inference mode guard) written through a pointer, and meta tensors,
which have no memory. And what the Python helpers would take wrongly: DiLoCo's
settings, aps.daemon's endpoints and timeouts, aps.launch's options (exit
status 2) and the device codec's tensors, layouts and stages."""

import re

import numpy as np
import pytest
import torch

import aps
import aps.daemon
import aps.torch
from aps._staging import HostStage

X = np.ones(8, np.float32)


def read_only(dtype, n=8):
    a = np.zeros(n, dtype)
    a.flags.writeable = False
    return a


def test_read_only_outputs_are_refused_unwritten():
    codes = aps.quantize(X, "e4m3")
    cases = [
        lambda: aps.quantize(X, "e4m3", out=read_only(np.uint8)),
        lambda: aps.dequantize(codes, "e4m3", 8, out=read_only(np.float32)),
        lambda: aps.accumulate(codes, "e4m3", read_only(np.float32)),
        lambda: aps.dequantize_blocks(codes, np.zeros(1, np.int8), "e4m3", 8,
                                      out=read_only(np.float32)),
    ]
    for call in cases:
        with pytest.raises(ValueError, match="read-only"):
            call()


@pytest.mark.parametrize("call,match", [
    (lambda: aps.quantize(X, "e4m3", scale_exp=2**32), "scale_exp 4294967296"),
    (lambda: aps.quantize(X, "e4m3", rounding="stochastic", seed=-1), "seed -1"),
    (lambda: aps.quantize(X, "e4m3", rounding="stochastic", stream=2**64), "stream"),
    (lambda: aps.dequantize(aps.quantize(X, "e4m3"), "e4m3", 8, scale_exp=-2**32), "scale_exp"),
    (lambda: aps.accumulate(aps.quantize(X, "e4m3"), "e4m3", X.copy(), scale_exp=2**31),
     "scale_exp"),
    (lambda: aps.aps_exponent(X, "e4m3", nworkers=2**32 + 1), "nworkers 4294967297"),
    (lambda: aps.packed_size("e4m3", 2**64 + 3), "count"),
    (lambda: aps.torch.aps_exponent(torch.ones(4), "e4m3", nworkers=2**31), "nworkers"),
])
def test_integers_out_of_their_c_range_are_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_integer_arguments_must_be_integers():
    with pytest.raises(TypeError, match="scale_exp must be an int"):
        aps.quantize(X, "e4m3", scale_exp=1.7)
    with pytest.raises(TypeError, match="nworkers must be an int"):
        aps.aps_exponent(X, "e4m3", nworkers=2.5)
    assert aps.quantize(X, "e4m3", scale_exp=np.int32(2)).size == 8


@pytest.mark.parametrize("call", [
    lambda: aps.quantize(X, "e4m3\0junk"),
    lambda: aps.format_info("e4m3\0junk"),
    lambda: aps.packed_size("fp16\0", 4),
    lambda: aps.torch.quantize(torch.ones(4), "e4m3\0junk"),
    lambda: aps.Client("tcp://127.0.0.1:1", 0, 1, job="a\0b"),
    lambda: aps.Client("tcp://127.0.0.1:1\0x", 0, 1),
    lambda: aps.Client("tcp://127.0.0.1:1", 0, 1, job_token="abc\0def"),
    lambda: aps.Client("tcp://127.0.0.1:1", 0, 1, rules="*=fp16\0,x=y"),
])
def test_strings_with_a_nul_are_refused(call):
    with pytest.raises(ValueError, match="NUL"):
        call()


@pytest.mark.parametrize("kwargs,match", [
    ({"timeout_ms": 2**32 + 100}, "timeout_ms 4294967396"),
    ({"timeout_ms": 0}, "timeout_ms 0"),
    ({"connect_timeout_ms": 2**31}, "connect_timeout_ms"),
    ({"partition_bytes": 2**64 + 100}, "partition_bytes"),
    ({"world_size": 2**32 + 1}, "not in a world of"),
    ({"world_size": 10**6}, "not in a world of 1000000"),
    ({"policy": "auto", "rules": "fc.*=fp16,,x=fp32"}, "empty rule"),
])
def test_client_options_out_of_range_are_refused_before_connecting(kwargs, match):
    args = {"endpoint": "tcp://127.0.0.1:1", "rank": 0, "world_size": 1,
            "connect_timeout_ms": 100, **kwargs}
    with pytest.raises(ValueError, match=match):
        aps.Client(**args)


def test_meta_tensors_are_refused_with_a_clear_message():
    meta = torch.empty(8, device="meta")
    cases = [
        lambda: aps.torch.quantize(meta, "e4m3"),
        lambda: aps.torch.quantize_blocks(meta, "e4m3"),
        lambda: aps.torch.aps_exponent(meta, "e4m3"),
        lambda: aps.torch.dequantize(torch.empty(8, dtype=torch.uint8, device="meta"),
                                     "e4m3", 8),
        lambda: HostStage().load(meta),
    ]
    for call in cases:
        with pytest.raises(ValueError, match="meta tensor"):
            call()


def test_tensors_that_cannot_be_written_are_refused_as_results(apsd):
    with aps.Client(apsd, 0, 1, format="fp32") as c:
        with pytest.raises(ValueError, match="meta tensor"):
            c.allreduce("t", torch.empty(8, device="meta"))
        with pytest.raises(ValueError, match="requires grad"):
            c.allreduce("t", torch.ones(8, requires_grad=True))
        with torch.inference_mode():
            frozen = torch.ones(8)
        with pytest.raises(ValueError, match="inference tensor"):
            c.allreduce("t", frozen)
        with pytest.raises(ValueError, match="NUL"):
            c.allreduce("t\0u", torch.ones(8))
        with pytest.raises(ValueError, match="timeout_ms"):
            c.allreduce("t", torch.ones(8), timeout_ms=2**31)
        assert torch.equal(c.allreduce("t", torch.ones(8)), torch.ones(8))


def tiny_model():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 2)


@pytest.mark.parametrize("kwargs,error,match", [
    ({"sync_every": 2.5}, TypeError, "sync_every must be an int, not float"),
    ({"sync_every": "4"}, TypeError, "sync_every must be an int, not str"),
    ({"sync_every": 0}, ValueError, "sync_every 0 is out of range"),
    ({"fragments": 1.5}, TypeError, "fragments must be an int"),
    ({"overlap": float("nan")}, TypeError, "overlap must be an int"),
    ({"mix": float("nan")}, ValueError, "mix nan is not a finite number"),
    ({"mix": "0.5"}, TypeError, "mix must be a number, not str"),
    ({"outer_lr": float("nan")}, ValueError, "outer_lr nan is not a finite number"),
    ({"outer_lr": float("inf")}, ValueError, "outer_lr inf"),
    ({"outer_lr": -0.7}, ValueError, "outer_lr -0.7 is out of range"),
    ({"outer_momentum": float("nan")}, ValueError, "outer_momentum nan"),
    ({"outer_momentum": -0.5}, ValueError, "outer_momentum -0.5 is out of range"),
    ({"prefix": "outer\0"}, ValueError, "prefix 'outer\\\\x00' holds a NUL"),
    ({"prefix": None}, TypeError, "prefix must be a str"),
])
def test_diloco_refuses_bad_settings_before_touching_the_client(kwargs, error, match):
    # a client with no attributes: the settings are refused before it is used
    args = {"sync_every": 4, **kwargs}
    with pytest.raises(error, match=match):
        aps.torch.DiLoCo(tiny_model(), None, object(), **args)


def test_diloco_sync_refuses_a_fragment_it_does_not_have(apsd):
    spec = aps.torch.optimizer_spec("sgd", momentum=0.9, nesterov=True)
    model = tiny_model()
    with aps.Client(apsd, 0, 1, format="fp32", optimizer=spec, job="frag") as c:
        diloco = aps.torch.DiLoCo(model, None, c, sync_every=4, fragments=2)
        for fragment, error, match in [(2, ValueError, "fragment 2 is out of range"),
                                       (-1, ValueError, "fragment -1 is out of range"),
                                       (True, TypeError, "fragment must be an int")]:
            with pytest.raises(error, match=match):
                diloco.sync(fragment)
        diloco.sync(1)
        assert diloco.syncs == 1


@pytest.mark.parametrize("kwargs,error,match", [
    ({"endpoint": "127.0.0.1:5555"}, ValueError, "is not tcp://HOST:PORT or ipc://PATH"),
    ({"endpoint": "ipc://"}, ValueError, "is not tcp://HOST:PORT or ipc://PATH"),
    ({"endpoint": "tcp://127.0.0.1"}, ValueError, "has no host:port"),
    ({"endpoint": "tcp://127.0.0.1:70000"}, ValueError, "endpoint 'tcp://127.0.0.1:70000'"),
    ({"endpoint": "tcp://127.0.0.1:0"}, ValueError, "port 0 is not in 1..65535"),
    ({"endpoint": 5555}, TypeError, "endpoint must be a str"),
    ({"log_level": "verbose"}, ValueError, "log_level must be one of"),
    ({"extra_args": "--stats s.json"}, TypeError, "extra_args must be a list"),
])
def test_local_daemon_refuses_what_it_could_not_start_or_probe(kwargs, error, match):
    # before: apsd was started, and left running when is_listening refused the endpoint
    with pytest.raises(error, match=match):
        aps.daemon.LocalDaemon(binary="/bin/true", **kwargs)


def test_a_local_daemon_on_ipv6_serves_and_is_seen_listening():
    # before: free_endpoint("::1") raised (an IPv4 socket), is_listening said
    # False of any IPv6 endpoint, and apsd could not listen on one
    endpoint = aps.daemon.free_endpoint("::1")
    assert endpoint.startswith("tcp://[::1]:"), endpoint
    assert not aps.daemon.is_listening(endpoint)
    with aps.daemon.LocalDaemon(endpoint) as d:
        assert aps.daemon.is_listening(d.endpoint)
        with aps.Client(d.endpoint, 0, 1, format="fp32") as c:
            x = np.array([1.5, -2.0], np.float32)
            c.allreduce("x", x)
            assert x.tolist() == [1.5, -2.0]


@pytest.mark.parametrize("timeout,error,match", [
    (float("nan"), ValueError, "timeout nan is not a finite number"),
    (float("inf"), ValueError, "timeout inf is not a finite number"),
    (-1, ValueError, "timeout -1.0 is out of range"),
    (None, TypeError, "timeout must be a number"),
])
def test_local_daemon_timeouts_are_finite_seconds(timeout, error, match):
    d = aps.daemon.LocalDaemon(binary="/bin/true")
    with pytest.raises(error, match=match):
        d.start(timeout=timeout)
    assert d.proc is None  # refused before anything was started
    with pytest.raises(error, match=match):
        d.stop(timeout=timeout)


@pytest.mark.parametrize("call,error,match", [
    (lambda: aps.daemon.is_listening("tcp://127.0.0.1:1", timeout=0), ValueError,
     "timeout 0 would not wait"),
    (lambda: aps.daemon.is_listening("tcp://127.0.0.1:1", timeout=float("nan")), ValueError,
     "timeout nan"),
    (lambda: aps.daemon.is_listening("tcp://127.0.0.1:1", timeout=1e12), ValueError,
     "timeout 1000000000000.0 is out of range"),
    (lambda: aps.daemon.is_listening(b"tcp://127.0.0.1:1"), TypeError,
     "endpoint must be a str"),
    (lambda: aps.daemon.is_listening("tcp://[::1:5555"), ValueError,
     "endpoint 'tcp://\\[::1:5555'"),
    (lambda: aps.daemon.is_local(None), TypeError, "endpoint must be a str"),
    (lambda: aps.daemon.free_endpoint(""), ValueError, "host is empty"),
    (lambda: aps.daemon.free_endpoint("127.0.0.1\0"), ValueError, "NUL"),
])
def test_daemon_probes_refuse_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


def parse_error(capsys, argv):
    """The exit status and message of a refused aps.launch command line."""
    import aps.launch
    with pytest.raises(SystemExit) as exc:
        aps.launch._parse([*argv, "train.py"])
    return exc.value.code, capsys.readouterr().err


@pytest.mark.parametrize("argv,env,match", [
    (["--nnodes", "0"], {}, "argument --nnodes: 0: at least 1 node"),
    (["--nnodes", "-2", "--node_rank", "-1"], {}, "argument --nnodes: -2: at least 1 node"),
    (["-n", "70000"], {}, "1 x --nproc_per_node 70000 is 70000 ranks: apsd takes at most 65536"),
    (["--nnodes", "300", "-n", "300", "--master_addr", "h", "--job-token", "t"], {},
     "--nnodes 300 x --nproc_per_node 300"),
    (["--shards", "65"], {}, "--shards 65: a client takes at most 64"),
    (["--endpoint", "127.0.0.1:5555"], {}, "--endpoint: endpoint '127.0.0.1:5555' is not tcp"),
    (["--endpoint", "tcp://127.0.0.1:5555,,tcp://127.0.0.1:5556"], {},
     "--endpoint: endpoint '' is not tcp"),
    (["--endpoint", "tcp://127.0.0.1:99999"], {}, "--endpoint: endpoint 'tcp://127.0.0.1:99999'"),
    (["--endpoint", "tcp://127.0.0.1"], {}, "--endpoint: endpoint 'tcp://127.0.0.1' has no"),
    (["--endpoint", ",".join(["ipc:///tmp/a"] * 65)], {}, "--endpoint: 65 endpoints: at most 64"),
    (["--endpoint", "ipc:///" + "a" * 300], {}, "longer than 255 bytes"),
    ([], {"APS_ENDPOINT": "localhost:5555"}, "APS_ENDPOINT: endpoint 'localhost:5555'"),
    (["--job", "my job"], {}, "--job: 'my job': 1 to 64 visible ASCII"),
    (["--job", "j" * 65], {}, "--job: 'jjj.*: 1 to 64 visible"),
    ([], {"APS_JOB": "caf\u00e9"}, "APS_JOB: 'caf\u00e9': 1 to 64 visible"),
    (["--job-token", "s" * 129], {}, "--job-token: 'sss.*1 to 128 visible"),
    ([], {"APS_JOB_TOKEN": "two words"}, "APS_JOB_TOKEN: 'two words'"),
])
def test_launch_refuses_options_every_worker_would_fail_on(capsys, monkeypatch, argv, env,
                                                           match):
    # before: apsd and every worker started, each Client failing (job, token, world size,
    # shards), a traceback (an endpoint is_listening cannot probe) or an unclear message
    for var in ("APS_ENDPOINT", "APS_JOB", "APS_JOB_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    code, err = parse_error(capsys, argv)
    assert code == 2 and re.search(match, err), err


def test_launch_takes_the_largest_valid_options(monkeypatch):
    import aps.launch
    for var in ("APS_ENDPOINT", "APS_JOB", "APS_JOB_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    args = aps.launch._parse(["-n", "65536", "--endpoint", ",".join(["ipc:///tmp/a"] * 64),
                              "--job", "j" * 64, "--job-token", "~" * 128, "train.py"])
    assert args.nproc == 65536 and args.job == "j" * 64
    assert aps.launch._parse(["--shards", "64", "train.py"]).shards == 64


@pytest.mark.parametrize("kwargs,error,match", [
    ({"nproc": 0}, ValueError, "nproc 0 is out of range"),
    ({"nproc": 2.0}, TypeError, "nproc must be an int"),
    ({"nnodes": 2, "node_rank": 2}, ValueError, "node_rank 2 is out of range \\(0 to 1\\)"),
    ({"nnodes": 0, "node_rank": 0}, ValueError, "nnodes 0 is out of range"),
    ({"nnodes": 1000, "nproc": 1000}, ValueError, "apsd takes at most 65536 ranks"),
    ({"master_port": 70000}, ValueError, "master_port 70000 is out of range"),
    ({"master_port": "29500"}, TypeError, "master_port must be an int"),
    ({"master_addr": ""}, ValueError, "master_addr is empty"),
])
def test_launch_layout_refuses_a_place_no_rank_has(kwargs, error, match):
    from aps.launch import Layout
    args = {"nproc": 2, "nnodes": 1, "node_rank": 0, "master_addr": "127.0.0.1",
            "master_port": 29500, **kwargs}
    with pytest.raises(error, match=match):
        Layout(**args)


def test_launch_worker_env_and_workers_refuse_bad_arguments():
    from aps.launch import Layout, Workers, worker_env
    layout = Layout(nproc=2, nnodes=2, node_rank=1, master_addr="h", master_port=29500)
    # before: local rank 2 of 2 on node 1 became RANK 4, in a world of 4
    with pytest.raises(ValueError, match="local_rank 2 is out of range \\(0 to 1\\)"):
        worker_env(layout, 2, "tcp://h:5555", "j", base={})
    with pytest.raises(ValueError, match="local_rank -1 is out of range"):
        worker_env(layout, -1, "tcp://h:5555", "j", base={})
    with pytest.raises(ValueError, match="job 'j\\\\x00k' holds a NUL"):
        worker_env(layout, 0, "tcp://h:5555", "j\0k", base={})
    with pytest.raises(TypeError, match="endpoint must be a str"):
        worker_env(layout, 0, None, "j", base={})
    assert worker_env(layout, 1, "tcp://h:5555", "j", base={})["RANK"] == "3"
    none = Workers.__new__(Workers)  # no worker started: only the arguments are checked
    none.output, none.procs = None, []
    with pytest.raises(ValueError, match="poll_s nan is not a finite number"):
        none.wait(poll_s=float("nan"))
    with pytest.raises(ValueError, match="grace_s -1.0 is out of range"):
        none.stop(grace_s=-1)


def test_device_codes_refuse_mismatched_tensors_layouts_and_stages(apsd):
    import aps._device_codes as dc
    with aps.Client(apsd, 0, 1, format="e4m3", job="device-codes-args") as c:
        [layouts] = c.codes_layouts([("t", 100)])
        send, result = layouts
        stage = dc.DeviceStage()
        # before: zip dropped "u", whose all-reduce silently never happened
        with pytest.raises(ValueError, match="2 tensors, 1 layouts and 1 stages"):
            dc.codes_call(c, [("t", torch.ones(100)), ("u", torch.ones(100))], [layouts],
                          [stage], False)
        # before: the 101st element was silently left out
        with pytest.raises(ValueError, match="tensor 't' has 101 elements, its layouts 100"):
            dc.codes_call(c, [("t", torch.ones(101))], [layouts], [stage], False)
        with pytest.raises(ValueError, match="x has 99 elements, the layout 100"):
            dc.encode(torch.ones(99), send, "local", torch.zeros(send.bytes, dtype=torch.uint8))
        with pytest.raises(ValueError, match="out must be uint8 with room for 100 bytes"):
            dc.encode(torch.ones(100), send, "local", torch.zeros(50, dtype=torch.uint8))
        codes = torch.zeros(result.bytes, dtype=torch.uint8)
        with pytest.raises(ValueError, match="exps has 0 exponents, the layout 1 chunks"):
            dc.decode(codes, [], result, torch.zeros(100))
        with pytest.raises(ValueError, match="out has 101 elements, the layout 100"):
            dc.decode(codes, [0], result, torch.zeros(101))
        t = torch.ones(100)
        assert dc.codes_call(c, [("t", t)], [layouts], [stage], False).wait() == []
        with pytest.raises(ValueError, match="into has 101 elements, the result of 't' 100"):
            stage.store(torch.zeros(101))
        stage.store()
        assert torch.equal(t, torch.ones(100))
        # before: "no" is truthy, and the device codec was used
        with pytest.raises(TypeError, match="device_codec must be None, True or False, not 'no'"):
            dc.use_device_codec("no", c, [])
        assert dc.use_device_codec(False, c, []) is False
