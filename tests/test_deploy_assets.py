"""The deployment assets agree with the code and with each other.

There is no Docker engine or cluster here, so the Dockerfile, docker-compose.yml and
deploy/ (Kubernetes manifests, Prometheus scrape configs and alerts, Grafana
provisioning and dashboard) are checked statically: every port, path, selector,
secret key, mount and datasource uid that one file names is looked up where it is
defined. Every PromQL expression is parsed, and its metric and label names are
checked against the /metrics of a live gateway that has relayed some traffic.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import httpx2
import promql_parser
import pytest
import yaml
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.chaos import ChaosUpstream, expected_answer
from gateway.config.load import default_config, load_config
from gateway.config.schema import GatewayConfig
from gateway.metrics import Metrics
from gateway.otel_env import tracing_enabled
from gateway.serve import SHUTDOWN_MARGIN
from tests.servers import free_port, gateway_config, running_gateway, wait_for

ROOT = Path(__file__).parent.parent
K8S = ROOT / "deploy" / "kubernetes"
PROMETHEUS = ROOT / "deploy" / "prometheus"
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "resumable-gateway.json"

SCRAPE_JOB = "resumable-gateway"  # the job name the alerts select, in every scrape config
GATEWAY = "resumable-gateway"  # the name of the gateway's Deployment, Service, PDB, HPA...


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def app_routes() -> set[str]:
    return {getattr(route, "path", "") for route in create_app(default_config({})).routes}


def is_subset(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


# ---------------------------------------------------------------------------------------
# Dockerfile and docker-compose.yml
# ---------------------------------------------------------------------------------------


def compose() -> dict[str, Any]:
    data = load_yaml(ROOT / "docker-compose.yml")
    assert isinstance(data, dict)
    return data


def service(name: str) -> dict[str, Any]:
    found: dict[str, Any] = compose()["services"][name]
    return found


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """A compose value as docker compose resolves it in ``env``: ${VAR}, ${VAR:-default}."""

    def resolve(match: re.Match[str]) -> str:
        return env.get(match[1]) or match[2] or ""

    return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}", resolve, value)


@dataclass(frozen=True)
class Published:
    address: str  # the host interface
    host_port: int
    container_port: int


def published(name: str, env: Mapping[str, str] | None = None) -> list[Published]:
    """A service's port mappings ("ADDRESS:HOST:CONTAINER"), resolved in ``env``."""
    found = []
    for mapping in service(name).get("ports", []):
        parts = interpolate(str(mapping), env or {}).split(":")
        assert len(parts) == 3, f"{name} publishes {mapping} without naming an address"
        address, host_port, container_port = parts
        found.append(Published(address, int(host_port), int(container_port)))
    return found


def published_port(name: str) -> int:
    """The container side of a service's one port mapping."""
    (mapping,) = published(name)
    return mapping.container_port


def mounts(name: str) -> dict[PurePosixPath, Path]:
    """A service's bind mounts from the repository: container path -> host path."""
    found = {}
    for volume in service(name).get("volumes", []):
        source, target, *_ = str(volume).split(":")
        if source.startswith("./"):
            found[PurePosixPath(target)] = ROOT / source
    return found


def host_path(name: str, container_path: str) -> Path:
    """Where a path inside a compose service's container comes from in the repository."""
    path = PurePosixPath(container_path)
    for target, source in mounts(name).items():
        if path == target or target in path.parents:
            return source.joinpath(*path.relative_to(target).parts)
    raise AssertionError(f"compose service {name} mounts nothing at {container_path}")


def test_compose_services_and_their_profiles() -> None:
    services = compose()["services"]
    assert set(services) == {"gateway", "redis", "chaos", "prometheus", "grafana", "jaeger"}
    assert published_port("gateway") == 8080
    assert services["chaos"]["profiles"] == ["demo"]
    assert services["prometheus"]["profiles"] == ["observability"]
    assert services["grafana"]["profiles"] == ["observability"]
    assert services["jaeger"]["profiles"] == ["observability"]
    assert "profiles" not in services["gateway"]
    assert "profiles" not in services["redis"]


