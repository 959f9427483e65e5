//! What the sync of a sidecar with its control server is derived from (contract
//! section 17), read from the live instances: the sidecar's upstream clusters with
//! their host-set digests (shared, not copied) and the xDS state its agent reports.

use std::sync::Arc;

use meshcat_common::wire::XdsState;

use super::clusterset::ClusterSet;
use super::{InstanceKey, Instances, LiveInstance};

/// One instance as the sync derivation reads it.
#[derive(Debug, Clone)]
pub struct SyncInput {
    pub key: InstanceKey,
    pub clusters: Arc<ClusterSet>,
    /// `None` when its agent reports no xDS state.
    pub xds: Option<XdsState>,
    /// The replica that owns it, when another one does: that replica derives its sync.
    pub owner: Option<String>,
}

fn input(key: InstanceKey, i: &LiveInstance) -> SyncInput {
    SyncInput {
        xds: i.xds().cloned(),
        clusters: i.clusters().clone(),
        owner: i.owner().map(str::to_owned),
        key,
    }
}

impl Instances {
    /// The sync input of a live instance; `None` when it is gone or not live.
    pub fn sync_input(&self, key: &InstanceKey) -> Option<SyncInput> {
        let by_zone = self.memory.clusters.get(&key.cluster)?;
        let i = by_zone
            .get(&key.zone)?
            .instances
            .get(&key.instance)
            .filter(|i| i.is_live())?;
        Some(input(key.clone(), i))
    }

    /// The sync inputs of every live instance of `zone` (all zones with `None`).
    pub fn sync_inputs(&self, zone: Option<&str>) -> Vec<SyncInput> {
        let mut out = Vec::new();
        for by_zone in self.memory.clusters.iter() {
            for (z, e) in by_zone.iter() {
                if zone.is_some_and(|want| want != z) {
                    continue;
                }
                for (name, i) in e.instances.iter().filter(|(_, i)| i.is_live()) {
                    let key = InstanceKey {
                        zone: z.clone(),
                        cluster: by_zone.key().clone(),
                        instance: name.clone(),
                    };
                    out.push(input(key, i));
                }
            }
        }
        out
    }
}
