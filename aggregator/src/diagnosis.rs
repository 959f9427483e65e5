//! The diagnosis as a service (contract section 5): collects the evidence of a
//! cluster's sidecars and of its zone's edge through the sidecar layer
//! ([`crate::sidecars`], this replica's agents and its peers alike), what the
//! catalog and Prometheus know of its metrics, and runs the playbook of
//! `meshcat-diagnose` over it. With a view of the zone's control server
//! ([`crate::control`]) it adds what that server declares for the cluster and the
//! sync of the edge's and the service's sidecars with it ([`crate::sync`]), for the
//! `control_server` step. The HTTP route (`api::diagnose`) parses and
//! authorizes the request and serializes the report; nothing here speaks HTTP but
//! the Prometheus query. Its configuration ([`DiagnosisConfig`]: the commands'
//! deadline, the edge refresh, Prometheus) is here.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use meshcat_common::mesh_names::service_of;
use meshcat_common::model::ZoneRecord;
use meshcat_common::wire::{EvidenceOutput, LineQuery};
use meshcat_diagnose::evidence::{
    MAX_DECLARED_CLUSTERS, MAX_DECLARED_ENDPOINTS, MAX_SYNC_SIDECARS,
};
use meshcat_diagnose::{
    ControlEvidence, DeclaredCluster, DeclaredEndpoint, DiagnosisInput, DiagnosisReport, Hop,
    MetricsEvidence, Reads, Role, RootCause, SidecarEvidence, SidecarSync, Symptom, Verdict,
    choose_edge, failing_upstreams, reports_metrics, request_to_ask,
};
use tracing::{info, warn};

use crate::control::{ControlState, Controls, ViewCluster};
use crate::graph::snapshot::{Graphs, Snapshot};
use crate::history::{Detail, History, Kind, Pending, Query};
use crate::sidecars::{Answer, Ask, Sidecars, window_deadline};
use crate::store::{Instances, Store};

/// Most service instances one diagnosis collects evidence from.
pub const MAX_DIAGNOSED_INSTANCES: usize = 5;
/// Log lines asked from each sidecar for the diagnosis.
pub const EVIDENCE_LOG_LINES: u32 = 2_000;
/// Most edge instances asked (at once) for the edge's evidence.
pub const MAX_EDGE_TRIES: usize = 3;
/// Deadline of the Prometheus query.
const PROMETHEUS_TIMEOUT: Duration = Duration::from_secs(3);
/// Most silent instances named in the metrics evidence.
const MAX_NAMED_SILENT: usize = 10;
/// Most instances owned by other replicas whose metrics one diagnosis asks for.
const MAX_REMOTE_METRICS: usize = 256;

/// What a diagnosis is asked.
#[derive(Debug, Clone)]
pub struct Request {
    /// Only the steps of this symptom (all without).
    pub symptom: Option<Symptom>,
    /// The request path the failing traffic takes, when known.
    pub path: Option<String>,
    /// A debug window of this many seconds on each sidecar of the cluster asked
    /// about (and its edge) before reading their logs; the clusters followed are
    /// read without one.
    pub debug_seconds: Option<u32>,
    /// Most clusters diagnosed along a failing chain, the one asked about included
    /// (at least 1).
    pub max_hops: usize,
    /// How far back the report's `recentChanges` reach.
    pub lookback: Duration,
}

impl Default for Request {
    fn default() -> Self {
        Request {
            symptom: None,
            path: None,
            debug_seconds: None,
            max_hops: DEFAULT_MAX_HOPS,
            lookback: DEFAULT_LOOKBACK,
        }
    }
}

/// How far back `recentChanges` reach by default (`lookback`).
pub const DEFAULT_LOOKBACK: Duration = Duration::from_secs(15 * 60);
/// The longest `lookback`: older changes are for `GET /history`.
pub const MAX_LOOKBACK: Duration = Duration::from_secs(24 * 3600);
/// Most entries in `recentChanges`, the newest.
pub const MAX_RECENT_CHANGES: usize = 100;

/// Clusters a diagnosis follows by default (`maxHops`).
pub const DEFAULT_MAX_HOPS: usize = 3;
/// Most clusters a diagnosis follows.
pub const MAX_HOPS: usize = 5;

/// Whose sidecar plays the edge of a diagnosis: the zone's request cluster for the
/// cluster asked about; the calling cluster for one reached by following a failing
/// call, since its sidecar is where that cluster's traffic comes from.
#[derive(Debug, Clone)]
enum EdgeSide {
    /// The zone's `requestCluster` (none when it is empty).
    Zone,
    /// The calling cluster the failing edge starts at, and its upstream cluster of
    /// that edge: the name its sidecars know the called cluster by.
    Caller {
        zone: String,
        cluster: String,
        upstream: String,
    },
}

/// A called cluster the diagnosis follows, and the caller's upstream cluster that
/// reaches it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Callee {
    zone: String,
    cluster: String,
    upstream: String,
}

/// One cluster's report, with what its sidecars' access lines show of its calls:
/// the upstream clusters whose calls failed, and how many lines each
/// ([`failing_upstreams`]).
struct Diagnosed {
    report: DiagnosisReport,
    failing_calls: BTreeMap<String, usize>,
}

/// Why a diagnosis produced no report.
#[derive(Debug, thiserror::Error)]
#[error("the diagnosis task failed: {0}")]
pub struct DiagnosisError(String);

/// Commands to sidecars, the diagnosis built on them, and the edge refresh.
#[derive(Debug, Clone)]
pub struct DiagnosisConfig {
    /// `--command-timeout`: deadline of each command sent to an agent.
    pub command_timeout: Duration,
    /// `--edge-refresh`: how often each zone's edge configuration is fetched.
    pub edge_refresh: Duration,
    /// `--prometheus-url`: asked by the missing-metrics step.
    pub prometheus_url: Option<String>,
}

/// Runs diagnoses over the catalog, the sidecars and Prometheus.
#[derive(Debug, Clone)]
pub struct Diagnosis {
    pub sidecars: Sidecars,
    pub store: Arc<Store>,
    pub instances: Arc<Instances>,
    /// Where the diagnosis is recorded and recent changes are read, when the
    /// history is on.
    pub history: Option<Arc<History>>,
    /// The shared graph snapshot the failing calls are read from.
    pub graphs: Arc<Graphs>,
    /// The zones' control servers: what each declares.
    pub controls: Controls,
    /// Each sidecar's sync with its zone's control server.
    pub sync: Arc<crate::sync::Sync>,
    /// The commands' deadline and the Prometheus client.
    pub tools: DiagnosisTools,
}

/// What every diagnosis runs with besides the catalog and the sidecars, built once
/// at start from the [`DiagnosisConfig`].
#[derive(Debug, Clone)]
pub struct DiagnosisTools {
    /// Deadline of each command sent to a sidecar (`--command-timeout`).
    pub command_timeout: Duration,
    /// The Prometheus the missing-metrics step asks (`--prometheus-url`).
    pub prometheus: Option<Prometheus>,
}

