"""Checks the Kubernetes manifests under deploy/kubernetes.

Run by scripts/check-deploy.sh inside the project's .venv (kubernetes-validate and
PyYAML). It checks, and reports every problem before failing:

1. layout: every YAML file is a kustomization, a file a kustomization generates a
   ConfigMap from, a manifest some kustomization lists, or a `promtool test rules`
   file (top-level `rule_files` and `tests`, run by scripts/check-monitoring.sh)
   whose rule files exist; every path a kustomization names exists;
2. schema: every manifest (and, when kubectl is present, every rendered kustomization)
   validates against the pinned Kubernetes version in strict mode; only the optional
   CRD kinds listed in OPTIONAL_CRDS may lack a schema, and only outside the default
   kustomization, where they get a structural check instead;
3. command lines: every `--flag` and `MESHCAT_*` variable given to a meshcat container
   is one its binary accepts (from `--help`, or from docs/configuration.md), in every
   manifest file and in every rendered overlay (whose patches set some);
4. contract: ports 9080/TCP, 9443/UDP, 9091/TCP (aggregator) and 9092/TCP (agent),
   probes on /healthz and /readyz, Prometheus annotations on /metrics (manifest files
   and rendered overlays);
5. image: the Dockerfile's ENTRYPOINT and every container command name a binary of
   the workspace;
6. security (docs/security.md): the aggregator reads its write and read tokens, and
   every key and token file, from Secret volumes; an agent whose ops port is not on
   loopback has an ops token from a Secret; an agent's zone is its pod's namespace
   (never a label or annotation the pod sets); no shipped manifest turns on
   development mode or anonymous writes; every aggregator turns on the per-cluster and
   per-edge series (MESHCAT_CLUSTER_METRICS, off by default) that the alerting rules
   shipped beside it use;
7. etcd and NetworkPolicies (contract section 10), on every rendered kustomization:
   an aggregator with `--store etcd://` has --etcd-ca-file, --etcd-cert and --etcd-key
   from Secret volumes; every etcd container listens on https only (a plain-HTTP
   --listen-metrics-urls for probes excepted), demands client certificates from
   clients and peers (--client-cert-auth, --peer-client-cert-auth, both CA files,
   keys from Secrets) and is not probed on its client port; overlays/ha runs the
   aggregator on etcd; every kustomization that runs the aggregator, the agent
   DaemonSet or etcd ships a NetworkPolicy selecting those pods: etcd's client port
   admitted only from aggregator pods and its peer port only from etcd pods, the
   aggregator's and the agent's pods admitting only their own ports, and the Envoy
   admin template admitting the admin port only from agent pods. A self-test first
   runs these checks on broken copies of the rendered HA overlay and fails when one
   is not caught;
8. privileges (contract section 18), on every manifest file and rendered
   kustomization: no pod shares the node's network or IPC namespace; every container
   drops ALL capabilities, is not privileged, cannot escalate, has a read-only root
   filesystem, a RuntimeDefault (or Localhost) seccomp profile and AppArmor not
   Unconfined; the only node path mounted is /var/log/pods, read-only. The one
   exception is an agent that reaches pods inside their network namespaces
   (MESHCAT_POD_NETNS): its pod has hostPID and the agent container, uid 0, adds
   exactly SYS_ADMIN and SYS_PTRACE; any other hostPID or added capability fails.
   overlays/loopback-admin must run its agent so, the base must not. A self-test runs
   these checks on broken copies of the rendered overlay and base first.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml
import kubernetes_validate

OPTIONAL_CRDS = {("monitoring.coreos.com/v1", "ServiceMonitor"),
                 ("monitoring.coreos.com/v1", "PrometheusRule")}
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "Pod"}
AGGREGATOR, AGENT = "meshcat-aggregator", "meshcat-agent"
# Contract section 1 and 9: default listen addresses.
DEFAULT_ADDRS = {
    AGGREGATOR: {"MESHCAT_API_ADDR": "0.0.0.0:9080", "MESHCAT_QUIC_ADDR": "0.0.0.0:9443",
                 "MESHCAT_OPS_ADDR": "0.0.0.0:9091"},
    AGENT: {"MESHCAT_OPS_ADDR": "127.0.0.1:9092"},
}
# (env var, expected port, protocol, probe paths served there)
CONTRACT_PORTS = {
    AGGREGATOR: [("MESHCAT_API_ADDR", 9080, "TCP"), ("MESHCAT_QUIC_ADDR", 9443, "UDP"),
                 ("MESHCAT_OPS_ADDR", 9091, "TCP")],
    AGENT: [("MESHCAT_OPS_ADDR", 9092, "TCP")],
}
PROBES = {AGGREGATOR: {"readinessProbe": "/readyz", "livenessProbe": "/healthz"},
          AGENT: {"livenessProbe": "/healthz"}}
OPS_PORT = {AGGREGATOR: 9091, AGENT: 9092}

NAME_LABEL = "app.kubernetes.io/name"
ETCD = "meshcat-etcd"
# Ports each component's pods may admit through their NetworkPolicy.
POLICY_PORTS = {AGGREGATOR: {(9080, "TCP"), (9443, "UDP"), (9091, "TCP")},
                AGENT: {(9092, "TCP")}}
ETCD_TLS_FLAGS = ["trusted-ca-file", "cert-file", "key-file",
                  "peer-trusted-ca-file", "peer-cert-file", "peer-key-file"]
ETCD_HTTPS_FLAGS = ["listen-client-urls", "advertise-client-urls", "listen-peer-urls",
                    "initial-advertise-peer-urls"]
ENVOY_ADMIN_PORT = 9901
SCRAPE_LABEL = "meshcat.io/scrape"
# Section 8: the capabilities the agent adds to enter pods' network namespaces
# (MESHCAT_POD_NETNS, overlays/loopback-admin), and the only node path any pod mounts.
LOOPBACK_CAPS = {"SYS_ADMIN", "SYS_PTRACE"}
HOST_PATHS = {"/var/log/pods"}
LOOPBACK_OVERLAY = ("overlays", "loopback-admin")

FLAG_RE = re.compile(r"(?<![\w-])--([a-z][a-z0-9-]*)")
ENV_RE = re.compile(r"\bMESHCAT_[A-Z0-9_]+\b")


class Checker:
    def __init__(self, root: Path, version: str):
        self.root = root
        self.kroot = root / "deploy" / "kubernetes"
        self.version = version
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.counts = {"files": 0, "resources": 0, "rendered": 0, "flags": 0, "envs": 0}

    def fail(self, where: str, msg: str) -> None:
        self.problems.append(f"{where}: {msg}")

    def rel(self, p: Path) -> str:
        # Rendered kustomizations are keyed as <dir>/(rendered).
        return str(p.relative_to(self.root)).replace("/(rendered)", " (rendered)")

    # 1. layout ---------------------------------------------------------------
    def layout(self) -> tuple[dict[Path, list[dict]], set[Path], list[Path]]:
        kustomizations = sorted(self.kroot.rglob("kustomization.yaml"))
        listed: set[Path] = set()
        generated: set[Path] = set()
        default_reach: set[Path] = set()
        for k in kustomizations:
            data = yaml.safe_load(k.read_text()) or {}
            for entry in data.get("resources", []) or []:
                target = (k.parent / entry).resolve()
                if not target.exists():
                    self.fail(self.rel(k), f"resource {entry} does not exist")
                elif target.is_file():
                    listed.add(target)
                elif not (target / "kustomization.yaml").exists():
                    self.fail(self.rel(k), f"resource directory {entry} has no kustomization.yaml")
            for gen in (data.get("configMapGenerator") or []) + (data.get("secretGenerator") or []):
                for f in gen.get("files", []) or []:
                    src = f.split("=", 1)[-1]
                    target = (k.parent / src).resolve()
                    if not target.is_file():
                        self.fail(self.rel(k), f"generator file {src} does not exist")
                    generated.add(target)
        # Files reachable from the default kustomization (what `apply -k` applies).
        stack = [self.kroot.resolve()]
        while stack:
            d = stack.pop()
            data = yaml.safe_load((d / "kustomization.yaml").read_text()) or {}
            for entry in data.get("resources", []) or []:
                t = (d / entry).resolve()
                if t.is_dir() and (t / "kustomization.yaml").exists():
                    stack.append(t)
                elif t.is_file():
                    default_reach.add(t)
        manifests: dict[Path, list[dict]] = {}
        for f in sorted(list(self.kroot.rglob("*.yaml")) + list(self.kroot.rglob("*.yml"))):
            rf = f.resolve()
            if f.name == "kustomization.yaml":
                continue
            if rf in generated:
                try:
                    yaml.safe_load(f.read_text())
                except yaml.YAMLError as e:
                    self.fail(self.rel(f), f"not valid YAML: {e}")
                continue
            try:
                docs = [d for d in yaml.safe_load_all(f.read_text()) if d is not None]
            except yaml.YAMLError as e:
                self.fail(self.rel(f), f"not valid YAML: {e}")
                continue
            if len(docs) == 1 and isinstance(docs[0], dict) and {"rule_files", "tests"} <= docs[0].keys():
                # A promtool unit test of rules, not a manifest.
                for rules in docs[0].get("rule_files") or []:
                    if not (f.parent / rules).is_file():
                        self.fail(self.rel(f), f"rule file {rules} does not exist")
                continue
            if rf not in listed:
                self.fail(self.rel(f), "not listed by any kustomization.yaml")
            manifests[rf] = docs
        return manifests, default_reach, [k.parent for k in kustomizations]

    # 2. schema ---------------------------------------------------------------
    def validate_doc(self, where: str, doc: dict, optional_ok: bool) -> None:
        kind, api = doc.get("kind"), doc.get("apiVersion")
        name = (doc.get("metadata") or {}).get("name", "?")
        label = f"{where} {kind}/{name}"
        try:
            kubernetes_validate.validate(doc, self.version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            if (api, kind) in OPTIONAL_CRDS and optional_ok:
                if kind == "ServiceMonitor":
                    self.check_servicemonitor(label, doc)
                else:
                    self.check_prometheusrule(label, doc)
                return
            self.fail(label, f"no schema for {api} {kind} in Kubernetes {self.version}")
        except kubernetes_validate.ValidationError as e:
            path = "/".join(str(p) for p in e.path) or "(root)"
            self.fail(label, f"{path}: {e.message}")

    def check_servicemonitor(self, label: str, doc: dict) -> None:
        spec = doc.get("spec") or {}
        if not spec.get("selector"):
            self.fail(label, "spec.selector is required")
        eps = spec.get("endpoints") or []
        if not eps:
            self.fail(label, "spec.endpoints is required")
        for ep in eps:
            if ep.get("path", "/metrics") != "/metrics":
                self.fail(label, f"endpoint path {ep.get('path')} is not /metrics")
            if "port" not in ep and "targetPort" not in ep:
                self.fail(label, "endpoint names no port")

    def check_prometheusrule(self, label: str, doc: dict) -> None:
        groups = (doc.get("spec") or {}).get("groups") or []
        if not groups:
            self.fail(label, "spec.groups is required")
        for g in groups:
            if not g.get("name"):
                self.fail(label, "a group has no name")
            for r in g.get("rules") or []:
                if not r.get("expr") or ("alert" in r) == ("record" in r):
                    self.fail(label, f"group {g.get('name')}: a rule needs expr and one of alert, record")

    def schema(self, manifests: dict[Path, list[dict]], default_reach: set[Path]) -> None:
        for f, docs in manifests.items():
            self.counts["files"] += 1
            for doc in docs:
                self.counts["resources"] += 1
                self.validate_doc(self.rel(f), doc, optional_ok=f not in default_reach)

    def render(self, kdirs: list[Path], kubectl: str | None) -> dict[Path, list[dict]]:
        """Renders every kustomization; returns the documents of each. Without kubectl
        a minimal renderer (resources and inline patches) feeds the checks of section
        7, and schema validation of rendered output is skipped."""
        rendered: dict[Path, list[dict]] = {}
        if not kubectl:
            self.notes.append("kustomize render skipped (no kubectl); etcd and NetworkPolicy "
                              "checks use resources and inline patches only")
            for d in kdirs:
                try:
                    rendered[d] = self.render_minimal(d)
                except (OSError, yaml.YAMLError, KeyError, TypeError) as e:
                    self.fail(self.rel(d), f"cannot assemble the kustomization: {e}")
            return rendered
        for d in kdirs:
            out = subprocess.run([kubectl, "kustomize", str(d)], capture_output=True, text=True)
            if out.returncode != 0:
                self.fail(self.rel(d), f"kubectl kustomize failed: {out.stderr.strip()}")
                continue
            optional_ok = d.resolve() != self.kroot.resolve()
            docs = [doc for doc in yaml.safe_load_all(out.stdout) if doc]
            rendered[d] = docs
            for doc in docs:
                self.counts["rendered"] += 1
                self.validate_doc(f"{self.rel(d)} (rendered)", doc, optional_ok)
        return rendered

    def render_minimal(self, d: Path) -> list[dict]:
        """A kustomization's resources with its inline strategic-merge patches applied
        (no generators, name prefixes or transformers): enough for section 7."""
        data = yaml.safe_load((d / "kustomization.yaml").read_text()) or {}
        docs: list[dict] = []
        for entry in data.get("resources", []) or []:
            t = (d / entry).resolve()
            if t.is_dir():
                docs += self.render_minimal(t)
            else:
                docs += [x for x in yaml.safe_load_all(t.read_text()) if x]
        for gen in data.get("configMapGenerator") or []:
            docs.append({"apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": {"name": gen["name"]}, "data": {}})
        for p in data.get("patches") or []:
            text = p["patch"] if "patch" in p else (d / p["path"]).read_text()
            for patch in [x for x in yaml.safe_load_all(text) if x]:
                target = p.get("target") or {}
                kind = target.get("kind", patch.get("kind"))
                name = target.get("name", (patch.get("metadata") or {}).get("name"))
                for doc in docs:
                    if doc.get("kind") == kind and doc["metadata"].get("name") == name:
                        merged = strategic_merge(doc, patch)
                        doc.clear()
                        doc.update(merged)
        return docs

    # 3 and 4. command lines and contract ports --------------------------------
    def meshcat_containers(self, manifests: dict[Path, list[dict]]):
        configmaps = {}
        for docs in manifests.values():
            for doc in docs:
                if doc.get("kind") == "ConfigMap":
                    configmaps[doc["metadata"]["name"]] = doc.get("data") or {}
        for f, docs in manifests.items():
            for doc in docs:
                if doc.get("kind") not in WORKLOAD_KINDS:
                    continue
                tpl = doc["spec"] if doc["kind"] == "Pod" else (doc["spec"].get("template") or {})
                if doc["kind"] == "Job":
                    tpl = doc["spec"]["template"]
                pod = tpl.get("spec", {}) if doc["kind"] != "Pod" else doc["spec"]
                annotations = ((tpl.get("metadata") or {}).get("annotations") or {}) \
                    if doc["kind"] != "Pod" else (doc["metadata"].get("annotations") or {})
                for c in (pod.get("initContainers") or []) + (pod.get("containers") or []):
                    where = f"{self.rel(f)} {doc['kind']}/{doc['metadata']['name']} container {c['name']}"
                    cmd = c.get("command") or []
                    image = c.get("image", "")
                    binary = os.path.basename(cmd[0]) if cmd else None
                    if binary not in (AGGREGATOR, AGENT):
                        if image.split("/")[-1].split(":")[0] == "meshcat":
                            self.fail(where, "runs the meshcat image without naming its binary in command")
                        continue
                    env: dict[str, str] = {}
                    for src in c.get("envFrom") or []:
                        ref = (src.get("configMapRef") or {}).get("name")
                        if ref is None:
                            continue
                        if ref not in configmaps:
                            self.fail(where, f"envFrom names ConfigMap {ref}, which no manifest defines")
                            continue
                        env.update({k: str(v) for k, v in configmaps[ref].items()})
                    for e in c.get("env") or []:
                        env[e["name"]] = str(e.get("value", "<from>"))
                    args = list(cmd[1:]) + list(c.get("args") or [])
                    yield where, binary, c, env, args, annotations, pod

    def command_lines(self, manifests, accepted: dict[str, tuple[set[str], set[str]]]) -> None:
        for where, binary, c, env, args, _, _ in self.meshcat_containers(manifests):
            flags, envs = accepted[binary]
            for a in args:
                if a.startswith("--"):
                    self.counts["flags"] += 1
                    name = a[2:].split("=", 1)[0]
                    if name not in flags:
                        self.fail(where, f"--{name} is not a flag of {binary}")
            for name in env:
                if name.startswith("MESHCAT_"):
                    self.counts["envs"] += 1
                    if name not in envs:
                        self.fail(where, f"{name} is not a setting of {binary}")

    def contract(self, manifests) -> None:
        services = {}
        for docs in manifests.values():
            for doc in docs:
                if doc.get("kind") == "Service":
                    services[doc["metadata"]["name"]] = doc
        for where, binary, c, env, args, annotations, _ in self.meshcat_containers(manifests):
            eff = dict(DEFAULT_ADDRS[binary])
            eff.update({k: v for k, v in env.items() if k in eff})
            for a in args:
                m = re.match(r"--([a-z-]+)=(.*)", a)
                if m and f"MESHCAT_{m.group(1).upper().replace('-', '_')}" in eff:
                    eff[f"MESHCAT_{m.group(1).upper().replace('-', '_')}"] = m.group(2)
            declared = {(p["containerPort"], p.get("protocol", "TCP")): p.get("name")
                        for p in c.get("ports") or []}
            names = {p.get("name"): p["containerPort"] for p in c.get("ports") or []}
            for var, port, proto in CONTRACT_PORTS[binary]:
                addr = eff[var]
                host, _, p = addr.rpartition(":")
                if p != str(port):
                    self.fail(where, f"{var}={addr} is not on the contract port {port}")
                if (port, proto) not in declared:
                    self.fail(where, f"containerPort {port}/{proto} is not declared")
                if var == "MESHCAT_OPS_ADDR" and host in ("127.0.0.1", "localhost", "[::1]"):
                    self.fail(where, f"{var}={addr} listens on loopback: kubelet probes and Prometheus cannot reach it")
            for probe, path in PROBES[binary].items():
                get = (c.get(probe) or {}).get("httpGet")
                if not get:
                    self.fail(where, f"{probe} must be an httpGet of {path}")
                    continue
                port = names.get(get.get("port"), get.get("port"))
                if get.get("path") != path or port != OPS_PORT[binary]:
                    self.fail(where, f"{probe} is {get.get('path')} on {get.get('port')}, not {path} on {OPS_PORT[binary]}")
            if annotations.get("prometheus.io/scrape") != "true":
                self.fail(where, "pod lacks the prometheus.io/scrape: \"true\" annotation")
            if annotations.get("prometheus.io/port") != str(OPS_PORT[binary]):
                self.fail(where, f"prometheus.io/port is {annotations.get('prometheus.io/port')}, not {OPS_PORT[binary]}")
            if annotations.get("prometheus.io/path", "/metrics") != "/metrics":
                self.fail(where, "prometheus.io/path is not /metrics")
            if binary == AGENT:
                agg = env.get("MESHCAT_AGGREGATOR", "127.0.0.1:9443")
                if not re.fullmatch(r"meshcat-aggregator\.[a-z0-9-]+\.svc(\.cluster\.local)?:9443", agg):
                    self.fail(where, f"MESHCAT_AGGREGATOR={agg} is not meshcat-aggregator.<namespace>.svc:9443")
        svc = services.get(AGGREGATOR)
        if svc is None:
            self.fail("deploy/kubernetes", f"no Service named {AGGREGATOR}")
        else:
            got = {(p["port"], p.get("protocol", "TCP")) for p in svc["spec"]["ports"]}
            for want in [(9080, "TCP"), (9443, "UDP"), (9091, "TCP")]:
                if want not in got:
                    self.fail(f"Service/{AGGREGATOR}", f"port {want[0]}/{want[1]} missing")

    # 6. security -------------------------------------------------------------
    @staticmethod
    def secret_backed(path: str, c: dict, pod: dict) -> bool:
        """Whether `path` lies in a volume made only of Secrets."""
        volumes = {v["name"]: v for v in pod.get("volumes") or []}
        for m in c.get("volumeMounts") or []:
            mp = m["mountPath"].rstrip("/")
            if path != mp and not path.startswith(mp + "/"):
                continue
            v = volumes.get(m["name"]) or {}
            if "secret" in v:
                return True
            sources = (v.get("projected") or {}).get("sources") or []
            return bool(sources) and all("secret" in src for src in sources)
        return False

    def security(self, manifests) -> None:
        required = {AGGREGATOR: ["MESHCAT_WRITE_TOKEN_FILE", "MESHCAT_READ_TOKEN_FILE"],
                    AGENT: []}
        secret_files = {AGGREGATOR: ["MESHCAT_TLS_KEY", "MESHCAT_AGENT_TOKEN_FILE",
                                     "MESHCAT_ETCD_KEY"],
                        AGENT: ["MESHCAT_KEY", "MESHCAT_TOKEN_FILE"]}
        never_on = ["MESHCAT_DEV", "MESHCAT_ALLOW_ANONYMOUS_WRITES", "MESHCAT_ALLOW_ANY_ZONE_CERT"]
        for where, binary, c, env, args, _, pod in self.meshcat_containers(manifests):
            flags = {}
            for a in args:
                m = re.match(r"--([a-z-]+)(?:=(.*))?$", a)
                if m:
                    flags["MESHCAT_" + m.group(1).upper().replace("-", "_")] = m.group(2) or "true"
            eff = {**env, **flags}
            for var in never_on:
                if eff.get(var, "false").lower() not in ("false", "0", ""):
                    self.fail(where, f"{var} is on: shipped manifests must be secure by default")
            wanted = list(required[binary])
            # The alerting rules shipped beside it (monitoring/) are written on the
            # per-cluster and per-edge series, which are off by default.
            if binary == AGGREGATOR and eff.get("MESHCAT_CLUSTER_METRICS", "false").lower() \
                    not in ("true", "1", "yes", "y", "on", "t"):
                self.fail(where, "MESHCAT_CLUSTER_METRICS is not on: the alerting rules of "
                                 "monitoring/ need the per-cluster and per-edge series")
            if binary == AGENT:
                host = eff.get("MESHCAT_OPS_ADDR", "127.0.0.1:9092").rpartition(":")[0]
                if host not in ("127.0.0.1", "localhost", "[::1]"):
                    wanted.append("MESHCAT_OPS_TOKEN_FILE")
            for var in wanted:
                if var not in eff:
                    self.fail(where, f"{var} is not set (docs/security.md)")
            if binary == AGGREGATOR and eff.get("MESHCAT_STORE", "redb").startswith("etcd://"):
                for var in ["MESHCAT_ETCD_CA_FILE", "MESHCAT_ETCD_CERT", "MESHCAT_ETCD_KEY"]:
                    if var not in eff:
                        self.fail(where, f"MESHCAT_STORE is etcd but {var} is not set: replicas "
                                         "reach etcd only over TLS with a client certificate")
                    elif var not in wanted + secret_files[binary]:
                        wanted.append(var)
            for var in wanted + secret_files[binary]:
                path = eff.get(var)
                if path and not self.secret_backed(path, c, pod):
                    self.fail(where, f"{var}={path} is not on a volume made of Secrets")
            if binary == AGENT:
                self.agent_zone(where, c, eff)

    def agent_zone(self, where: str, c: dict, eff: dict) -> None:
        """An agent's zone, when given, must be its pod's namespace."""
        zone = eff.get("MESHCAT_ZONE")
        if zone is None:
            return
        fields = {e["name"]: ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
                  for e in c.get("env") or []}
        m = re.fullmatch(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", zone)
        if not m or fields.get(m.group(1)) != "metadata.namespace":
            self.fail(where, f"the zone ({zone}) is not the pod's namespace (fieldRef metadata.namespace)")

    # 7. etcd and NetworkPolicies -------------------------------------------------
    def store_and_policies(self, d: Path, docs: list[dict]) -> None:
        """Section 7 on one rendered kustomization."""
        label = f"{self.rel(d)} (rendered)"
        pods = list(pod_templates(docs))
        policies = [doc for doc in docs if doc.get("kind") == "NetworkPolicy"]
        for kind, name, labels, pod in pods:
            where = f"{label} {kind}/{name}"
            for c in (pod.get("initContainers") or []) + (pod.get("containers") or []):
                if is_etcd(c):
                    self.etcd_server(f"{where} container {c['name']}", c, pod)
            role = pod_role(labels, pod)
            if role is None:
                continue
            selecting = [p for p in policies if policy_selects(p, labels)
                         and "Ingress" in policy_types(p)]
            if not selecting:
                self.fail(where, f"no NetworkPolicy selects these {role} pods (contract section 10: "
                                 "the manifests ship NetworkPolicies for the aggregator, the agent and etcd)")
                continue
            names = container_port_names(pod)
            for pol in selecting:
                pw = f"{label} NetworkPolicy/{pol['metadata']['name']}"
                if role == ETCD:
                    self.etcd_policy(pw, pol, names, etcd_ports(pod))
                else:
                    self.component_policy(pw, pol, names, role)
            if role == ETCD:
                client = etcd_ports(pod)[0]
                if not any(admits_from(r, client, "TCP", names, AGGREGATOR)
                           for p in selecting for r in ingress_rules(p)):
                    self.fail(where, f"no NetworkPolicy admits the aggregator pods to etcd's client port {client}")
            elif role == AGGREGATOR:
                if not any(rule_admits(r, 9443, "UDP", names) and r.get("from")
                           for p in selecting for r in ingress_rules(p)):
                    self.fail(where, "no NetworkPolicy admits agents to the QUIC ingest port 9443/UDP")
        for pol in policies:
            if scrape_policy(pol):
                self.envoy_admin_policy(f"{label} NetworkPolicy/{pol['metadata']['name']}", pol)
        if d.resolve() != self.kroot.resolve() and d.is_relative_to(self.kroot / "overlays"):
            self.security({d / "(rendered)": docs})
        if d.resolve() == (self.kroot / "overlays" / "ha").resolve():
            stores = [env.get("MESHCAT_STORE", "redb") for _, b, _, env, _, _, _
                      in self.meshcat_containers({d / "(rendered)": docs}) if b == AGGREGATOR]
            if not stores or not all(s.startswith("etcd://") for s in stores):
                self.fail(label, "the HA overlay must run every aggregator on an etcd store (MESHCAT_STORE=etcd://...)")

    def etcd_server(self, where: str, c: dict, pod: dict) -> None:
        flags = etcd_flags(c)
        for f in ETCD_HTTPS_FLAGS + ["initial-cluster"]:
            value = flags.get(f)
            if value is None:
                if f != "initial-cluster":
                    self.fail(where, f"--{f} is not set: etcd would listen on plain http (its default)")
                continue
            urls = [u.split("=", 1)[-1] for u in value.split(",")] if f == "initial-cluster" \
                else value.split(",")
            for u in urls:
                if not u.strip().startswith("https://"):
                    self.fail(where, f"--{f} has {u.strip()}: etcd must not speak plain http to clients or peers")
        for f in ["client-cert-auth", "peer-client-cert-auth"]:
            if flags.get(f, "false").lower() not in ("true", "1"):
                self.fail(where, f"--{f} is not on: etcd must demand a certificate of every "
                                 f"{'client' if f.startswith('client') else 'peer'}")
        for f in ["auto-tls", "peer-auto-tls"]:
            if flags.get(f, "false").lower() not in ("false", "0"):
                self.fail(where, f"--{f} is on: self-signed certificates that nobody verifies")
        for f in ETCD_TLS_FLAGS:
            if not flags.get(f):
                self.fail(where, f"--{f} is not set")
            elif f.endswith("key-file") and not self.secret_backed(flags[f], c, pod):
                self.fail(where, f"--{f}={flags[f]} is not on a volume made of Secrets")
        client = etcd_ports(pod)[0]
        names = container_port_names(pod)
        for probe in ["readinessProbe", "livenessProbe", "startupProbe"]:
            get = (c.get(probe) or {}).get("httpGet")
            if get and resolve_port(get.get("port"), names) == client:
                self.fail(where, f"{probe} is an httpGet on the client port {client}, which demands a "
                                 "client certificate: probe a plain-HTTP --listen-metrics-urls port")

    def etcd_policy(self, where: str, pol: dict, names: dict, ports: tuple[int, int]) -> None:
        client, peer = ports
        for i, rule in enumerate(ingress_rules(pol)):
            for port, who in [(client, AGGREGATOR), (peer, ETCD)]:
                if not rule_admits(rule, port, "TCP", names):
                    continue
                peers = rule.get("from") or []
                if not peers:
                    self.fail(where, f"ingress rule {i} admits etcd port {port} from anywhere; only {who} pods may reach it")
                for src in peers:
                    if not only_pods_of(src, who):
                        self.fail(where, f"ingress rule {i} admits etcd port {port} from {src}; "
                                         f"only {who} pods of this namespace may reach it")

    def component_policy(self, where: str, pol: dict, names: dict, role: str) -> None:
        allowed = POLICY_PORTS[role]
        for i, rule in enumerate(ingress_rules(pol)):
            entries = rule.get("ports")
            if not entries:
                self.fail(where, f"ingress rule {i} admits every port of the {role} pods")
                continue
            for e in entries:
                proto = e.get("protocol", "TCP")
                port = resolve_port(e.get("port"), names)
                if port is None or e.get("endPort") not in (None, port) or (port, proto) not in allowed:
                    self.fail(where, f"ingress rule {i} admits {e.get('port', 'every port')}/{proto}, "
                                     f"not one of the {role} ports {sorted(allowed)}")
            if role == AGENT and not rule.get("from"):
                self.fail(where, f"ingress rule {i} admits the agent's ops port from anywhere")

    def envoy_admin_policy(self, where: str, pol: dict) -> None:
        admits = False
        for i, rule in enumerate(ingress_rules(pol)):
            if not rule_admits(rule, ENVOY_ADMIN_PORT, "TCP", {}):
                continue
            peers = rule.get("from") or []
            if not peers:
                self.fail(where, f"ingress rule {i} admits the Envoy admin port {ENVOY_ADMIN_PORT} from anywhere")
            for src in peers:
                pod_sel = src.get("podSelector") or {}
                if "ipBlock" in src or (pod_sel.get("matchLabels") or {}).get(NAME_LABEL) != AGENT \
                        or pod_sel.get("matchExpressions"):
                    self.fail(where, f"ingress rule {i} admits the Envoy admin port from {src}, not only agent pods")
                else:
                    admits = True
        if not admits:
            self.fail(where, f"admits the Envoy admin port {ENVOY_ADMIN_PORT} to no agent pod")

    # 8. privileges -----------------------------------------------------------
    def privileges(self, manifests: dict[Path, list[dict]], pod_netns: bool | None = None) -> None:
        """Section 8 on one set of documents. `pod_netns` says whether their agent
        DaemonSet must run with MESHCAT_POD_NETNS (True: overlays/loopback-admin), must
        not (False: the base), or either (None)."""
        netns_agents = set()
        agent_daemonsets = []
        for _, binary, c, env, args, _, _ in self.meshcat_containers(manifests):
            if binary == AGENT and pod_netns_on(env, args):
                netns_agents.add(id(c))
        for f, docs in manifests.items():
            label = self.rel(f)
            for kind, name, _, pod in pod_templates(docs):
                where = f"{label} {kind}/{name}"
                containers = (pod.get("initContainers") or []) + (pod.get("containers") or [])
                runs_netns = any(id(c) in netns_agents for c in containers)
                if kind == "DaemonSet" and any(
                        os.path.basename((c.get("command") or [""])[0]) == AGENT for c in containers):
                    agent_daemonsets.append((where, runs_netns))
                self.pod_privileges(where, pod, containers, runs_netns, netns_agents)
        for where, runs_netns in agent_daemonsets:
            if pod_netns is True and not runs_netns:
                self.fail(where, "the loopback-admin overlay must run the agent with MESHCAT_POD_NETNS=true "
                                 "(each pod's admin on its loopback, inside its network namespace)")
            if pod_netns is False and runs_netns:
                self.fail(where, "the base DaemonSet must not turn on MESHCAT_POD_NETNS: it stays without "
                                 "hostPID and capabilities (overlays/loopback-admin turns it on)")
        if pod_netns is True and not agent_daemonsets:
            self.fail(self.rel(next(iter(manifests))), "the loopback-admin overlay has no agent DaemonSet")

    def pod_privileges(self, where: str, pod: dict, containers: list[dict], runs_netns: bool,
                       netns_agents: set[int]) -> None:
        """No host namespace, no added capability, no privilege, no escalation, a
        read-only root, a confining seccomp profile and AppArmor left on, and host
        paths only from HOST_PATHS, read-only; except that a pod whose agent reaches
        pods inside their network namespaces (MESHCAT_POD_NETNS) has hostPID and its
        agent container, run as uid 0, adds exactly LOOPBACK_CAPS."""
        for ns in ["hostNetwork", "hostIPC"]:
            if pod.get(ns):
                self.fail(where, f"{ns} is on: no shipped pod shares the node's {ns[4:]} namespace")
        if pod.get("hostPID") and not runs_netns:
            self.fail(where, "hostPID is on, but no agent of the pod runs with MESHCAT_POD_NETNS: only the "
                             "loopback-admin agent may see the node's processes")
        if runs_netns and not pod.get("hostPID"):
            self.fail(where, "the agent runs with MESHCAT_POD_NETNS but the pod lacks hostPID: true, so it "
                             "cannot see the pods' processes in /proc")
        pod_sc = pod.get("securityContext") or {}
        if (pod_sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
            self.fail(where, "AppArmor is Unconfined for the pod: keep the runtime's default profile")
        volumes = {v["name"]: v for v in pod.get("volumes") or []}
        for v in volumes.values():
            path = ((v.get("hostPath") or {}).get("path") or "").rstrip("/") or None
            if "hostPath" in v and path not in HOST_PATHS:
                self.fail(where, f"volume {v['name']} is hostPath {v['hostPath'].get('path')}: only "
                                 f"{', '.join(sorted(HOST_PATHS))} may come from the node")
        for c in containers:
            cw = f"{where} container {c['name']}"
            sc = c.get("securityContext") or {}
            caps = sc.get("capabilities") or {}
            drop = {cap_name(x) for x in caps.get("drop") or []}
            add = {cap_name(x) for x in caps.get("add") or []}
            if sc.get("privileged"):
                self.fail(cw, "is privileged")
            if sc.get("allowPrivilegeEscalation") is not False:
                self.fail(cw, "allowPrivilegeEscalation is not false")
            if sc.get("readOnlyRootFilesystem") is not True:
                self.fail(cw, "readOnlyRootFilesystem is not true")
            if "ALL" not in drop:
                self.fail(cw, "capabilities do not drop ALL")
            seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
            if seccomp not in ("RuntimeDefault", "Localhost"):
                self.fail(cw, f"seccomp profile is {seccomp or 'not set'}: use RuntimeDefault")
            if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
                self.fail(cw, "AppArmor is Unconfined: keep the runtime's default profile")
            if id(c) in netns_agents:
                if add != LOOPBACK_CAPS:
                    self.fail(cw, f"adds {sorted(add) or 'no capability'}; with MESHCAT_POD_NETNS the agent "
                                  f"adds exactly {' and '.join(sorted(LOOPBACK_CAPS))}")
                uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
                if uid != 0:
                    user = "the image's user" if uid is None else f"uid {uid}"
                    self.fail(cw, f"adds capabilities but runs as {user}: Kubernetes puts added "
                                  "capabilities in the effective set of uid 0 only")
            elif add:
                self.fail(cw, f"adds capabilities {sorted(add)}: only the agent with MESHCAT_POD_NETNS "
                              f"adds any ({' and '.join(sorted(LOOPBACK_CAPS))})")
            for m in c.get("volumeMounts") or []:
                if "hostPath" in volumes.get(m["name"], {}) and not m.get("readOnly"):
                    self.fail(cw, f"mounts hostPath volume {m['name']} writable")

    # 5. image ----------------------------------------------------------------
    def workspace_bins(self) -> set[str]:
        ws = tomllib.loads((self.root / "Cargo.toml").read_text())
        bins = set()
        for member in ws.get("workspace", {}).get("members", []):
            crate = tomllib.loads((self.root / member / "Cargo.toml").read_text())
            for b in crate.get("bin", []):
                bins.add(b["name"])
            if (self.root / member / "src" / "main.rs").exists():
                bins.add(crate["package"]["name"])
        return bins

    def image(self, manifests) -> None:
        bins = self.workspace_bins()
        dockerfile = self.root / "Dockerfile"
        text = dockerfile.read_text()
        m = re.findall(r"^ENTRYPOINT\s+(\[.*\])\s*$", text, re.M)
        if not m:
            self.fail("Dockerfile", "has no exec-form ENTRYPOINT")
        else:
            entry = yaml.safe_load(m[-1])[0]
            if os.path.basename(entry) not in bins:
                self.fail("Dockerfile", f"ENTRYPOINT {entry} is not a binary of the workspace ({sorted(bins)})")
        for src in re.findall(r"^COPY --from=\S+ (.+) /usr/local/bin/\s*$", text, re.M):
            for path in src.split():
                if os.path.basename(path) not in bins:
                    self.fail("Dockerfile", f"copies {path}, which is not a binary of the workspace")
        for where, binary, *_ in self.meshcat_containers(manifests):
            if binary not in bins:
                self.fail(where, f"command {binary} is not a binary of the workspace")


def strategic_merge(base, patch):
    """Kustomize's strategic merge for what the manifests use: maps merge, lists of
    objects merge by name (mountPath for volumeMounts), other lists are replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = strategic_merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(patch, list) and all(isinstance(x, dict) for x in base + patch):
        key = next((k for k in ("name", "mountPath", "containerPort")
                    if all(k in x for x in base + patch)), None)
        if key:
            out = [copy.deepcopy(x) for x in base]
            for item in patch:
                i = next((j for j, x in enumerate(out) if x[key] == item[key]), None)
                if i is None:
                    out.append(copy.deepcopy(item))
                else:
                    out[i] = strategic_merge(out[i], item)
            return out
    return copy.deepcopy(patch)


