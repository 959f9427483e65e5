//! The sidecars the agent watches: a [`Target`] names one (its admin address, the
//! network namespace it lives in, and the zone, cluster and instance it reports
//! under), a [`TargetKey`] tells two apart, and a targets file lists them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use meshcat_common::config::parse_host_port;
use meshcat_common::wire::InstanceReport;
use serde::Deserialize;

use crate::envoy::{AdminEndpoint, EnvoyAdmin, EnvoyError, Netns, NetnsErrorHook};

/// Largest targets file read.
pub const MAX_TARGETS_FILE: u64 = 1 << 20;
/// Most targets one agent scrapes.
pub const MAX_TARGETS: usize = 256;
/// One sidecar to scrape and the identity it reports under.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Target {
    /// Admin API address, `host:port`.
    pub admin: String,
    #[serde(default)]
    pub zone_name: String,
    #[serde(default)]
    pub cluster_name: String,
    /// Instance name; (zone, cluster, instance) is unique among the agent's targets.
    #[serde(default)]
    pub instance: String,
    /// The sidecar's log file, tailed for diagnosis.
    #[serde(default)]
    pub log_file: Option<PathBuf>,
    /// The sidecar's own (local) upstream cluster, which the graph leaves out; without
    /// it the aggregator finds it from the sidecar's inbound listener.
    #[serde(default)]
    pub local_cluster: Option<String>,
    /// The network namespace the sidecar lives in (`/proc/<pid>/ns/net`,
    /// `/run/netns/<name>`): every admin connection is opened inside it (contract
    /// section 18). `None`: the agent's own namespace.
    #[serde(default)]
    pub netns: Option<Netns>,
}

/// What a target reports under, and what tells two targets apart: sidecars of one
/// instance name in two zones (pods of one name in two namespaces) are two targets.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TargetKey {
    pub zone_name: String,
    pub cluster_name: String,
    pub instance: String,
}

impl TargetKey {
    /// The key of `zone`, `cluster` and `instance`.
    pub fn new(zone: &str, cluster: &str, instance: &str) -> Self {
        TargetKey {
            zone_name: zone.to_owned(),
            cluster_name: cluster.to_owned(),
            instance: instance.to_owned(),
        }
    }

    /// The key a report is filed under.
    pub fn of_report(r: &InstanceReport) -> Self {
        TargetKey::new(&r.zone_name, &r.cluster_name, &r.instance)
    }
}

impl std::fmt::Display for TargetKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}/{}",
            self.zone_name, self.cluster_name, self.instance
        )
    }
}

impl Target {
    /// The (zone, cluster, instance) this target reports under.
    pub fn key(&self) -> TargetKey {
        TargetKey::new(&self.zone_name, &self.cluster_name, &self.instance)
    }

    /// Where the sidecar's admin API listens.
    pub fn endpoint(&self) -> AdminEndpoint {
        AdminEndpoint {
            addr: self.admin.clone(),
            netns: self.netns.clone(),
        }
    }

    /// A client of the sidecar's admin API whose calls time out after `timeout`, its
    /// namespace failures told to `on_netns_error`.
    pub fn admin_client(
        &self,
        timeout: Duration,
        on_netns_error: NetnsErrorHook,
    ) -> Result<EnvoyAdmin, EnvoyError> {
        Ok(EnvoyAdmin::at(self.endpoint(), timeout)?.observing_netns_errors(on_netns_error))
    }
}

/// Why a targets file was refused.
#[derive(Debug, thiserror::Error)]
pub enum TargetsError {
    #[error("cannot read targets file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("targets file {path} is over the limit of {MAX_TARGETS_FILE} bytes")]
    TooLarge { path: String },
    #[error("targets file {path} is not a JSON array of targets: {reason}")]
    Invalid { path: String, reason: String },
}

/// Reads and checks a targets file. An empty `instance` defaults to the host
/// name and the admin port.
pub fn read_targets_file(path: &Path) -> Result<Vec<Target>, TargetsError> {
    let p = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|e| TargetsError::Read {
        path: p.clone(),
        source: e,
    })?;
    if meta.len() > MAX_TARGETS_FILE {
        return Err(TargetsError::TooLarge { path: p });
    }
    let text = std::fs::read_to_string(path).map_err(|e| TargetsError::Read {
        path: p.clone(),
        source: e,
    })?;
    parse_targets(&text).map_err(|reason| TargetsError::Invalid { path: p, reason })
}

/// Parses and checks the JSON text of a targets file.
pub fn parse_targets(text: &str) -> Result<Vec<Target>, String> {
    let mut targets: Vec<Target> = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if targets.len() > MAX_TARGETS {
        return Err(format!("{} targets, at most {MAX_TARGETS}", targets.len()));
    }
    let mut seen = std::collections::BTreeSet::new();
    for t in &mut targets {
        parse_host_port(&t.admin)?;
        if t.instance.is_empty() {
            let port = t.admin.rsplit_once(':').map_or("", |(_, p)| p);
            t.instance = format!("{}-{port}", host_name());
        }
        // The namespace a path names now is the target's: a process that later takes
        // a dead one's PID (and so its /proc path) is not entered in its name.
        if let Some(ns) = &mut t.netns {
            ns.pin();
        }
        if !seen.insert(t.key()) {
            return Err(format!(
                "instance {:?} of zone {:?} and cluster {:?} is listed twice",
                t.instance, t.zone_name, t.cluster_name
            ));
        }
    }
    Ok(targets)
}

/// The host's name, or `localhost` when it cannot be read.
pub fn host_name() -> String {
    sysinfo::System::host_name()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_file_text() {
        let t = parse_targets(
            r#"[{"admin":"127.0.0.1:9901","zoneName":"z","clusterName":"c","instance":"i","logFile":"/var/log/envoy.log"},
                {"admin":"127.0.0.1:9902"}]"#,
        )
        .unwrap();
        assert_eq!(t[0].instance, "i");
        assert_eq!(
            t[0].log_file.as_deref(),
            Some(Path::new("/var/log/envoy.log"))
        );
        assert!(t[1].instance.ends_with("-9902"));
        assert!(parse_targets(r#"[{"admin":"nope"}]"#).is_err());
        assert!(parse_targets(r#"{"admin":"127.0.0.1:1"}"#).is_err());
        assert!(
            parse_targets(
                r#"[{"admin":"127.0.0.1:1","instance":"a"},{"admin":"127.0.0.1:2","instance":"a"}]"#
            )
            .is_err()
        );
        assert!(parse_targets(r#"[{"admin":"127.0.0.1:1","zone":"typo"}]"#).is_err());
        // One instance name in two zones: two targets.
        let two = parse_targets(
            r#"[{"admin":"127.0.0.1:1","zoneName":"a","clusterName":"c","instance":"x"},
                {"admin":"127.0.0.1:2","zoneName":"b","clusterName":"c","instance":"x"}]"#,
        )
        .unwrap();
        assert_ne!(two[0].key(), two[1].key());
    }
}
