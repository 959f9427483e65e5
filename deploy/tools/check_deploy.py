"""Checks the Kubernetes manifests under deploy/kubernetes.

Run by scripts/check-deploy.sh inside the project's .venv (kubernetes-validate and
PyYAML). It checks, and reports every problem before failing:

1. layout: every YAML file is a kustomization, a file a kustomization generates a
   ConfigMap from, or a manifest some kustomization lists; every path a kustomization
   names exists;
2. schema: every manifest (and, when kubectl is present, every rendered kustomization)
   validates against the pinned Kubernetes version in strict mode; only the optional
   CRD kinds listed in OPTIONAL_CRDS may lack a schema, and only outside the default
   kustomization;
3. command lines: every `--flag` and `MESHCAT_*` variable given to a meshcat container
   is one its binary accepts (from `--help`, or from docs/configuration.md);
4. contract: ports 9080/TCP, 9443/UDP, 9091/TCP (aggregator) and 9092/TCP (agent),
   probes on /healthz and /readyz, Prometheus annotations on /metrics;
5. image: the Dockerfile's ENTRYPOINT and every container command name a binary of
   the workspace;
6. security (docs/security.md): the aggregator reads its write and read tokens, and
   every key and token file, from Secret volumes; an agent whose ops port is not on
   loopback has an ops token from a Secret; an agent's zone is its pod's namespace
   (never a label or annotation the pod sets); no shipped manifest turns on
   development mode or anonymous writes.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml
import kubernetes_validate

OPTIONAL_CRDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}
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
        return str(p.relative_to(self.root))

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
            if rf not in listed:
                self.fail(self.rel(f), "not listed by any kustomization.yaml")
            try:
                docs = [d for d in yaml.safe_load_all(f.read_text()) if d is not None]
            except yaml.YAMLError as e:
                self.fail(self.rel(f), f"not valid YAML: {e}")
                continue
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
                self.check_servicemonitor(label, doc)
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

    def schema(self, manifests: dict[Path, list[dict]], default_reach: set[Path]) -> None:
        for f, docs in manifests.items():
            self.counts["files"] += 1
            for doc in docs:
                self.counts["resources"] += 1
                self.validate_doc(self.rel(f), doc, optional_ok=f not in default_reach)

    def render(self, kdirs: list[Path], kubectl: str | None) -> None:
        if not kubectl:
            self.notes.append("kustomize render skipped (no kubectl)")
            return
        for d in kdirs:
            out = subprocess.run([kubectl, "kustomize", str(d)], capture_output=True, text=True)
            if out.returncode != 0:
                self.fail(self.rel(d), f"kubectl kustomize failed: {out.stderr.strip()}")
                continue
            optional_ok = d.resolve() != self.kroot.resolve()
            for doc in yaml.safe_load_all(out.stdout):
                if doc:
                    self.counts["rendered"] += 1
                    self.validate_doc(f"{self.rel(d)} (rendered)", doc, optional_ok)

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
            if binary == AGENT:
                host = eff.get("MESHCAT_OPS_ADDR", "127.0.0.1:9092").rpartition(":")[0]
                if host not in ("127.0.0.1", "localhost", "[::1]"):
                    wanted.append("MESHCAT_OPS_TOKEN_FILE")
            for var in wanted:
                if var not in eff:
                    self.fail(where, f"{var} is not set (docs/security.md)")
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
    ck.render(kdirs, a.kubectl)
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
          f"tokens and keys from Secrets, zones from namespaces")
    return 0


if __name__ == "__main__":
    sys.exit(main())
