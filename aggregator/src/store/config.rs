//! How the catalog is opened and the rules it applies: where registrations live
//! (`--store`, `--data-dir`, TLS to etcd) and the thresholds of the status rules, with
//! their defaults, which the flags take as theirs.

use std::path::PathBuf;
use std::time::Duration;

use meshcat_common::config::{parse_positive_duration, parse_ratio};
use meshcat_common::identity::IdentityRules;

use super::etcd::EtcdTlsFiles;

/// Where registrations live (`--store`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreSpec {
    /// The embedded redb database under `--data-dir`.
    Redb,
    /// An etcd cluster (v3 API) shared by every replica.
    Etcd {
        /// `host:port` of each member.
        endpoints: Vec<String>,
        /// Key prefix, starting with `/`, without a trailing `/`.
        prefix: String,
    },
}

/// Where registrations live, and the status rules the store applies.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// `--store`.
    pub spec: StoreSpec,
    /// `--data-dir`: the redb database, and the development certificates.
    pub data_dir: PathBuf,
    /// `--etcd-ca-file`, `--etcd-cert`, `--etcd-key` (etcd store only).
    pub etcd_tls: Option<EtcdTlsFiles>,
    /// `--instance-ttl` and `--error-ratio-warning`.
    pub rules: Rules,
}

/// Default `--instance-ttl`, written as the flag is: the flag's default is this value.
pub const DEFAULT_INSTANCE_TTL: &str = "15s";
/// Default `--error-ratio-warning`, written as the flag is.
pub const DEFAULT_ERROR_RATIO_WARNING: &str = "0.05";
/// Default `--graph-window`, written as the flag is.
pub const DEFAULT_GRAPH_WINDOW: &str = "60s";

/// Thresholds of the status rules.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// An instance not reported for this long is dropped.
    pub instance_ttl: Duration,
    /// Error ratio above which a cluster is in warning.
    pub error_ratio_warning: f64,
    /// The dependency graph's window (`--graph-window`).
    pub graph_window: Duration,
    /// When a certificate is expiring or its rotation overdue (`--cert-warning`,
    /// `--cert-rotation-overdue`).
    pub identity: IdentityRules,
}

impl Rules {
    /// The rules at their defaults ([`DEFAULT_INSTANCE_TTL`],
    /// [`DEFAULT_ERROR_RATIO_WARNING`], [`DEFAULT_GRAPH_WINDOW`]), which are the
    /// flags' defaults too.
    pub fn defaults() -> Rules {
        let duration = |s| parse_positive_duration(s).expect("default durations parse");
        Rules {
            instance_ttl: duration(DEFAULT_INSTANCE_TTL),
            error_ratio_warning: parse_ratio(DEFAULT_ERROR_RATIO_WARNING)
                .expect("the default ratio parses"),
            graph_window: duration(DEFAULT_GRAPH_WINDOW),
            identity: IdentityRules::default(),
        }
    }
}