impl DiagnosisTools {
    /// Builds the Prometheus client, when a Prometheus URL is configured.
    pub fn new(config: &DiagnosisConfig) -> Result<DiagnosisTools, String> {
        Ok(DiagnosisTools {
            command_timeout: config.command_timeout,
            prometheus: config
                .prometheus_url
                .as_deref()
                .map(Prometheus::new)
                .transpose()?,
        })
    }
}

/// A Prometheus server and the client that asks it: one for the process, so it
/// keeps its connection pool between diagnoses.
#[derive(Debug, Clone)]
pub struct Prometheus {
    /// Base URL (`http://host:port`, no trailing `/`).
    base: String,
    client: reqwest::Client,
}

impl Prometheus {
    /// A client of the Prometheus at `base`, each query held to a deadline.
    pub fn new(base: &str) -> Result<Prometheus, String> {
        let client = reqwest::Client::builder()
            .timeout(PROMETHEUS_TIMEOUT)
            .build()
            .map_err(|e| format!("no HTTP client for Prometheus: {e}"))?;
        Ok(Prometheus {
            base: base.to_owned(),
            client,
        })
    }

    /// Whether Prometheus has an `up` series for `job`; an error when it cannot be
    /// asked.
    async fn up(&self, job: &str) -> Result<bool, String> {
        let base = &self.base;
        let escaped = job.replace('\\', "\\\\").replace('"', "\\\"");
        let query = format!("up{{job=\"{escaped}\"}}");
        let resp = self
            .client
            .get(format!("{base}/api/v1/query"))
            .query(&[("query", query.as_str())])
            .send()
            .await
            .map_err(|e| format!("Prometheus at {base} did not answer: {e}"))?;
        if !resp.status().is_success() {
            return Err(format!("Prometheus at {base} answered {}", resp.status()));
        }
        let v: serde_json::Value = resp
            .json()
            .await
            .map_err(|e| format!("Prometheus at {base} answered no JSON: {e}"))?;
        v.pointer("/data/result")
            .and_then(serde_json::Value::as_array)
            .map(|r| !r.is_empty())
            .ok_or_else(|| format!("Prometheus at {base} answered without data.result"))
    }
}

impl Diagnosis {
    /// Diagnoses `cluster` in `zone`, then, while the last cluster diagnosed fails
    /// in a way a failing call of its own can explain and one of its calls to
    /// another cluster fails ([`fails_on_its_own`], [`failing_callee`]), the called
    /// cluster the same way, up to `req.max_hops` clusters. The clusters followed
    /// are read without the request's path and debug window (see [`hop_request`]).
    /// The report is the asked cluster's checks with the clusters followed (`hops`)
    /// and the deepest one whose own checks fail (`rootCause`), which the
    /// conclusion starts with.
    pub async fn run(
        &self,
        zone: &ZoneRecord,
        cluster: &str,
        req: &Request,
    ) -> Result<DiagnosisReport, DiagnosisError> {
        let max_hops = most_hops(req);
        let warning = self.store.rules().error_ratio_warning;
        let first = self.run_one(zone, cluster, req, &EdgeSide::Zone).await?;
        let mut failing_calls = first.failing_calls;
        let mut reports = vec![first.report];
        let mut hops = vec![(zone.zone_name.clone(), cluster.to_owned())];
        let hop_req = hop_request(req);
        while hops.len() < max_hops {
            if reports.last().is_some_and(fails_on_its_own) {
                break;
            }
            let (from_zone, from) = hops.last().cloned().expect("one hop at least");
            // The shared snapshot: at most `MAX_AGE` old, built off the runtime's
            // threads when it is not. A graph that cannot be built is logged there.
            let Ok(snapshot) = self.graphs.fresh(&self.store).await else {
                break;
            };
            let Some(callee) = failing_callee(
                &snapshot,
                (&from_zone, &from),
                &failing_calls,
                warning,
                &hops,
            ) else {
                break;
            };
            let Some(to_zone_record) = self.store.zone(&callee.zone) else {
                break;
            };
            info!(zone = %from_zone, cluster = %from, callee = %callee.cluster, upstream = %callee.upstream, "Following a failing call.");
            let edge = EdgeSide::Caller {
                zone: from_zone,
                cluster: from,
                upstream: callee.upstream,
            };
            let next = self
                .run_one(&to_zone_record, &callee.cluster, &hop_req, &edge)
                .await?;
            failing_calls = next.failing_calls;
            reports.push(next.report);
            hops.push((callee.zone, callee.cluster));
        }
        let mut report = across_hops(&self.store, reports);
        report.recent_changes = self.recent_changes(&hops, req.lookback).await;
        info!(zone = %zone.zone_name, %cluster, symptom = req.symptom.map_or("all", Symptom::as_str), hops = report.hops.len(), recent_changes = report.recent_changes.len(), conclusion = %report.conclusion, "Diagnosis run.");
        if let Some(h) = &self.history {
            h.record_diagnosis(
                Pending::new(
                    Kind::Diagnosed,
                    &zone.zone_name,
                    cluster,
                    "",
                    diagnosed_detail(req.symptom, &report),
                ),
                std::time::Instant::now(),
            );
        }
        Ok(report)
    }

    /// The history entries of the clusters followed within `lookback` before now,
    /// newest first, at most [`MAX_RECENT_CHANGES`]. A history that cannot be read
    /// leaves them out (the diagnosis itself stands).
    async fn recent_changes(
        &self,
        hops: &[(String, String)],
        lookback: Duration,
    ) -> Vec<meshcat_common::model::HistoryEntry> {
        let Some(db) = self.history.as_ref().map(|h| h.db().clone()) else {
            return Vec::new();
        };
        let since = crate::history::entry::now_ms()
            .saturating_sub(i64::try_from(lookback.as_millis()).unwrap_or(i64::MAX));
        let queries: Vec<Query> = hops
            .iter()
            .map(|(zone, cluster)| Query {
                zone: Some(zone.clone()),
                cluster: Some(cluster.clone()),
                since: Some(since),
                limit: MAX_RECENT_CHANGES,
                ..Query::default()
            })
            .collect();
        let read = db
            .read(move |db| {
                let mut rows = Vec::new();
                for q in &queries {
                    rows.extend(db.query(q)?.rows);
                }
                Ok(rows)
            })
            .await;
        let mut rows = match read {
            Ok(rows) => rows,
            Err(e) => {
                warn!(error = %e, "Recent changes not read.");
                return Vec::new();
            }
        };
        rows.sort_by_key(|r| std::cmp::Reverse(r.id));
        rows.dedup_by_key(|r| r.id);
        rows.truncate(MAX_RECENT_CHANGES);
        rows.iter().map(|r| r.stored().to_entry(r.id)).collect()
    }

