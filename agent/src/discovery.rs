//! Pod discovery for the DaemonSet: turns the node's pod list (as `kubectl get pods
//! -o json` writes it, `--pods-file`) into scrape targets. Only facts Kubernetes itself
//! vouches for choose where the agent goes and under which zone it reports: the zone
//! is the pod's namespace, the admin address is the pod's own IP, the log file is a
//! container log inside that pod's own folder under `--pod-log-dir`. Annotations, which
//! whoever runs the pod writes, only pick the cluster, the mesh, the admin port and
//! which of the pod's own containers is the sidecar. With `--pod-netns` the admin is
//! the pod's loopback, reached inside the pod's own network namespace ([`podns`]).

pub mod podns;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use meshcat_common::pods::{
    ADMIN_PORT_ANNOTATION, CLUSTER_ANNOTATION, DEFAULT_SIDECAR, LOCAL_CLUSTER_ANNOTATION,
    MESH_ANNOTATION, Mesh, SCRAPE_LABEL, SIDECAR_ANNOTATION, ZONE_ANNOTATION, admin_port_of,
    mesh_of,
};
use meshcat_common::validate::is_valid_name;
use serde::Deserialize;

use crate::envoy::Netns;
use crate::target::{MAX_TARGETS, Target, TargetsError};

/// Largest pods file read (a busy node's full pod objects fit easily).
pub const MAX_PODS_FILE: u64 = 32 << 20;

/// Where discovery points the agent at a pod's admin API.
#[derive(Debug, Clone, Copy)]
pub enum AdminReach<'a> {
    /// The pod's own IP, from the agent's namespace.
    PodIp,
    /// `127.0.0.1` inside the pod's network namespace, by pod UID ([`podns::scan`]).
    PodLoopback(&'a BTreeMap<String, Netns>),
}

/// A `kubectl get pods -o json` answer: a `List` of pods. Unknown fields are ignored:
/// the file carries whole pod objects.
#[derive(Debug, Default, Deserialize)]
pub struct PodList {
    #[serde(default)]
    pub items: Vec<Pod>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Pod {
    #[serde(default)]
    pub metadata: PodMeta,
    #[serde(default)]
    pub spec: PodSpec,
    #[serde(default)]
    pub status: PodStatus,
}

#[derive(Debug, Default, Deserialize)]
pub struct PodMeta {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub uid: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(default)]
    pub containers: Vec<Named>,
    /// Native sidecars (restartPolicy: Always) are init containers.
    #[serde(default)]
    pub init_containers: Vec<Named>,
    /// A pod on the node's network has the node's IP as its own.
    #[serde(default)]
    pub host_network: bool,
}

