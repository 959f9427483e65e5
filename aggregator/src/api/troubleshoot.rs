//! The troubleshooting routes of contract section 5: the sidecar log level per
//! instance and per cluster, timed debug windows, and `GET /diagnose/{clusterName}`,
//! which collects evidence through the agents ([`Command::Evidence`]) and runs the
//! playbook engine ([`meshcat_diagnose::diagnose`]).
//!
//! Every command carries a deadline: an agent that is gone or hung costs its own
//! instance an error answer, never a hang and never another request's time.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::future::join_all;
use meshcat_common::level;
use meshcat_common::model::ZoneRecord;
use meshcat_common::validate::is_valid_name;
use meshcat_common::wire::{DebugWindowOutput, EvidenceOutput};
use meshcat_diagnose::{
    DiagnosisInput, DiagnosisReport, MetricsEvidence, Reads, Role, SidecarEvidence, Symptom,
    Verdict, edge_weight, reports_metrics,
};
use serde::Serialize;
use tracing::{info, warn};

use super::AppState;
use super::auth::{DiagnoseCaller, Granted, Reader, Writer};
use super::error::ApiError;
use super::handlers::Params;
use super::query;
use crate::ingest::CommandError;
use crate::peer_signature::Access;
use crate::replicas::{PeerCallError, Replicas};
use crate::sidecars::{Answer, Ask, Owner, SidecarError, Sidecars, Target};

type Shared = State<Arc<AppState>>;

/// Longest debug window one request may ask for, in seconds.
pub const MAX_DEBUG_SECONDS: u32 = 300;
/// Most service instances one diagnosis collects evidence from.
pub const MAX_DIAGNOSED_INSTANCES: usize = 5;
/// Log lines asked from each sidecar for the diagnosis.
pub const EVIDENCE_LOG_LINES: u32 = 2_000;
/// Longest `path` accepted by the diagnosis.
pub const MAX_PATH_LEN: usize = 2_048;
/// Most instances named in one debug-window request.
pub const MAX_WINDOW_INSTANCES: usize = 64;
/// Time beyond a window's length an agent gets to restore the level, wait for the
/// sidecar's last lines (1 s) and answer.
const WINDOW_GRACE: Duration = Duration::from_secs(5);

/// The deadline of a command that runs a debug window of `seconds` (none: 0).
fn window_deadline(command_timeout: Duration, seconds: u32) -> Duration {
    if seconds == 0 {
        command_timeout
    } else {
        command_timeout + Duration::from_secs(u64::from(seconds)) + WINDOW_GRACE
    }
}
/// Deadline of the Prometheus query.
const PROMETHEUS_TIMEOUT: Duration = Duration::from_secs(3);
/// Most silent instances named in the metrics evidence.
const MAX_NAMED_SILENT: usize = 10;
/// Most instances owned by other replicas whose metrics one diagnosis asks for.
const MAX_REMOTE_METRICS: usize = 256;
/// Most edge instances asked (at once) for the edge's evidence.
pub const MAX_EDGE_TRIES: usize = 3;

fn check_name(what: &str, v: &str) -> Result<(), ApiError> {
    if is_valid_name(v) {
        Ok(())
    } else {
        Err(ApiError::bad_path(format!(
            "{what} in the path must be 1 to 253 characters of letters, digits, '.', '_' and '-'."
        )))
    }
}

/// The sidecar layer over this replica's agents and its peers.
fn sidecars(s: &AppState) -> Sidecars {
    Sidecars::new(
        s.store.clone(),
        s.agents.clone(),
        Replicas::new(s.store.clone(), s.peers.clone()),
    )
}

fn ingest_off() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "ingest_off",
        "Agent ingest is off on this aggregator, so no sidecar can be reached.",
    )
}