    /// Diagnoses one cluster with `edge` in the edge's role: collects the evidence,
    /// runs the playbook and adds to each skipped step why its evidence was not read.
    async fn run_one(
        &self,
        zone: &ZoneRecord,
        cluster: &str,
        req: &Request,
        edge: &EdgeSide,
    ) -> Result<Diagnosed, DiagnosisError> {
        let mut notes = Notes::default();
        let mut input = DiagnosisInput::new(cluster, &zone.zone_name);
        input.symptom = req.symptom;
        input.path = req.path.clone();
        if let EdgeSide::Caller { upstream, .. } = edge {
            input.edge_cluster = Some(upstream.clone());
        }
        if req.symptom != Some(Symptom::MissingMetrics) {
            collect_sidecars(self, zone, cluster, req, edge, &mut input, &mut notes).await;
            input.control = control_evidence(self, zone, cluster, edge);
            input.identity = self.identity_evidence(zone, cluster, edge).await;
        }
        input.metrics = metrics_evidence(self, &zone.zone_name, cluster, &mut notes.metrics).await;
        if input.metrics.is_none() {
            notes.metrics.push(format!(
                "cluster {cluster} is not registered in zone {}",
                zone.zone_name
            ));
        }
        let (mut report, failing_calls) = tokio::task::spawn_blocking(move || {
            (
                meshcat_diagnose::diagnose(&input),
                failing_upstreams(&input.services),
            )
        })
        .await
        .map_err(|e| DiagnosisError(e.to_string()))?;
        add_notes(&mut report, &notes);
        Ok(Diagnosed {
            report,
            failing_calls,
        })
    }
}

impl Diagnosis {
    /// The workload identity on the hop from the edge side to `cluster`, from the
    /// catalog (contract section 19): the caller's SAN expectations against what the
    /// cluster's instances present (the graph's `tlsIdentity` of the edge), each
    /// side's certificates, both owners. `None` when neither side holds any identity.
    async fn identity_evidence(
        &self,
        zone: &ZoneRecord,
        cluster: &str,
        edge: &EdgeSide,
    ) -> Option<meshcat_diagnose::IdentityEvidence> {
        let (caller_zone, caller) = match edge {
            EdgeSide::Zone if !zone.request_cluster.is_empty() => {
                (zone.zone_name.clone(), zone.request_cluster.clone())
            }
            EdgeSide::Zone => return None,
            EdgeSide::Caller { zone, cluster, .. } => (zone.clone(), cluster.clone()),
        };
        let identities = self.instances.identities();
        let max = meshcat_diagnose::evidence::MAX_IDENTITY_INSTANCES;
        let callers = identities.instances_of(&caller_zone, &caller, max);
        let targets = identities.instances_of(&zone.zone_name, cluster, max);
        let none = |v: &[(String, meshcat_common::identity::InstanceIdentity)]| {
            v.iter()
                .all(|(_, i)| i.state == meshcat_common::identity::CertState::None)
        };
        if none(&callers) && none(&targets) {
            return None;
        }
        let tls = match self.graphs.fresh(&self.store).await {
            Ok(snapshot) => snapshot
                .calls_from(&caller_zone, &caller)
                .into_iter()
                .find(|(_, n)| n.zone_name == zone.zone_name && n.cluster_name == cluster)
                .and_then(|(l, _)| snapshot.graph().tls_identity(l).cloned()),
            Err(_) => None,
        };
        let owner = |z: &str, c: &str| {
            self.store
                .record(z, c)
                .map(|r| r.owner.clone())
                .unwrap_or_default()
        };
        Some(meshcat_diagnose::IdentityEvidence {
            caller_owner: owner(&caller_zone, &caller),
            target_owner: owner(&zone.zone_name, cluster),
            caller,
            tls,
            callers,
            targets,
            read_at_ms: crate::history::entry::now_ms(),
        })
    }
}

/// Most clusters a diagnosis follows, the one asked about included: `maxHops`
/// within its bounds; only that one for `missing_metrics`, which no failing call
/// explains.
fn most_hops(req: &Request) -> usize {
    match req.symptom {
        Some(Symptom::MissingMetrics) => 1,
        _ => req.max_hops.clamp(1, MAX_HOPS),
    }
}

/// How a cluster reached by following a failing call is read: every access line
/// (the request's path is the first cluster's, its internal calls have others; the
/// newest failing line is followed), and without a debug window (one request runs
/// at most one window, the first cluster's, so it takes at most `debugSeconds`
/// longer whatever the hops).
fn hop_request(req: &Request) -> Request {
    Request {
        path: None,
        debug_seconds: None,
        ..req.clone()
    }
}

/// Whether a cluster's failure is its own: its deepest failing step on the
/// request's way is one of the mesh's way to its service (the control server,
/// discovery, routes, mTLS, a refused connection, no endpoint), which no failing call of its service to
/// another cluster explains. Such a cluster is the root cause; the diagnosis goes
/// no further. A failure its service answered itself (an error, a timeout), or
/// none, or one of the metrics checks only, leaves its calls to be looked at.
fn fails_on_its_own(report: &DiagnosisReport) -> bool {
    report
        .failure
        .as_ref()
        .is_some_and(|f| f.step.reads() != Reads::Metrics && !f.answered_by_service)
}

/// The cluster that `(zone, cluster)` calls and whose failure can explain the
/// caller's: an edge of the graph from the caller to a cluster not yet followed
/// (external services are not diagnosed) with errors within the window, and either
/// failing access lines of the caller's sidecars to the edge's upstream
/// (`failing_calls`) or an error ratio at or above `warning` (the status rules'
/// warning ratio; every call failing counts as 1 when none was answered). Of
/// several, the one with the most errors, then the highest error ratio, then by
/// id. Answers it with the caller's upstream cluster that reaches it.
fn failing_callee(
    snapshot: &Snapshot,
    (zone, cluster): (&str, &str),
    failing_calls: &BTreeMap<String, usize>,
    warning: f64,
    followed: &[(String, String)],
) -> Option<Callee> {
    snapshot
        .calls_from(zone, cluster)
        .into_iter()
        .filter(|(l, n)| l.errors > 0 && n.kind == "cluster")
        .filter_map(|(l, n)| {
            let upstream = l.via.as_deref()?;
            let key = (n.zone_name.clone(), n.cluster_name.clone());
            let ratio = if l.requests == 0 {
                1.0
            } else {
                (l.errors as f64 / l.requests as f64).min(1.0)
            };
            let logged = failing_calls.get(upstream).is_some_and(|n| *n > 0);
            (!followed.contains(&key) && (logged || ratio >= warning))
                .then_some((l.errors, ratio, key, upstream))
        })
        .max_by(|(ea, ra, ka, _), (eb, rb, kb, _)| {
            ea.cmp(eb).then(ra.total_cmp(rb)).then(kb.cmp(ka))
        })
        .map(|(_, _, (zone, cluster), upstream)| Callee {
            zone,
            cluster,
            upstream: upstream.to_owned(),
        })
}