#[derive(Debug, Default, Deserialize)]
pub struct Named {
    #[serde(default)]
    pub name: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    #[serde(default)]
    pub phase: String,
    #[serde(rename = "podIP", default)]
    pub pod_ip: String,
    #[serde(default)]
    pub container_statuses: Vec<ContainerStatus>,
    #[serde(default)]
    pub init_container_statuses: Vec<ContainerStatus>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatus {
    #[serde(default)]
    pub name: String,
    /// Kubelet names a container's log `<restartCount>.log`.
    #[serde(default)]
    pub restart_count: u32,
}

/// What discovery made of one pod list: the targets, and why pods (or their log
/// files) were left out, for the log.
#[derive(Debug, Default)]
pub struct Discovered {
    pub targets: Vec<Target>,
    pub notes: Vec<String>,
}

/// Reads a pods file; see [`targets_from_pods`] for the targets.
pub fn read_pods_file(path: &Path) -> Result<PodList, TargetsError> {
    let p = path.display().to_string();
    let read = |e| TargetsError::Read {
        path: p.clone(),
        source: e,
    };
    let meta = std::fs::metadata(path).map_err(read)?;
    if !meta.is_file() {
        return Err(TargetsError::Invalid {
            path: p,
            reason: "not a regular file".into(),
        });
    }
    if meta.len() > MAX_PODS_FILE {
        return Err(TargetsError::Invalid {
            path: p,
            reason: format!("over the limit of {MAX_PODS_FILE} bytes"),
        });
    }
    let text = std::fs::read(path).map_err(read)?;
    serde_json::from_slice(&text).map_err(|e| TargetsError::Invalid {
        path: p.clone(),
        reason: e.to_string(),
    })
}

/// The targets of a pod list, refused whole past [`MAX_TARGETS`].
pub fn checked_targets(
    pods: &PodList,
    log_dir: &Path,
    reach: AdminReach<'_>,
    path: &Path,
) -> Result<Discovered, TargetsError> {
    let found = targets_from_pods(pods, log_dir, reach);
    if found.targets.len() > MAX_TARGETS {
        return Err(TargetsError::Invalid {
            path: path.display().to_string(),
            reason: format!("{} targets, at most {MAX_TARGETS}", found.targets.len()),
        });
    }
    Ok(found)
}

/// The targets of the running pods labelled `meshcat.io/scrape: "true"`:
/// - zone: the pod's namespace (a `meshcat.io/zone` annotation is ignored);
/// - cluster: `meshcat.io/cluster` (required);
/// - admin: the pod's own IP and `meshcat.io/admin-port` (a port number, nothing else;
///   default the mesh's, [`Mesh`], else
///   [`meshcat_common::pods::DEFAULT_ADMIN_PORT`]); with
///   [`AdminReach::PodLoopback`], `127.0.0.1` and that port inside the pod's network
///   namespace, and a pod whose namespace is not found is left out (noted); a pod on
///   the node's network (`hostNetwork`) is left out, since its IP and its loopback are
///   the node's;
/// - instance: the pod's name. Pods are told apart by namespace and name: pods of one
///   name in two namespaces are two targets (two zones); a second pod of the same
///   namespace and name is left out;
/// - log file: `<log_dir>/<namespace>_<name>_<uid>/<container>/<restarts>.log` of the
///   container `meshcat.io/sidecar-container` names, which must be one of the pod's own
///   containers, and which must resolve inside the pod's own log folder (no link out).
///   The target carries the resolved path (kubelet's links followed here, once and
///   checked), which the log tail then opens without following any link.
pub fn targets_from_pods(pods: &PodList, log_dir: &Path, reach: AdminReach<'_>) -> Discovered {
    let mut out = Discovered::default();
    let mut seen = BTreeSet::new();
    for pod in &pods.items {
        let m = &pod.metadata;
        if m.labels.get(SCRAPE_LABEL).map(String::as_str) != Some("true")
            || pod.status.phase != "Running"
        {
            continue;
        }
        let who = format!("pod {}/{}", m.namespace, m.name);
        match target_of(pod, log_dir, reach) {
            Ok((target, note)) => {
                if let Some(n) = note {
                    out.notes.push(format!("{who}: {n}"));
                }
                if !seen.insert((target.zone_name.clone(), target.instance.clone())) {
                    out.notes.push(format!(
                        "{who}: another pod of this node has the same namespace and name; left out"
                    ));
                    continue;
                }
                out.targets.push(target);
            }
            Err(why) => out.notes.push(format!("{who}: {why}; left out")),
        }
    }
    out
}

/// The target of one pod, with a note when its log file was left out.
fn target_of(
    pod: &Pod,
    log_dir: &Path,
    reach: AdminReach<'_>,
) -> Result<(Target, Option<String>), String> {
    let m = &pod.metadata;
    if !plain_component(&m.namespace) || !plain_component(&m.name) {
        return Err("namespace or name is not a valid name".into());
    }
    // Its "own" IP would be the node's, where the admin-port annotation could point
    // the agent at any program listening on the node.
    if pod.spec.host_network {
        return Err("it uses the node's network (hostNetwork), so its IP is the node's".into());
    }
    let mesh = mesh_of(m.annotations.get(MESH_ANNOTATION).map(String::as_str))?;
    let port = admin_port_of(
        m.annotations.get(ADMIN_PORT_ANNOTATION).map(String::as_str),
        mesh,
    )?;
    let cluster = m
        .annotations
        .get(CLUSTER_ANNOTATION)
        .ok_or_else(|| format!("no {CLUSTER_ANNOTATION} annotation"))?;
    if !is_valid_name(cluster) {
        return Err(format!(
            "{CLUSTER_ANNOTATION} {cluster:?} is not a valid name"
        ));
    }
    let mut note = None;
    if let Some(z) = m
        .annotations
        .get(ZONE_ANNOTATION)
        .filter(|z| **z != m.namespace)
    {
        note = Some(format!(
            "{ZONE_ANNOTATION} {z:?} ignored: the zone is the namespace"
        ));
    }
    let (admin, netns) = match reach {
        AdminReach::PodIp => {
            let ip: IpAddr = pod
                .status
                .pod_ip
                .parse()
                .map_err(|_| format!("pod IP {:?} is not an IP address", pod.status.pod_ip))?;
            (SocketAddr::new(ip, port), None)
        }
        AdminReach::PodLoopback(namespaces) => {
            let ns = podns::uid_key(&m.uid)
                .and_then(|uid| namespaces.get(&uid))
                .ok_or("no process of this pod in the node's process list, so its network namespace is unknown")?;
            (
                SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), port),
                Some(ns.clone()),
            )
        }
    };
    let log_file = match log_file_of(pod, log_dir, mesh) {
        Ok(f) => Some(f),
        Err(why) => {
            note = Some(format!("no log file: {why}"));
            None
        }
    };
    Ok((
        Target {
            admin: admin.to_string(),
            zone_name: m.namespace.clone(),
            cluster_name: cluster.clone(),
            instance: m.name.clone(),
            log_file,
            local_cluster: m.annotations.get(LOCAL_CLUSTER_ANNOTATION).cloned(),
            netns,
        },
        note,
    ))
}