def test_compose_environment_is_what_the_embedded_defaults_read() -> None:
    env = compose()["services"]["gateway"]["environment"]
    assert isinstance(env, dict)
    resolved = {k: interpolate(str(v), {}) for k, v in env.items()}
    config = default_config(resolved)
    assert config.upstreams[0].base_url == resolved["GATEWAY_UPSTREAM_BASE_URL"]
    assert config.state.redis_url is not None
    assert config.state.redis_url.get_secret_value() == "redis://redis:6379/0"
    # Traces are off unless OTEL_EXPORTER_OTLP_ENDPOINT is given (to Jaeger's OTLP/HTTP).
    assert not tracing_enabled(config.tracing, resolved)
    told = {
        k: interpolate(str(v), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4318"})
        for k, v in env.items()
    }
    assert tracing_enabled(config.tracing, told)
    assert (
        "OTEL_EXPORTER_OTLP_ENDPOINT=http://jaeger:4318 docker compose --profile "
        "observability up" in (ROOT / "docker-compose.yml").read_text(encoding="utf-8")
    )


def test_dockerfile_runs_non_root_on_the_compose_port_with_a_healthcheck() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^USER (?!root)\w+", dockerfile, re.M)
    assert "EXPOSE 8080" in dockerfile
    assert '"--port", "8080"' in dockerfile
    assert "/healthz" in dockerfile.split("HEALTHCHECK", 1)[1]
    app = create_app(default_config({}))
    assert "/healthz" in {getattr(route, "path", None) for route in app.routes}


def test_compose_publishes_on_loopback_unless_told_otherwise() -> None:
    publishing = {name for name in compose()["services"] if service(name).get("ports")}
    assert publishing == {"gateway", "prometheus", "grafana", "jaeger"}
    for name in publishing:
        for mapping in published(name):
            assert mapping.address == "127.0.0.1", name
            assert mapping.host_port == mapping.container_port, name
        opened = published(name, {"PUBLISH_ADDRESS": "0.0.0.0"})
        assert {mapping.address for mapping in opened} == {"0.0.0.0"}, name


def chaos_port() -> int:
    command = [str(arg) for arg in service("chaos")["command"]]
    return int(command[command.index("--port") + 1])


def test_compose_chaos_publishes_nothing_and_the_gateway_reaches_it_inside() -> None:
    assert "ports" not in service("chaos")
    assert f"GATEWAY_UPSTREAM_BASE_URL=http://chaos:{chaos_port()}/v1" in (
        ROOT / "docker-compose.yml"
    ).read_text(encoding="utf-8")


def dockerfile_healthcheck() -> list[str]:
    """The exec form of the image's HEALTHCHECK CMD."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text(encoding="utf-8"))
    (line,) = [line for line in text.splitlines() if line.startswith("HEALTHCHECK ")]
    argv = json.loads(line.split(" CMD ", 1)[1])
    assert isinstance(argv, list)
    return [str(arg) for arg in argv]


def probe(argv: Sequence[str], port: int, actual_port: int) -> int:
    """Run a container health check here, its loopback ``port`` moved to ``actual_port``."""
    assert argv[0] == "python"  # in the image; curl is not
    moved = [arg.replace(f"127.0.0.1:{port}/", f"127.0.0.1:{actual_port}/") for arg in argv]
    assert moved != list(argv), f"the check does not probe 127.0.0.1:{port}: {argv}"
    result = subprocess.run([sys.executable, *moved[1:]], capture_output=True, timeout=20)
    return result.returncode


def test_compose_chaos_has_a_healthcheck_on_its_own_port(chaos: ChaosUpstream) -> None:
    """Without one, chaos inherits the image's check of :8080 and is never healthy."""
    check = service("chaos")["healthcheck"]
    assert check["test"][0] == "CMD"
    argv = [str(arg) for arg in check["test"][1:]]
    assert argv != dockerfile_healthcheck()
    live = urlsplit(chaos.base_url).port
    assert live is not None
    assert probe(argv, chaos_port(), live) == 0
    assert probe(argv, chaos_port(), free_port()) != 0


def test_dockerfile_healthcheck_passes_on_a_live_gateway(chaos: ChaosUpstream) -> None:
    with running_gateway(gateway_config(chaos.base_url)) as gateway:
        live = urlsplit(gateway.url).port
        assert live is not None
        assert probe(dockerfile_healthcheck(), 8080, live) == 0
    assert probe(dockerfile_healthcheck(), 8080, free_port()) != 0


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile's stages, each a list of (INSTRUCTION, arguments), without comments."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text(encoding="utf-8"))
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        instruction, _, arguments = line.strip().partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        stages[-1].append((instruction.upper(), arguments))
    return stages


def test_dockerfile_pulls_no_frontend_image() -> None:
    # A "# syntax=" parser directive makes BuildKit pull docker/dockerfile from a registry.
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert not re.search(r"^#\s*syntax\s*=", text, re.M | re.I)


def test_dockerfile_final_image_holds_no_wheels() -> None:
    """The wheels are bind-mounted into the install step, never copied into a layer."""
    build, final = dockerfile_stages()
    stage = build[0][1].split()[-1]  # FROM image AS <stage>
    (wheel,) = [args for instruction, args in build if "pip wheel" in args]
    wheels = re.search(r"--wheel-dir[ =](\S+)", wheel)
    assert wheels is not None
    for instruction, args in final:
        assert instruction not in {"COPY", "ADD"} or "--from" not in args, args
    (install,) = [args for instruction, args in final if "pip install" in args]
    mounts = [
        dict(option.split("=", 1) for option in m.split(","))
        for m in re.findall(r"--mount=(\S+)", install)
    ]
    assert mounts == [{"type": "bind", "from": stage, "source": wheels[1], "target": wheels[1]}]
    assert "--no-index" in install  # everything from the build stage, nothing downloaded


def test_compose_gives_the_gateway_time_to_drain_before_sigkill() -> None:
    """``docker compose stop`` waits stop_grace_period (Docker's default: 10 s)."""
    grace = compose()["services"]["gateway"]["stop_grace_period"]
    match = re.fullmatch(r"(\d+)s", grace)
    assert match is not None, grace
    drain = default_config({}).listen.drain_timeout
    assert int(match[1]) > math.ceil(drain + SHUTDOWN_MARGIN)


def test_every_path_compose_mounts_from_the_repository_exists() -> None:
    for name in compose()["services"]:
        for source in mounts(name).values():
            assert source.exists(), f"compose service {name} mounts missing {source}"


# ---------------------------------------------------------------------------------------
# Prometheus and Grafana in the compose `observability` profile
# ---------------------------------------------------------------------------------------


def grafana_datasource() -> dict[str, Any]:
    (datasource,) = load_yaml(GRAFANA / "provisioning" / "datasources" / "prometheus.yml")[
        "datasources"
    ]
    assert isinstance(datasource, dict)
    return datasource


def test_compose_prometheus_loads_its_config_and_the_alerts() -> None:
    flags = dict(str(arg).split("=", 1) for arg in service("prometheus")["command"])
    assert host_path("prometheus", flags["--config.file"]) == PROMETHEUS / "prometheus.yml"
    rule_files = load_yaml(PROMETHEUS / "prometheus.yml")["rule_files"]
    assert [host_path("prometheus", path) for path in rule_files] == [PROMETHEUS / "alerts.yml"]


def test_compose_prometheus_scrapes_the_compose_gateway() -> None:
    (job,) = load_yaml(PROMETHEUS / "prometheus.yml")["scrape_configs"]
    assert job["job_name"] == SCRAPE_JOB
    assert job.get("metrics_path", "/metrics") in app_routes()
    (static,) = job["static_configs"]
    (target,) = static["targets"]
    host, port = target.rsplit(":", 1)
    assert host == "gateway"
    assert int(port) == published_port("gateway")


def test_grafana_datasource_is_the_compose_prometheus() -> None:
    datasource = grafana_datasource()
    assert datasource["type"] == "prometheus"
    url = urlsplit(datasource["url"])
    assert url.hostname == "prometheus"
    assert url.port == published_port("prometheus")
    # $__rate_interval is only right when Grafana knows the scrape interval.
    scrape_interval = load_yaml(PROMETHEUS / "prometheus.yml")["global"]["scrape_interval"]
    assert datasource["jsonData"]["timeInterval"] == scrape_interval


def test_grafana_provisioning_is_mounted_where_grafana_reads_it() -> None:
    provisioning = "/etc/grafana/provisioning"
    for provisioned in ("datasources/prometheus.yml", "dashboards/dashboards.yml"):
        mounted = host_path("grafana", f"{provisioning}/{provisioned}")
        assert mounted == GRAFANA / "provisioning" / provisioned


def test_grafana_loads_the_dashboard_from_where_compose_mounts_it() -> None:
    (provider,) = load_yaml(GRAFANA / "provisioning" / "dashboards" / "dashboards.yml")["providers"]
    assert provider["type"] == "file"
    assert host_path("grafana", provider["options"]["path"]) == DASHBOARD.parent
    home = service("grafana")["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert host_path("grafana", home) == DASHBOARD


# ---------------------------------------------------------------------------------------
# The Grafana dashboard
# ---------------------------------------------------------------------------------------


def dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def nodes(tree: Any) -> Iterator[Any]:
    """Every value in a JSON or YAML tree, depth first."""
    yield tree
    children = tree.values() if isinstance(tree, dict) else tree if isinstance(tree, list) else []
    for child in children:
        yield from nodes(child)


def panels(container: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including those inside (collapsed) rows."""
    for panel in container.get("panels", []):
        yield panel
        yield from panels(panel)


def test_dashboard_uses_the_provisioned_datasource_everywhere() -> None:
    uid = grafana_datasource()["uid"]
    refs = [
        node["datasource"]
        for node in nodes(dashboard())
        if isinstance(node, dict) and isinstance(node.get("datasource"), dict)
    ]
    assert refs
    for ref in refs:
        if ref.get("type") != "grafana":  # the built-in annotations
            assert ref == {"type": "prometheus", "uid": uid}
    for panel in panels(dashboard()):
        if panel["type"] != "row":
            assert panel.get("datasource") and panel["targets"], panel["title"]


def test_dashboard_is_well_formed() -> None:
    board = dashboard()
    assert board["uid"] and board["title"]
    assert board["schemaVersion"] >= 36
    ids = [panel["id"] for panel in panels(board)]
    assert len(ids) == len(set(ids))
    for panel in panels(board):
        refs = [target["refId"] for target in panel.get("targets", [])]
        assert len(refs) == len(set(refs)), panel["title"]


# ---------------------------------------------------------------------------------------
# Kubernetes manifests
# ---------------------------------------------------------------------------------------


def kustomization() -> dict[str, Any]:
    data = load_yaml(K8S / "kustomization.yaml")
    assert isinstance(data, dict)
    return data


def manifest_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def applied() -> list[dict[str, Any]]:
    """The objects `kubectl apply -k deploy/kubernetes` creates."""
    return [doc for name in kustomization()["resources"] for doc in documents(K8S / name)]


def k8s_object(kind: str, name: str = GATEWAY) -> Any:
    found = [o for o in applied() if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}"
    return found[0]


def pod_spec(deployment: str = GATEWAY) -> Any:
    return k8s_object("Deployment", deployment)["spec"]["template"]["spec"]


def pod_labels(deployment: str = GATEWAY) -> dict[str, str]:
    template = k8s_object("Deployment", deployment)["spec"]["template"]
    labels: dict[str, str] = template["metadata"]["labels"]
    return labels


def container() -> Any:
    (gateway,) = pod_spec()["containers"]
    return gateway


def container_port(port: int | str, of: Any = None) -> int:
    """A port number, or a port name resolved against the container's ports."""
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in (of or container())["ports"] if p["name"] == port]
    assert isinstance(number, int)
    return number


def config_path() -> PurePosixPath:
    args = container()["args"]
    return PurePosixPath(args[args.index("--config") + 1])


def config_text() -> str:
    """The config file serve reads: the ConfigMap key mounted at --config's path."""
    path = config_path()
    volume_mounts = container()["volumeMounts"]
    (mount,) = [m for m in volume_mounts if PurePosixPath(m["mountPath"]) in path.parents]
    assert mount.get("readOnly") is True
    (volume,) = [v for v in pod_spec()["volumes"] if v["name"] == mount["name"]]
    configmap = k8s_object("ConfigMap", volume["configMap"]["name"])
    text: str = configmap["data"][str(path.relative_to(mount["mountPath"]))]
    return text


def env_refs(text: str) -> set[str]:
    """The ${VAR} names a config file's values use (not its comments)."""
    strings = [value for value in nodes(yaml.safe_load(text)) if isinstance(value, str)]
    return {name for value in strings for name in re.findall(r"\$\{(\w+)(?::-[^}]*)?\}", value)}


def k8s_config(tmp_path: Path) -> GatewayConfig:
    """The ConfigMap's config as the gateway loads it, with a dummy value for every env var."""
    path = tmp_path / "config.yaml"
    path.write_text(config_text(), encoding="utf-8")
    return load_config(path, {name: f"dummy-{name.lower()}" for name in env_refs(config_text())})


def pre_stop_seconds() -> int:
    pre_stop = container()["lifecycle"]["preStop"]
    if "sleep" in pre_stop:  # Kubernetes >= 1.30
        seconds: int = pre_stop["sleep"]["seconds"]
        return seconds
    command = pre_stop["exec"]["command"]
    assert command[0] == "sleep" and len(command) == 2
    return int(command[1])


def test_every_kubernetes_manifest_parses_and_names_its_object() -> None:
    assert manifest_files()
    for path in manifest_files():
        assert documents(path), path.name
        for doc in documents(path):
            assert doc["apiVersion"] and doc["kind"], path.name
            assert doc["metadata"]["name"], path.name


def test_kustomization_lists_every_manifest_but_the_examples() -> None:
    listed = kustomization()["resources"]
    examples = {p.name for p in manifest_files() if p.name.endswith(".example.yaml")}
    assert "secret.example.yaml" in examples
    assert sorted(listed) == sorted({p.name for p in manifest_files()} - examples)
    namespaces = [obj for obj in applied() if obj["kind"] == "Namespace"]
    assert [ns["metadata"]["name"] for ns in namespaces] == [kustomization()["namespace"]]


def test_deployment_keeps_two_replicas_and_rolls_without_losing_capacity() -> None:
    spec = k8s_object("Deployment")["spec"]
    assert spec["replicas"] >= 2
    assert spec["strategy"]["type"] == "RollingUpdate"
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert spec["strategy"]["rollingUpdate"]["maxSurge"] >= 1


def test_probes_use_real_routes_on_the_container_port() -> None:
    gateway = container()
    routes = app_routes()
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        if kind in gateway:
            probe = gateway[kind]["httpGet"]
            assert probe["path"] in routes, kind
            assert container_port(probe["port"]) == container_port("http"), kind


def test_one_port_from_config_to_container_service_and_scrape(tmp_path: Path) -> None:
    port = container_port("http")
    assert port == k8s_config(tmp_path).listen.port
    assert "--port" not in container()["args"]  # the config's listen.port is what is bound
    (service_port,) = k8s_object("Service")["spec"]["ports"]
    assert container_port(service_port["targetPort"]) == port
    annotations = k8s_object("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(port)
    assert annotations["prometheus.io/path"] in app_routes()


def test_selectors_and_targets_name_the_gateway_pods() -> None:
    labels = pod_labels()
    deployment = k8s_object("Deployment")
    assert is_subset(deployment["spec"]["selector"]["matchLabels"], labels)
    assert is_subset(k8s_object("Service")["spec"]["selector"], labels)
    assert is_subset(k8s_object("PodDisruptionBudget")["spec"]["selector"]["matchLabels"], labels)
    for constraint in pod_spec().get("topologySpreadConstraints", []):
        assert is_subset(constraint["labelSelector"]["matchLabels"], labels)
    # The gateway's Service does not also select the Redis pods.
    assert not is_subset(k8s_object("Service")["spec"]["selector"], pod_labels("redis"))
    hpa = k8s_object("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"]) == ("apps/v1", "Deployment")
    assert target["name"] == deployment["metadata"]["name"]


def test_hpa_scales_on_cpu_from_two_replicas() -> None:
    spec = k8s_object("HorizontalPodAutoscaler")["spec"]
    assert 2 <= spec["minReplicas"] <= spec["maxReplicas"]
    (metric,) = spec["metrics"]
    assert metric["resource"]["name"] == "cpu"
    assert metric["resource"]["target"]["type"] == "Utilization"
    # Utilization is a share of the request: without one the HPA cannot compute it.
    assert container()["resources"]["requests"]["cpu"]


def test_resources_are_requested_and_limited() -> None:
    resources = container()["resources"]
    assert resources["requests"]["cpu"] and resources["requests"]["memory"]
    assert resources["limits"]["memory"]


def test_pod_runs_as_the_image_user_with_a_writable_tmp_only() -> None:
    uid = re.search(r"--uid (\d+)", (ROOT / "Dockerfile").read_text())
    assert uid is not None
    security = pod_spec()["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == int(uid.group(1))
    assert container()["securityContext"]["allowPrivilegeEscalation"] is False
    if container()["securityContext"].get("readOnlyRootFilesystem"):
        # Multiprocess metrics (serve --workers N) and temporary files need /tmp.
        (tmp,) = [m for m in container()["volumeMounts"] if m["mountPath"] == "/tmp"]
        (volume,) = [v for v in pod_spec()["volumes"] if v["name"] == tmp["name"]]
        assert "emptyDir" in volume


def test_every_secret_ref_names_a_key_of_the_example_secret() -> None:
    (secret,) = documents(K8S / "secret.example.yaml")
    assert secret["kind"] == "Secret"
    assert secret["metadata"]["namespace"] == kustomization()["namespace"]
    refs = [
        env["valueFrom"]["secretKeyRef"]
        for env in container()["env"]
        if "secretKeyRef" in env.get("valueFrom", {})
    ]
    assert refs
    for ref in refs:
        assert ref["name"] == secret["metadata"]["name"]
        assert ref["key"] in secret["stringData"]


def test_every_env_var_the_config_uses_comes_from_the_deployment() -> None:
    provided = {env["name"] for env in container()["env"]}
    used = env_refs(config_text())
    assert used, "the secrets should come from the environment, not the ConfigMap"
    assert used <= provided, f"not in the Deployment's env: {sorted(used - provided)}"


def test_the_configmap_config_validates_and_is_mounted_where_serve_reads_it(
    tmp_path: Path,
) -> None:
    config = k8s_config(tmp_path)  # load_config: YAML, ${VAR} interpolation, validation
    assert config.listen.host == "0.0.0.0"
    assert config.auth.keys, "a gateway reachable in a cluster should require its own keys"
    assert not config.logging.content, "prompts and completions stay out of production logs"
    assert config.state.backend == "redis", "replicas share runs only through Redis"


def test_termination_grace_covers_prestop_drain_and_the_last_checkpoint(tmp_path: Path) -> None:
    # After SIGTERM the gateway drains for drain_timeout, then checkpoints what is left;
    # uvicorn's own shutdown timeout (SHUTDOWN_MARGIN later) is the backstop. The kubelet
    # must not SIGKILL before either: its grace period starts with the preStop sleep.
    grace = pod_spec()["terminationGracePeriodSeconds"]
    drain = k8s_config(tmp_path).listen.drain_timeout
    assert pre_stop_seconds() >= 1
    assert grace > pre_stop_seconds() + math.ceil(drain + SHUTDOWN_MARGIN)


def test_the_config_points_at_the_redis_service(tmp_path: Path) -> None:
    redis_url = k8s_config(tmp_path).state.redis_url
    assert redis_url is not None
    url = urlsplit(redis_url.get_secret_value())
    assert url.hostname is not None
    redis = k8s_object("Service", url.hostname)
    (port,) = redis["spec"]["ports"]
    assert port["port"] == (url.port or 6379)
    assert is_subset(redis["spec"]["selector"], pod_labels(url.hostname))
    (redis_container,) = pod_spec(url.hostname)["containers"]
    assert container_port(port["targetPort"], redis_container) == 6379


# What Prometheus's Kubernetes pod discovery knows about a pod, before relabelling: one
# target per declared container port (https://prometheus.io/docs/prometheus/latest/
# configuration/configuration/#pod), with label and annotation names sanitized.
POD_IP = "10.0.0.7"


def sanitized(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def discovered_targets(deployment: str, job: dict[str, Any]) -> list[dict[str, str]]:
    template = k8s_object("Deployment", deployment)["spec"]["template"]
    pod = {
        "__meta_kubernetes_namespace": kustomization()["namespace"],
        "__meta_kubernetes_pod_name": f"{deployment}-7d9f8b6c5d-x2x4q",
        "__meta_kubernetes_pod_ip": POD_IP,
        "__metrics_path__": job.get("metrics_path", "/metrics"),
        "__scheme__": "http",
        "job": job["job_name"],
    }
    for key, value in template["metadata"].get("labels", {}).items():
        pod[f"__meta_kubernetes_pod_label_{sanitized(key)}"] = value
    for key, value in template["metadata"].get("annotations", {}).items():
        pod[f"__meta_kubernetes_pod_annotation_{sanitized(key)}"] = value
    return [
        pod
        | {
            "__address__": f"{POD_IP}:{port['containerPort']}",
            "__meta_kubernetes_pod_container_name": each["name"],
            "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
            "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
        }
        for each in template["spec"]["containers"]
        for port in each.get("ports", [])
    ]


def relabel(labels: dict[str, str], rules: list[dict[str, Any]]) -> dict[str, str] | None:
    """Prometheus relabelling of one target (the actions used here); None: dropped."""
    labels = dict(labels)
    for rule in rules:
        action = rule.get("action", "replace")
        sources = rule.get("source_labels", [])
        value = rule.get("separator", ";").join(labels.get(name, "") for name in sources)
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        if (action == "keep" and match is None) or (action == "drop" and match is not None):
            return None
        if action == "keepequal" and value != labels.get(rule["target_label"], ""):
            return None
        if action == "replace" and match is not None:
            template = re.sub(r"\$\{?(\d+)\}?", r"\\g<\1>", rule.get("replacement", "$1"))
            labels[rule["target_label"]] = match.expand(template)
        elif action not in {"keep", "drop", "keepequal", "replace"}:
            raise AssertionError(f"relabel action {action!r} is not simulated here")
    labels.setdefault("instance", labels["__address__"])
    return labels


def test_the_kubernetes_scrape_config_keeps_the_gateway_pods_on_their_metrics_port() -> None:
    (job,) = load_yaml(PROMETHEUS / "kubernetes-scrape.yml")["scrape_configs"]
    assert job["job_name"] == SCRAPE_JOB
    (discovery,) = job["kubernetes_sd_configs"]
    assert discovery["role"] == "pod"
    assert kustomization()["namespace"] in discovery["namespaces"]["names"]
    rules = job["relabel_configs"]

    kept = [relabel(target, rules) for target in discovered_targets(GATEWAY, job)]
    targets = [target for target in kept if target is not None]
    assert len(targets) == 1, "one target per gateway pod, whatever ports it declares"
    (target,) = targets
    assert target["__address__"] == f"{POD_IP}:{container_port('http')}"
    assert target["__metrics_path__"] in app_routes()
    assert target["instance"] == discovered_targets(GATEWAY, job)[0]["__meta_kubernetes_pod_name"]
    assert not [t for t in discovered_targets("redis", job) if relabel(t, rules)]


def test_the_podmonitor_example_selects_the_gateway_port() -> None:
    (monitor,) = documents(K8S / "podmonitor.example.yaml")
    assert is_subset(monitor["spec"]["selector"]["matchLabels"], pod_labels())
    assert pod_labels()[monitor["spec"]["jobLabel"]] == SCRAPE_JOB
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert container_port(endpoint["port"]) == container_port("http")
    assert endpoint["path"] in app_routes()


# ---------------------------------------------------------------------------------------
# Alerts and PromQL
# ---------------------------------------------------------------------------------------


def alert_rules() -> list[dict[str, Any]]:
    groups = load_yaml(PROMETHEUS / "alerts.yml")["groups"]
    return [rule for group in groups for rule in group["rules"]]


# Grafana's interval variables, replaced by a duration so that the expression parses.
GRAFANA_DURATIONS = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}


def grafana_variable_query(query: Any) -> str:
    """A templating query as PromQL: label_values(expr, label) is group by (label) (expr)."""
    text = query["query"] if isinstance(query, dict) else str(query)
    if match := re.fullmatch(r"label_values\((.+),\s*(\w+)\)", text.strip()):
        return f"group by ({match[2]}) ({match[1]})"
    if match := re.fullmatch(r"query_result\((.+)\)", text.strip()):
        return match[1]
    return text


def promql_expressions() -> list[tuple[str, str]]:
    """(where, expression) for every PromQL expression in the dashboard and the alerts."""
    found = []
    board = dashboard()
    for panel in panels(board):
        for target in panel.get("targets", []):
            found.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    for variable in board.get("templating", {}).get("list", []):
        if variable["type"] == "query":
            query = grafana_variable_query(variable["query"])
            found.append((f"variable ${variable['name']}", query))
    for rule in alert_rules():
        found.append((f"alert {rule['alert']}", rule["expr"]))
    return found


def parse_promql(text: str) -> promql_parser.Expr:
    for variable, duration in GRAFANA_DURATIONS.items():
        text = text.replace(variable, duration)
    return promql_parser.parse(text)


@dataclass(frozen=True)
class Selector:
    name: str | None
    labels: frozenset[str]  # in its matchers
    matchers: tuple[tuple[str, str], ...]  # (label, value)


@dataclass(frozen=True)
class Grouping:
    """A by/without clause or an on/ignoring/group_left list, and the selectors under it."""

    clause: str
    labels: frozenset[str]
    selectors: tuple[Selector, ...]


def selectors(expr: promql_parser.Expr) -> tuple[Selector, ...]:
    found: list[Selector] = []

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            matchers = [*node.matchers.matchers]
            matchers += [m for group in node.matchers.or_matchers for m in group]
            pairs = tuple((m.name, m.value) for m in matchers if m.name != "__name__")
            found.append(Selector(node.name, frozenset(k for k, _ in pairs), pairs))

    promql_parser.walk(expr, visit)
    return tuple(found)


def groupings(expr: promql_parser.Expr) -> list[Grouping]:
    found: list[Grouping] = []

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            by = node.modifier.type == promql_parser.AggModifierType.By
            clause = "by" if by else "without"
            found.append(Grouping(clause, frozenset(node.modifier.labels), selectors(node)))
        if isinstance(node, promql_parser.BinaryExpr) and node.modifier is not None:
            matching = node.modifier.matching
            labels = set(matching.labels) if matching is not None else set()
            labels |= set(node.modifier.group_labels or [])
            if labels:
                found.append(Grouping("vector matching", frozenset(labels), selectors(node)))

    promql_parser.walk(expr, visit)
    return found


def test_every_promql_expression_parses() -> None:
    expressions = promql_expressions()
    assert len(expressions) > 20
    failures = []
    for where, text in expressions:
        try:
            parse_promql(text)
        except ValueError as exc:
            failures.append(f"{where}: {exc}\n    {text}")
    assert not failures, "\n".join(failures)


def test_every_alert_has_a_duration_a_severity_and_a_summary() -> None:
    rules = alert_rules()
    assert {"GatewayNoReadyReplica", "GatewayRecoveryFailures"} <= {r["alert"] for r in rules}
    assert {"GatewayUpstreamErrors", "GatewayCheckpointWriteErrors"} <= {r["alert"] for r in rules}
    for rule in rules:
        assert promql_parser.parse_duration(rule["for"]).total_seconds() > 0, rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        assert rule["annotations"]["summary"].strip(), rule["alert"]
        assert rule["annotations"]["description"].strip(), rule["alert"]


def test_job_matchers_name_the_scrape_job() -> None:
    jobs = {
        value
        for _, text in promql_expressions()
        for selector in selectors(parse_promql(text))
        for label, value in selector.matchers
        if label == "job"
    }
    assert jobs == {SCRAPE_JOB}


# ---------------------------------------------------------------------------------------
# PromQL against a live gateway
# ---------------------------------------------------------------------------------------

# Labels Prometheus attaches to every scraped series (the Kubernetes scrape config sets
# instance to the pod's name), and the series it synthesizes for each target.
TARGET_LABELS = frozenset({"job", "instance"})
SYNTHESIZED = {"up"}
# The samples of a family, by type (their *_created series are families of their own in
# the text format).
SAMPLE_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
    "unknown": ("",),
}


@dataclass(frozen=True)
class Family:
    name: str  # as prometheus-client names it: a counter's without _total
    type: str
    labels: frozenset[str]

    @property
    def sample_names(self) -> set[str]:
        return {self.name + suffix for suffix in SAMPLE_SUFFIXES[self.type]}


def declared_families() -> dict[str, Family]:
    """The metric families gateway/metrics.py defines, with their declared label names."""
    metrics = Metrics()
    wrappers = [m for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)]
    assert len(wrappers) == len(list(metrics.registry.collect()))
    return {m._name: Family(m._name, str(m._type), frozenset(m._labelnames)) for m in wrappers}


@dataclass
class Exposition:
    """What one scrape of /metrics says: the sample names a query may use, and labels."""

    names: set[str] = field(default_factory=set)
    labels: dict[str, set[str]] = field(default_factory=dict)  # sample name -> label names
    values: dict[str, float] = field(default_factory=dict)  # unlabelled samples only

    @classmethod
    def parse(cls, text: str) -> Exposition:
        exposition = cls()
        for family in text_string_to_metric_families(text):
            exposition.names |= Family(family.name, family.type, frozenset()).sample_names
            for sample in family.samples:
                exposition.names.add(sample.name)
                exposition.labels.setdefault(sample.name, set()).update(sample.labels)
                if not sample.labels:
                    exposition.values[sample.name] = sample.value
        return exposition

    def labels_of(self, name: str) -> set[str]:
        """Label names of a sample name: from live samples, else as declared."""
        if name in SYNTHESIZED:
            return set()
        if name in self.labels:
            return self.labels[name]
        (family,) = [f for f in declared_families().values() if name in f.sample_names]
        return set(family.labels) | ({"le"} if name.endswith("_bucket") else set())

    def problems(self, expr: promql_parser.Expr) -> list[str]:
        found = []
        for selector in selectors(expr):
            if selector.name is None:
                found.append("a selector without a metric name")
            elif selector.name not in self.names | SYNTHESIZED:
                found.append(f"{selector.name} is not exported")
            elif unknown := selector.labels - self.labels_of(selector.name) - TARGET_LABELS:
                found.append(f"{selector.name} has no label {', '.join(sorted(unknown))}")
        for grouping in groupings(expr):
            for selector in grouping.selectors:
                if selector.name not in self.names | SYNTHESIZED:
                    continue  # reported above
                known = self.labels_of(selector.name) | TARGET_LABELS
                if unknown := grouping.labels - known:
                    found.append(
                        f"{grouping.clause} ({', '.join(sorted(unknown))}): "
                        f"not a label of {selector.name}"
                    )
        return found


MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
# Unique specs (seed=91xx): times=1 counts by spec on the session's shared chaos upstream.
TRAFFIC = {
    "clean, with usage": "chaos:text=8,usage=1,seed=9101",
    "reset mid-stream, recovered": "chaos:text=40,seed=9102,fault=reset,at=10,times=1",
    "a malformed event, skipped": "chaos:text=8,seed=9103,fault=malformed,at=4,times=1",
    "HTTP 500, retried": "chaos:text=8,seed=9104,fault=http_500,times=1",
    "prefill refused, continued in prompt mode": (
        "chaos:text=20,seed=9105,prefill=0,fault=reset,at=5,times=1"
    ),
}


def drive_traffic(client: OpenAI) -> None:
    """Streams that touch every metric: recoveries, retries, usage, a resume."""
    for what, model in TRAFFIC.items():
        stream = client.chat.completions.create(
            model=model, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        assert text == expected_answer(model).text, what
    model = TRAFFIC["clean, with usage"]
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=MESSAGES, stream=True
    )
    assert len(list(raw.parse())) > 2
    resumed = client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        stream=True,
        extra_headers={"x-run-id": raw.headers["x-run-id"], "x-resume-from": "2"},
    )
    assert list(resumed)
    # A background Responses stream its client leaves: past the detach grace nobody will
    # read it, and the upstream's response is cancelled.
    model = "chaos:text=400,seed=67,pace_ms=20"
    with client.responses.with_streaming_response.create(
        model=model, input="x", stream=True
    ) as response:
        next(response.iter_lines())