/// One report from the reports of the clusters followed, in order: the first one's
/// checks, the hops, the root cause (the deepest cluster whose own checks fail) with
/// its owner, and a conclusion that starts with it.
fn across_hops(store: &Store, reports: Vec<DiagnosisReport>) -> DiagnosisReport {
    let hops: Vec<Hop> = reports
        .iter()
        .map(|r| Hop {
            zone_name: r.zone.clone(),
            cluster_name: r.cluster.clone(),
            conclusion: r.conclusion.clone(),
        })
        .collect();
    // A cluster followed for its failing calls is their cause only through a check
    // of the request's way; its metrics settings explain no failing call.
    let root = reports.iter().enumerate().rev().find_map(|(i, r)| {
        r.failure
            .as_ref()
            .filter(|f| i == 0 || f.step.reads() != Reads::Metrics)
            .map(|_| r)
    });
    let root_cause = root.and_then(|r| {
        let failure = r.failure.as_ref()?;
        let record = store.record(&r.zone, &r.cluster);
        Some(RootCause {
            zone_name: r.zone.clone(),
            cluster_name: r.cluster.clone(),
            owner: record.as_ref().map(|c| c.owner.clone()).unwrap_or_default(),
            owner_url: record.map(|c| c.owner_url.clone()).unwrap_or_default(),
            step: failure.step,
            finding: failure.finding.clone(),
        })
    });
    let mut conclusion = match (&root_cause, root) {
        (Some(rc), Some(r)) => {
            let owner = if rc.owner.is_empty() {
                "no owner registered".to_owned()
            } else if rc.owner_url.is_empty() {
                format!("owner {}", rc.owner)
            } else {
                format!("owner {}, {}", rc.owner, rc.owner_url)
            };
            format!(
                "{} in zone {} ({owner}): {}",
                rc.cluster_name, rc.zone_name, r.conclusion
            )
        }
        _ => reports[0].conclusion.clone(),
    };
    if hops.len() > 1 {
        let chain: Vec<&str> = hops.iter().map(|h| h.cluster_name.as_str()).collect();
        conclusion.push_str(&format!(
            " Followed the failing calls {}.",
            chain.join(" -> ")
        ));
    }
    let mut first = reports.into_iter().next().expect("one report at least");
    first.conclusion = conclusion;
    first.hops = hops;
    first.root_cause = root_cause;
    first
}

/// The detail of a `diagnosed` entry: the conclusion as the root cause's own
/// cluster put it, naming that cluster but not its owner (the registration says
/// who owns it, once, not every entry), and the root cause by zone, cluster, step
/// and finding. The writer caps each string.
fn diagnosed_detail(symptom: Option<Symptom>, report: &DiagnosisReport) -> Detail {
    let own = |zone: &str, cluster: &str| {
        report
            .hops
            .iter()
            .find(|h| h.zone_name == zone && h.cluster_name == cluster)
            .map(|h| h.conclusion.as_str())
    };
    let conclusion = match &report.root_cause {
        Some(rc) => format!(
            "{} in zone {}: {}",
            rc.cluster_name,
            rc.zone_name,
            own(&rc.zone_name, &rc.cluster_name).unwrap_or("")
        ),
        None => report
            .hops
            .first()
            .map_or_else(|| report.conclusion.clone(), |h| h.conclusion.clone()),
    };
    Detail::Diagnosed {
        symptom: symptom.map(Symptom::as_str),
        conclusion,
        root_cause: report.root_cause.as_ref().map(|rc| {
            serde_json::json!({
                "zoneName": rc.zone_name,
                "clusterName": rc.cluster_name,
                "step": rc.step,
                "finding": rc.finding,
            })
        }),
    }
}

/// Notes on evidence that could not be collected, added to the skipped steps.
#[derive(Default)]
struct Notes {
    /// Which edge instance's evidence the edge checks read, when one answered: the
    /// edge cluster may have several instances and the first may have failed.
    edge_source: Option<String>,
    edge: Vec<String>,
    services: Vec<String>,
    metrics: Vec<String>,
}

/// Asks one sidecar for its evidence, wherever it is served.
async fn collect(
    sidecars: &Sidecars,
    zone: &str,
    cluster: &str,
    instance: &str,
    ask: Ask,
    deadline: Duration,
) -> Result<EvidenceOutput, String> {
    let target = sidecars
        .target(zone, cluster, instance)
        .map_err(|e| format!("{instance}: {e}"))?;
    match sidecars.run((zone, cluster), &target, ask, deadline).await {
        Ok(Answer::Evidence(e)) => Ok(*e),
        Ok(_) => Err(format!(
            "{instance}: the agent answered with an unexpected output"
        )),
        Err(e) => Err(e.to_string()),
    }
}

/// What the catalog knows about the cluster's metrics; `None` when unregistered.
async fn metrics_evidence(
    d: &Diagnosis,
    zone: &str,
    cluster: &str,
    notes: &mut Vec<String>,
) -> Option<MetricsEvidence> {
    let record = d.store.record(zone, cluster)?;
    // (instance, whether it reports metrics): this replica's instances, then those
    // other replicas own, whose metrics are asked from their owner.
    let mut read: Vec<(String, bool)> = d
        .instances
        .live_instances(zone, cluster)
        .iter()
        .map(|i| (i.instance.clone(), reports_metrics(&i.metrics)))
        .collect();
    let mut remote: Vec<(String, String)> = d
        .instances
        .live_owners(zone, cluster)
        .into_iter()
        .filter_map(|live| Some((live.instance, live.owner?)))
        .collect();
    if remote.len() > MAX_REMOTE_METRICS {
        notes.push(format!(
            "{} instances owned by other replicas not read (the first {MAX_REMOTE_METRICS} by name were)",
            remote.len() - MAX_REMOTE_METRICS
        ));
        remote.truncate(MAX_REMOTE_METRICS);
    }
    let replicas = d.sidecars.replicas();
    let asked = join_all(remote.iter().map(|(instance, owner)| {
        let replicas = &replicas;
        async move {
            replicas
                .metrics(owner, (zone, cluster, instance), d.tools.command_timeout)
                .await
                .map(|m| reports_metrics(&m))
                .map_err(|e| format!("{instance}: {e}"))
        }
    }))
    .await;
    for ((instance, _), answer) in remote.iter().zip(asked) {
        match answer {
            Ok(reports) => read.push((instance.clone(), reports)),
            Err(e) => notes.push(e),
        }
    }
    read.sort();
    let silent: Vec<&str> = read
        .iter()
        .filter(|(_, reports)| !reports)
        .map(|(i, _)| i.as_str())
        .collect();
    let with_metrics = read.len() - silent.len();
    let silent_instances = silent
        .iter()
        .take(MAX_NAMED_SILENT)
        .map(|n| (*n).to_owned())
        .collect();
    let prometheus_up = match (&d.tools.prometheus, record.prometheus_job.is_empty()) {
        (Some(prometheus), false) => match prometheus.up(&record.prometheus_job).await {
            Ok(up) => Some(up),
            Err(e) => {
                notes.push(e);
                None
            }
        },
        (None, _) => {
            notes.push("no --prometheus-url is set, so the collector was not asked".into());
            None
        }
        (Some(_), true) => None,
    };
    Some(MetricsEvidence {
        enable_instance_metrics: record.enable_instance_metrics,
        prometheus_job: record.prometheus_job.clone(),
        live_instances: read.len(),
        instances_with_metrics: with_metrics,
        silent_instances,
        prometheus_up,
    })
}