def cap_name(cap) -> str:
    """A capability as Kubernetes names it: `SYS_ADMIN` (a `CAP_` prefix dropped)."""
    c = str(cap).upper()
    return c[4:] if c.startswith("CAP_") else c


def pod_netns_on(env: dict[str, str], args: list[str]) -> bool:
    """Whether an agent reaches pods inside their network namespaces (--pod-netns):
    the flag, or MESHCAT_POD_NETNS with any value but false (one from elsewhere,
    `valueFrom`, counts as on: its privileges must then be the mode's)."""
    for a in args:
        m = re.fullmatch(r"--pod-netns(?:=(.*))?", a)
        if m:
            return (m.group(1) or "true").lower() not in ("false", "0", "")
    value = env.get("MESHCAT_POD_NETNS")
    return value is not None and value.lower() not in ("false", "0", "")


def pod_templates(docs: list[dict]):
    """(kind, name, labels, pod spec) of every workload."""
    for doc in docs:
        kind = doc.get("kind")
        if kind not in WORKLOAD_KINDS:
            continue
        if kind == "Pod":
            yield kind, doc["metadata"]["name"], doc["metadata"].get("labels") or {}, doc["spec"]
        else:
            tpl = doc["spec"].get("template") or {}
            yield (kind, doc["metadata"]["name"], (tpl.get("metadata") or {}).get("labels") or {},
                   tpl.get("spec") or {})


