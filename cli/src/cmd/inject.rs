//! `meshcat inject -f FILE`: the agent's sidecar mode, in the manner of `linkerd
//! inject` (contract section 18). Reads Kubernetes objects (YAML documents, a `List`,
//! or JSON) and prints every one of them, in order, as YAML: the pod template of
//! each `apps/v1` Deployment, StatefulSet and DaemonSet gets the agent's container
//! (the one of `deploy/kubernetes/agent-sidecar`, its settings written into it), the
//! Secret volumes it mounts and the label the aggregator's NetworkPolicy admits; any
//! other object passes through as it is. One line per object on standard error says
//! what was done. Every object is checked before anything is printed. It reads only
//! the file: no API, no cluster.

use std::fmt;
use std::io::Write;
use std::path::Path;

use meshcat_common::pods::{
    ADMIN_PORT_ANNOTATION, CLUSTER_ANNOTATION, MESH_ANNOTATION, admin_port_of, mesh_of,
};
use meshcat_common::validate::is_valid_name;
use serde_json::{Map, Value, json};

use super::emit;
use crate::args::{InjectArgs, aggregator_host};
use crate::catalog::{self, Problem};
use crate::client::CliError;
use crate::render::{self, printable, quoted};

/// The agent container's name: a pod that has it is injected already.
pub const CONTAINER: &str = "meshcat-agent";
/// The pod label the aggregator's NetworkPolicy admits to QUIC ingest.
pub const AGENT_LABEL: &str = "meshcat.io/agent";
/// The volume of the TLS Secret, and where the agent finds it.
const TLS_VOLUME: &str = "meshcat-agent-tls";
const TLS_DIR: &str = "/etc/meshcat/tls";
/// The volume of the ops token Secret, its one key, and where the agent finds it.
const OPS_TOKEN_VOLUME: &str = "meshcat-agent-ops-token";
const OPS_TOKEN_KEY: &str = "ops-token";
const OPS_TOKEN_DIR: &str = "/etc/meshcat/ops-token";
/// The name of the agent's ops port: unique in the pod, unlike the example's `ops`.
const OPS_PORT_NAME: &str = "meshcat-ops";
/// The user and group of the meshcat image.
const AGENT_UID: u32 = 65532;
/// The Secrets' files readable by all: the agent runs as its own user, and without
/// the pod's `fsGroup` (which inject does not set: it would change the owner of the
/// application's volumes) a 0440 file would be root's alone. Only the agent's
/// container mounts these volumes.
const SECRET_MODE: u32 = 0o444;

/// What every added container carries: the command line's settings, checked by clap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sidecar {
    /// The agent's image.
    pub image: String,
    /// Where the agent reports: one or more `host:port`.
    pub aggregator: String,
    /// The name the aggregator's certificate must carry.
    pub server_name: String,
    /// The Secret of the agent's certificate and the aggregator's CA.
    pub tls_secret: String,
    /// The Secret of the token `PUT /logging` on the ops port needs.
    pub ops_token_secret: String,
    /// The ConfigMap read as environment, when one is named.
    pub config_map: Option<String>,
    /// The agent's ops port, on the pod IP.
    pub ops_port: u16,
}

impl Sidecar {
    pub fn new(a: &InjectArgs) -> Sidecar {
        Sidecar {
            image: a.image.clone(),
            aggregator: a.aggregator.clone(),
            server_name: a
                .server_name
                .clone()
                .unwrap_or_else(|| aggregator_host(&a.aggregator).to_owned()),
            tls_secret: a.tls_secret.clone(),
            ops_token_secret: a.ops_token_secret.clone(),
            config_map: Some(a.config_map.clone()).filter(|c| !c.is_empty()),
            ops_port: a.ops_port,
        }
    }