/// Appends the collection notes to the steps skipped for lack of that evidence, and
/// puts first in the edge checks which edge instance answered.
fn add_notes(report: &mut DiagnosisReport, notes: &Notes) {
    for step in &mut report.steps {
        let reads = step.name.reads();
        if let Some(source) = &notes.edge_source
            && matches!(reads, Reads::Edge | Reads::EdgeAndServices)
        {
            step.evidence.insert(0, source.clone());
        }
        if step.verdict != Verdict::Skipped {
            continue;
        }
        let which: &[String] = match reads {
            Reads::Edge => &notes.edge,
            Reads::Services => &notes.services,
            Reads::EdgeAndServices => {
                step.evidence.extend(notes.edge.iter().cloned());
                &notes.services
            }
            Reads::Metrics => &notes.metrics,
            // Read from this replica's own view and sync; the step's own evidence
            // says what is missing.
            Reads::ControlServer => &[],
        };
        step.evidence.extend(which.iter().cloned());
    }
}

/// Whether the control-plane cluster `raw` stands for the diagnosed `cluster`, which
/// the edge knows as `edge_name`: by either name, or as the service a mesh-specific
/// name stands for ([`service_of`]) when `raw` is not a registered cluster of its
/// own (the catalog's rule, `store::declared`).
fn stands_for(
    raw: &str,
    (cluster, edge_name): (&str, &str),
    registered: impl Fn(&str) -> bool,
) -> bool {
    raw == cluster || raw == edge_name || (service_of(raw) == cluster && !registered(raw))
}

/// What the zone's control server declares for `cluster`, and the sync with it of
/// the sidecars in the edge's role (cut to that cluster's upstream) and of the
/// cluster's own sidecars. `None` when the zone has no view of a control server (the
/// control plane is off for meshcat, or the server never answered): the step is
/// then left out and the report is the playbook's alone.
fn control_evidence(
    d: &Diagnosis,
    zone: &ZoneRecord,
    cluster: &str,
    edge: &EdgeSide,
) -> Option<ControlEvidence> {
    let z = zone.zone_name.as_str();
    let status = d.controls.status(z)?;
    if status.state == ControlState::Disabled {
        return None;
    }
    let view = d.controls.view(z)?;
    let (edge_zone, edge_cluster, edge_name) = match edge {
        EdgeSide::Zone => (z, zone.request_cluster.as_str(), cluster),
        EdgeSide::Caller {
            zone: ez,
            cluster: ec,
            upstream,
        } => (ez.as_str(), ec.as_str(), upstream.as_str()),
    };
    // The catalog's own mapping first (it also maps by listener address), then the
    // names the edge may use.
    let mapped = d.store.declared_names(z, cluster);
    let ours = |raw: &str| {
        mapped.iter().any(|m| m == raw)
            || stands_for(raw, (cluster, edge_name), |r| {
                d.store.record(z, r).is_some()
            })
    };
    let declared = view
        .clusters
        .iter()
        .filter(|(raw, _)| ours(raw))
        .take(MAX_DECLARED_CLUSTERS)
        .map(|(raw, c)| declared_of(raw, c))
        .collect();
    let mut sidecars = Vec::new();
    if !edge_cluster.is_empty() && (edge_zone, edge_cluster) != (z, cluster) {
        let owner = owner_of(d, edge_zone, edge_cluster);
        let (_, proxies) = d.sync.list(Some(edge_zone), Some(edge_cluster), None);
        sidecars.extend(
            first_proxies(proxies)
                .iter()
                .map(|p| sync_of(Role::Edge, p, &owner, Some(&ours))),
        );
    }
    let owner = owner_of(d, z, cluster);
    let (_, proxies) = d.sync.list(Some(z), Some(cluster), None);
    sidecars.extend(
        first_proxies(proxies)
            .iter()
            .map(|p| sync_of(Role::Service, p, &owner, None)),
    );
    Some(ControlEvidence {
        server_address: status.server_address,
        state: status.state.as_str().to_owned(),
        error: status.error,
        view_clusters: view.clusters.len(),
        declared,
        sidecars,
        read_at_ms: crate::sync::now_ms(),
    })
}

fn owner_of(d: &Diagnosis, zone: &str, cluster: &str) -> String {
    d.store
        .record(zone, cluster)
        .map(|r| r.owner.clone())
        .unwrap_or_default()
}

fn declared_of(name: &str, c: &ViewCluster) -> DeclaredCluster {
    DeclaredCluster {
        name: name.to_owned(),
        endpoints: c.len(),
        healthy: c.healthy as usize,
        listed: c
            .endpoints()
            .take(MAX_DECLARED_ENDPOINTS)
            .map(|e| DeclaredEndpoint {
                address: e.address.to_owned(),
                health: e.health.to_owned(),
                healthy: e.healthy,
            })
            .collect(),
    }
}

/// At most [`MAX_SYNC_SIDECARS`] proxies: those out of sync first, then by name.
fn first_proxies(mut proxies: Vec<crate::sync::Proxy>) -> Vec<crate::sync::Proxy> {
    use crate::sync::SyncState as S;
    proxies.sort_by_key(|p| matches!(p.state, S::Synced | S::Unknown));
    proxies.truncate(MAX_SYNC_SIDECARS);
    proxies
}

/// A proxy's sync for the engine. With `keep`, only the stale upstreams and the
/// endpoint rejections of the clusters it keeps (an edge's, for the diagnosed
/// cluster); a rejection of clusters, listeners or routes concerns every cluster.
fn sync_of(
    role: Role,
    p: &crate::sync::Proxy,
    owner: &str,
    keep: Option<&dyn Fn(&str) -> bool>,
) -> SidecarSync {
    let kept = |name: &str| keep.is_none_or(|k| k(name));
    let mut s = SidecarSync::new(
        role,
        (&p.cluster_name, owner),
        &p.instance,
        p.state,
        p.since_ms,
    );
    s.text = p.detail.text.clone();
    s.stale = p
        .detail
        .clusters
        .iter()
        .filter(|c| kept(&c.cluster))
        .cloned()
        .collect();
    s.rejections = p
        .detail
        .rejections
        .iter()
        .filter(|r| r.kind != "endpoints" || r.resource.is_empty() || kept(&r.resource))
        .cloned()
        .collect();
    s
}

/// The live instances of (zone, cluster) by name, this replica's and its peers'.
fn live_names(sidecars: &Sidecars, zone: &str, cluster: &str) -> Vec<String> {
    sidecars
        .targets(zone, cluster)
        .into_iter()
        .map(|t| t.instance)
        .collect()
}