impl From<SidecarError> for ApiError {
    fn from(e: SidecarError) -> ApiError {
        match e {
            SidecarError::IngestOff => ingest_off(),
            SidecarError::NotLive {
                zone,
                cluster,
                instance,
            } => ApiError::not_found(format!(
                "Instance {instance} of cluster {cluster} in zone {zone} is not live."
            )),
            SidecarError::Agent { instance, error } => command_error(&instance, &error),
            SidecarError::Unexpected { instance } => unexpected(&instance),
            SidecarError::Peer { instance, error } => match error {
                PeerCallError::Unknown { .. } => ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "owner_unreachable",
                    format!(
                        "Instance {instance} is served by a replica whose address is not known yet."
                    ),
                ),
                PeerCallError::Unreachable { owner } => ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    "owner_unreachable",
                    format!("The replica {owner} serving instance {instance} did not answer."),
                ),
                PeerCallError::Answered {
                    status, message, ..
                } => ApiError::new(status, "owner_failed", message),
                PeerCallError::Unreadable { owner, why } => ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    "owner_failed",
                    format!(
                        "The answer of replica {owner} for instance {instance} is not readable: {why}."
                    ),
                ),
            },
        }
    }
}

/// The error answer of a command that produced no output.
fn command_error(instance: &str, e: &CommandError) -> ApiError {
    match e {
        CommandError::UnknownInstance { .. } => ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_instance",
            format!("No connected agent reports instance {instance}."),
        ),
        CommandError::AgentGone => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "agent_gone",
            format!("The agent of instance {instance} disconnected before answering."),
        ),
        CommandError::Timeout(d) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "agent_timeout",
            format!("The agent of instance {instance} did not answer within {d:?}."),
        ),
        CommandError::Busy => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "agent_busy",
            format!("The agent of instance {instance} has too many commands in progress."),
        ),
        CommandError::Failed(msg) => ApiError::new(
            StatusCode::BAD_GATEWAY,
            "sidecar_error",
            format!(
                "The sidecar of instance {instance} failed the command: {}.",
                msg.trim_end_matches('.')
            ),
        ),
    }
}

fn unexpected(instance: &str) -> ApiError {
    ApiError::new(
        StatusCode::BAD_GATEWAY,
        "agent_error",
        format!("The agent of instance {instance} answered with an unexpected output."),
    )
}

fn zone_or_404(s: &AppState, zone: &str) -> Result<ZoneRecord, ApiError> {
    s.store
        .zone(zone)
        .ok_or_else(|| ApiError::not_found(format!("Zone {zone} does not exist.")))
}

/// A cluster is known in a zone when it is registered there or has live instances.
fn cluster_or_404(sidecars: &Sidecars, zone: &str, cluster: &str) -> Result<(), ApiError> {
    if sidecars.knows(zone, cluster) {
        Ok(())
    } else {
        Err(ApiError::not_found(format!(
            "Cluster {cluster} does not exist in zone {zone}."
        )))
    }
}

fn level_query(raw: Option<&str>) -> Result<&'static str, ApiError> {
    let mut level = None;
    for (_, v) in query::parse(raw, &["level"])? {
        if level.is_some() {
            return Err(ApiError::bad_query("Query parameter level is given twice."));
        }
        level = Some(level::envoy_name(&v).map(level::seed_name).ok_or_else(|| {
            ApiError::bad_query(format!(
                "Query parameter level must be error, warn, info or debug, not {v:?}."
            ))
        })?);
    }
    level.ok_or_else(|| ApiError::bad_query("Query parameter level is required."))
}

fn text(level: String) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], level).into_response()
}

/// Asks one instance's sidecar for its level, or sets it; the level it has now.
async fn run_level_command(
    s: &AppState,
    (zone, cluster, instance): (&str, &str, &str),
    ask: Ask,
) -> Result<String, ApiError> {
    let sidecars = sidecars(s);
    let target = sidecars.target(zone, cluster, instance)?;
    match sidecars
        .run((zone, cluster), &target, ask, s.command_timeout)
        .await?
    {
        Answer::Level(l) => Ok(l),
        _ => Err(unexpected(instance)),
    }
}

