"""deploy/k8s: the manifests parsed and cross-checked, without a cluster.

The wiring a typo breaks silently: the headless Service selects the
StatefulSet's pods, the ports agree (apsd's listen, the container, the
Service, the NetworkPolicy), the Job's APS_ENDPOINT names every shard, its
world size matches its completions, the rank comes from the completion index,
the token from the Secret; apsd accepts every key and flag, listens beyond
loopback only with insecure or CURVE, and starts with the ConfigMap's
configuration. Then the manifests are replayed on loopback: replicas real
apsd with that configuration, completions real workers with the Job's
environment and command. Nothing here builds the image or talks to Kubernetes.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from conftest import APSD, ROOT, collect, free_port

yaml = pytest.importorskip("yaml", reason="python3-yaml is not installed "
                           "(deploy/install-deps.sh installs it)")

K8S = ROOT / "deploy" / "k8s"
NAMESPACE = "aps"
INDEX_ANNOTATION = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


class Manifests:
    """Every object of deploy/k8s/*.yaml, by kind (one of each)."""

    def __init__(self):
        self.objects = [doc for path in sorted(K8S.glob("*.yaml"))
                        for doc in yaml.safe_load_all(path.read_text()) if doc]
        by_kind = {}
        for obj in self.objects:
            assert obj["kind"] not in by_kind, f"two objects of kind {obj['kind']}"
            by_kind[obj["kind"]] = obj
        self.namespace = by_kind["Namespace"]
        self.config = by_kind["ConfigMap"]
        self.service = by_kind["Service"]
        self.sts = by_kind["StatefulSet"]
        self.policy = by_kind["NetworkPolicy"]
        self.secret = by_kind["Secret"]
        self.job = by_kind["Job"]
        self.apsd = one(self.sts["spec"]["template"]["spec"]["containers"])
        self.worker = one(self.job["spec"]["template"]["spec"]["containers"])
        self.env = {e["name"]: e for e in self.worker["env"]}

    def conf_path(self):
        """The --config path of the apsd container."""
        cmd = self.apsd["command"] + self.apsd.get("args", [])
        return cmd[cmd.index("--config") + 1]

    def conf(self):
        """The ConfigMap's apsd.conf as apsd reads it: key -> value."""
        return conf_pairs(self.config["data"][pathlib.PurePath(self.conf_path()).name])

    def listen(self):
        return self.conf()["listen"]

    def port(self, name):
        return one(p["containerPort"] for p in self.apsd["ports"] if p["name"] == name)


def one(items):
    items = list(items)
    assert len(items) == 1, items
    return items[0]


def conf_pairs(text):
    """key -> value of an apsd.conf (deploy/apsd.conf's syntax)."""
    pairs = {}
    for line in text.splitlines():
        line = re.split(r"(?:^|\s)[#;]", line)[0].strip()
        if not line or line == "[apsd]":
            continue
        key, _, value = line.partition("=")
        key, value = key.strip(), value.strip().strip('"')
        assert key not in pairs, f"{key} twice"
        pairs[key] = value
    return pairs


def labels_match(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def apsd_keys():
    """Every --key that apsd --help lists."""
    out = subprocess.run([str(APSD), "--help"], capture_output=True, text=True,
                         timeout=10).stdout
    return set(re.findall(r"^  --([a-z_]+)", out, re.M))


@pytest.fixture(scope="module")
def m():
    return Manifests()


def test_every_object_lives_in_the_namespace(m):
    assert m.namespace["metadata"]["name"] == NAMESPACE
    for obj in m.objects:
        if obj is not m.namespace:
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["metadata"]


def test_headless_service_selects_the_shards(m):
    pod_labels = m.sts["spec"]["template"]["metadata"]["labels"]
    assert m.service["spec"]["clusterIP"] == "None"
    assert labels_match(m.service["spec"]["selector"], pod_labels)
    assert labels_match(m.sts["spec"]["selector"]["matchLabels"], pod_labels)
    assert m.sts["spec"]["serviceName"] == m.service["metadata"]["name"]
    assert labels_match(m.policy["spec"]["podSelector"]["matchLabels"], pod_labels)


def test_ports_agree(m):
    listen_port = int(m.listen().rsplit(":", 1)[1])
    metrics_port = int(m.conf()["metrics_listen"].rsplit(":", 1)[1])
    assert m.port("aps") == listen_port
    assert m.port("metrics") == metrics_port
    service_ports = {p["name"]: p for p in m.service["spec"]["ports"]}
    for name, port in (("aps", listen_port), ("metrics", metrics_port)):
        assert service_ports[name]["port"] == port
        assert service_ports[name]["targetPort"] in (name, port)
    policy_ports = [p["port"] for rule in m.policy["spec"]["ingress"] for p in rule["ports"]]
    assert sorted(policy_ports) == ["aps", "metrics"]


def test_only_the_workers_reach_the_shards(m):
    worker_labels = m.job["spec"]["template"]["metadata"]["labels"]
    rule = one(r for r in m.policy["spec"]["ingress"] if r["ports"] == [{"port": "aps"}])
    peer = one(rule["from"])
    assert labels_match(peer["podSelector"]["matchLabels"], worker_labels)


def test_listening_beyond_loopback_is_allowed(m):
    conf = m.conf()
    host = m.listen().split("://", 1)[1].rsplit(":", 1)[0]
    loopback = host.startswith("127.") or host in ("localhost", "[::1]")
    curve = conf.get("curve_secret_key_file") and conf.get("curve_allow_file")
    assert loopback or curve or conf.get("insecure") == "yes", conf


def test_apsd_knows_every_key_and_flag(m):
    keys = apsd_keys()
    assert {"listen", "insecure", "config"} <= keys  # the help still lists keys
    assert set(m.conf()) <= keys
    cmd = m.apsd["command"] + m.apsd.get("args", [])
    assert pathlib.PurePath(cmd[0]).name == "apsd"
    flags = {a[2:].split("=")[0].replace("-", "_") for a in cmd if a.startswith("--")}
    assert flags <= keys, flags - keys


def test_config_map_is_mounted_where_apsd_reads_it(m):
    conf_path = pathlib.PurePath(m.conf_path())
    pod = m.sts["spec"]["template"]["spec"]
    volume = one(v for v in pod["volumes"] if "configMap" in v)
    assert volume["configMap"]["name"] == m.config["metadata"]["name"]
    mount = one(v for v in m.apsd["volumeMounts"] if v["name"] == volume["name"])
    assert pathlib.PurePath(mount["mountPath"]) == conf_path.parent
    assert conf_path.name in m.config["data"]
    # the stats socket, probed by apsctl, is on a writable volume
    stats = pathlib.PurePath(m.conf()["stats"])
    assert any(pathlib.PurePath(v["mountPath"]) == stats.parent for v in m.apsd["volumeMounts"])
    assert str(stats) in m.apsd["readinessProbe"]["exec"]["command"]


def test_job_is_one_world_of_indexed_ranks(m):
    spec = m.job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert int(m.env["WORLD_SIZE"]["value"]) == spec["completions"] == spec["parallelism"]
    assert m.env["RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == INDEX_ANNOTATION
    assert spec["template"]["spec"]["restartPolicy"] == "Never"


def test_job_names_every_shard(m):
    port = m.port("aps")
    svc, sts = m.service["metadata"]["name"], m.sts["metadata"]["name"]
    want = [f"tcp://{sts}-{i}.{svc}.{NAMESPACE}.svc:{port}"
            for i in range(m.sts["spec"]["replicas"])]
    got = m.env["APS_ENDPOINT"]["value"].split(",")
    assert [e.replace(".svc.cluster.local:", ".svc:") for e in got] == want


def test_token_comes_from_the_secret(m):
    ref = m.env["APS_JOB_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == m.secret["metadata"]["name"]
    token = m.secret["stringData"][ref["key"]]
    assert 1 <= len(token) <= 128 and token.isascii() and token.isprintable()
    assert " " not in token


def test_image_holds_what_the_pods_run(m):
    dockerfile = (K8S / "Dockerfile").read_text()
    assert m.apsd["image"] == m.worker["image"]
    assert "--prefix=/usr" in dockerfile  # /usr/sbin/apsd, /usr/bin/apsctl
    assert m.apsd["command"][0] == "/usr/sbin/apsd"
    assert m.apsd["readinessProbe"]["exec"]["command"][0] == "/usr/bin/apsctl"
    script = m.worker["command"][-1]
    assert script in dockerfile
    assert (ROOT / "worker" / "examples" / pathlib.PurePath(script).name).exists()


def test_manifests_replayed_on_loopback(m, daemon_factory, tmp_path):
    """replicas apsd with the ConfigMap's file (the listen address, stats, metrics
    and checkpoint paths moved to loopback and tmp_path), and completions workers
    with the Job's environment, each rank its index."""
    conf = tmp_path / "apsd.conf"
    conf.write_text(m.config["data"]["apsd.conf"])
    shards = [daemon_factory(extra=["--config", str(conf), "--stats", str(tmp_path / f"s{i}"),
                                    "--metrics_listen", f"127.0.0.1:{free_port()}",
                                    "--checkpoint_dir", str(tmp_path)])
              for i in range(m.sts["spec"]["replicas"])]
    env = {k: v for k, v in os.environ.items() if k not in ("APS_RANK", "APS_WORLD_SIZE")}
    env |= {"APS_ENDPOINT": ",".join(d.endpoint for d in shards),
            "APS_JOB_TOKEN": m.secret["stringData"]["token"]}
    env.update((k, e["value"]) for k, e in m.env.items()
               if "value" in e and k not in ("APS_ENDPOINT", "APS_CONNECT_TIMEOUT_MS"))
    script = ROOT / "worker" / "examples" / pathlib.PurePath(m.worker["command"][-1]).name
    world = m.job["spec"]["completions"]
    procs = [subprocess.Popen([sys.executable, str(script)], env={**env, "RANK": str(k)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for k in range(world)]
    results = collect(procs, timeout=60)
    for k, (code, out) in enumerate(results):
        assert code == 0, out
        assert f"rank {k}/{world}: allreduce ok" in out, out
    assert f"allreduce check passed: {world} ranks, {len(shards)} shards" in results[0][1]
    for d in shards:
        assert f"job started job={m.env['APS_JOB']['value']} world_size={world}" \
            in d.log_path.read_text()