/// Collects the edge's and the service instances' evidence, all at once.
async fn collect_sidecars(
    d: &Diagnosis,
    zone: &ZoneRecord,
    cluster: &str,
    q: &Request,
    edge: &EdgeSide,
    input: &mut DiagnosisInput,
    notes: &mut Notes,
) {
    let sidecars = &d.sidecars;
    let cmd = Ask::Evidence {
        path: q.path.clone(),
        max_lines: EVIDENCE_LOG_LINES,
        debug_seconds: q.debug_seconds,
        lines: LineQuery::default(),
    };
    let deadline = window_deadline(d.tools.command_timeout, q.debug_seconds.unwrap_or(0));
    let (edge_zone, edge_cluster) = match edge {
        EdgeSide::Zone => (zone.zone_name.as_str(), zone.request_cluster.as_str()),
        EdgeSide::Caller {
            zone: z,
            cluster: c,
            ..
        } => (z.as_str(), c.as_str()),
    };
    let edges: Vec<String> = if edge_cluster.is_empty() {
        notes.edge.push(format!(
            "zone {} has no requestCluster, so no edge sidecar is known",
            zone.zone_name
        ));
        Vec::new()
    } else {
        let live = live_names(sidecars, edge_zone, edge_cluster);
        if live.is_empty() {
            notes.edge.push(format!(
                "the edge cluster {edge_cluster} has no live instance reported by an agent"
            ));
        }
        live.into_iter().take(MAX_EDGE_TRIES).collect()
    };
    let mut services = live_names(sidecars, &zone.zone_name, cluster);
    if services.is_empty() {
        notes.services.push(format!(
            "cluster {cluster} has no live instance reported by an agent"
        ));
    }
    if services.len() > MAX_DIAGNOSED_INSTANCES {
        notes.services.push(format!(
            "{} of {} instances read (the first by name)",
            MAX_DIAGNOSED_INSTANCES,
            services.len()
        ));
        services.truncate(MAX_DIAGNOSED_INSTANCES);
    }
    let mut edge_notes = Vec::new();
    let edge_run = collect_edge(
        sidecars,
        input,
        (edge_zone, edge_cluster),
        &edges,
        &cmd,
        deadline,
        &mut edge_notes,
    );
    let service_runs = join_all(
        services
            .iter()
            .map(|i| collect(sidecars, &zone.zone_name, cluster, i, cmd.clone(), deadline)),
    );
    let ((edge_out, edge_failures), service_outs) = tokio::join!(edge_run, service_runs);
    notes.edge.extend(edge_notes);
    if let Some((i, e)) = edge_out {
        let others = if edge_failures.is_empty() {
            String::new()
        } else {
            format!(", not from {}", edge_failures.join("; "))
        };
        notes.edge_source = Some(match edge {
            EdgeSide::Zone => format!("edge evidence from instance {i}{others}"),
            EdgeSide::Caller {
                cluster: caller,
                upstream,
                ..
            } if upstream != cluster => format!(
                "edge evidence from instance {i} of {caller}, whose calls to {cluster} (its cluster {upstream}) fail{others}"
            ),
            EdgeSide::Caller {
                cluster: caller, ..
            } => format!(
                "edge evidence from instance {i} of {caller}, whose calls to {cluster} fail{others}"
            ),
        });
        input.edge = Some(e);
    } else {
        notes.edge.extend(edge_failures);
    }
    for (i, out) in services.iter().zip(service_outs) {
        match out {
            Ok(e) => input.services.push(SidecarEvidence::from_output(
                Role::Service,
                i,
                &e,
                &mut notes.services,
            )),
            Err(e) => notes.services.push(e),
        }
    }
    ask_request_lines(d, &zone.zone_name, cluster, input, notes).await;
}

/// Asks again, by its request id, each service sidecar whose log answer lacks the
/// lines of the request the edge's line names and does not reach back to its time
/// ([`request_to_ask`]): a flood of other lines (a debug window, a busy sidecar)
/// fills the newest lines, not the request's, which the agent picks from every line
/// it holds. Only the log is read again, within the command deadline.
async fn ask_request_lines(
    d: &Diagnosis,
    zone: &str,
    cluster: &str,
    input: &mut DiagnosisInput,
    notes: &mut Notes,
) {
    let asks: Vec<(usize, String)> = input
        .services
        .iter()
        .enumerate()
        .filter_map(|(n, side)| request_to_ask(input, side).map(|id| (n, id)))
        .collect();
    if asks.is_empty() {
        return;
    }
    let answers = join_all(asks.iter().map(|(n, id)| {
        let ask = Ask::Evidence {
            path: None,
            max_lines: EVIDENCE_LOG_LINES,
            debug_seconds: None,
            lines: LineQuery {
                request_id: Some(id.clone()),
                log_only: true,
            },
        };
        let instance = input.services[*n].instance.clone();
        async move {
            collect(
                &d.sidecars,
                zone,
                cluster,
                &instance,
                ask,
                d.tools.command_timeout,
            )
            .await
        }
    }))
    .await;
    for ((n, id), answer) in asks.iter().zip(answers) {
        match answer {
            Ok(out) => input.services[*n].add_request_lines(id, &out),
            Err(e) => notes
                .services
                .push(format!("the lines of request {id} were not read: {e}")),
        }
    }
}