/// `GET /zones/{zoneName}/clusters/{clusterName}/instances/{instanceId}/logging`.
pub async fn get_instance_logging(
    State(s): Shared,
    _r: Reader,
    Params((zone, cluster, instance)): Params<(String, String, String)>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    check_name("zoneName", &zone)?;
    check_name("clusterName", &cluster)?;
    query::parse(q.as_deref(), &[])?;
    zone_or_404(&s, &zone)?;
    let level = run_level_command(&s, (&zone, &cluster, &instance), Ask::GetLevel).await?;
    Ok(text(level))
}

/// `PUT /zones/{zoneName}/clusters/{clusterName}/instances/{instanceId}/logging?level=`.
pub async fn put_instance_logging(
    State(s): Shared,
    _w: Writer,
    Params((zone, cluster, instance)): Params<(String, String, String)>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    check_name("zoneName", &zone)?;
    check_name("clusterName", &cluster)?;
    let level = level_query(q.as_deref())?;
    zone_or_404(&s, &zone)?;
    let now = run_level_command(&s, (&zone, &cluster, &instance), Ask::SetLevel(level)).await?;
    info!(%zone, %cluster, %instance, level = %now, "Sidecar log level set through the API.");
    Ok(text(now))
}

/// One instance's outcome in a per-cluster answer.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceOutcome {
    instance: String,
    /// HTTP-like status of this instance's part: 200, or the error's status.
    status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    level: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    debug_window: Option<DebugWindowOutput>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<&'static str>,
}

impl InstanceOutcome {
    fn failed(instance: &str, e: &ApiError) -> Self {
        InstanceOutcome {
            instance: instance.to_owned(),
            status: e.status.as_u16(),
            level: None,
            debug_window: None,
            error: Some(e.message.clone()),
            code: Some(e.code),
        }
    }

    fn ok(instance: &str) -> Self {
        InstanceOutcome {
            instance: instance.to_owned(),
            status: 200,
            level: None,
            debug_window: None,
            error: None,
            code: None,
        }
    }
}

/// The answer of the per-cluster routes.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterOutcome {
    zone_name: String,
    cluster_name: String,
    /// Instances whose part succeeded.
    succeeded: usize,
    /// Instances whose part failed.
    failed: usize,
    instances: Vec<InstanceOutcome>,
}

impl ClusterOutcome {
    fn new(zone: String, cluster: String, instances: Vec<InstanceOutcome>) -> Self {
        let succeeded = instances.iter().filter(|i| i.status == 200).count();
        ClusterOutcome {
            zone_name: zone,
            cluster_name: cluster,
            succeeded,
            failed: instances.len() - succeeded,
            instances,
        }
    }
}

/// `PUT /zones/{zoneName}/clusters/{clusterName}/logging?level=`: every live instance
/// at once, each with its own deadline.
pub async fn put_cluster_logging(
    State(s): Shared,
    _w: Writer,
    Params((zone, cluster)): Params<(String, String)>,
    RawQuery(q): RawQuery,
) -> Result<Json<ClusterOutcome>, ApiError> {
    check_name("zoneName", &zone)?;
    check_name("clusterName", &cluster)?;
    let level = level_query(q.as_deref())?;
    zone_or_404(&s, &zone)?;
    let sidecars = sidecars(&s);
    cluster_or_404(&sidecars, &zone, &cluster)?;
    let targets = sidecars.targets(&zone, &cluster);
    let deadline = s.command_timeout;
    let runs = targets.iter().map(|t| {
        let (sidecars, zone, cluster) = (&sidecars, zone.as_str(), cluster.as_str());
        async move {
            match sidecars
                .run((zone, cluster), t, Ask::SetLevel(level), deadline)
                .await
            {
                Ok(Answer::Level(now)) => InstanceOutcome {
                    level: Some(now),
                    ..InstanceOutcome::ok(&t.instance)
                },
                Ok(_) => InstanceOutcome::failed(&t.instance, &unexpected(&t.instance)),
                Err(e) => InstanceOutcome::failed(&t.instance, &e.into()),
            }
        }
    });
    let mut outcomes = join_all(runs).await;
    outcomes.sort_by(|a, b| a.instance.cmp(&b.instance));
    let answer = ClusterOutcome::new(zone, cluster, outcomes);
    info!(zone = %answer.zone_name, cluster = %answer.cluster_name, level, succeeded = answer.succeeded, failed = answer.failed, "Cluster log level set through the API.");
    Ok(Json(answer))
}

