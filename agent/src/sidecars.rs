//! The diagnosis side of each target: the tail of its sidecar log ([`LogTail`]) and
//! its debug windows ([`DebugWindows`], driving the level through the sidecar's admin
//! API). Follows target changes: a target whose admin address or log file changes
//! gets a fresh tail and windows; a removed target's tail stops and any window of it
//! restores the level at once.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::debugwindow::{DebugWindows, LevelControl};
use crate::envoy::{AdminEndpoint, EnvoyAdmin};
use crate::logtail::{LogTail, TailBounds, TailConfig};
use crate::ops_metrics::OpsMetrics;
use crate::target::{Target, TargetKey};

/// A sidecar's log level, read and set through its admin API.
struct AdminLevel(EnvoyAdmin);

impl LevelControl for AdminLevel {
    fn get_level(&self) -> BoxFuture<'static, Result<String, String>> {
        let admin = self.0.clone();
        async move { admin.log_level().await.map_err(|e| e.to_string()) }.boxed()
    }

    fn set_level(&self, level: &str) -> BoxFuture<'static, Result<(), String>> {
        let admin = self.0.clone();
        let level = level.to_owned();
        async move {
            admin
                .set_envoy_level(&level)
                .await
                .map_err(|e| e.to_string())
        }
        .boxed()
    }
}

/// The tail and windows of one target.
#[derive(Debug, Clone)]
pub struct SidecarDiag {
    /// Where the admin API the windows talk to listens; a change (address or
    /// namespace) makes a fresh entry.
    admin: AdminEndpoint,
    /// The followed file; a change makes a fresh entry.
    log_file: Option<PathBuf>,
    /// The tail of the sidecar's log, when it has a log file.
    pub tail: Option<LogTail>,
    /// The sidecar's debug windows.
    pub windows: DebugWindows,
    /// Stops this entry's tail and windows.
    cancel: CancellationToken,
}

/// Every target's [`SidecarDiag`], by (zone, cluster, instance).
#[derive(Debug)]
pub struct Diagnostics {
    /// The agent's shutdown: parent of every entry's token.
    root: CancellationToken,
    /// Entries by target; locked briefly, never across `.await`.
    by_target: Mutex<BTreeMap<TargetKey, SidecarDiag>>,
    /// Timeout of the windows' admin calls.
    admin_timeout: Duration,
    /// Where the windows' namespace failures are counted.
    metrics: OpsMetrics,
    /// How much of each sidecar's log is held.
    tail_bounds: TailBounds,
}

impl Diagnostics {
    /// No targets yet; admin calls of the windows time out after `admin_timeout` and
    /// count their namespace failures in `metrics`; each log is held within
    /// `tail_bounds`.
    pub fn new(admin_timeout: Duration, metrics: OpsMetrics, tail_bounds: TailBounds) -> Self {
        Diagnostics {
            root: CancellationToken::new(),
            by_target: Mutex::new(BTreeMap::new()),
            admin_timeout,
            metrics,
            tail_bounds,
        }
    }

    fn map(&self) -> MutexGuard<'_, BTreeMap<TargetKey, SidecarDiag>> {
        self.by_target.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes the entries match `targets`. Needs a Tokio runtime (tails run as tasks).
    pub fn reconcile(&self, targets: &[Target]) {
        if self.root.is_cancelled() {
            return;
        }
        let mut map = self.map();
        map.retain(|key, d| {
            let keep = targets
                .iter()
                .any(|t| t.key() == *key && t.endpoint() == d.admin && t.log_file == d.log_file);
            if !keep {
                d.cancel.cancel();
            }
            keep
        });
        for t in targets {
            let key = t.key();
            if map.contains_key(&key) {
                continue;
            }
            let hook = self
                .metrics
                .netns_error_hook((&t.zone_name, &t.cluster_name, &t.instance));
            let admin = match t.admin_client(self.admin_timeout, hook) {
                Ok(a) => a,
                Err(e) => {
                    warn!(instance = %t.instance, error = %e, "No debug windows for this target.");
                    continue;
                }
            };
            let cancel = self.root.child_token();
            let tail = t.log_file.as_ref().map(|path| {
                let (tail, _task) =
                    LogTail::spawn(TailConfig::bounded(path, self.tail_bounds), cancel.clone());
                tail
            });
            if tail.is_none() {
                info!(instance = %t.instance, "No sidecar log file: the log rules of the diagnosis will be skipped.");
            }
            let windows =
                DebugWindows::new(Arc::new(AdminLevel(admin)), tail.clone(), cancel.clone());
            map.insert(
                key,
                SidecarDiag {
                    admin: t.endpoint(),
                    log_file: t.log_file.clone(),
                    tail,
                    windows,
                    cancel,
                },
            );
        }
    }

    /// The entry of `target`.
    pub fn get(&self, target: &TargetKey) -> Option<SidecarDiag> {
        self.map().get(target).cloned()
    }

    /// Ends every running window, restoring levels, and stops the tails; resolves
    /// once no window holds a level raised.
    pub async fn shutdown(&self) {
        self.root.cancel();
        let all: Vec<SidecarDiag> = self.map().values().cloned().collect();
        for d in all {
            d.windows.wait_restored().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(instance: &str, admin: &str, log: Option<&str>) -> Target {
        Target {
            admin: admin.into(),
            zone_name: "z".into(),
            cluster_name: "c".into(),
            instance: instance.into(),
            log_file: log.map(PathBuf::from),
            local_cluster: None,
            netns: None,
        }
    }

    fn key(instance: &str) -> TargetKey {
        TargetKey::new("z", "c", instance)
    }

    #[tokio::test]
    async fn follows_target_changes() {
        let d = Diagnostics::new(
            Duration::from_secs(1),
            OpsMetrics::new(),
            TailBounds::default(),
        );
        d.reconcile(&[
            target("a", "127.0.0.1:9901", Some("/tmp/a.log")),
            target("b", "127.0.0.1:9902", None),
        ]);
        let a = d.get(&key("a")).unwrap();
        assert_eq!(
            a.tail.as_ref().map(|t| t.path().to_owned()),
            Some(PathBuf::from("/tmp/a.log"))
        );
        assert!(d.get(&key("b")).unwrap().tail.is_none());

        // Unchanged targets keep their entry; a changed log file gets a fresh one; a
        // removed target's tail and windows stop.
        d.reconcile(&[
            target("a", "127.0.0.1:9901", Some("/tmp/a2.log")),
            target("b", "127.0.0.1:9902", None),
        ]);
        assert!(a.cancel.is_cancelled());
        let a2 = d.get(&key("a")).unwrap();
        assert_eq!(
            a2.tail.as_ref().map(|t| t.path().to_owned()),
            Some(PathBuf::from("/tmp/a2.log"))
        );
        let b = d.get(&key("b")).unwrap();
        d.reconcile(&[target("a", "127.0.0.1:9901", Some("/tmp/a2.log"))]);
        assert!(b.cancel.is_cancelled());
        assert!(d.get(&key("b")).is_none());
        assert!(!a2.cancel.is_cancelled());

        d.shutdown().await;
        assert!(a2.cancel.is_cancelled());
        // After shutdown no new entries start.
        d.reconcile(&[target("c", "127.0.0.1:9903", None)]);
        assert!(d.get(&key("c")).is_none());
    }
}