    /// The agent's container for one pod: its zone is the pod's namespace, its
    /// instance the pod's name (both from the downward API, expanded by the kubelet
    /// in the arguments), its cluster and admin port what the pod's annotations say.
    pub fn container(&self, cluster: &str, admin_port: u16) -> Value {
        let field = |name: &str, path: &str| json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}});
        let value = |name: &str, value: String| json!({"name": name, "value": value});
        let mut c = json!({
            "name": CONTAINER,
            "image": self.image,
            "imagePullPolicy": "IfNotPresent",
            "command": ["meshcat-agent"],
            // The cluster is a checked name: no `$(` for the kubelet to expand.
            "args": [
                "--zone=$(POD_NAMESPACE)",
                format!("--cluster={cluster}"),
                "--instance=$(POD_NAME)",
            ],
            "env": [
                field("POD_NAME", "metadata.name"),
                field("POD_NAMESPACE", "metadata.namespace"),
                value("MESHCAT_AGGREGATOR", self.aggregator.clone()),
                value("MESHCAT_SERVER_NAME", self.server_name.clone()),
                value("MESHCAT_CA_FILE", format!("{TLS_DIR}/ca.crt")),
                value("MESHCAT_CERT", format!("{TLS_DIR}/tls.crt")),
                value("MESHCAT_KEY", format!("{TLS_DIR}/tls.key")),
                value("MESHCAT_SIDECAR_ADMIN", format!("127.0.0.1:{admin_port}")),
                // Probes and Prometheus reach the pod IP; PUT /logging there needs
                // the ops token.
                value("MESHCAT_OPS_ADDR", format!("0.0.0.0:{}", self.ops_port)),
                value("MESHCAT_OPS_TOKEN_FILE", format!("{OPS_TOKEN_DIR}/{OPS_TOKEN_KEY}")),
            ],
            "ports": [
                {"name": OPS_PORT_NAME, "containerPort": self.ops_port, "protocol": "TCP"},
            ],
            "livenessProbe": {
                "httpGet": {"path": "/healthz", "port": OPS_PORT_NAME},
                "initialDelaySeconds": 10,
                "periodSeconds": 10,
            },
            "readinessProbe": {
                "httpGet": {"path": "/healthz", "port": OPS_PORT_NAME},
                "periodSeconds": 10,
            },
            "resources": {
                "requests": {"cpu": "20m", "memory": "32Mi"},
                "limits": {"cpu": "200m", "memory": "128Mi"},
            },
            // The example's pod-level settings too, on the container: the pod is the
            // application's, and must not change for the agent.
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "capabilities": {"drop": ["ALL"]},
                "runAsNonRoot": true,
                "runAsUser": AGENT_UID,
                "runAsGroup": AGENT_UID,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "volumeMounts": [
                {"name": TLS_VOLUME, "mountPath": TLS_DIR, "readOnly": true},
                {"name": OPS_TOKEN_VOLUME, "mountPath": OPS_TOKEN_DIR, "readOnly": true},
            ],
        });
        if let Some(cm) = &self.config_map {
            c["envFrom"] = json!([{"configMapRef": {"name": cm, "optional": true}}]);
        }
        c
    }

    /// The volumes the container mounts.
    pub fn volumes(&self) -> [Value; 2] {
        [
            json!({"name": TLS_VOLUME, "secret": {
                "secretName": self.tls_secret,
                "defaultMode": SECRET_MODE,
            }}),
            json!({"name": OPS_TOKEN_VOLUME, "secret": {
                "secretName": self.ops_token_secret,
                "defaultMode": SECRET_MODE,
                "items": [{"key": OPS_TOKEN_KEY, "path": OPS_TOKEN_KEY}],
            }}),
        ]
    }
}

/// Whether inject adds the agent to objects of this kind (those of [`APPS_V1`]).
/// Not Jobs: their pods would never complete beside an agent that never exits.
pub fn is_workload(kind: &str) -> bool {
    matches!(kind, "Deployment" | "StatefulSet" | "DaemonSet")
}

/// The only apiVersion of the workloads that Kubernetes still serves.
const APPS_V1: &str = "apps/v1";

/// Why an object was left as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    /// Its pod already runs the agent.
    AlreadyInjected,
    /// Not a workload inject changes.
    Kind(String),
    /// A workload of another apiVersion than `apps/v1`.
    ApiVersion(String),
}

/// What was done with one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Injected,
    Skipped(Skip),
}

/// One line of the summary: an object and what was done with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub kind: String,
    pub name: String,
    pub outcome: Outcome,
}

impl fmt::Display for Report {
    /// `deployment "catalog" injected`, `service "catalog" skipped: kind Service`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", object_name(&self.kind, &self.name))?;
        match &self.outcome {
            Outcome::Injected => write!(f, " injected"),
            Outcome::Skipped(Skip::AlreadyInjected) => write!(f, " skipped: already injected"),
            Outcome::Skipped(Skip::Kind(k)) => write!(f, " skipped: kind {}", printable(k)),
            Outcome::Skipped(Skip::ApiVersion(v)) => {
                write!(f, " skipped: apiVersion {}, not {APPS_V1}", printable(v))
            }
        }
    }
}

/// `deployment "catalog"`, as kubectl and linkerd name objects, safe to print.
fn object_name(kind: &str, name: &str) -> String {
    format!("{} {}", printable(&kind.to_lowercase()), quoted(name))
}

/// The objects of a file, injected, with what was done with each.
#[derive(Debug, Clone)]
pub struct Injected {
    /// Every document, in order.
    pub documents: Vec<Value>,
    /// One per object (a List's items each have theirs).
    pub reports: Vec<Report>,
}

impl Injected {
    /// The documents as YAML, separated by `---`.
    pub fn yaml(&self) -> Result<String, CliError> {
        let mut out = String::new();
        for (i, d) in self.documents.iter().enumerate() {
            if i > 0 {
                out.push_str("---\n");
            }
            out.push_str(&render::yaml(d)?);
        }
        Ok(out)
    }
}

