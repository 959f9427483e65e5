//! The zone's control server (contract section 17): whether it declares the
//! diagnosed cluster and with how many (healthy) endpoints, and whether the edge's
//! and the service's sidecars hold what it declares. The finding says where the
//! fault is, the control server or one sidecar, and whose that part is: `platform`
//! for the control server, the owner of the sidecar's cluster for a sidecar.

use super::{Outcome, outcome, skipped};
use crate::evidence::{
    ControlEvidence, DeclaredCluster, DiagnosisInput, Role, SidecarSync, StaleUpstream, SyncState,
};
use crate::report::{StepName, Verdict};

/// Who answers for the zone's control server.
pub const PLATFORM: &str = "platform";

const NOT_DECLARED: &str = "Platform: make the control plane declare the service (its registration, or the mesh objects it builds the cluster from) and look in its logs for why it does not; the sidecars discover only what it declares.";
const NO_ENDPOINT: &str = "Platform: the control plane links no instance to the service: check the service's registration in the control plane (its selector and the instances' labels or registrations) and that its instances run.";
const NONE_HEALTHY: &str = "Platform: the control plane marks every endpoint of the service unhealthy: look at its health checks of the instances, then at the instances themselves.";
const SERVER_DOWN: &str = "Platform: bring the control server back (its process, its address, the network between it and the sidecars); the sidecars keep their last configuration meanwhile.";
const REJECTED: &str = "The sidecar refused the update and keeps its last good configuration: fix the resource the reason names (in the mesh objects the control server builds it from), or run a sidecar that reads it; then watch its update counters move.";
const STALE: &str = "The sidecar does not hold what the control server declares: check its xDS stream (control_plane.connected_state and the update counters in its /stats, its log), and restart it if it stays behind; the control server's view is the intended configuration.";
const DISCONNECTED: &str = "The sidecar lost its stream to the control plane while the control server answers meshcat: check the sidecar's way to it (its xds cluster's address, certificates and network policy), then restart the sidecar.";
const PASS: &str = "None: the control server declares the service with healthy endpoints and the sidecars hold what it declares.";
const NO_SYNC: &str = "Run meshcat agents beside the edge's and the service's sidecars (configured over xDS) to compare what they hold with what the control server declares.";

pub(super) fn control_server(input: &DiagnosisInput) -> Option<Outcome> {
    const NAME: StepName = StepName::ControlServer;
    let c = input.control.as_ref()?;
    let mut evidence = vec![server_line(c)];
    evidence.extend(c.declared.iter().map(declared_line));
    let mut sidecars: Vec<&SidecarSync> = c.sidecars.iter().collect();
    // The edge's first: its view of the cluster is what requests are sent by.
    sidecars.sort_by_key(|s| s.role != Role::Edge);
    evidence.extend(sidecars.iter().map(|s| sync_line(input, s, c.read_at_ms)));
    let fault = server_fault(input, c, &sidecars)
        .or_else(|| sidecars.iter().find_map(|s| sidecar_fault(input, s, c)));
    if let Some((action, finding)) = fault {
        return Some(outcome(NAME, Verdict::Fail, evidence, action, finding));
    }
    if sidecars.iter().all(|s| s.state == SyncState::Unknown) {
        evidence.push(format!(
            "no sidecar of the edge or of {} reports its sync with the control server",
            input.cluster
        ));
        return Some(skipped(NAME, evidence, NO_SYNC));
    }
    Some(outcome(NAME, Verdict::Pass, evidence, PASS, ""))
}

/// The cluster's names: the catalog's, and the edge's when it is another.
fn cluster_names(input: &DiagnosisInput) -> String {
    let edge = input.edge_name();
    if edge == input.cluster {
        input.cluster.clone()
    } else {
        format!("{} (the edge's {edge})", input.cluster)
    }
}

/// "view", or "last good view" when the stream is not up.
fn view_words(c: &ControlEvidence) -> &'static str {
    if c.state == "connected" {
        "view"
    } else {
        "last good view"
    }
}

fn server_line(c: &ControlEvidence) -> String {
    let error = if c.error.is_empty() {
        String::new()
    } else {
        format!(" ({})", c.error)
    };
    format!(
        "control server {}: {}{error}; its {} holds {} clusters",
        c.server_address,
        c.state,
        view_words(c),
        c.view_clusters
    )
}