/// Asks the edge instances all at once, each within `deadline`, and keeps the answer
/// whose log speaks most for the diagnosis ([`choose_edge`]): with several edges,
/// only one may have seen the failure. Answers the chosen instance, its evidence,
/// and why the others were not chosen.
async fn collect_edge(
    s: &Sidecars,
    input: &DiagnosisInput,
    (zone, edge_cluster): (&str, &str),
    edges: &[String],
    cmd: &Ask,
    deadline: Duration,
    notes: &mut Vec<String>,
) -> (Option<(String, SidecarEvidence)>, Vec<String>) {
    let answers = join_all(
        edges
            .iter()
            .map(|i| collect(s, zone, edge_cluster, i, cmd.clone(), deadline)),
    )
    .await;
    let mut failures = Vec::new();
    let mut answered = Vec::new();
    for (instance, answer) in edges.iter().zip(answers) {
        match answer {
            Ok(out) => {
                let ev = SidecarEvidence::from_output(Role::Edge, instance, &out, notes);
                answered.push((instance.clone(), ev));
            }
            Err(e) => {
                warn!(%zone, %instance, error = %e, "Edge evidence failed.");
                failures.push(e);
            }
        }
    }
    let choice = choose_edge(input, answered);
    failures.extend(choice.passed_over);
    (choice.chosen, failures)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Built, Link, Node};
    use meshcat_common::model::{ClusterRecord, Status};
    use meshcat_diagnose::{Failure, StepName};

    fn node(id: &str, kind: &'static str) -> Node {
        let (zone, name) = id.split_once('/').unwrap();
        Node {
            id: id.into(),
            kind,
            zone_name: zone.into(),
            cluster_name: name.strip_prefix("external:").unwrap_or(name).into(),
            registered: kind == "cluster",
            status: (kind == "cluster").then_some(Status::Stable),
            owner: String::new(),
            instances: 1,
            drifted: false,
            cert_expires_ms: None,
            identity_state: meshcat_common::identity::CertState::None,
        }
    }

    /// z/a's calls: to b through b's listener (as `b-by-address`), to c by name,
    /// to d without errors, to y/e in another zone, to an external service; its
    /// figures as (requests, errors).
    fn calls_of_a(figures: [(u64, u64); 5]) -> Snapshot {
        let nodes = vec![
            node("y/e", "cluster"),
            node("z/a", "cluster"),
            node("z/b", "cluster"),
            node("z/c", "cluster"),
            node("z/d", "cluster"),
            node("z/external:x", "external"),
        ];
        let targets = [
            (2, "b-by-address"),
            (3, "c"),
            (4, "d"),
            (0, "e-out"),
            (5, "x"),
        ];
        let links = targets
            .iter()
            .zip(figures)
            .map(|(&(target, via), (requests, errors))| Link {
                requests,
                errors,
                observed: true,
                via: Some(Arc::from(via)),
                ..Link::new(1, target)
            })
            .collect();
        let mut graph = Built {
            window_seconds: 60,
            error_ratio_warning: 0.05,
            nodes,
            links,
            tls: Vec::new(),
        };
        graph.links.sort_by_key(|l| (l.source, l.target));
        Snapshot::new(1, graph)
    }

    fn callee(zone: &str, cluster: &str, upstream: &str) -> Option<Callee> {
        Some(Callee {
            zone: zone.into(),
            cluster: cluster.into(),
            upstream: upstream.into(),
        })
    }

    #[test]
    fn a_call_is_followed_on_failing_lines_or_an_error_ratio_at_the_warning() {
        let from_a = ("z", "a");
        let none = BTreeMap::new();
        let asked = vec![("z".to_owned(), "a".to_owned())];
        // A stray 5xx on b (1 in 1,000), c at the warning ratio, d without errors,
        // the external service failing every call.
        let graph = calls_of_a([(1000, 1), (100, 5), (100, 0), (0, 0), (10, 10)]);
        assert_eq!(
            failing_callee(&graph, from_a, &none, 0.05, &asked),
            callee("z", "c", "c")
        );
        // Below the ratio, with nothing in the caller's lines: nothing to follow.
        assert_eq!(failing_callee(&graph, from_a, &none, 0.06, &asked), None);
        // The caller's sidecar logged failing calls to b's upstream: b, by the
        // caller's name for it, although its ratio is low.
        let logged = BTreeMap::from([("b-by-address".to_owned(), 1)]);
        let graph = calls_of_a([(1000, 20), (100, 5), (100, 0), (0, 0), (10, 10)]);
        assert_eq!(
            failing_callee(&graph, from_a, &logged, 0.05, &asked),
            callee("z", "b", "b-by-address")
        );
        // Lines of an upstream whose edge has no errors in the window do not count.
        let graph = calls_of_a([(1000, 0), (100, 5), (100, 0), (0, 0), (10, 10)]);
        assert_eq!(
            failing_callee(&graph, from_a, &logged, 0.05, &asked),
            callee("z", "c", "c")
        );
        // A cluster already followed is not followed again.
        let mut followed = asked.clone();
        followed.push(("z".into(), "c".into()));
        assert_eq!(failing_callee(&graph, from_a, &none, 0.05, &followed), None);
        // Calls that all failed before an answer (no request counted): ratio 1; in
        // another zone too.
        let graph = calls_of_a([(1000, 0), (100, 0), (100, 0), (0, 3), (10, 10)]);
        assert_eq!(
            failing_callee(&graph, from_a, &none, 0.5, &asked),
            callee("y", "e", "e-out")
        );
        // Of several, the most errors.
        let graph = calls_of_a([(100, 50), (100, 60), (100, 0), (0, 0), (10, 10)]);
        assert_eq!(
            failing_callee(&graph, from_a, &none, 0.05, &asked),
            callee("z", "c", "c")
        );
        // A cluster that calls nothing, or is no node.
        assert_eq!(failing_callee(&graph, ("z", "b"), &none, 0.0, &asked), None);
        assert_eq!(
            failing_callee(&graph, ("z", "nobody"), &none, 0.0, &asked),
            None
        );
    }

    fn report(cluster: &str, failure: Option<(StepName, bool)>) -> DiagnosisReport {
        let mut r = meshcat_diagnose::diagnose(&DiagnosisInput::new(cluster, "z"));
        r.failure = failure.map(|(step, answered_by_service)| Failure {
            step,
            finding: format!("{cluster} fails at {step}."),
            answered_by_service,
        });
        if let Some(f) = &r.failure {
            r.conclusion = format!("{} failed: {}", f.step, f.finding);
        }
        r
    }

    #[test]
    fn a_failure_on_the_way_to_the_service_is_its_own() {
        for (failure, own) in [
            (None, false),
            (Some((StepName::EdgeRoutes, false)), true),
            (Some((StepName::EdgeDiscovery, false)), true),
            (Some((StepName::ControlServer, false)), true),
            (Some((StepName::ServiceDiscovery, false)), true),
            (Some((StepName::Mtls, false)), true),
            (Some((StepName::ServiceLogs, false)), true),
            (Some((StepName::ServiceLogs, true)), false),
            (Some((StepName::EdgeLogs, true)), false),
            (Some((StepName::MetricsSettings, false)), false),
        ] {
            assert_eq!(fails_on_its_own(&report("a", failure)), own, "{failure:?}");
        }
    }

    /// A `diagnosed` entry names the root cause's cluster, never its owner's text,
    /// however long that is; without a root cause it holds the asked cluster's own
    /// conclusion.
    #[test]
    fn a_diagnosed_entry_names_the_cluster_and_holds_no_owner_text() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _instances) = Store::open(dir.path(), crate::store::Rules::defaults()).unwrap();
        store
            .writes()
            .create_zone(ZoneRecord::new("z", "cp:50000"))
            .unwrap();
        let owner = format!("team-secret {}", "x".repeat(3000));
        for cluster in ["a", "b"] {
            let mut r = ClusterRecord::new("z", cluster, cluster);
            r.owner = owner.clone();
            r.owner_url = "https://teams.example/secret".into();
            store.writes().create_cluster(r).unwrap();
        }
        let r = across_hops(
            &store,
            vec![
                report("a", Some((StepName::ServiceLogs, true))),
                report("b", Some((StepName::ServiceLogs, false))),
            ],
        );
        assert!(r.conclusion.contains("team-secret"), "the answer names it");
        let d =
            serde_json::to_string(&diagnosed_detail(Some(Symptom::NoHealthyUpstream), &r)).unwrap();
        assert!(
            !d.contains("team-secret") && !d.contains("teams.example"),
            "{d}"
        );
        let j: serde_json::Value = serde_json::from_str(&d).unwrap();
        assert_eq!(
            j["conclusion"],
            "b in zone z: service_logs failed: b fails at service_logs."
        );
        assert_eq!(j["rootCause"]["clusterName"], "b");
        assert_eq!(j["rootCause"]["step"], "service_logs");
        assert!(d.len() < 400, "{d}");
        let r = across_hops(&store, vec![report("a", None)]);
        let j = serde_json::to_value(diagnosed_detail(None, &r)).unwrap();
        assert_eq!(j["conclusion"], r.conclusion.as_str());
        assert!(j["rootCause"].is_null());
    }

    #[test]
    fn the_root_cause_is_the_deepest_cluster_whose_own_checks_fail() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _instances) = Store::open(dir.path(), crate::store::Rules::defaults()).unwrap();
        store
            .writes()
            .create_zone(ZoneRecord::new("z", "cp:50000"))
            .unwrap();
        for (cluster, owner) in [("a", "team-a"), ("b", "team-b")] {
            let mut r = ClusterRecord::new("z", cluster, cluster);
            r.owner = owner.into();
            r.owner_url = format!("https://teams.example/{cluster}");
            store.writes().create_cluster(r).unwrap();
        }
        // a's service answered 5xx; b's refuses connections behind its sidecar.
        let r = across_hops(
            &store,
            vec![
                report("a", Some((StepName::ServiceLogs, true))),
                report("b", Some((StepName::ServiceLogs, false))),
            ],
        );
        let root = r.root_cause.unwrap();
        assert_eq!(
            (root.cluster_name.as_str(), root.owner.as_str(), root.step),
            ("b", "team-b", StepName::ServiceLogs)
        );
        assert!(
            r.conclusion
                .starts_with("b in zone z (owner team-b, https://teams.example/b): "),
            "{}",
            r.conclusion
        );
        assert!(
            r.conclusion
                .ends_with(" Followed the failing calls a -> b.")
        );
        assert_eq!(r.hops.len(), 2);
        // The cluster asked about, when nothing followed fails on its own; a
        // metrics check counts for it, not for a cluster followed.
        let r = across_hops(
            &store,
            vec![
                report("a", Some((StepName::MetricsSettings, false))),
                report("b", Some((StepName::MetricsCollector, false))),
            ],
        );
        assert_eq!(r.root_cause.unwrap().cluster_name, "a");
        // Nothing fails: no root cause, the asked cluster's conclusion.
        let r = across_hops(&store, vec![report("a", None)]);
        assert!(r.root_cause.is_none());
        assert!(
            r.conclusion.starts_with("No check failed"),
            "{}",
            r.conclusion
        );
    }

    #[test]
    fn a_cluster_followed_is_read_without_the_path_and_the_debug_window() {
        let req = Request {
            symptom: Some(Symptom::UpstreamConnectError),
            path: Some("/orders".into()),
            debug_seconds: Some(300),
            max_hops: 5,
            lookback: Duration::from_secs(60),
        };
        let hop = hop_request(&req);
        assert_eq!((hop.path, hop.debug_seconds), (None, None));
        assert_eq!(
            (hop.symptom, hop.max_hops, hop.lookback),
            (req.symptom, 5, req.lookback)
        );
        assert_eq!(most_hops(&req), 5);
        let bounded = |max_hops, symptom| {
            most_hops(&Request {
                max_hops,
                symptom,
                ..Request::default()
            })
        };
        assert_eq!((bounded(0, None), bounded(9, None)), (1, MAX_HOPS));
        assert_eq!(bounded(5, Some(Symptom::MissingMetrics)), 1);
    }

    #[test]
    fn control_plane_names_stand_for_the_cluster_as_the_catalog_maps_them() {
        let registered = |r: &str| ["reviews", "reviews.shadow"].contains(&r);
        let ours = |raw: &str| stands_for(raw, ("reviews", "reviews-by-address"), registered);
        assert!(ours("reviews"));
        assert!(ours("reviews-by-address"));
        assert!(ours("outbound|9080||reviews.default.svc.cluster.local"));
        assert!(ours("outbound|9080|v2|reviews.default.svc.cluster.local"));
        assert!(ours("reviews.default.dc1.internal.abc.consul"));
        // A registered cluster stands for itself, whatever its name looks like.
        assert!(!ours("reviews.shadow"));
        assert!(!ours("ratings"));
        assert!(!ours("outbound|9080||ratings.default.svc.cluster.local"));
    }

    #[test]
    fn an_edges_sync_is_cut_to_the_diagnosed_clusters_upstream() {
        use crate::sync::derive::{Rejection, StaleCluster};
        use crate::sync::{Proxy, SyncDetail, SyncState};
        let stale = |cluster: &str| StaleCluster {
            cluster: cluster.into(),
            since_ms: 1,
            removed: false,
            missing: vec!["10.0.0.1:80".into()],
            missing_count: Some(1),
            extra: Vec::new(),
            extra_count: Some(0),
            sidecar_hosts: 0,
            control_endpoints: 1,
        };
        let rejection = |kind: &str, resource: &str| Rejection {
            kind: kind.into(),
            resource: resource.into(),
            reason: "bad".into(),
            since_ms: 2,
        };
        let proxy = Proxy {
            zone_name: "z".into(),
            cluster_name: "edge".into(),
            instance: "edge-0".into(),
            state: SyncState::Stale,
            since_ms: 3,
            detail: SyncDetail {
                text: "stale".into(),
                clusters: vec![stale("catalog"), stale("ledger")],
                rejections: vec![
                    rejection("endpoints", "ledger"),
                    rejection("endpoints", "catalog"),
                    rejection("routes", "edge-routes"),
                ],
            },
        };
        let keep = |name: &str| name == "catalog";
        let s = sync_of(Role::Edge, &proxy, "team-edge", Some(&keep));
        assert_eq!(
            (s.state, s.owner.as_str(), s.cluster.as_str()),
            (meshcat_diagnose::SyncState::Stale, "team-edge", "edge")
        );
        assert_eq!(s.stale.len(), 1);
        assert_eq!(s.stale[0].cluster, "catalog");
        let kept: Vec<&str> = s.rejections.iter().map(|r| r.resource.as_str()).collect();
        assert_eq!(kept, ["catalog", "edge-routes"]);
        // A service's own sidecar keeps all of it.
        let s = sync_of(Role::Service, &proxy, "", None);
        assert_eq!((s.stale.len(), s.rejections.len()), (2, 3));
        // Out of sync first, then by name, at most MAX_SYNC_SIDECARS.
        let mut many: Vec<Proxy> = (0..20)
            .map(|i| Proxy {
                instance: format!("i{i:02}"),
                state: if i == 17 {
                    SyncState::Rejected
                } else {
                    SyncState::Synced
                },
                ..proxy.clone()
            })
            .collect();
        many.sort_by(|a, b| a.instance.cmp(&b.instance));
        let first = first_proxies(many);
        assert_eq!(first.len(), MAX_SYNC_SIDECARS);
        assert_eq!(first[0].instance, "i17");
        assert_eq!(first[1].instance, "i00");
    }

    #[test]
    fn notes_go_to_the_skipped_steps_only() {
        let input = DiagnosisInput::new("catalog", "east");
        let mut report = meshcat_diagnose::diagnose(&input);
        let notes = Notes {
            edge_source: Some("edge evidence from instance edge-1".into()),
            edge: vec!["edge note".into()],
            services: vec!["service note".into()],
            metrics: vec!["metrics note".into()],
        };
        add_notes(&mut report, &notes);
        let has = |step: StepName, note: &str| {
            report
                .step(step)
                .unwrap()
                .evidence
                .iter()
                .any(|e| e == note)
        };
        assert!(has(StepName::EdgeDiscovery, "edge note"));
        assert!(has(StepName::ServiceDiscovery, "service note"));
        assert!(has(StepName::Mtls, "edge note") && has(StepName::Mtls, "service note"));
        assert!(has(StepName::MetricsCollector, "metrics note"));
        assert!(!has(StepName::EdgeDiscovery, "service note"));
        let first = |step: StepName| report.step(step).unwrap().evidence[0].clone();
        assert_eq!(
            first(StepName::EdgeDiscovery),
            "edge evidence from instance edge-1"
        );
        assert_eq!(first(StepName::Mtls), "edge evidence from instance edge-1");
        assert!(!has(
            StepName::ServiceDiscovery,
            "edge evidence from instance edge-1"
        ));
    }
}