pub fn run(args: InjectArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let sidecar = Sidecar::new(&args);
    let name = if args.file == Path::new("-") {
        "standard input".to_owned()
    } else {
        printable(&args.file.display().to_string())
    };
    let text = catalog::read(&args.file).map_err(|why| CliError::File(format!("{name}: {why}")))?;
    let done = inject(&name, &text, &sidecar).map_err(|list| {
        CliError::File(
            list.iter()
                .map(Problem::to_string)
                .collect::<Vec<_>>()
                .join("\n"),
        )
    })?;
    emit(out, &done.yaml()?)?;
    let mut err = anstream::stderr();
    for r in &done.reports {
        let _ = writeln!(err, "{r}");
    }
    Ok(())
}

/// Reads the documents of `text` (named `file` in problems) and adds the agent to
/// each workload. Numbers are read as Kubernetes reads them (YAML 1.1: `0440` is
/// octal), so that what passes through means what it meant. Every problem, or none.
pub fn inject(file: &str, text: &str, sidecar: &Sidecar) -> Result<Injected, Vec<Problem>> {
    let problem = |document: Option<usize>, refusal: Refusal| Problem {
        file: file.to_owned(),
        document,
        record: refusal.record,
        why: refusal.why,
    };
    let options = serde_saphyr::options! { legacy_octal_numbers: true };
    let mut documents: Vec<Value> = serde_saphyr::from_multiple_with_options(text, options)
        .map_err(|e| {
            vec![problem(
                None,
                Refusal::new(format!("not valid YAML: {}", catalog::yaml_error(&e))),
            )]
        })?;
    if documents.is_empty() {
        return Err(vec![problem(None, Refusal::new("no document found"))]);
    }
    let mut reports = Vec::new();
    let mut problems = Vec::new();
    for (i, d) in documents.iter_mut().enumerate() {
        let mut refused = Vec::new();
        object(d, "", sidecar, &mut reports, &mut refused);
        problems.extend(refused.into_iter().map(|r| problem(Some(i + 1), r)));
    }
    if problems.is_empty() {
        Ok(Injected { documents, reports })
    } else {
        Err(problems)
    }
}

/// Why an object cannot be injected: which one (when it can be named) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Refusal {
    record: Option<String>,
    why: String,
}

impl Refusal {
    fn new(why: impl Into<String>) -> Refusal {
        Refusal {
            record: None,
            why: why.into(),
        }
    }
}

/// One object, a List's items one by one; `at` names the item (`item 3, `) in a List.
fn object(
    v: &mut Value,
    at: &str,
    sidecar: &Sidecar,
    reports: &mut Vec<Report>,
    refused: &mut Vec<Refusal>,
) {
    let whole = || at.trim_end_matches(", ").to_owned();
    let Value::Object(m) = v else {
        refused.push(Refusal {
            record: Some(whole()).filter(|w| !w.is_empty()),
            why: format!("not a mapping (a Kubernetes object) but {}", type_of(v)),
        });
        return;
    };
    let kind = match m.get("kind") {
        Some(Value::String(k)) => k.clone(),
        other => {
            let why = match other {
                None => "no kind".to_owned(),
                Some(v) => format!("kind is {}, not a string", type_of(v)),
            };
            refused.push(Refusal {
                record: Some(whole()).filter(|w| !w.is_empty()),
                why,
            });
            return;
        }
    };
    let name = m
        .get("metadata")
        .and_then(|meta| meta.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let record = format!("{at}{}", object_name(&kind, &name));
    if kind.ends_with("List")
        && let Some(items) = m.get_mut("items")
    {
        let Value::Array(items) = items else {
            refused.push(Refusal {
                record: Some(record),
                why: format!("items is {}, not a list", type_of(items)),
            });
            return;
        };
        for (j, item) in items.iter_mut().enumerate() {
            object(
                item,
                &format!("{at}item {}, ", j + 1),
                sidecar,
                reports,
                refused,
            );
        }
        return;
    }
    let mut report = |outcome| {
        reports.push(Report {
            kind: kind.clone(),
            name: name.clone(),
            outcome,
        });
    };
    if !is_workload(&kind) {
        report(Outcome::Skipped(Skip::Kind(kind.clone())));
        return;
    }
    let api = m.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    if api != APPS_V1 {
        report(Outcome::Skipped(Skip::ApiVersion(api.to_owned())));
        return;
    }
    match add_agent(m, &name, sidecar) {
        Ok(outcome) => report(outcome),
        Err(why) => refused.push(Refusal {
            record: Some(record),
            why,
        }),
    }
}

/// What a value is, for a message.
fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// The mapping at `key` of `m`; absent is `None`, another type an error.
fn mapping<'a>(
    m: &'a Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<&'a Map<String, Value>>, String> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(o)) => Ok(Some(o)),
        Some(other) => Err(format!("{path} is {}, not a mapping", type_of(other))),
    }
}

/// The list at `key` of `m`; absent is empty, another type an error.
fn list<'a>(m: &'a Map<String, Value>, key: &str, path: &str) -> Result<&'a [Value], String> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(other) => Err(format!("{path} is {}, not a list", type_of(other))),
    }
}

/// What the pod template's annotations choose: the cluster and the admin port.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    cluster: String,
    admin_port: u16,
}