fn seconds_value(name: &str, v: &str) -> Result<u32, ApiError> {
    v.parse::<u32>()
        .ok()
        .filter(|n| (1..=MAX_DEBUG_SECONDS).contains(n))
        .ok_or_else(|| {
            ApiError::bad_query(format!(
                "Query parameter {name} must be a whole number of seconds from 1 to {MAX_DEBUG_SECONDS}."
            ))
        })
}

/// `POST /zones/{zoneName}/clusters/{clusterName}/debug-window?seconds=N[&instance=I...]`.
pub async fn post_debug_window(
    State(s): Shared,
    _w: Writer,
    Params((zone, cluster)): Params<(String, String)>,
    RawQuery(q): RawQuery,
) -> Result<Json<ClusterOutcome>, ApiError> {
    check_name("zoneName", &zone)?;
    check_name("clusterName", &cluster)?;
    let mut seconds = None;
    let mut wanted: Vec<String> = Vec::new();
    for (k, v) in query::parse(q.as_deref(), &["seconds", "instance"])? {
        if k == "seconds" {
            if seconds.is_some() {
                return Err(ApiError::bad_query(
                    "Query parameter seconds is given twice.",
                ));
            }
            seconds = Some(seconds_value("seconds", &v)?);
        } else if wanted.len() == MAX_WINDOW_INSTANCES {
            return Err(ApiError::bad_query(format!(
                "At most {MAX_WINDOW_INSTANCES} instances may be named."
            )));
        } else if !wanted.contains(&v) {
            wanted.push(v);
        }
    }
    let seconds =
        seconds.ok_or_else(|| ApiError::bad_query("Query parameter seconds is required."))?;
    zone_or_404(&s, &zone)?;
    let sidecars = sidecars(&s);
    if !sidecars.ingest_on() {
        return Err(ingest_off());
    }
    cluster_or_404(&sidecars, &zone, &cluster)?;
    // Every live instance, or those named (one not live answers its own 404).
    let targets: Vec<Result<Target, SidecarError>> = if wanted.is_empty() {
        sidecars
            .targets(&zone, &cluster)
            .into_iter()
            .map(Ok)
            .collect()
    } else {
        wanted
            .iter()
            .map(|i| sidecars.target(&zone, &cluster, i))
            .collect()
    };
    let deadline = window_deadline(s.command_timeout, seconds);
    info!(%zone, %cluster, seconds, instances = targets.len(), "Debug window asked through the API.");
    let runs = targets.into_iter().zip(0..).map(|(t, n)| {
        let (sidecars, zone, cluster) = (&sidecars, zone.as_str(), cluster.as_str());
        let name = if wanted.is_empty() {
            t.as_ref().map(|t| t.instance.clone()).unwrap_or_default()
        } else {
            wanted[n].clone()
        };
        async move {
            let t = match t {
                Ok(t) => t,
                Err(e) => return InstanceOutcome::failed(&name, &e.into()),
            };
            match sidecars
                .run((zone, cluster), &t, Ask::DebugWindow { seconds }, deadline)
                .await
            {
                Ok(Answer::DebugWindow(w)) => InstanceOutcome {
                    debug_window: Some(w),
                    ..InstanceOutcome::ok(&name)
                },
                Ok(_) => InstanceOutcome::failed(&name, &unexpected(&name)),
                Err(e) => InstanceOutcome::failed(&name, &e.into()),
            }
        }
    });
    let outcomes = join_all(runs).await;
    Ok(Json(ClusterOutcome::new(zone, cluster, outcomes)))
}

/// The query of `GET /diagnose/{clusterName}`.
#[derive(Debug)]
struct DiagnoseQuery {
    zone: String,
    symptom: Option<Symptom>,
    path: Option<String>,
    debug_seconds: Option<u32>,
}

