//! Configuration drift (contract section 15): the live instances of a cluster
//! grouped by the hash of their sidecar's effective configuration, which each agent
//! computes without what is per instance by nature (`docs/agent.md`, "The drift
//! hash"). Instances with different hashes are drifted. The history notes when a
//! cluster's drift starts and ends, with these groups.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::Serialize;

use super::Entry;
use super::instances::LiveInstance;
use crate::history::GroupDetail;
use crate::history::entry::{MAX_GROUP_NAMES, MAX_GROUPS};

/// The resource kinds that carry a hash of their own (contract section 15).
pub const RESOURCE_KINDS: [&str; 4] = ["listeners", "clusters", "routes", "secrets"];

/// Longest configuration hash kept (the agent sends 16 hex digits).
pub const MAX_CONFIG_HASH: usize = 64;

/// Whether `h` has the form of a configuration hash: 1 to [`MAX_CONFIG_HASH`] hex
/// digits.
pub fn is_config_hash(h: &str) -> bool {
    !h.is_empty() && h.len() <= MAX_CONFIG_HASH && h.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Keeps of what a report (or a peer's publication) says about an instance's
/// configuration only what has the agent's form: the hash when it is one, and the
/// per-kind hashes of the four resource kinds that are hashes, none without the
/// hash. Whatever else an agent sends never reaches the history, the drift answer
/// or the publications to other replicas.
pub fn sanitise_hashes(hash: &mut Option<String>, kinds: &mut BTreeMap<String, String>) {
    if hash.as_deref().is_some_and(|h| !is_config_hash(h)) {
        *hash = None;
    }
    if hash.is_none() {
        kinds.clear();
        return;
    }
    kinds.retain(|k, v| RESOURCE_KINDS.contains(&k.as_str()) && is_config_hash(v));
}

/// `GET /clusters/{c}/drift`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DriftView {
    /// Whether the live instances run more than one configuration.
    pub drifted: bool,
    /// One group per configuration, the largest first (instances whose agent sent
    /// no hash in a group of their own, last among groups of their size); without
    /// drift, one group with every live instance, under the one hash they report
    /// (null when none did), its list empty when no instance is live.
    pub groups: Vec<DriftGroup>,
    /// The resource kinds (`listeners`, `clusters`, `routes`, `secrets`) whose
    /// hashes differ between the groups; empty without drift.
    pub differs: Vec<String>,
}

/// Instances that run one configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DriftGroup {
    /// The configuration's hash; with drift, null for the instances whose agent
    /// sent none yet (an agent older than drift, or a sidecar whose configuration
    /// was not read), which count for no drift; without drift, the one hash the
    /// live instances report, null when none reports one.
    pub config_hash: Option<String>,
    /// Instance names, sorted.
    pub instances: Vec<String>,
}

/// Whether live instances run more than one known configuration.
pub(super) fn drifted<'a>(instances: impl Iterator<Item = &'a LiveInstance>) -> bool {
    let mut first: Option<&Arc<str>> = None;
    for i in instances.filter(|i| i.is_live()) {
        if let Some(h) = &i.config_hash {
            match first {
                None => first = Some(h),
                Some(f) if f != h => return true,
                Some(_) => {}
            }
        }
    }
    false
}

/// The live instances of `e` by configuration, the largest group first; known
/// configurations before unknown ones. Without drift (at most one known hash) there
/// is one group: every live instance, under that hash (none when no instance sent
/// one), as the contract's drift answer has it; with no live instance its list is
/// empty.
fn groups_of(e: &Entry) -> Vec<(Option<Arc<str>>, Vec<&String>)> {
    let mut groups: BTreeMap<Option<Arc<str>>, Vec<&String>> = BTreeMap::new();
    for (name, i) in e.instances.iter().filter(|(_, i)| i.is_live()) {
        groups.entry(i.config_hash.clone()).or_default().push(name);
    }
    if groups.keys().filter(|h| h.is_some()).count() <= 1 {
        let hash = groups.keys().find_map(Clone::clone);
        let mut all: Vec<&String> = groups.into_values().flatten().collect();
        all.sort();
        return vec![(hash, all)];
    }
    let mut groups: Vec<_> = groups.into_iter().collect();
    groups.sort_by(|(ha, a), (hb, b)| {
        b.len()
            .cmp(&a.len())
            .then(ha.is_none().cmp(&hb.is_none()))
            .then(ha.cmp(hb))
    });
    groups
}

/// The groups as a history entry holds them: bounded in groups and names.
pub(super) fn group_details(e: &Entry) -> Vec<GroupDetail> {
    groups_of(e)
        .into_iter()
        .take(MAX_GROUPS)
        .map(|(h, names)| GroupDetail {
            config_hash: h.map(|h| h.to_string()),
            instance_count: names.len(),
            instances: names.into_iter().take(MAX_GROUP_NAMES).cloned().collect(),
        })
        .collect()
}

/// The drift of the live instances of `e` (`GET /clusters/{c}/drift`).
pub(super) fn view(e: &Entry) -> DriftView {
    // One instance per configuration, whose report says its kinds' hashes.
    let mut sample: BTreeMap<Arc<str>, &LiveInstance> = BTreeMap::new();
    for i in e.instances.values().filter(|i| i.is_live()) {
        if let Some(h) = &i.config_hash {
            sample.entry(h.clone()).or_insert(i);
        }
    }
    let drifted = sample.len() > 1;
    let differs = if drifted {
        let kinds: Vec<BTreeMap<String, String>> =
            sample.values().map(|i| i.report().config_hashes).collect();
        let names: BTreeSet<&String> = kinds.iter().flat_map(|k| k.keys()).collect();
        names
            .into_iter()
            .filter(|n| kinds.iter().any(|k| k.get(*n) != kinds[0].get(*n)))
            .cloned()
            .collect()
    } else {
        Vec::new()
    };
    let groups = groups_of(e)
        .into_iter()
        .map(|(h, instances)| DriftGroup {
            config_hash: h.map(|h| h.to_string()),
            instances: instances.into_iter().cloned().collect(),
        })
        .collect();
    DriftView {
        drifted,
        groups,
        differs,
    }
}