/// Reads the cluster (annotation, else the workload's name) and the admin port
/// (annotation, else the mesh's, else
/// [`meshcat_common::pods::DEFAULT_ADMIN_PORT`]), checked as the
/// agent checks them.
fn target(annotations: Option<&Map<String, Value>>, name: &str) -> Result<Target, String> {
    let annotation = |key: &str| -> Result<Option<&str>, String> {
        match annotations.and_then(|a| a.get(key)) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(format!(
                "annotation {key} is {}, not a string",
                type_of(other)
            )),
        }
    };
    let cluster = match annotation(CLUSTER_ANNOTATION)? {
        Some(c) if is_valid_name(c) => c.to_owned(),
        Some(c) => {
            return Err(format!(
                "{CLUSTER_ANNOTATION} {} is not a valid cluster name",
                quoted(c)
            ));
        }
        None if name.is_empty() => {
            return Err(format!(
                "no metadata.name, and no {CLUSTER_ANNOTATION} annotation to name the cluster"
            ));
        }
        None if is_valid_name(name) => name.to_owned(),
        None => {
            return Err(format!(
                "the name {} is not a valid cluster name: set {CLUSTER_ANNOTATION}",
                quoted(name)
            ));
        }
    };
    let mesh = mesh_of(annotation(MESH_ANNOTATION)?)?;
    let admin_port = admin_port_of(annotation(ADMIN_PORT_ANNOTATION)?, mesh)?;
    Ok(Target {
        cluster,
        admin_port,
    })
}