fn diagnose_query(raw: Option<&str>) -> Result<DiagnoseQuery, ApiError> {
    let mut zone = None;
    let mut symptom = None;
    let mut path = None;
    let mut debug_seconds = None;
    for (k, v) in query::parse(raw, &["zoneName", "symptom", "path", "debugSeconds"])? {
        let twice = || ApiError::bad_query(format!("Query parameter {k} is given twice."));
        match k.as_str() {
            "zoneName" => {
                if zone.is_some() {
                    return Err(twice());
                }
                if !is_valid_name(&v) {
                    return Err(ApiError::bad_query(
                        "Query parameter zoneName must be 1 to 253 characters of letters, digits, '.', '_' and '-'.",
                    ));
                }
                zone = Some(v);
            }
            "symptom" => {
                if symptom.is_some() {
                    return Err(twice());
                }
                symptom =
                    Some(Symptom::from_query(Some(&v)).map_err(|e| {
                        ApiError::bad_query(format!("Query parameter symptom: {e}."))
                    })?);
            }
            "path" => {
                if path.is_some() {
                    return Err(twice());
                }
                if !v.is_empty() {
                    if !v.starts_with('/')
                        || v.len() > MAX_PATH_LEN
                        || v.contains(char::is_whitespace)
                    {
                        return Err(ApiError::bad_query(format!(
                            "Query parameter path must start with '/', hold no spaces and be at most {MAX_PATH_LEN} bytes."
                        )));
                    }
                    path = Some(v);
                }
            }
            _ => {
                if debug_seconds.is_some() {
                    return Err(twice());
                }
                debug_seconds = Some(seconds_value("debugSeconds", &v)?);
            }
        }
    }
    Ok(DiagnoseQuery {
        zone: zone.ok_or_else(|| ApiError::bad_query("Query parameter zoneName is required."))?,
        symptom: symptom.flatten(),
        path,
        debug_seconds,
    })
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

/// The replicas' own route for diagnosis evidence (etcd store only, never in the
/// public API): a peer asks the owner of an instance for that sidecar's evidence.
pub const PEER_EVIDENCE: &str = crate::replicas::PEER_EVIDENCE;

/// `GET /peer/evidence?zoneName=&clusterName=&instance=[&path=][&debugSeconds=]`:
/// answers only requests forwarded by a peer (the forwarding layer has checked their
/// secret); anything else is told there is no such route.
pub async fn peer_evidence(
    State(s): Shared,
    granted: Option<axum::Extension<Granted>>,
    RawQuery(q): RawQuery,
) -> Result<Json<EvidenceOutput>, ApiError> {
    let Some(axum::Extension(Granted(access))) = granted.filter(|_| s.store.etcd().is_some())
    else {
        return Err(ApiError::not_found(format!(
            "No resource at GET {PEER_EVIDENCE}."
        )));
    };
    let mut zone = None;
    let mut cluster = None;
    let mut instance = None;
    let mut path = None;
    let mut debug_seconds = None;
    for (k, v) in query::parse(
        q.as_deref(),
        &[
            "zoneName",
            "clusterName",
            "instance",
            "path",
            "debugSeconds",
        ],
    )? {
        match k.as_str() {
            "zoneName" => zone = Some(v),
            "clusterName" => cluster = Some(v),
            "instance" => instance = Some(v),
            "path" => path = Some(v),
            _ => debug_seconds = Some(seconds_value("debugSeconds", &v)?),
        }
    }
    // Evidence is live data; a debug window changes the sidecar.
    let needed = if debug_seconds.is_some() {
        Access::Write
    } else {
        Access::Read
    };
    if access < needed {
        return Err(ApiError::forbidden());
    }
    let (Some(zone), Some(cluster), Some(instance)) = (zone, cluster, instance) else {
        return Err(ApiError::bad_query(
            "Query parameters zoneName, clusterName and instance are required.",
        ));
    };
    // Served here, on this replica's agent: a peer asks only the owner.
    let ask = Ask::Evidence {
        path,
        max_lines: EVIDENCE_LOG_LINES,
        debug_seconds,
    };
    let deadline = window_deadline(s.command_timeout, debug_seconds.unwrap_or(0));
    let here = Target {
        instance: instance.clone(),
        owner: Owner::Here,
    };
    match sidecars(&s)
        .run((&zone, &cluster), &here, ask, deadline)
        .await?
    {
        Answer::Evidence(e) => Ok(Json(*e)),
        _ => Err(unexpected(&instance)),
    }
}

/// Turns an agent's answer into the engine's evidence; what fails to parse is noted.
fn sidecar_evidence(
    role: Role,
    instance: &str,
    out: EvidenceOutput,
    notes: &mut Vec<String>,
) -> SidecarEvidence {
    let mut s = SidecarEvidence::new(role, instance);
    for e in &out.errors {
        notes.push(format!("{instance}: {e}"));
    }
    if let Some(t) = &out.clusters_json {
        match s.clone().with_clusters_json(t) {
            Ok(v) => s = v,
            Err(e) => notes.push(format!("{instance}: {e}")),
        }
    }
    if let Some(t) = &out.config_dump_json {
        match s.clone().with_config_dump_json(t) {
            Ok(v) => s = v,
            Err(e) => notes.push(format!("{instance}: {e}")),
        }
    }
    if let Some(t) = &out.stats_json {
        match s.clone().with_stats_json(t) {
            Ok(v) => s = v,
            Err(e) => notes.push(format!("{instance}: {e}")),
        }
    }
    if let Some(lines) = &out.log_lines {
        s = s.with_log(&lines.join("\n"));
    }
    if let Some(lines) = &out.debug_lines {
        s = s.with_debug_log(&lines.join("\n"));
    }
    s
}

/// The Prometheus client, built once: it keeps its connection pool between diagnoses.
fn prometheus_client() -> Result<&'static reqwest::Client, String> {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    if let Some(c) = CLIENT.get() {
        return Ok(c);
    }
    let built = reqwest::Client::builder()
        .timeout(PROMETHEUS_TIMEOUT)
        .build()
        .map_err(|e| format!("no HTTP client for Prometheus: {e}"))?;
    Ok(CLIENT.get_or_init(|| built))
}