def is_etcd(c: dict) -> bool:
    cmd = c.get("command") or []
    if cmd:
        return os.path.basename(cmd[0]) == "etcd"
    return "etcd" in c.get("image", "").split("/")[-1].split(":")[0]


ETCD_BOOL_FLAGS = {"client-cert-auth", "peer-client-cert-auth", "auto-tls", "peer-auto-tls"}


def etcd_flags(c: dict) -> dict[str, str]:
    """etcd's settings from its ETCD_* variables and command line (the latter wins).
    A boolean flag given bare is "true"; `--flag value` takes the next argument."""
    flags = {}
    for e in c.get("env") or []:
        if e["name"].startswith("ETCD_") and "value" in e:
            flags[e["name"][5:].lower().replace("_", "-")] = str(e["value"])
    args = list((c.get("command") or [])[1:]) + list(c.get("args") or [])
    for i, a in enumerate(args):
        m = re.match(r"--?([a-z][a-z0-9-]*)(?:=(.*))?$", a)
        if not m:
            continue
        name, value = m.group(1), m.group(2)
        if value is None:
            nxt = args[i + 1] if i + 1 < len(args) else ""
            value = "true" if name in ETCD_BOOL_FLAGS or nxt.startswith("-") else nxt
        flags[name] = value
    return flags