/// Adds the agent to a workload's pod template, unless it runs one already. Checks
/// everything before it changes anything.
fn add_agent(
    workload: &mut Map<String, Value>,
    name: &str,
    sidecar: &Sidecar,
) -> Result<Outcome, String> {
    let template = workload
        .get("spec")
        .and_then(|s| s.get("template"))
        .and_then(Value::as_object)
        .ok_or("no spec.template")?;
    let pod = mapping(template, "spec", "spec.template.spec")?.ok_or("no spec.template.spec")?;
    let containers = match pod.get("containers") {
        Some(Value::Array(c)) => c,
        None | Some(Value::Null) => return Err("no spec.template.spec.containers".into()),
        Some(other) => {
            return Err(format!(
                "spec.template.spec.containers is {}, not a list",
                type_of(other)
            ));
        }
    };
    let init = list(pod, "initContainers", "spec.template.spec.initContainers")?;
    let all: Vec<&Map<String, Value>> = containers
        .iter()
        .chain(init)
        .map(|c| {
            c.as_object()
                .ok_or_else(|| format!("a container is {}, not a mapping", type_of(c)))
        })
        .collect::<Result<_, _>>()?;
    if all
        .iter()
        .any(|c| c.get("name").and_then(Value::as_str) == Some(CONTAINER))
    {
        return Ok(Outcome::Skipped(Skip::AlreadyInjected));
    }
    for c in &all {
        let taken = list(c, "ports", "a container's ports")?.iter().any(|p| {
            p.get("containerPort").and_then(Value::as_u64) == Some(sidecar.ops_port.into())
        });
        if taken {
            let owner = c.get("name").and_then(Value::as_str).unwrap_or("");
            return Err(format!(
                "container {} has port {}, the agent's ops port: choose another with --ops-port",
                quoted(owner),
                sidecar.ops_port
            ));
        }
    }
    let meta = mapping(template, "metadata", "spec.template.metadata")?;
    let annotations = match meta {
        Some(m) => mapping(m, "annotations", "spec.template.metadata.annotations")?,
        None => None,
    };
    if let Some(m) = meta {
        mapping(m, "labels", "spec.template.metadata.labels")?;
    }
    list(pod, "volumes", "spec.template.spec.volumes")?;
    let target = target(annotations, name)?;

    // Checked: from here on nothing fails.
    let template = &mut workload["spec"]["template"];
    let labels = &mut template["metadata"]["labels"];
    if labels.is_null() {
        *labels = json!({});
    }
    labels[AGENT_LABEL] = json!("true");
    let pod = &mut template["spec"];
    if let Some(c) = pod["containers"].as_array_mut() {
        c.push(sidecar.container(&target.cluster, target.admin_port));
    }
    if pod["volumes"].is_null() {
        pod["volumes"] = json!([]);
    }
    if let Some(volumes) = pod["volumes"].as_array_mut() {
        // A volume of that name that the pod has already is the operator's own (a
        // projected or CSI volume in place of the Secret): it is kept.
        for v in sidecar.volumes() {
            if !volumes.iter().any(|have| have.get("name") == v.get("name")) {
                volumes.push(v);
            }
        }
    }
    Ok(Outcome::Injected)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::args::{Cli, Command};

    const WORKLOADS: &str = include_str!("../../tests/fixtures/inject_workloads.yaml");

    /// The command line's own settings for these flags.
    fn sidecar(flags: &[&str]) -> Sidecar {
        let mut args = vec!["meshcat", "inject", "-f", "-"];
        args.extend_from_slice(flags);
        match Cli::try_parse_from(args).unwrap().command {
            Command::Inject(a) => Sidecar::new(&a),
            other => panic!("{other:?}"),
        }
    }

    fn run(text: &str) -> Result<Injected, Vec<String>> {
        inject("app.yaml", text, &sidecar(&[]))
            .map_err(|p| p.iter().map(Problem::to_string).collect())
    }

    fn lines(done: &Injected) -> Vec<String> {
        done.reports.iter().map(Report::to_string).collect()
    }

    /// The agent's container of a workload.
    fn agent(workload: &Value) -> &Value {
        workload["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == CONTAINER)
            .unwrap_or_else(|| panic!("no agent in {workload}"))
    }

    fn env<'a>(container: &'a Value, name: &str) -> &'a Value {
        container["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .map_or(&Value::Null, |e| {
                if e["value"].is_null() {
                    &e["valueFrom"]
                } else {
                    &e["value"]
                }
            })
    }

    fn arg<'a>(container: &'a Value, flag: &str) -> &'a str {
        let prefix = format!("--{flag}=");
        container["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .find_map(|a| a.strip_prefix(prefix.as_str()))
            .unwrap_or_else(|| panic!("no --{flag} in {container}"))
    }

    fn parse_back(yaml: &str) -> Vec<Value> {
        serde_saphyr::from_multiple(yaml).unwrap()
    }

    #[test]
    fn workloads_get_the_agent_and_the_rest_passes_through() {
        let input: Vec<Value> = serde_saphyr::from_multiple_with_options(
            WORKLOADS,
            serde_saphyr::options! {
                legacy_octal_numbers: true
            },
        )
        .unwrap();
        let done = run(WORKLOADS).unwrap();
        assert_eq!(
            lines(&done),
            [
                "deployment \"catalog\" injected",
                "statefulset \"ledger\" injected",
                "daemonset \"node-exporter\" injected",
                "deployment \"reviews\" injected",
                "service \"catalog\" skipped: kind Service",
                "configmap \"catalog-config\" skipped: kind ConfigMap",
            ]
        );
        let yaml = done.yaml().unwrap();
        let out = parse_back(&yaml);
        assert_eq!(out, done.documents, "{yaml}");
        assert_eq!(out.len(), 6);
        // The Service and the ConfigMap as they came.
        assert_eq!(out[4], input[4]);
        assert_eq!(out[5], input[5]);
        assert_eq!(out[5]["data"]["version"], "2.3.1");
        // (cluster, admin, pod's containers after) per workload: the istio and consul
        // defaults, an admin-port annotation over the mesh's, the default port.
        let want = [
            ("catalog", "127.0.0.1:15000", 2),
            ("ledger-db", "127.0.0.1:19100", 2),
            ("node-exporter", "127.0.0.1:19000", 2),
            ("reviews", "127.0.0.1:9901", 2),
        ];
        for (w, (cluster, admin, n)) in out.iter().zip(want) {
            let a = agent(w);
            assert_eq!(arg(a, "cluster"), cluster, "{w}");
            assert_eq!(arg(a, "zone"), "$(POD_NAMESPACE)");
            assert_eq!(arg(a, "instance"), "$(POD_NAME)");
            assert_eq!(env(a, "MESHCAT_SIDECAR_ADMIN"), admin, "{w}");
            assert_eq!(
                env(a, "POD_NAMESPACE"),
                &json!({"fieldRef": {"fieldPath": "metadata.namespace"}})
            );
            assert_eq!(
                env(a, "POD_NAME"),
                &json!({"fieldRef": {"fieldPath": "metadata.name"}})
            );
            assert_eq!(
                env(a, "MESHCAT_AGGREGATOR"),
                "meshcat-aggregator.meshcat.svc:9443"
            );
            assert_eq!(
                env(a, "MESHCAT_SERVER_NAME"),
                "meshcat-aggregator.meshcat.svc"
            );
            assert_eq!(a["image"], "meshcat:latest");
            let pod = &w["spec"]["template"];
            assert_eq!(pod["spec"]["containers"].as_array().unwrap().len(), n);
            assert_eq!(pod["metadata"]["labels"][AGENT_LABEL], "true");
            let volumes: Vec<&str> = pod["spec"]["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|v| v["name"].as_str())
                .collect();
            assert!(
                volumes.ends_with(&[TLS_VOLUME, OPS_TOKEN_VOLUME]),
                "{volumes:?}"
            );
        }
        // The application's own containers, volumes and labels are kept; its octal
        // mode read as Kubernetes reads it.
        let catalog = &out[0]["spec"]["template"]["spec"];
        assert_eq!(
            catalog["containers"][0],
            input[0]["spec"]["template"]["spec"]["containers"][0]
        );
        assert_eq!(catalog["volumes"][0]["configMap"]["defaultMode"], 0o440);
        assert_eq!(catalog["volumes"].as_array().unwrap().len(), 3);
        assert_eq!(
            out[0]["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"],
            "catalog"
        );
        assert_eq!(out[0]["spec"]["selector"], input[0]["spec"]["selector"]);
        // The rest of each workload is untouched.
        assert_eq!(
            out[1]["spec"]["volumeClaimTemplates"],
            input[1]["spec"]["volumeClaimTemplates"]
        );
        assert_eq!(
            out[3]["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"],
            "yes"
        );
    }

    #[test]
    fn an_injected_workload_is_left_as_it_is() {
        let once = run(WORKLOADS).unwrap();
        let yaml = once.yaml().unwrap();
        let twice = run(&yaml).unwrap();
        assert_eq!(twice.documents, once.documents);
        assert_eq!(twice.yaml().unwrap(), yaml);
        assert_eq!(
            lines(&twice)[..4],
            [
                "deployment \"catalog\" skipped: already injected",
                "statefulset \"ledger\" skipped: already injected",
                "daemonset \"node-exporter\" skipped: already injected",
                "deployment \"reviews\" skipped: already injected",
            ]
        );
        // A pod that runs the agent as an init container (a native sidecar) too.
        let native = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: native}\nspec:\n  template:\n    spec:\n      initContainers: [{name: meshcat-agent, image: meshcat, restartPolicy: Always}]\n      containers: [{name: app, image: app}]\n";
        let done = run(native).unwrap();
        assert_eq!(
            lines(&done),
            ["deployment \"native\" skipped: already injected"]
        );
        assert_eq!(done.documents, parse_back(native));
    }

    /// The example this command follows, deploy/kubernetes/agent-sidecar: its own
    /// pod is injected already, and the container added has its shape, with the
    /// settings of its ConfigMap.
    #[test]
    fn the_container_is_the_sidecar_examples() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes/agent-sidecar");
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
        let example_text = read("deployment.yaml");
        let done = run(&example_text).unwrap();
        assert_eq!(
            lines(&done),
            ["deployment \"sample-app\" skipped: already injected"]
        );
        let example: Value = serde_saphyr::from_str(&example_text).unwrap();
        let theirs = agent(&example);
        let settings: Value = serde_saphyr::from_str(&read("agent-configmap.yaml")).unwrap();
        let mut app = example.clone();
        let containers = app["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .unwrap();
        containers.retain(|c| c["name"] != CONTAINER);
        app["spec"]["template"]["spec"]["volumes"] = json!([]);
        app["spec"]["template"]["metadata"]["annotations"] =
            json!({"meshcat.io/cluster": "sample-app"});
        let text = serde_json::to_string(&app).unwrap();
        let done = run(&text).unwrap();
        let ours = agent(&done.documents[0]);
        for key in ["image", "imagePullPolicy", "command", "resources"] {
            assert_eq!(ours[key], theirs[key], "{key}");
        }
        for (key, v) in theirs["securityContext"].as_object().unwrap() {
            assert_eq!(&ours["securityContext"][key], v, "securityContext.{key}");
        }
        for probe in ["livenessProbe", "readinessProbe"] {
            assert_eq!(
                ours[probe]["httpGet"]["path"],
                theirs[probe]["httpGet"]["path"]
            );
            assert_eq!(ours[probe]["periodSeconds"], theirs[probe]["periodSeconds"]);
        }
        assert_eq!(
            ours["ports"][0]["containerPort"],
            theirs["ports"][0]["containerPort"]
        );
        for flag in ["zone", "instance"] {
            assert_eq!(arg(ours, flag), arg(theirs, flag));
        }
        for var in ["POD_NAME", "POD_NAMESPACE"] {
            assert_eq!(env(ours, var), env(theirs, var), "{var}");
        }
        for (var, v) in settings["data"].as_object().unwrap() {
            let mine = env(ours, var);
            if !mine.is_null() {
                assert_eq!(mine, v, "{var}");
            }
        }
        for var in [
            "MESHCAT_AGGREGATOR",
            "MESHCAT_SERVER_NAME",
            "MESHCAT_CA_FILE",
            "MESHCAT_CERT",
            "MESHCAT_KEY",
            "MESHCAT_SIDECAR_ADMIN",
            "MESHCAT_OPS_ADDR",
            "MESHCAT_OPS_TOKEN_FILE",
        ] {
            assert!(env(ours, var).is_string(), "{var} is written");
        }
        let mounts = |c: &Value| -> Vec<Value> {
            c["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| {
                    m["mountPath"]
                        .as_str()
                        .is_some_and(|p| p.starts_with("/etc/meshcat"))
                })
                .map(|m| json!([m["mountPath"], m["readOnly"]]))
                .collect()
        };
        assert_eq!(mounts(ours), mounts(theirs));
        assert_eq!(
            ours["envFrom"],
            json!([{"configMapRef": {"name": settings["metadata"]["name"], "optional": true}}])
        );
        // The Secrets of the example, the same keys.
        let volumes = done.documents[0]["spec"]["template"]["spec"]["volumes"].clone();
        let secret = |vs: &Value, mount: &str| -> Value {
            let mounted = theirs["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .chain(ours["volumeMounts"].as_array().unwrap())
                .filter(|m| m["mountPath"] == mount)
                .filter_map(|m| m["name"].as_str())
                .collect::<Vec<_>>();
            let v = vs
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"].as_str().is_some_and(|n| mounted.contains(&n)))
                .unwrap();
            json!([v["secret"]["secretName"], v["secret"]["items"]])
        };
        let example_volumes = &example["spec"]["template"]["spec"]["volumes"];
        for mount in [TLS_DIR, OPS_TOKEN_DIR] {
            assert_eq!(
                secret(&volumes, mount),
                secret(example_volumes, mount),
                "{mount}"
            );
        }
    }

    #[test]
    fn flags_change_the_container_and_volumes() {
        let s = sidecar(&[
            "--image",
            "registry.example.com/meshcat:1.2",
            "--aggregator",
            "agg-0.example.com:7443, [fd00::1]:7443",
            "--tls-secret",
            "shop-agent-tls",
            "--ops-token-secret",
            "shop-ops",
            "--config-map",
            "",
            "--ops-port",
            "19092",
        ]);
        assert_eq!(s.server_name, "agg-0.example.com");
        assert_eq!(s.aggregator, "agg-0.example.com:7443,[fd00::1]:7443");
        let c = s.container("c", 9901);
        assert_eq!(c["image"], "registry.example.com/meshcat:1.2");
        assert_eq!(
            env(&c, "MESHCAT_AGGREGATOR"),
            "agg-0.example.com:7443,[fd00::1]:7443"
        );
        assert_eq!(env(&c, "MESHCAT_OPS_ADDR"), "0.0.0.0:19092");
        assert_eq!(c["ports"][0]["containerPort"], 19092);
        assert!(c.get("envFrom").is_none(), "{c}");
        let [tls, ops] = s.volumes();
        assert_eq!(tls["secret"]["secretName"], "shop-agent-tls");
        assert_eq!(ops["secret"]["secretName"], "shop-ops");
        assert_eq!(ops["secret"]["defaultMode"], 0o444);
        let v6 = sidecar(&["--aggregator", "[fd00::1]:7443"]);
        assert_eq!(v6.server_name, "fd00::1");
        let named = sidecar(&["--server-name", "aggregator.internal"]);
        assert_eq!(named.server_name, "aggregator.internal");
        for bad in [
            &["--aggregator", "no-port"][..],
            &["--aggregator", "a:1,"],
            &["--image", ""],
            &["--image", "a b"],
            &["--tls-secret", "Upper"],
            &["--config-map", "-x"],
            &["--ops-port", "0"],
            &["--server-name", "a b"],
        ] {
            let mut args = vec!["meshcat", "inject", "-f", "-"];
            args.extend_from_slice(bad);
            assert!(Cli::try_parse_from(&args).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_list_and_json_are_read_too() {
        let json = r#"{"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "a"},
             "spec": {"template": {"metadata": {"annotations": {"meshcat.io/mesh": "istio"}},
                                    "spec": {"containers": [{"name": "app", "image": "app"}]}}}},
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"}},
            {"apiVersion": "apps/v1", "kind": "DaemonSetList", "items": [
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "d"},
                 "spec": {"template": {"spec": {"containers": []}}}}]},
            {"apiVersion": "extensions/v1beta1", "kind": "Deployment", "metadata": {"name": "old"},
             "spec": {"template": {"spec": {"containers": []}}}}
        ]}"#;
        let done = run(json).unwrap();
        assert_eq!(
            lines(&done),
            [
                "deployment \"a\" injected",
                "service \"a\" skipped: kind Service",
                "daemonset \"d\" injected",
                "deployment \"old\" skipped: apiVersion extensions/v1beta1, not apps/v1",
            ]
        );
        let out = parse_back(&done.yaml().unwrap());
        assert_eq!(out.len(), 1);
        assert_eq!(out[0]["kind"], "List");
        let items = &out[0]["items"];
        assert_eq!(
            env(agent(&items[0]), "MESHCAT_SIDECAR_ADMIN"),
            "127.0.0.1:15000"
        );
        assert_eq!(arg(agent(&items[2]["items"][0]), "cluster"), "d");
        assert_eq!(
            items[3]["spec"]["template"]["spec"]["containers"],
            json!([])
        );
    }

    #[test]
    fn bad_documents_say_which_and_why_and_nothing_is_printed() {
        let text = "\
apiVersion: apps/v1
kind: Deployment
metadata: {name: fine}
spec: {template: {spec: {containers: [{name: app}]}}}
---
- a list
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec: {serviceName: db}
---
metadata: {name: kindless}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: ds}
spec:
  template:
    metadata: {annotations: {meshcat.io/admin-port: \"http\"}}
    spec: {containers: [{name: app}]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: mesh}
spec:
  template:
    metadata: {annotations: {meshcat.io/mesh: linkerd}}
    spec: {containers: [{name: app}]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: kafka}
spec: {template: {spec: {containers: [{name: broker, ports: [{containerPort: 9092}]}]}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: c}
spec:
  template:
    metadata: {annotations: {meshcat.io/cluster: \"a/b\"}}
    spec: {containers: [{name: app}]}
---
apiVersion: v1
kind: List
items: [{apiVersion: apps/v1, kind: Deployment, metadata: {name: x}, spec: {template: {}}}, 7]
---
apiVersion: apps/v1
kind: Deployment
spec: {template: {spec: {containers: {name: app}}}}
";
        let errs = run(text).unwrap_err();
        assert_eq!(
            errs,
            [
                "app.yaml: document 2: not a mapping (a Kubernetes object) but a list",
                "app.yaml: document 3 (statefulset \"db\"): no spec.template",
                "app.yaml: document 4: no kind",
                "app.yaml: document 5 (daemonset \"ds\"): meshcat.io/admin-port \"http\" is not a port number",
                "app.yaml: document 6 (deployment \"mesh\"): meshcat.io/mesh \"linkerd\" is not one of istio, consul",
                "app.yaml: document 7 (deployment \"kafka\"): container \"broker\" has port 9092, the agent's ops port: choose another with --ops-port",
                "app.yaml: document 8 (deployment \"c\"): meshcat.io/cluster \"a/b\" is not a valid cluster name",
                "app.yaml: document 9 (item 1, deployment \"x\"): no spec.template.spec",
                "app.yaml: document 9 (item 2): not a mapping (a Kubernetes object) but a number",
                "app.yaml: document 10 (deployment \"\"): spec.template.spec.containers is a mapping, not a list",
            ]
        );
        let e = run("kind: [").unwrap_err();
        assert!(e[0].starts_with("app.yaml: not valid YAML: "), "{e:?}");
        assert_eq!(
            run("# nothing\n---\n").unwrap_err(),
            ["app.yaml: no document found"]
        );
        let e = run("kind: Deployment\napiVersion: apps/v1\nspec: {template: {spec: {containers: [{name: a}]}}}\n")
            .unwrap_err();
        assert!(
            e[0].contains("no metadata.name, and no meshcat.io/cluster"),
            "{e:?}"
        );
    }

    #[test]
    fn text_from_the_file_is_printed_without_control_characters() {
        let text = "apiVersion: v1\nkind: \"Serv\\e[2Jice\"\nmetadata: {name: \"a\\e]0;owned\\a\"}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: \"d\\r\"}\nspec: {template: {metadata: {annotations: {meshcat.io/cluster: d, meshcat.io/mesh: \"\\e[31m\"}}, spec: {containers: []}}}\n";
        let errs = run(text).unwrap_err();
        let done = run(text.split("---\n").next().unwrap()).unwrap();
        for line in errs.iter().chain(&lines(&done)) {
            assert!(!line.chars().any(char::is_control), "{line:?}");
        }
        assert_eq!(
            lines(&done),
            ["serv\\u{1b}[2jice \"a\\u{1b}]0;owned\\u{7}\" skipped: kind Serv\\u{1b}[2Jice"]
        );
        assert!(errs[0].contains("(deployment \"d\\r\")"), "{errs:?}");
        assert!(
            errs[0].contains("meshcat.io/mesh \"\\u{1b}[31m\""),
            "{errs:?}"
        );
    }

    #[test]
    fn the_pods_own_volumes_and_labels_stay() {
        let text = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: own}\nspec:\n  template:\n    metadata: {labels: {meshcat.io/agent: \"false\", team: a}}\n    spec:\n      containers: [{name: app}]\n      volumes: [{name: meshcat-agent-tls, csi: {driver: csi.cert-manager.io}}]\n";
        let done = run(text).unwrap();
        let pod = &done.documents[0]["spec"]["template"];
        assert_eq!(
            pod["metadata"]["labels"],
            json!({"meshcat.io/agent": "true", "team": "a"})
        );
        let volumes = pod["spec"]["volumes"].as_array().unwrap();
        assert_eq!(volumes.len(), 2);
        assert_eq!(volumes[0]["csi"]["driver"], "csi.cert-manager.io");
        assert_eq!(volumes[1]["name"], OPS_TOKEN_VOLUME);
    }

    /// The agent's own flag parser takes what inject writes, and finds the sidecar
    /// inject meant.
    #[test]
    fn the_agent_reads_what_inject_writes() {
        let c = sidecar(&[]).container("orders", 15000);
        let args: Vec<String> = std::iter::once("meshcat-agent".to_owned())
            .chain(c["args"].as_array().unwrap().iter().map(|a| {
                a.as_str()
                    .unwrap()
                    .replace("$(POD_NAMESPACE)", "shop")
                    .replace("$(POD_NAME)", "orders-1")
            }))
            .chain(c["env"].as_array().unwrap().iter().filter_map(|e| {
                let flag = e["name"].as_str()?.strip_prefix("MESHCAT_")?;
                Some(format!(
                    "--{}={}",
                    flag.to_lowercase().replace('_', "-"),
                    e["value"].as_str()?
                ))
            }))
            .collect();
        let config = meshcat_agent::config::AgentConfig::try_from_args(&args)
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        let t = &config.flag_targets()[0];
        assert_eq!(
            (
                t.zone_name.as_str(),
                t.cluster_name.as_str(),
                t.instance.as_str()
            ),
            ("shop", "orders", "orders-1")
        );
        assert_eq!(t.admin, "127.0.0.1:15000");
    }
}