/// Whether Prometheus has an `up` series for `job`; `None` when it cannot be asked.
async fn prometheus_up(base: &str, job: &str) -> Result<bool, String> {
    let client = prometheus_client()?;
    let escaped = job.replace('\\', "\\\\").replace('"', "\\\"");
    let query = format!("up{{job=\"{escaped}\"}}");
    let resp = client
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

/// What the catalog knows about the cluster's metrics; `None` when unregistered.
async fn metrics_evidence(
    s: &AppState,
    zone: &str,
    cluster: &str,
    notes: &mut Vec<String>,
) -> Option<MetricsEvidence> {
    let record = s.store.record(zone, cluster)?;
    // (instance, whether it reports metrics): this replica's instances, then those
    // other replicas own, whose metrics are asked from their owner.
    let mut read: Vec<(String, bool)> = s
        .store
        .live_instances(zone, cluster)
        .iter()
        .map(|i| (i.instance.clone(), reports_metrics(&i.metrics)))
        .collect();
    let mut remote = s.store.remote_live(zone, cluster);
    if remote.len() > MAX_REMOTE_METRICS {
        notes.push(format!(
            "{} instances owned by other replicas not read (the first {MAX_REMOTE_METRICS} by name were)",
            remote.len() - MAX_REMOTE_METRICS
        ));
        remote.truncate(MAX_REMOTE_METRICS);
    }
    let replicas = Replicas::new(s.store.clone(), s.peers.clone());
    let asked = join_all(remote.iter().map(|(instance, owner)| {
        let replicas = &replicas;
        async move {
            replicas
                .metrics(owner, (zone, cluster, instance), s.command_timeout)
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
    let prometheus_up = match (&s.prometheus_url, record.prometheus_job.is_empty()) {
        (Some(base), false) => match prometheus_up(base, &record.prometheus_job).await {
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
        };
        step.evidence.extend(which.iter().cloned());
    }
}

/// `GET /diagnose/{clusterName}?zoneName=&symptom=&path=[&debugSeconds=N]`.
pub async fn diagnose(
    State(s): Shared,
    _c: DiagnoseCaller,
    Params(cluster): Params<String>,
    RawQuery(q): RawQuery,
) -> Result<Json<DiagnosisReport>, ApiError> {
    check_name("clusterName", &cluster)?;
    let q = diagnose_query(q.as_deref())?;
    let zone = zone_or_404(&s, &q.zone)?;
    let sidecars = sidecars(&s);
    cluster_or_404(&sidecars, &q.zone, &cluster)?;
    let mut notes = Notes::default();
    let mut input = DiagnosisInput::new(&cluster, &q.zone);
    input.symptom = q.symptom;
    input.path = q.path.clone();

    let wants_sidecars = q.symptom != Some(Symptom::MissingMetrics);
    if wants_sidecars {
        collect_sidecars(&s, &sidecars, &zone, &cluster, &q, &mut input, &mut notes).await;
    }
    input.metrics = metrics_evidence(&s, &q.zone, &cluster, &mut notes.metrics).await;
    if input.metrics.is_none() {
        notes.metrics.push(format!(
            "cluster {cluster} is not registered in zone {}",
            q.zone
        ));
    }
    let mut report = tokio::task::spawn_blocking(move || meshcat_diagnose::diagnose(&input))
        .await
        .map_err(|e| {
            warn!(error = %e, "Diagnosis task failed.");
            ApiError::internal()
        })?;
    add_notes(&mut report, &notes);
    info!(zone = %q.zone, %cluster, symptom = q.symptom.map_or("all", Symptom::as_str), conclusion = %report.conclusion, "Diagnosis run.");
    Ok(Json(report))
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
    s: &AppState,
    sidecars: &Sidecars,
    zone: &ZoneRecord,
    cluster: &str,
    q: &DiagnoseQuery,
    input: &mut DiagnosisInput,
    notes: &mut Notes,
) {
    let cmd = Ask::Evidence {
        path: q.path.clone(),
        max_lines: EVIDENCE_LOG_LINES,
        debug_seconds: q.debug_seconds,
    };
    let deadline = window_deadline(s.command_timeout, q.debug_seconds.unwrap_or(0));
    let edges: Vec<String> = if zone.request_cluster.is_empty() {
        notes.edge.push(format!(
            "zone {} has no requestCluster, so no edge sidecar is known",
            zone.zone_name
        ));
        Vec::new()
    } else {
        let live = live_names(sidecars, &zone.zone_name, &zone.request_cluster);
        if live.is_empty() {
            notes.edge.push(format!(
                "the edge cluster {} has no live instance reported by an agent",
                zone.request_cluster
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
        &zone.request_cluster,
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
        notes.edge_source = Some(format!("edge evidence from instance {i}{others}"));
        input.edge = Some(e);
    } else {
        notes.edge.extend(edge_failures);
    }
    for (i, out) in services.iter().zip(service_outs) {
        match out {
            Ok(e) => {
                input
                    .services
                    .push(sidecar_evidence(Role::Service, i, e, &mut notes.services))
            }
            Err(e) => notes.services.push(e),
        }
    }
}

/// What [`edge_weight`] says of one edge instance's answer.
type EdgeWeight = Option<(bool, String)>;

/// Asks the edge instances all at once, each within `deadline`, and keeps the answer
/// whose log speaks most for the diagnosis ([`edge_weight`]: the newest failing line
/// for the cluster): with several edges, only one may have seen the failure. Answers
/// the chosen instance, its evidence, and why the others were not chosen.
async fn collect_edge(
    s: &Sidecars,
    input: &DiagnosisInput,
    edge_cluster: &str,
    edges: &[String],
    cmd: &Ask,
    deadline: Duration,
    notes: &mut Vec<String>,
) -> (Option<(String, SidecarEvidence)>, Vec<String>) {
    let zone = input.zone.as_str();
    let answers = join_all(
        edges
            .iter()
            .map(|i| collect(s, zone, edge_cluster, i, cmd.clone(), deadline)),
    )
    .await;
    let mut failures = Vec::new();
    let mut answered: Vec<(String, SidecarEvidence, EdgeWeight)> = Vec::new();
    for (instance, answer) in edges.iter().zip(answers) {
        match answer {
            Ok(out) => {
                let ev = sidecar_evidence(Role::Edge, instance, out, notes);
                let weight = edge_weight(input, &ev);
                answered.push((instance.clone(), ev, weight));
            }
            Err(e) => {
                warn!(%zone, %instance, error = %e, "Edge evidence failed.");
                failures.push(e);
            }
        }
    }
    let best = answered
        .iter()
        .enumerate()
        .max_by_key(|(n, (_, _, w))| (w.clone(), std::cmp::Reverse(*n)))
        .map(|(n, _)| n);
    let Some(best) = best else {
        return (None, failures);
    };
    let (instance, ev, weight) = answered.swap_remove(best);
    for (other, _, w) in &answered {
        let why = match (&weight, w) {
            (Some((true, _)), Some((false, _)) | None) => "has no failing line for the diagnosis",
            (_, None) => "has no line for the diagnosis",
            _ => "has an older line",
        };
        failures.push(format!("{other}: answered, but {why}"));
    }
    (Some((instance, ev)), failures)
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshcat_diagnose::StepName;

    #[test]
    fn levels_are_the_seeds_four() {
        assert_eq!(level_query(Some("level=warn")).unwrap(), "warn");
        assert_eq!(level_query(Some("level=debug")).unwrap(), "debug");
        for bad in [
            None,
            Some(""),
            Some("level="),
            Some("level=warning"),
            Some("level=INFO"),
            Some("level=info&level=info"),
            Some("lvl=info"),
        ] {
            let e = level_query(bad).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad:?}");
        }
    }

    #[test]
    fn diagnose_query_bounds() {
        let q = diagnose_query(Some(
            "zoneName=east&symptom=no_healthy_upstream&path=%2Fcatalog%2Fitems&debugSeconds=300",
        ))
        .unwrap();
        assert_eq!(q.zone, "east");
        assert_eq!(q.symptom, Some(Symptom::NoHealthyUpstream));
        assert_eq!(q.path.as_deref(), Some("/catalog/items"));
        assert_eq!(q.debug_seconds, Some(300));
        let all = diagnose_query(Some("zoneName=east&symptom=&path=")).unwrap();
        assert_eq!((all.symptom, all.path), (None, None));
        let e = diagnose_query(Some("zoneName=east&symptom=slow")).unwrap_err();
        assert!(e.message.contains("\"slow\""), "{}", e.message);
        for bad in [
            "",
            "symptom=ingress_502_503",
            "zoneName=a%20b",
            "zoneName=east&zoneName=west",
            "zoneName=east&debugSeconds=0",
            "zoneName=east&debugSeconds=301",
            "zoneName=east&debugSeconds=1.5",
            "zoneName=east&path=catalog",
            "zoneName=east&other=1",
        ] {
            let e = diagnose_query(Some(bad)).err();
            assert_eq!(e.map(|e| e.status), Some(StatusCode::BAD_REQUEST), "{bad}");
        }
    }

    #[test]
    fn command_errors_map_to_statuses() {
        let e = |c: CommandError| command_error("i-0", &c).status;
        assert_eq!(e(CommandError::AgentGone), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            e(CommandError::Timeout(Duration::from_secs(1))),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(e(CommandError::Busy), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e(CommandError::Failed("x".into())), StatusCode::BAD_GATEWAY);
        assert_eq!(
            e(CommandError::UnknownInstance {
                zone: "z".into(),
                cluster: "c".into(),
                instance: "i-0".into()
            }),
            StatusCode::NOT_FOUND
        );
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