fn declared_line(d: &DeclaredCluster) -> String {
    let mut listed: Vec<String> = d
        .listed
        .iter()
        .map(|e| format!("{} {}", e.address, e.health))
        .collect();
    if d.endpoints > listed.len() {
        listed.push(format!("and {} more", d.endpoints - listed.len()));
    }
    let listed = if listed.is_empty() {
        String::new()
    } else {
        format!(": {}", listed.join(", "))
    };
    format!(
        "control server declares {}: {} endpoints, {} healthy{listed}",
        d.name, d.endpoints, d.healthy
    )
}

/// "the edge sidecar edge-0 of cluster edge".
fn whose(s: &SidecarSync) -> String {
    let role = match s.role {
        Role::Edge => "edge",
        Role::Service => "service",
    };
    format!("the {role} sidecar {} of cluster {}", s.instance, s.cluster)
}

fn owner_words(owner: &str) -> String {
    if owner.is_empty() {
        "no owner registered".to_owned()
    } else {
        format!("owner {owner}")
    }
}

fn sync_line(input: &DiagnosisInput, s: &SidecarSync, now: i64) -> String {
    let head = format!(
        "{} ({}): {} since {}",
        whose(s),
        owner_words(&s.owner),
        s.state.as_str(),
        at(s.since_ms, now)
    );
    let tail = match s.state {
        SyncState::Stale if s.stale.is_empty() => format!(
            ": on other upstreams; its view of {} equals the control server's",
            input.edge_name()
        ),
        SyncState::Stale => {
            let parts: Vec<String> = s
                .stale
                .iter()
                .map(|u| {
                    format!(
                        "{} differs since {}: {}",
                        u.cluster,
                        at(u.since_ms, now),
                        difference(u)
                    )
                })
                .collect();
            format!(": {}", parts.join("; "))
        }
        SyncState::Rejected if s.rejections.is_empty() => {
            " (an update of another cluster's endpoints)".to_owned()
        }
        SyncState::Rejected => {
            let parts: Vec<String> = s
                .rejections
                .iter()
                .map(|r| {
                    format!(
                        "{} update{} rejected since {}: {}",
                        r.kind,
                        resource_words(&r.resource),
                        at(r.since_ms, now),
                        reason_words(&r.reason)
                    )
                })
                .collect();
            format!(": {}", parts.join("; "))
        }
        SyncState::Unknown if !s.text.is_empty() => format!(": {}", s.text),
        _ => String::new(),
    };
    format!("{head}{tail}")
}

fn resource_words(resource: &str) -> String {
    if resource.is_empty() {
        String::new()
    } else {
        format!(" of {resource}")
    }
}

fn reason_words(reason: &str) -> &str {
    if reason.is_empty() {
        "its reason was not read from the sidecar's log"
    } else {
        reason
    }
}

/// What differs in one upstream, in words.
fn difference(u: &StaleUpstream) -> String {
    if u.removed {
        return format!(
            "the control server no longer declares it; the sidecar still has it with {} hosts",
            u.sidecar_hosts
        );
    }
    let mut parts = Vec::new();
    if !u.missing.is_empty() {
        parts.push(format!(
            "it lacks {}",
            addresses(&u.missing, u.missing_count)
        ));
    }
    if !u.extra.is_empty() {
        parts.push(format!(
            "it still has {}",
            addresses(&u.extra, u.extra_count)
        ));
    }
    parts.push(format!(
        "{} hosts at the sidecar, {} endpoints at the control server",
        u.sidecar_hosts, u.control_endpoints
    ));
    parts.join(", ")
}

fn addresses(named: &[String], count: Option<u64>) -> String {
    let more = count
        .and_then(|n| usize::try_from(n).ok())
        .map_or(0, |n| n.saturating_sub(named.len()));
    if more > 0 {
        format!("{} and {more} more", named.join(", "))
    } else {
        named.join(", ")
    }
}