@pytest.fixture(scope="module")
def live(chaos: ChaosUpstream) -> Exposition:
    """/metrics of a gateway that relayed TRAFFIC and answered a readiness probe."""
    # Models that refuse a prefill are continued by prefix first (then learned).
    # A circuit that opens on the first failure (the HTTP 500 above) and probes at once.
    # Responses asked as background responses, and a detached run let go at once.
    upstream = {
        "continuation_models": {"*prefill=0*": "prefix"},
        "circuit": {"failures": 1, "cooldown": 0.01},
        "background": True,
    }
    config = gateway_config(chaos.base_url, upstream=upstream, state={"detach_grace": 0.2})
    with running_gateway(config) as gateway:
        with OpenAI(base_url=gateway.base_url, api_key="sk-test", max_retries=0) as client:
            drive_traffic(client)
        cancelled = gateway.metrics.upstream_cancels.labels("chaos", "cancelled")
        wait_for(lambda: cancelled._value.get() == 1, 10, "the abandoned response cancelled")
        with httpx2.Client(base_url=gateway.url) as http:
            assert http.get("/readyz").status_code == 200
            # A WebSocket upgrade where none is served: refused with 426.
            upgrade = {
                "upgrade": "websocket",
                "connection": "Upgrade",
                "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
                "sec-websocket-version": "13",
            }
            assert http.get("/v1/chat/completions", headers=upgrade).status_code == 426
            scrape = http.get("/metrics")
    assert scrape.status_code == 200
    return Exposition.parse(scrape.text)


def test_promql_names_only_metrics_and_labels_the_gateway_exports(live: Exposition) -> None:
    problems = [
        f"{where}: {problem}\n    {text}"
        for where, text in promql_expressions()
        for problem in live.problems(parse_promql(text))
    ]
    assert not problems, "\n".join(problems)


def test_the_dashboard_shows_every_gateway_metric() -> None:
    used = {
        selector.name
        for where, text in promql_expressions()
        if where.startswith("panel ")
        for selector in selectors(parse_promql(text))
    }
    unused = [
        family.name for family in declared_families().values() if not family.sample_names & used
    ]
    assert not unused, f"metrics no dashboard panel shows: {unused}"


def test_the_traffic_gives_every_gateway_metric_a_sample(live: Exposition) -> None:
    """Each metric the dashboard plots is really recorded (not only declared)."""
    silent = [
        family.name
        for family in declared_families().values()
        if not family.sample_names & set(live.labels)
    ]
    assert not silent, f"declared, but no sample after the traffic: {silent}"


def test_a_ready_gateway_says_so_in_gateway_ready(live: Exposition) -> None:
    # The GatewayNoReadyReplica alert fires while no replica reports 1.
    assert live.values["gateway_ready"] == 1
