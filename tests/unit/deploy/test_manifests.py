"""The Kubernetes manifests and the image files parse and agree with each other and with the agent.

What a cluster would refuse or silently get wrong is checked here without
one: selectors that select nothing, a Service port that names no container
port, a scrape annotation on another port than the agent serves, a volume
mounted but not declared, an agent flag that does not exist (the args are
checked against `inferprobe agent --help`), an OTLP variable the exporter
does not read.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from inferprobe.cli.main import cli
from inferprobe.collector.attach.cpu_budget import parse_share
from inferprobe.collector.model.segment_ring import parse_span
from inferprobe.exporters.otlp import resolve_settings

ROOT = Path(__file__).resolve().parents[3]
BASE = ROOT / "deploy" / "kubernetes" / "base"
IMAGE = ROOT / "deploy" / "image"


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.fixture(scope="module")
def objects() -> dict[str, dict]:
    """kind -> object, as kustomize renders the base (or the files as they are without kubectl)."""
    if shutil.which("kubectl"):
        rendered = subprocess.run(["kubectl", "kustomize", str(BASE)], capture_output=True, text=True,
                                  timeout=60, check=True).stdout
        docs = [d for d in yaml.safe_load_all(rendered) if d]
    else:
        kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
        docs = [d for name in kustomization["resources"] for d in _docs(BASE / name)]
    by_kind = {d["kind"]: d for d in docs}
    assert len(by_kind) == len(docs), "one object of each kind in the base"
    return by_kind


@pytest.fixture(scope="module")
def agent_flags() -> set[str]:
    result = CliRunner().invoke(cli, ["agent", "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", result.output))


def _container(objects) -> dict:
    (container,) = objects["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    return container


def _flag_values(args: list[str]) -> dict[str, str | None]:
    values: dict[str, str | None] = {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else None
            values[arg] = None if nxt is None or nxt.startswith("--") else nxt
    return values


def test_every_file_parses_and_the_kustomization_lists_each_once():
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    listed = kustomization["resources"]
    assert len(listed) == len(set(listed))
    on_disk = {p.name for p in BASE.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(listed) == on_disk
    for name in on_disk:
        assert _docs(BASE / name), name
    _docs(ROOT / "deploy" / "prometheus" / "scrape-inferprobe.yml")


def test_selectors_select_the_agent_pods(objects):
    ds = objects["DaemonSet"]
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert objects["Service"]["spec"]["selector"].items() <= pod_labels.items()
    scrape = _docs(ROOT / "deploy" / "prometheus" / "scrape-inferprobe.yml")[0]["scrape_configs"][0]
    keep_app = next(r for r in scrape["relabel_configs"]
                    if r["source_labels"] == ["__meta_kubernetes_pod_label_app_kubernetes_io_name"])
    assert keep_app["regex"] == pod_labels["app.kubernetes.io/name"]
    namespace = objects["Namespace"]["metadata"]["name"]
    assert scrape["kubernetes_sd_configs"][0]["namespaces"]["names"] == [namespace]
    assert all(o["metadata"].get("namespace", namespace) == namespace
               for o in objects.values() if o["kind"] != "Namespace")


def test_the_metrics_port_is_the_one_the_agent_serves(objects):
    ds, container = objects["DaemonSet"], _container(objects)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    served = _flag_values(container["args"])["--prometheus"]
    assert served is not None and int(served.rsplit(":", 1)[1]) == ports["metrics"]
    assert not served.startswith("127."), "a pod's metrics must be reachable from Prometheus"
    annotations = ds["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == ports["metrics"]
    assert container["readinessProbe"]["httpGet"]["port"] in ports
    for port in objects["Service"]["spec"]["ports"]:
        assert port["targetPort"] in ports and port["port"] == ports[port["targetPort"]]


def test_args_are_real_agent_flags_with_valid_values(objects, agent_flags):
    container = _container(objects)
    assert container["args"][0] == "agent"
    values = _flag_values(container["args"][1:])
    assert set(values) <= agent_flags, set(values) - agent_flags
    parse_span(values["--keep"])
    parse_share(values["--max-cpu"])
    # The image's default command is an agent command line too.
    cmd = re.search(r'^CMD \[(.*)\]$', (IMAGE / "Dockerfile").read_text(), re.M)
    assert cmd is not None
    cmd_args = [a.strip().strip('"') for a in cmd.group(1).split(",")]
    assert cmd_args[0] == "agent" and set(_flag_values(cmd_args[1:])) <= agent_flags


def test_the_otlp_settings_come_from_the_configmap(objects):
    container = _container(objects)
    config_maps = [e["configMapRef"]["name"] for e in container["envFrom"]]
    assert config_maps == [objects["ConfigMap"]["metadata"]["name"]]
    assert "--otlp" in container["args"]
    data = objects["ConfigMap"]["data"]
    settings = resolve_settings(env=data)
    assert settings.endpoint == data["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    assert settings.protocol == data["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"]


def test_host_access_is_the_documented_least_set(objects):
    spec = objects["DaemonSet"]["spec"]["template"]["spec"]
    container = _container(objects)
    assert spec["hostPID"] is True
    security = container["securityContext"]
    assert security["privileged"] is False and security["capabilities"]["drop"] == ["ALL"]
    added = set(security["capabilities"]["add"])
    documented = re.search(r"capabilities: `(.*?)`", (ROOT / "docs" / "deploy.md").read_text())
    assert documented is not None
    assert added == {c.strip().removeprefix("CAP_") for c in documented.group(1).split(",")}
    assert "SYS_ADMIN" not in added
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert volumes.keys() == mounts.keys()
    host_paths = {volumes[n]["hostPath"]["path"]: m["mountPath"]
                  for n, m in mounts.items() if "hostPath" in volumes[n]}
    for needed in ("/sys/kernel/tracing", "/sys/kernel/debug"):
        assert host_paths.get(needed) == needed, needed   # same path inside: libbpf looks there
    # No kernel headers: the programs are built into the image (CO-RE).
    assert not {"/lib/modules", "/usr/src"} & set(host_paths)
    # Without CAP_SYS_ADMIN, uprobes are made through uprobe_events in the first of these mounted.
    writable = {m["mountPath"] for m in mounts.values() if not m.get("readOnly")}
    assert {"/sys/kernel/tracing", "/sys/kernel/debug"} <= writable
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert host_paths["/sys/fs/cgroup"] == env["INFERPROBE_CGROUP_ROOT"]
    ring = _flag_values(container["args"])["--ring"]
    assert any(ring.startswith(m["mountPath"]) for m in mounts.values() if not m.get("readOnly"))


def test_the_image_files_exist_and_the_entrypoint_is_valid_shell():
    dockerfile = (IMAGE / "Dockerfile").read_text()
    for src in re.findall(r"^COPY (?!--from=)(\S+) ", dockerfile, re.M):
        assert (ROOT / src).exists(), src
    assert re.search(r"^FROM debian:", dockerfile, re.M)
    # The runtime stage (the last FROM) has libbpf and no compiler, headers or bcc.
    runtime = dockerfile.rsplit("\nFROM ", 1)[1]
    assert "libbpf1" in runtime
    assert not re.search(r"clang|llvm|linux-headers|bpfcc", runtime), runtime
    subprocess.run(["sh", "-n", str(IMAGE / "entrypoint.sh")], check=True)