/// A fault of the control server itself: it declares no such cluster, none of its
/// endpoints, none healthy, or it is down with the sidecars disconnected from it.
fn server_fault(
    input: &DiagnosisInput,
    c: &ControlEvidence,
    sidecars: &[&SidecarSync],
) -> Option<(&'static str, String)> {
    let at_server = format!("the control server at {}", c.server_address);
    let blame = format!(
        "The fault is in the control server ({}).",
        owner_words(PLATFORM)
    );
    if c.declared.is_empty() {
        return Some((
            NOT_DECLARED,
            format!(
                "{at_server} does not declare {}: none of the {} clusters of its {} stands for it. {blame}",
                cluster_names(input),
                c.view_clusters,
                view_words(c)
            ),
        ));
    }
    let names: Vec<&str> = c.declared.iter().map(|d| d.name.as_str()).collect();
    let names = names.join(", ");
    let endpoints: usize = c.declared.iter().map(|d| d.endpoints).sum();
    let healthy: usize = c.declared.iter().map(|d| d.healthy).sum();
    if endpoints == 0 {
        return Some((
            NO_ENDPOINT,
            format!("{at_server} declares {names} without any endpoint. {blame}"),
        ));
    }
    if healthy == 0 {
        let listed: Vec<String> = c
            .declared
            .iter()
            .flat_map(|d| &d.listed)
            .map(|e| format!("{} {}", e.address, e.health))
            .collect();
        return Some((
            NONE_HEALTHY,
            format!(
                "{at_server} declares {names} with {endpoints} endpoints, none healthy ({}). {blame}",
                listed.join(", ")
            ),
        ));
    }
    let disconnected: Vec<&&SidecarSync> = sidecars
        .iter()
        .filter(|s| s.state == SyncState::Disconnected)
        .collect();
    if c.state == "unreachable" && !disconnected.is_empty() {
        let error = if c.error.is_empty() {
            String::new()
        } else {
            format!(" ({})", c.error)
        };
        let names: Vec<&str> = disconnected.iter().map(|s| s.instance.as_str()).collect();
        let since = disconnected.iter().map(|s| s.since_ms).min().unwrap_or(0);
        return Some((
            SERVER_DOWN,
            format!(
                "{at_server} is unreachable{error} and the sidecars {} are disconnected from it since {}. {blame}",
                names.join(", "),
                at(since, c.read_at_ms)
            ),
        ));
    }
    None
}

/// A sidecar that does not hold what the control server declares: it rejected the
/// update, holds another host set for the cluster past the grace, or lost its
/// stream.
fn sidecar_fault(
    input: &DiagnosisInput,
    s: &SidecarSync,
    c: &ControlEvidence,
) -> Option<(&'static str, String)> {
    let now = c.read_at_ms;
    let blame = format!(
        "The fault is in that sidecar ({}), not in the control server.",
        owner_words(&s.owner)
    );
    match s.state {
        SyncState::Rejected => {
            // An edge's rejection of another cluster's endpoints is left out by the
            // caller; a service sidecar's rejections are all its own.
            let r = s.rejections.first();
            if r.is_none() && s.role == Role::Edge {
                return None;
            }
            let what = r.map_or_else(
                || format!("an update since {}", at(s.since_ms, now)),
                |r| {
                    format!(
                        "the control server's {} update{} since {}: {}",
                        r.kind,
                        resource_words(&r.resource),
                        at(r.since_ms, now),
                        reason_words(&r.reason)
                    )
                },
            );
            Some((REJECTED, format!("{} rejected {what}. {blame}", whose(s))))
        }
        SyncState::Stale => {
            let u = s.stale.first()?;
            let view = if s.role == Role::Edge {
                format!("its view of {}", input.edge_name())
            } else {
                format!("its upstream {}", u.cluster)
            };
            let name = if u.cluster == input.edge_name() || s.role == Role::Service {
                String::new()
            } else {
                format!(" (as {})", u.cluster)
            };
            Some((
                STALE,
                format!(
                    "{} is stale: {view}{name} differs from the control server's since {}: {}. {blame}",
                    whose(s),
                    at(u.since_ms, now),
                    difference(u)
                ),
            ))
        }
        SyncState::Disconnected => Some((
            DISCONNECTED,
            format!(
                "{} is disconnected from its control plane since {}, while the control server answers meshcat ({}). {blame}",
                whose(s),
                at(s.since_ms, now),
                c.state
            ),
        )),
        SyncState::Synced | SyncState::Unknown => None,
    }
}

/// A time in UTC with how long before `now` it was.
fn at(ms: i64, now: i64) -> String {
    if ms <= 0 {
        return "an unknown time".to_owned();
    }
    format!("{} ({} before the diagnosis)", utc(ms), ago(now - ms))
}

fn ago(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0 => "less than 1s".to_owned(),
        1..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        _ => format!("{}h{}m", s / 3600, s % 3600 / 60),
    }
}

/// `2026-11-21T23:58:15Z` for ms since the epoch.
fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let t = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        t / 3600,
        t % 3600 / 60,
        t % 60
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_written_in_utc() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(1_795_305_495_589), "2026-11-21T23:58:15Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(ago(61_000), "1m1s");
        assert_eq!(ago(400), "less than 1s");
        assert_eq!(at(0, 5), "an unknown time");
    }
}