def etcd_ports(pod: dict) -> tuple[int, int]:
    """The client and peer ports of the pod's etcd container (2379, 2380 by default)."""
    for c in pod.get("containers") or []:
        if is_etcd(c):
            flags = etcd_flags(c)
            ports = []
            for f, default in [("listen-client-urls", 2379), ("listen-peer-urls", 2380)]:
                m = re.search(r":(\d+)/?$", (flags.get(f) or "").split(",")[0])
                ports.append(int(m.group(1)) if m else default)
            return ports[0], ports[1]
    return 2379, 2380


def pod_role(labels: dict, pod: dict) -> str | None:
    """Which component these pods are, for the NetworkPolicy they need."""
    name = labels.get(NAME_LABEL)
    if name in (AGGREGATOR, AGENT, ETCD):
        return name
    if any(is_etcd(c) for c in pod.get("containers") or []):
        return ETCD
    return None


def container_port_names(pod: dict) -> dict[str, tuple[int, str]]:
    return {p["name"]: (p["containerPort"], p.get("protocol", "TCP"))
            for c in (pod.get("initContainers") or []) + (pod.get("containers") or [])
            for p in c.get("ports") or [] if p.get("name")}


def resolve_port(port, names: dict) -> int | None:
    """A port number, or a container port's name resolved to its number."""
    if isinstance(port, int):
        return port
    if isinstance(port, str):
        if port.isdigit():
            return int(port)
        if port in names:
            return names[port][0]
    return None