/// A path component Kubernetes could have produced: no separator, not `.` or `..`.
fn plain_component(s: &str) -> bool {
    is_valid_name(s) && s != "." && s != ".."
}

/// The sidecar container's current log file, checked to stay inside the pod's folder,
/// with the links that exist now resolved.
fn log_file_of(pod: &Pod, log_dir: &Path, mesh: Option<Mesh>) -> Result<PathBuf, String> {
    let m = &pod.metadata;
    let container = m.annotations.get(SIDECAR_ANNOTATION).map_or(
        mesh.map_or(DEFAULT_SIDECAR, Mesh::sidecar_container),
        String::as_str,
    );
    let own = pod
        .spec
        .containers
        .iter()
        .chain(&pod.spec.init_containers)
        .any(|c| c.name == container);
    if !own || !plain_component(container) {
        return Err(format!(
            "{SIDECAR_ANNOTATION} {container:?} is not a container of this pod"
        ));
    }
    if !plain_component(&m.uid) {
        return Err("the pod has no valid uid".into());
    }
    let restarts = pod
        .status
        .container_statuses
        .iter()
        .chain(&pod.status.init_container_statuses)
        .find(|s| s.name == container)
        .map_or(0, |s| s.restart_count);
    let pod_dir = log_dir.join(format!("{}_{}_{}", m.namespace, m.name, m.uid));
    let file = pod_dir.join(container).join(format!("{restarts}.log"));
    resolve_inside(&file, &pod_dir, log_dir)
}

