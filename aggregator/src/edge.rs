//! Keeps, per zone, the list of clusters that the zone's edge sidecar (the live
//! instances of its `requestCluster`) has in its configuration, so that
//! `GET /services` can list clusters that should be in the mesh but that nobody
//! registered. The list comes from the sidecar's `/config_dump`, fetched through its
//! agent with a [`Command::ConfigDump`].

use std::sync::Arc;
use std::time::Duration;

use meshcat_common::config_dump::{self, Item};
use meshcat_common::limits::MAX_SIDECAR_CLUSTERS as MAX_CLUSTERS;
use meshcat_common::wire::{Command, CommandOutput};
use serde_json::Value;
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::ingest::Agents;
use crate::store::{Instances, Store};

/// The names of the clusters a `/config_dump` declares (static and dynamic, active
/// and warming), sorted, each once, at most [`MAX_CLUSTERS`].
pub fn cluster_names(dump: &[u8]) -> Result<Vec<String>, config_dump::Error> {
    let mut names = Vec::new();
    config_dump::read_declared(dump, |item| {
        if let Item::Cluster(c) = item
            && let Some(name) = c.get("name").and_then(Value::as_str)
            && names.len() < MAX_CLUSTERS
        {
            names.push(name.to_owned());
        }
    })?;
    names.sort();
    names.dedup();
    Ok(names)
}

/// Refreshes every zone's edge clusters now: asks one live instance of each zone's
/// request cluster for its config dump. Zones whose edge has no live instance keep
/// their previous list until one reports again.
pub async fn refresh(store: &Store, instances: &Instances, agents: &Agents, deadline: Duration) {
    for zone in store.zones() {
        if zone.request_cluster.is_empty() {
            continue;
        }
        let live = instances.live_instances(&zone.zone_name, &zone.request_cluster);
        for edge in live {
            let outcome = agents
                .command(
                    &zone.zone_name,
                    &zone.request_cluster,
                    &edge.instance,
                    Command::ConfigDump,
                    deadline,
                )
                .await;
            match outcome {
                Ok(CommandOutput::ConfigDump(text)) => match cluster_names(text.as_bytes()) {
                    Ok(names) => {
                        debug!(zone = %zone.zone_name, instance = %edge.instance, clusters = names.len(), "Edge clusters refreshed.");
                        instances.set_edge_clusters(&zone.zone_name, names);
                        break;
                    }
                    Err(e) => {
                        warn!(zone = %zone.zone_name, instance = %edge.instance, error = %e, "Edge config dump cannot be read.");
                    }
                },
                Ok(_) => {
                    warn!(zone = %zone.zone_name, instance = %edge.instance, "Agent answered a config dump with something else.");
                }
                Err(e) => {
                    debug!(zone = %zone.zone_name, instance = %edge.instance, error = %e, "Edge config dump failed.");
                }
            }
        }
    }
}

/// Runs [`refresh`] every `period` until `stop` turns true (the first one at once;
/// zones whose edge has not reported yet are skipped until the next).
pub async fn refresh_loop(
    store: Arc<Store>,
    instances: Arc<Instances>,
    agents: Agents,
    period: Duration,
    deadline: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let stopping = tokio::select! {
            _ = tick.tick() => false,
            _ = stop.wait_for(|s| *s) => true,
        };
        if stopping {
            return;
        }
        refresh(&store, &instances, &agents, deadline).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_static_and_dynamic_clusters() {
        let dump = serde_json::json!({"configs": [
            {"@type": "type.googleapis.com/envoy.admin.v3.BootstrapConfigDump"},
            {"@type": "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
             "static_clusters": [{"cluster": {"name": "b"}}, {"cluster": {"name": "a"}}],
             "dynamic_active_clusters": [{"cluster": {"name": "c"}}, {"cluster": {"name": "a"}}],
             "dynamic_warming_clusters": [{"cluster": {"name": "d"}}]}
        ]});
        assert_eq!(
            cluster_names(dump.to_string().as_bytes()).unwrap(),
            ["a", "b", "c", "d"]
        );
        assert!(cluster_names(b"null").is_err());
        assert!(cluster_names(b"{}").unwrap().is_empty());
    }
}