def selector_matches(sel: dict, labels: dict) -> bool:
    for k, v in (sel.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in sel.get("matchExpressions") or []:
        k, op, vals = e["key"], e["operator"], e.get("values") or []
        if op == "In" and labels.get(k) not in vals:
            return False
        if op == "NotIn" and labels.get(k) in vals:
            return False
        if op == "Exists" and k not in labels:
            return False
        if op == "DoesNotExist" and k in labels:
            return False
    return True


def policy_selects(pol: dict, labels: dict) -> bool:
    return selector_matches((pol.get("spec") or {}).get("podSelector") or {}, labels)


def policy_types(pol: dict) -> list[str]:
    spec = pol.get("spec") or {}
    return spec.get("policyTypes") or (["Ingress"] + (["Egress"] if spec.get("egress") else []))


def ingress_rules(pol: dict) -> list[dict]:
    return (pol.get("spec") or {}).get("ingress") or []


def rule_admits(rule: dict, port: int, proto: str, names: dict) -> bool:
    """Whether an ingress rule admits traffic to port/proto (from someone)."""
    entries = rule.get("ports")
    if not entries:
        return True
    for e in entries:
        if e.get("protocol", "TCP") != proto:
            continue
        if "port" not in e:
            return True
        if isinstance(e["port"], str) and not e["port"].isdigit():
            if names.get(e["port"]) == (port, proto):
                return True
            continue
        low = int(e["port"])
        if low == port or (e.get("endPort") is not None and low <= port <= int(e["endPort"])):
            return True
    return False


def only_pods_of(src: dict, name: str) -> bool:
    """Whether a `from` entry names only pods labelled NAME_LABEL=name in the policy's
    own namespace."""
    sel = src.get("podSelector")
    if "ipBlock" in src or "namespaceSelector" in src or sel is None:
        return False
    return (sel.get("matchLabels") or {}).get(NAME_LABEL) == name and not sel.get("matchExpressions")


def admits_from(rule: dict, port: int, proto: str, names: dict, who: str) -> bool:
    return rule_admits(rule, port, proto, names) and any(
        only_pods_of(src, who) for src in rule.get("from") or [])


def scrape_policy(pol: dict) -> bool:
    """A policy for application pods the DaemonSet scrapes (the Envoy admin template)."""
    sel = (pol.get("spec") or {}).get("podSelector") or {}
    return SCRAPE_LABEL in (sel.get("matchLabels") or {})


def self_test(root: Path, version: str, ha: Path, docs: list[dict]) -> tuple[list[str], int]:
    """Runs section 7 on the rendered HA overlay and on broken copies of it; returns
    what went wrong (a broken copy that passes, or a clean one that fails) and how
    many broken copies were tried."""
    def run(mutate) -> list[str]:
        ck = Checker(root, version)
        broken = copy.deepcopy(docs)
        mutate(broken)
        ck.store_and_policies(ha, broken)
        return ck.problems

    def containers(ds, pred):
        for _, _, _, pod in pod_templates(ds):
            for c in pod.get("containers") or []:
                if pred(c):
                    yield c

    def etcd_args(ds, edit):
        for c in containers(ds, is_etcd):
            c["args"] = [x for x in (edit(a) for a in c.get("args") or []) if x is not None]

    def drop_env(var):
        def m(ds):
            for c in containers(ds, lambda c: (c.get("command") or [""])[0] == AGGREGATOR):
                c["env"] = [e for e in c.get("env") or [] if e["name"] != var]
        return m

    def drop_policy(name):
        def m(ds):
            ds[:] = [d for d in ds if not (d.get("kind") == "NetworkPolicy"
                                           and d["metadata"]["name"] == name)]
        return m

    def open_etcd_client(ds):
        for d in ds:
            if d.get("kind") == "NetworkPolicy" and d["metadata"]["name"] == ETCD:
                for r in ingress_rules(d):
                    if rule_admits(r, 2379, "TCP", {}):
                        r["from"] = [{"namespaceSelector": {}}]

    cases = [
        ("etcd clients on plain http", lambda ds: etcd_args(
            ds, lambda a: a.replace("https://0.0.0.0:2379", "http://0.0.0.0:2379")), "plain http"),
        ("etcd peers on plain http", lambda ds: etcd_args(
            ds, lambda a: a.replace("https://", "http://") if a.startswith("--initial-cluster=") else a),
         "plain http"),
        ("etcd without --client-cert-auth", lambda ds: etcd_args(
            ds, lambda a: None if a.startswith("--client-cert-auth") else a), "--client-cert-auth"),
        ("etcd without --peer-client-cert-auth", lambda ds: etcd_args(
            ds, lambda a: None if a.startswith("--peer-client-cert-auth") else a), "--peer-client-cert-auth"),
        ("etcd without --trusted-ca-file", lambda ds: etcd_args(
            ds, lambda a: None if a.startswith("--trusted-ca-file") else a), "--trusted-ca-file"),
        ("aggregator on etcd without MESHCAT_ETCD_CA_FILE", drop_env("MESHCAT_ETCD_CA_FILE"),
         "MESHCAT_ETCD_CA_FILE"),
        ("aggregator on etcd without MESHCAT_ETCD_CERT", drop_env("MESHCAT_ETCD_CERT"), "MESHCAT_ETCD_CERT"),
        ("aggregator on etcd without MESHCAT_ETCD_KEY", drop_env("MESHCAT_ETCD_KEY"), "MESHCAT_ETCD_KEY"),
        ("no etcd NetworkPolicy", drop_policy(ETCD), "no NetworkPolicy selects these meshcat-etcd pods"),
        ("no aggregator NetworkPolicy", drop_policy(AGGREGATOR),
         "no NetworkPolicy selects these meshcat-aggregator pods"),
        ("no agent NetworkPolicy", drop_policy(AGENT), "no NetworkPolicy selects these meshcat-agent pods"),
        ("etcd client port open to every namespace", open_etcd_client, "only meshcat-aggregator pods"),
    ]
    if run(lambda ds: None):
        # The overlay itself fails (reported by the check proper): nothing to compare.
        return [], 0
    failures = []
    for what, mutate, expected in cases:
        problems = run(mutate)
        if not any(expected in p for p in problems):
            failures.append(f"{what} is not caught (expected a problem naming {expected!r}; got {problems})")
    return failures, len(cases)


def privileges_self_test(root: Path, version: str, overlay: Path, overlay_docs: list[dict],
                         base: Path, base_docs: list[dict]) -> tuple[list[str], int]:
    """Runs section 8 on the rendered loopback-admin overlay and base, and on broken
    copies of them; returns what went wrong (a broken copy that passes) and how many
    broken copies were tried."""
    def run(d, docs, netns, mutate) -> list[str]:
        ck = Checker(root, version)
        broken = copy.deepcopy(docs)
        mutate(broken)
        ck.privileges({d / "(rendered)": broken}, netns)
        return ck.problems

    def pods(ds):
        return [pod for _, _, _, pod in pod_templates(ds)]

    def agent(edit):
        def m(ds):
            for pod in pods(ds):
                for c in pod.get("containers") or []:
                    if os.path.basename((c.get("command") or [""])[0]) == AGENT:
                        edit(c.setdefault("securityContext", {}), c, pod)
        return m

    def caps(edit):
        return agent(lambda sc, c, pod: edit(sc.setdefault("capabilities", {})))

    def agent_pod(edit):
        return agent(lambda sc, c, pod: edit(pod))

    def setting(value):
        def m(ds):
            for d in ds:
                if d.get("kind") == "ConfigMap" and d["metadata"]["name"] == AGENT:
                    data = d.setdefault("data", {})
                    if value is None:
                        data.pop("MESHCAT_POD_NETNS", None)
                    else:
                        data["MESHCAT_POD_NETNS"] = value
        return m

    def host_root(pod):
        pod.setdefault("volumes", []).append({"name": "node-root", "hostPath": {"path": "/"}})
        pod["containers"][-1].setdefault("volumeMounts", []).append(
            {"name": "node-root", "mountPath": "/host", "readOnly": True})

    def logs_writable(pod):
        for c in pod.get("containers") or []:
            for mount in c.get("volumeMounts") or []:
                if mount["mountPath"] == "/var/log/pods":
                    mount["readOnly"] = False

    def discover_adds(ds):
        for pod in pods(ds):
            for c in pod.get("initContainers") or []:
                c.setdefault("securityContext", {}).setdefault("capabilities", {})["add"] = ["SYS_ADMIN"]

    exact = "adds exactly SYS_ADMIN and SYS_PTRACE"
    only_netns = "only the agent with MESHCAT_POD_NETNS adds any"
    overlay_cases = [
        ("agent adds NET_ADMIN as well", caps(lambda cp: cp["add"].append("NET_ADMIN")), exact),
        ("agent adds CAP_SYS_ADMIN alone", caps(lambda cp: cp.update(add=["CAP_SYS_ADMIN"])), exact),
        ("agent drops nothing", caps(lambda cp: cp.pop("drop", None)), "do not drop ALL"),
        ("agent privileged", agent(lambda sc, c, pod: sc.update(privileged=True)), "is privileged"),
        ("agent may escalate", agent(lambda sc, c, pod: sc.update(allowPrivilegeEscalation=True)),
         "allowPrivilegeEscalation"),
        ("agent root filesystem writable", agent(lambda sc, c, pod: sc.update(readOnlyRootFilesystem=False)),
         "readOnlyRootFilesystem"),
        ("agent under seccomp Unconfined",
         agent(lambda sc, c, pod: sc.update(seccompProfile={"type": "Unconfined"})),
         "seccomp profile is Unconfined"),
        ("agent under AppArmor Unconfined",
         agent(lambda sc, c, pod: sc.update(appArmorProfile={"type": "Unconfined"})), "AppArmor is Unconfined"),
        ("agent as uid 65532", agent(lambda sc, c, pod: sc.update(runAsUser=65532, runAsNonRoot=True)),
         "runs as uid 65532"),
        ("pod without hostPID", agent_pod(lambda pod: pod.pop("hostPID", None)), "lacks hostPID"),
        ("pod on the node's network", agent_pod(lambda pod: pod.update(hostNetwork=True)), "hostNetwork is on"),
        ("the node's root mounted", agent_pod(host_root), "only /var/log/pods may come from the node"),
        ("pod logs mounted writable", agent_pod(logs_writable), "writable"),
        ("discover adds SYS_ADMIN", discover_adds, only_netns),
        ("MESHCAT_POD_NETNS off", setting(None), "must run the agent with MESHCAT_POD_NETNS"),
    ]
    base_cases = [
        ("base DaemonSet with hostPID", agent_pod(lambda pod: pod.update(hostPID=True)), "hostPID is on"),
        ("base agent adds SYS_PTRACE", caps(lambda cp: cp.update(add=["SYS_PTRACE"])), only_netns),
        ("base agent with MESHCAT_POD_NETNS", setting("true"), "base DaemonSet must not turn on"),
    ]
    if run(overlay, overlay_docs, True, lambda ds: None) or run(base, base_docs, False, lambda ds: None):
        # The manifests themselves fail (reported by the check proper): nothing to compare.
        return [], 0
    failures = []
    for d, docs, netns, cases in [(overlay, overlay_docs, True, overlay_cases),
                                  (base, base_docs, False, base_cases)]:
        for what, mutate, expected in cases:
            problems = run(d, docs, netns, mutate)
            if not any(expected in p for p in problems):
                failures.append(f"{what} is not caught (expected a problem naming {expected!r}; got {problems})")
    return failures, len(overlay_cases) + len(base_cases)


def accepted_from_help(text: str) -> tuple[set[str], set[str]]:
    flags = set(FLAG_RE.findall(text))
    envs = set(ENV_RE.findall(text))
    # Contract section 9: every flag is also read from MESHCAT_<FLAG_IN_UPPER_SNAKE>.
    envs |= {"MESHCAT_" + f.upper().replace("-", "_") for f in flags}
    return flags, envs


def accepted_from_doc(text: str) -> dict[str, tuple[set[str], set[str]]]:
    """Splits docs/configuration.md by headings naming one binary; text under other
    headings counts for both."""
    parts = {AGGREGATOR: [], AGENT: []}
    current = None
    for line in text.splitlines():
        if line.startswith("#"):
            low = line.lower()
            current = AGGREGATOR if "aggregator" in low else AGENT if "agent" in low else None
        for b in parts:
            if current in (None, b):
                parts[b].append(line)
    return {b: accepted_from_help("\n".join(lines)) for b, lines in parts.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--kubernetes-version", default="1.31.0")
    ap.add_argument("--aggregator-help", type=Path)
    ap.add_argument("--agent-help", type=Path)
    ap.add_argument("--config-doc", type=Path)
    ap.add_argument("--kubectl")
    a = ap.parse_args()

    ck = Checker(a.root.resolve(), a.kubernetes_version)
    manifests, default_reach, kdirs = ck.layout()
    ck.schema(manifests, default_reach)
    rendered = ck.render(kdirs, a.kubectl)
    if a.aggregator_help and a.agent_help:
        accepted = {AGGREGATOR: accepted_from_help(a.aggregator_help.read_text()),
                    AGENT: accepted_from_help(a.agent_help.read_text())}
        source = "--help of the built binaries"
    else:
        accepted = accepted_from_doc(a.config_doc.read_text())
        source = str(a.config_doc.relative_to(ck.root))
    for b, (flags, _) in accepted.items():
        if not flags:
            ck.fail(source, f"lists no flags for {b}")
    ck.command_lines(manifests, accepted)
    ck.contract(manifests)
    ck.image(manifests)
    ck.security(manifests)
    ha = ck.kroot / "overlays" / "ha"
    if ha not in rendered:
        ck.fail(ck.rel(ha), "the HA overlay is missing or does not render")
    else:
        failures, tried = self_test(ck.root, ck.version, ha, rendered[ha])
        for f in failures:
            ck.fail("check_deploy.py self-test", f)
        if not tried:
            ck.notes.append("self-test skipped: the HA overlay itself fails the etcd and NetworkPolicy checks")
        ck.counts["selftest"] = tried - len(failures)
    for d, docs in rendered.items():
        ck.store_and_policies(d, docs)
        if d.is_relative_to(ck.kroot / "overlays"):
            # Overlays change settings and pods through patches: their command lines,
            # ports and probes are checked as rendered, like the base's files.
            ck.command_lines({d / "(rendered)": docs}, accepted)
            ck.contract({d / "(rendered)": docs})
    ck.privileges(manifests)
    loopback = ck.kroot.joinpath(*LOOPBACK_OVERLAY)
    base = (ck.kroot, ck.kroot / "agent")
    for d, docs in rendered.items():
        netns = True if d == loopback else False if d in base else None
        ck.privileges({d / "(rendered)": docs}, netns)
    if loopback not in rendered or ck.kroot not in rendered:
        ck.fail(ck.rel(loopback), "the loopback-admin overlay or the base is missing or does not render")
    else:
        failures, tried = privileges_self_test(ck.root, ck.version, loopback, rendered[loopback],
                                               ck.kroot, rendered[ck.kroot])
        for f in failures:
            ck.fail("check_deploy.py self-test", f)
        if not tried:
            ck.notes.append("privileges self-test skipped: the loopback-admin overlay or the base itself "
                            "fails the privilege checks")
        ck.counts["privselftest"] = tried - len(failures)
    if rendered and not any(scrape_policy(doc) for docs in rendered.values() for doc in docs
                            if doc.get("kind") == "NetworkPolicy"):
        ck.fail("deploy/kubernetes", "no NetworkPolicy template for the Envoy admin port of scraped "
                                     f"pods ({SCRAPE_LABEL}=true; deploy/kubernetes/envoy-admin-policy)")

    for n in ck.notes:
        print(f"note: {n}")
    for p in ck.problems:
        print(f"error: {p}")
    c = ck.counts
    if ck.problems:
        print(f"check-deploy: FAILED with {len(ck.problems)} problem(s) in {c['files']} manifest file(s)")
        return 1
    print(f"check-deploy: OK: {c['files']} manifest files, {c['resources']} resources "
          f"({c['rendered']} rendered) valid for Kubernetes {a.kubernetes_version} (strict); "
          f"{c['flags']} flags and {c['envs']} MESHCAT_* settings known to the binaries "
          f"(source: {source}); ports, probes and image consistent with the contract; "
          f"tokens and keys from Secrets, zones from namespaces; etcd on TLS with client "
          f"certificates and NetworkPolicies for aggregator, agent and etcd "
          f"(self-test: {c.get('selftest', 0)} broken variants caught); no host namespace, "
          f"capability or privilege beyond the loopback-admin agent's hostPID, SYS_ADMIN and "
          f"SYS_PTRACE (self-test: {c.get('privselftest', 0)} broken variants caught)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