/// `file` resolved through the symbolic links that exist now, checked to stay inside
/// `pod_dir`, itself inside `log_dir`. Parts that do not exist yet (a pod just started)
/// are names built from checked components, so they cannot leave either folder; they
/// are kept as named, under the deepest part that exists, resolved.
fn resolve_inside(file: &Path, pod_dir: &Path, log_dir: &Path) -> Result<PathBuf, String> {
    let root = std::fs::canonicalize(log_dir)
        .map_err(|e| format!("pod log folder {} unusable: {e}", log_dir.display()))?;
    let Ok(pod_real) = std::fs::canonicalize(pod_dir) else {
        return Ok(file.to_owned());
    };
    let escapes = || format!("{} leads outside the pod's log folder", file.display());
    if !pod_real.starts_with(&root) || pod_real.parent() != Some(root.as_path()) {
        return Err(escapes());
    }
    let mut resolved = None;
    for part in [file.parent(), Some(file)].into_iter().flatten() {
        if let Ok(real) = std::fs::canonicalize(part) {
            if !real.starts_with(&pod_real) {
                return Err(escapes());
            }
            resolved = Some((part, real));
        }
    }
    Ok(match resolved {
        Some((part, real)) if part == file => real,
        Some((_, real_parent)) => match file.file_name() {
            Some(name) => real_parent.join(name),
            None => file.to_owned(),
        },
        None => pod_real.join(file.strip_prefix(pod_dir).unwrap_or(file)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(ns: &str, name: &str, annotations: serde_json::Value) -> serde_json::Value {
        json!({
            "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"),
                         "labels": {"meshcat.io/scrape": "true"}, "annotations": annotations},
            "spec": {"containers": [{"name": "app"}, {"name": "envoy"}]},
            "status": {"phase": "Running", "podIP": "10.1.2.3",
                       "containerStatuses": [{"name": "envoy", "restartCount": 2}]}
        })
    }

    fn discover(items: Vec<serde_json::Value>, log_dir: &Path) -> Discovered {
        let list: PodList =
            serde_json::from_value(json!({"kind": "List", "items": items})).unwrap();
        targets_from_pods(&list, log_dir, AdminReach::PodIp)
    }

    #[test]
    fn the_zone_is_the_namespace_and_the_admin_the_pod_ip() {
        let logs = tempfile::tempdir().unwrap();
        let d = discover(
            vec![pod(
                "team-a",
                "orders-1",
                json!({"meshcat.io/zone": "team-b", "meshcat.io/cluster": "orders",
                       "meshcat.io/admin-port": "15000"}),
            )],
            logs.path(),
        );
        let t = &d.targets[0];
        assert_eq!(t.zone_name, "team-a");
        assert_eq!(t.cluster_name, "orders");
        assert_eq!(t.admin, "10.1.2.3:15000");
        assert_eq!(t.instance, "orders-1");
        assert_eq!(
            t.log_file.as_deref(),
            Some(
                logs.path()
                    .join("team-a_orders-1_uid-orders-1/envoy/2.log")
                    .as_path()
            )
        );
        assert!(d.notes[0].contains("ignored"), "{:?}", d.notes);
    }

    #[test]
    fn annotations_cannot_choose_a_host() {
        let logs = tempfile::tempdir().unwrap();
        for port in [
            "1@169.254.169.254:80",
            "80/latest/meta-data",
            "0",
            "70000",
            "9901 ",
            "evil.example:80",
        ] {
            let d = discover(
                vec![pod(
                    "a",
                    "p",
                    json!({"meshcat.io/cluster": "c", "meshcat.io/admin-port": port}),
                )],
                logs.path(),
            );
            assert!(d.targets.is_empty(), "{port:?} gave {:?}", d.targets);
        }
        // A pod on the node's network would aim the agent at the node itself.
        let mut host = pod("a", "p", json!({"meshcat.io/cluster": "c"}));
        host["spec"]["hostNetwork"] = json!(true);
        let d = discover(vec![host], logs.path());
        assert!(d.targets.is_empty(), "{:?}", d.targets);
        assert!(d.notes[0].contains("hostNetwork"), "{:?}", d.notes);
        let mut bad_ip = pod("a", "p", json!({"meshcat.io/cluster": "c"}));
        bad_ip["status"]["podIP"] = json!("metadata.google.internal");
        assert!(discover(vec![bad_ip], logs.path()).targets.is_empty());
        let d = discover(
            vec![pod("a", "p", json!({"meshcat.io/cluster": "../x"}))],
            logs.path(),
        );
        assert!(d.targets.is_empty());
    }

    #[test]
    fn the_log_file_stays_in_the_pods_own_folder() {
        let logs = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("2.log"), "secret\n").unwrap();
        for container in [
            "../../../etc",
            "/etc/shadow",
            "..",
            "sidecar-of-someone-else",
        ] {
            let d = discover(
                vec![pod(
                    "a",
                    "p",
                    json!({"meshcat.io/cluster": "c", "meshcat.io/sidecar-container": container}),
                )],
                logs.path(),
            );
            assert_eq!(d.targets.len(), 1, "{container:?}");
            assert_eq!(d.targets[0].log_file, None, "{container:?}");
        }

        // The named container's folder links out of the pod's folder.
        let pod_dir = logs.path().join("a_p_uid-p");
        std::fs::create_dir_all(&pod_dir).unwrap();
        std::os::unix::fs::symlink(outside.path(), pod_dir.join("envoy")).unwrap();
        let d = discover(
            vec![pod("a", "p", json!({"meshcat.io/cluster": "c"}))],
            logs.path(),
        );
        assert_eq!(d.targets[0].log_file, None);
        assert!(
            d.notes.iter().any(|n| n.contains("outside")),
            "{:?}",
            d.notes
        );

        // The log file itself links to another pod's folder.
        let other = logs.path().join("b_q_uid-q/envoy");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join("0.log"), "theirs\n").unwrap();
        std::fs::remove_file(pod_dir.join("envoy")).unwrap();
        std::fs::create_dir_all(pod_dir.join("envoy")).unwrap();
        std::os::unix::fs::symlink(other.join("0.log"), pod_dir.join("envoy/2.log")).unwrap();
        let d = discover(
            vec![pod("a", "p", json!({"meshcat.io/cluster": "c"}))],
            logs.path(),
        );
        assert_eq!(d.targets[0].log_file, None);

        // A real file of its own is kept.
        std::fs::remove_file(pod_dir.join("envoy/2.log")).unwrap();
        std::fs::write(pod_dir.join("envoy/2.log"), "mine\n").unwrap();
        let d = discover(
            vec![pod("a", "p", json!({"meshcat.io/cluster": "c"}))],
            logs.path(),
        );
        assert_eq!(
            d.targets[0].log_file,
            Some(std::fs::canonicalize(pod_dir.join("envoy/2.log")).unwrap())
        );
    }

    #[test]
    fn only_running_labelled_pods_with_a_cluster_and_unique_names() {
        let logs = tempfile::tempdir().unwrap();
        let mut pending = pod("a", "p1", json!({"meshcat.io/cluster": "c"}));
        pending["status"]["phase"] = json!("Pending");
        let mut unlabelled = pod("a", "p2", json!({"meshcat.io/cluster": "c"}));
        unlabelled["metadata"]["labels"] = json!({});
        let d = discover(
            vec![
                pending,
                unlabelled,
                pod("a", "p3", json!({})),
                pod("a", "p4", json!({"meshcat.io/cluster": "c"})),
                pod("a", "p4", json!({"meshcat.io/cluster": "c"})),
            ],
            logs.path(),
        );
        assert_eq!(d.targets.len(), 1);
        assert_eq!(d.targets[0].zone_name, "a");
        assert!(
            d.notes
                .iter()
                .any(|n| n.contains("same namespace and name")),
            "{:?}",
            d.notes
        );
    }

    #[test]
    fn pods_of_one_name_in_two_namespaces_are_two_targets() {
        let logs = tempfile::tempdir().unwrap();
        let mut other = pod(
            "team-b",
            "orders-1",
            json!({"meshcat.io/cluster": "orders", "meshcat.io/admin-port": "15001"}),
        );
        other["metadata"]["uid"] = json!("uid-other");
        other["status"]["podIP"] = json!("10.1.2.4");
        let d = discover(
            vec![
                pod(
                    "team-a",
                    "orders-1",
                    json!({"meshcat.io/cluster": "orders", "meshcat.io/admin-port": "15000"}),
                ),
                other,
            ],
            logs.path(),
        );
        assert!(d.notes.is_empty(), "{:?}", d.notes);
        let got: Vec<(&str, &str, &str)> = d
            .targets
            .iter()
            .map(|t| (t.zone_name.as_str(), t.instance.as_str(), t.admin.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("team-a", "orders-1", "10.1.2.3:15000"),
                ("team-b", "orders-1", "10.1.2.4:15001")
            ]
        );
        assert_ne!(d.targets[0].key(), d.targets[1].key());
        assert_ne!(d.targets[0].log_file, d.targets[1].log_file);
    }

    #[test]
    fn a_link_inside_the_pods_folder_is_resolved_for_the_tail() {
        let logs = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(logs.path()).unwrap();
        let pod_dir = root.join("a_p_uid-p");
        std::fs::create_dir_all(pod_dir.join("envoy")).unwrap();
        // As some runtimes do: the numbered log is a link to the real file beside it.
        std::fs::write(pod_dir.join("envoy/current.log"), "line\n").unwrap();
        std::os::unix::fs::symlink(
            pod_dir.join("envoy/current.log"),
            pod_dir.join("envoy/2.log"),
        )
        .unwrap();
        let d = discover(
            vec![pod("a", "p", json!({"meshcat.io/cluster": "c"}))],
            logs.path(),
        );
        assert_eq!(
            d.targets[0].log_file.as_deref(),
            Some(pod_dir.join("envoy/current.log").as_path())
        );
        // Not there yet: the named path under the resolved folder.
        std::fs::remove_file(pod_dir.join("envoy/2.log")).unwrap();
        let d = discover(
            vec![pod("a", "p", json!({"meshcat.io/cluster": "c"}))],
            logs.path(),
        );
        assert_eq!(
            d.targets[0].log_file.as_deref(),
            Some(pod_dir.join("envoy/2.log").as_path())
        );
    }

    #[test]
    fn a_mesh_names_the_admin_port_and_the_sidecar_container() {
        let logs = tempfile::tempdir().unwrap();
        let mut istio = pod(
            "a",
            "p",
            json!({"meshcat.io/cluster": "c", "meshcat.io/mesh": "istio"}),
        );
        istio["spec"]["containers"] = json!([{"name": "app"}, {"name": "istio-proxy"}]);
        let d = discover(vec![istio], logs.path());
        assert_eq!(d.targets[0].admin, "10.1.2.3:15000");
        assert!(
            d.targets[0]
                .log_file
                .as_deref()
                .unwrap()
                .ends_with("istio-proxy/0.log"),
            "{:?}",
            d.targets[0].log_file
        );
        // An explicit port wins over the mesh's.
        let d = discover(
            vec![pod(
                "a",
                "p",
                json!({"meshcat.io/cluster": "c", "meshcat.io/mesh": "consul",
                       "meshcat.io/admin-port": "19001"}),
            )],
            logs.path(),
        );
        assert_eq!(d.targets[0].admin, "10.1.2.3:19001");
        let d = discover(
            vec![pod(
                "a",
                "p",
                json!({"meshcat.io/cluster": "c", "meshcat.io/mesh": "linkerd"}),
            )],
            logs.path(),
        );
        assert!(d.targets.is_empty());
        assert!(
            d.notes[0].contains("not one of istio, consul"),
            "{:?}",
            d.notes
        );
    }

    #[test]
    fn on_the_pods_loopback_the_admin_is_reached_in_its_namespace() {
        let logs = tempfile::tempdir().unwrap();
        let uid = "0A1B2C3D-4E5F-6A7B-8C9D-0E1F2A3B4C5D";
        let mut found = pod(
            "a",
            "found",
            json!({"meshcat.io/cluster": "c", "meshcat.io/mesh": "consul"}),
        );
        found["metadata"]["uid"] = json!(uid);
        found["status"]["podIP"] = json!("");
        let mut unknown = pod("a", "unknown", json!({"meshcat.io/cluster": "c"}));
        unknown["metadata"]["uid"] = json!("9a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d");
        let mut host = pod("a", "host", json!({"meshcat.io/cluster": "c"}));
        host["metadata"]["uid"] = json!(uid);
        host["spec"]["hostNetwork"] = json!(true);
        let ns = Netns::with_inode(PathBuf::from("/proc/42/ns/net"), 4026531992);
        let namespaces = BTreeMap::from([(uid.to_ascii_lowercase(), ns.clone())]);
        let list: PodList =
            serde_json::from_value(json!({"items": [found, unknown, host]})).unwrap();
        let d = targets_from_pods(&list, logs.path(), AdminReach::PodLoopback(&namespaces));
        assert_eq!(d.targets.len(), 1, "{:?}", d.notes);
        assert_eq!(d.targets[0].instance, "found");
        assert_eq!(d.targets[0].admin, "127.0.0.1:19000");
        assert_eq!(d.targets[0].netns, Some(ns));
        assert!(
            d.notes
                .iter()
                .any(|n| n.contains("a/unknown") && n.contains("network namespace is unknown")),
            "{:?}",
            d.notes
        );
        assert!(
            d.notes
                .iter()
                .any(|n| n.contains("a/host") && n.contains("hostNetwork")),
            "{:?}",
            d.notes
        );
    }
}
