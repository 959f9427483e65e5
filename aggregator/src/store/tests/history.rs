//! What the store notes in the history: registrations, instances arriving, leaving
//! and restarting, status changes with their reason, configuration changes and
//! drift; nothing at loading.

use serde_json::json;

use super::*;
use crate::history::{HistoryConfig, HistoryMetrics};

fn open_with_history() -> (tempfile::TempDir, Store, Instances) {
    let dir = tempfile::tempdir().unwrap();
    let (s, live) = Store::open(dir.path(), Rules::defaults()).unwrap();
    attach(&s, dir.path());
    (dir, s, live)
}

fn attach(s: &Store, dir: &std::path::Path) {
    let h = History::open(
        dir,
        crate::history::DB_FILE,
        HistoryConfig::default(),
        HistoryMetrics::unregistered(),
    )
    .unwrap();
    s.set_history(std::sync::Arc::new(h)).unwrap();
}

/// Every entry so far, oldest first, as (kind, cluster, instance, detail).
fn entries(s: &Store) -> Vec<(String, String, String, serde_json::Value)> {
    let h = s.memory.history.get().unwrap();
    h.flush();
    let mut rows = h
        .db()
        .query(&crate::history::Query {
            limit: 1000,
            ..Default::default()
        })
        .unwrap()
        .rows;
    rows.reverse();
    rows.iter()
        .map(|r| {
            let e = r.stored().to_entry(r.id);
            (e.kind, e.cluster_name, e.instance, e.detail)
        })
        .collect()
}

fn kinds(s: &Store) -> Vec<String> {
    entries(s).into_iter().map(|e| e.0).collect()
}

fn hashed(instance: &str, hash: &str, routes: &str) -> InstanceReport {
    let mut r = report("z", "a", instance, 0, 0);
    r.config_hash = Some(hash.into());
    r.config_hashes = [("listeners", "1e"), ("routes", routes)]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    r
}

#[test]
fn registrations_are_noted_with_the_fields_that_changed() {
    let (_d, s, _live) = open_with_history();
    s.writes().create_zone(zone("z")).unwrap();
    s.writes()
        .create_cluster(ClusterRecord::new("z", "a", "A"))
        .unwrap();
    let mut edited = ClusterRecord::new("z", "a", "A");
    edited.owner = "team-a".into();
    edited.version = "2".into();
    s.writes().replace_cluster(edited.clone()).unwrap();
    // The same record again changes nothing.
    s.writes().replace_cluster(edited).unwrap();
    s.writes()
        .create_cluster(ClusterRecord::new("z", "b", "B"))
        .unwrap();
    let mut moved = zone("z");
    moved.server_address = "cp:60000".into();
    s.writes().replace_zone(moved.clone()).unwrap();
    s.writes().replace_zone(moved).unwrap();
    s.writes().delete_cluster("z", "a").unwrap();
    s.writes().delete_zone("z").unwrap();
    let got = entries(&s);
    let summary: Vec<(&str, &str)> = got.iter().map(|e| (e.0.as_str(), e.1.as_str())).collect();
    assert_eq!(
        summary,
        [
            ("zone-registered", ""),
            ("cluster-registered", "a"),
            ("cluster-updated", "a"),
            ("cluster-registered", "b"),
            ("zone-updated", ""),
            ("cluster-deleted", "a"),
            ("cluster-deleted", "b"),
            ("zone-deleted", ""),
        ]
    );
    assert_eq!(got[2].3, json!({"changed": ["owner", "version"]}));
    assert_eq!(got[4].3, json!({"changed": ["serverAddress"]}));
}

#[test]
fn loading_notes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (s, _live) = Store::open(dir.path(), Rules::defaults()).unwrap();
        s.writes().create_zone(zone("z")).unwrap();
        s.writes()
            .create_cluster(ClusterRecord::new("z", "a", "A"))
            .unwrap();
    }
    let (s, _live) = Store::open(dir.path(), Rules::defaults()).unwrap();
    attach(&s, dir.path());
    assert!(kinds(&s).is_empty());
}

#[test]
fn instances_join_leave_and_restart_with_status_reasons() {
    let (_d, s, live) = open_with_history();
    s.writes().create_zone(zone("z")).unwrap();
    let mut c = ClusterRecord::new("z", "a", "A");
    c.min_instances = 2;
    s.writes().create_cluster(c).unwrap();
    let now = Instant::now();
    live.apply_report("agent-1", report("z", "a", "i1", 0, 0), now);
    live.apply_report("agent-2", report("z", "a", "i2", 0, 0), now);
    // Steady reports note nothing.
    live.apply_report("agent-1", report("z", "a", "i1", 10, 0), now);
    let mut down = report("z", "a", "i1", 10, 0);
    down.reachable = false;
    live.apply_report("agent-1", down, now);
    let mut back = report("z", "a", "i1", 0, 0);
    back.start_time_ms += 60_000;
    live.apply_report("agent-1", back, now);
    live.agent_gone("agent-2");
    live.expire(now + Duration::from_secs(16));
    // After the zone's and the cluster's registrations.
    let got = entries(&s).split_off(2);
    let summary: Vec<(&str, &str)> = got.iter().map(|e| (e.0.as_str(), e.2.as_str())).collect();
    assert_eq!(
        summary,
        [
            ("instance-joined", "i1"),
            ("status-changed", ""),
            ("instance-joined", "i2"),
            ("status-changed", ""),
            ("instance-left", "i1"),
            ("status-changed", ""),
            ("instance-joined", "i1"),
            ("instance-restarted", "i1"),
            ("status-changed", ""),
            ("instance-left", "i2"),
            ("status-changed", ""),
            ("instance-left", "i1"),
            ("status-changed", ""),
        ]
    );
    assert_eq!(got[0].3, json!({"startTime": 1_700_000_000_000i64}));
    assert_eq!(
        got[1].3,
        json!({"from": "down", "to": "warning", "reason": "1 live instance, below minInstances 2"})
    );
    assert_eq!(got[3].3["to"], "stable");
    assert_eq!(got[4].3, json!({"reason": "unreachable"}));
    assert_eq!(
        got[7].3,
        json!({"startTime": 1_700_000_060_000i64, "previousStartTime": 1_700_000_000_000i64})
    );
    assert_eq!(got[9].3, json!({"reason": "disconnected"}));
    assert_eq!(got[11].3, json!({"reason": "expired"}));
    assert_eq!(got[12].3["to"], "down");
    // Raising minInstances moves the status: noted after the update.
    live.apply_report("agent-1", report("z", "a", "i1", 0, 0), Instant::now());
    let mut c = ClusterRecord::new("z", "a", "A");
    c.min_instances = 1;
    s.writes().replace_cluster(c).unwrap();
    let tail: Vec<String> = kinds(&s).into_iter().rev().take(2).collect();
    assert_eq!(tail, ["status-changed", "cluster-updated"]);
}

#[test]
fn configuration_changes_and_drift_are_noted() {
    let (_d, s, live) = open_with_history();
    s.writes().create_zone(zone("z")).unwrap();
    s.writes()
        .create_cluster(ClusterRecord::new("z", "a", "A"))
        .unwrap();
    let now = Instant::now();
    live.apply_report("agent-1", hashed("i1", "a1", "b1"), now);
    live.apply_report("agent-2", hashed("i2", "a1", "b1"), now);
    // i2 runs another route: its configuration changed and the cluster drifted.
    live.apply_report("agent-2", hashed("i2", "a2", "b2"), now);
    // Back to the first: the drift ends.
    live.apply_report("agent-2", hashed("i2", "a1", "b1"), now);
    let got: Vec<_> = entries(&s)
        .into_iter()
        .filter(|e| e.0.starts_with("config-") || e.0.starts_with("drift-"))
        .collect();
    let names: Vec<&str> = got.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "config-changed",
            "drift-started",
            "config-changed",
            "drift-ended"
        ]
    );
    assert_eq!(
        got[0].3,
        json!({"from": "a1", "to": "a2", "resources": ["routes"]})
    );
    assert_eq!(got[0].2, "i2");
    assert_eq!(
        got[1].3,
        json!({"groups": [
            {"configHash": "a1", "instances": ["i1"], "instanceCount": 1},
            {"configHash": "a2", "instances": ["i2"], "instanceCount": 1},
        ]})
    );
    assert_eq!(
        got[3].3,
        json!({"groups": [{"configHash": "a1", "instances": ["i1", "i2"], "instanceCount": 2}]})
    );
    // A drifted instance that leaves ends the drift too.
    live.apply_report("agent-2", hashed("i2", "a3", "b3"), now);
    live.agent_gone("agent-2");
    let tail: Vec<String> = kinds(&s).into_iter().rev().take(4).collect();
    assert_eq!(
        tail,
        [
            "drift-ended",
            "instance-left",
            "drift-started",
            "config-changed"
        ]
    );
}

#[test]
fn a_peers_instances_are_noted_from_its_publications() {
    let (_d, s, live) = open_with_history();
    s.writes().create_zone(zone("z")).unwrap();
    s.writes()
        .create_cluster(ClusterRecord::new("z", "a", "A"))
        .unwrap();
    live.put_remote(remote("r1", true, 0));
    // A new publication with the same facts notes nothing.
    live.put_remote(remote("r1", true, 5));
    live.drop_remote("z", "a", "r1", crate::history::LeftReason::Disconnected);
    let got = entries(&s);
    let summary: Vec<(&str, &str)> = got.iter().map(|e| (e.0.as_str(), e.2.as_str())).collect();
    assert_eq!(
        &summary[2..],
        [
            ("instance-joined", "r1"),
            ("status-changed", ""),
            ("instance-left", "r1"),
            ("status-changed", ""),
        ]
    );
    assert_eq!(got[4].3, json!({"reason": "disconnected"}));
}

/// What an agent sends beside the hashes' form (an outsized or non-hex hash, kinds
/// the contract does not name) reaches neither the history nor the drift answer.
#[test]
fn only_well_formed_hashes_reach_the_history_and_the_drift() {
    let (_d, s, live) = open_with_history();
    s.writes().create_zone(zone("z")).unwrap();
    s.writes()
        .create_cluster(ClusterRecord::new("z", "a", "A"))
        .unwrap();
    let now = Instant::now();
    let with = |instance: &str, hash: &str, kinds: &[(&str, &str)]| {
        let mut r = report("z", "a", instance, 0, 0);
        r.config_hash = Some(hash.into());
        r.config_hashes = kinds
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        r
    };
    let long = "f".repeat(65);
    let junk: &[(&str, &str)] = &[
        ("listeners", "1e"),
        ("routes", "b1"),
        ("x-injected", "00"),
        ("clusters", "not hex"),
        ("secrets", long.as_str()),
    ];
    live.apply_report("agent-1", with("i1", "a1", junk), now);
    live.apply_report("agent-2", with("i2", "a1", junk), now);
    // A hash that is no hash counts as none: no configuration change, no drift.
    live.apply_report("agent-2", with("i2", &long, junk), now);
    live.apply_report("agent-2", with("i2", "<script>", junk), now);
    assert!(
        kinds(&s)
            .iter()
            .all(|k| !k.starts_with("config-") && !k.starts_with("drift-")),
        "{:?}",
        kinds(&s)
    );
    // A well-formed change names only the contract's kinds that differ.
    let other: &[(&str, &str)] = &[
        ("listeners", "1e"),
        ("routes", "b2"),
        ("x-injected", "01"),
        ("clusters", "also not hex"),
        ("secrets", "5e"),
    ];
    live.apply_report("agent-2", with("i2", "a1", junk), now);
    live.apply_report("agent-2", with("i2", "A2", other), now);
    let got: Vec<_> = entries(&s)
        .into_iter()
        .filter(|e| e.0 == "config-changed")
        .collect();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        got[0].3,
        json!({"from": "a1", "to": "A2", "resources": ["routes", "secrets"]})
    );
    let d = live.drift("z", "a").unwrap();
    assert!(d.drifted);
    assert_eq!(d.differs, ["routes", "secrets"]);
    let hashes: Vec<Option<String>> = d.groups.iter().map(|g| g.config_hash.clone()).collect();
    assert_eq!(hashes, [Some("A2".to_owned()), Some("a1".to_owned())]);
    // A peer's publication goes through the same sieve.
    let mut r = remote("r1", true, 0);
    r.config_hash = Some(long.clone());
    r.config_hashes = [("x-injected".to_owned(), "00".to_owned())].into();
    live.put_remote(r);
    let d = live.drift("z", "a").unwrap();
    assert!(
        d.groups
            .iter()
            .any(|g| g.config_hash.is_none() && g.instances == ["r1"]),
        "{d:?}"
    );
}

/// Without drift the answer is one group with every live instance, those whose
/// agent sent no hash included, as the contract has it; with drift, one group per
/// hash and the instances without one apart.
#[test]
fn the_drift_answer_without_drift_is_one_group_of_every_live_instance() {
    let (_d, s, live) = open_with_history();
    s.writes().create_zone(zone("z")).unwrap();
    s.writes()
        .create_cluster(ClusterRecord::new("z", "a", "A"))
        .unwrap();
    let group = |g: &crate::store::drift::DriftGroup| (g.config_hash.clone(), g.instances.clone());
    let d = live.drift("z", "a").unwrap();
    assert!(!d.drifted);
    assert_eq!(
        d.groups.iter().map(group).collect::<Vec<_>>(),
        [(None, vec![])]
    );
    assert!(d.differs.is_empty());
    let now = Instant::now();
    live.apply_report("agent-1", hashed("i1", "a1", "b1"), now);
    live.apply_report("agent-2", report("z", "a", "i2", 0, 0), now);
    let d = live.drift("z", "a").unwrap();
    assert!(!d.drifted);
    assert_eq!(
        d.groups.iter().map(group).collect::<Vec<_>>(),
        [(
            Some("a1".to_owned()),
            vec!["i1".to_owned(), "i2".to_owned()]
        )]
    );
    live.apply_report("agent-3", hashed("i3", "c3", "b2"), now);
    let d = live.drift("z", "a").unwrap();
    assert!(d.drifted);
    assert_eq!(
        d.groups.iter().map(group).collect::<Vec<_>>(),
        [
            (Some("a1".to_owned()), vec!["i1".to_owned()]),
            (Some("c3".to_owned()), vec!["i3".to_owned()]),
            (None, vec!["i2".to_owned()]),
        ]
    );
    assert_eq!(d.differs, ["routes"]);
    // The drift entries' groups are the answer's.
    live.agent_gone("agent-3");
    let ended = entries(&s)
        .into_iter()
        .rfind(|e| e.0 == "drift-ended")
        .unwrap();
    assert_eq!(
        ended.3,
        json!({"groups": [{"configHash": "a1", "instances": ["i1", "i2"], "instanceCount": 2}]})
    );
}

/// An instance that flips on every report (reachable or not, another start time),
/// applied through the store at the reports' times, records at most its allowance
/// one by one and one `instance-flapping` entry a minute with the counts of the
/// rest: nothing is lost from the counts, and the history grows by minutes, not by
/// reports.
#[test]
fn a_flapping_instance_is_summed_once_a_minute() {
    let (_d, s, live) = open_with_history();
    let t0 = Instant::now();
    let mut flips = 0u64;
    let at = |k: u64| {
        let mut r = report("z", "a", "i1", 0, 0);
        r.reachable = k % 2 == 0;
        r.start_time_ms += (k / 2) as i64;
        r
    };
    // Every 2 s for 5 minutes: left, then joined and restarted, over and over.
    for k in 0..150 {
        live.apply_report("agent-1", at(k), t0 + Duration::from_secs(2 * k));
        flips += match k {
            0 => 1,
            k if k % 2 == 1 => 1,
            _ => 2,
        };
    }
    // A report after the fifth minute ends it.
    live.apply_report("agent-1", at(180), t0 + Duration::from_secs(360));
    flips += 2;
    let got = entries(&s);
    let (summaries, one_by_one): (Vec<_>, Vec<_>) = got
        .iter()
        .filter(|e| e.2 == "i1")
        .partition(|e| e.0 == "instance-flapping");
    assert_eq!(summaries.len(), 5, "one a minute: {summaries:?}");
    let limit = crate::history::limit::INSTANCE_ENTRIES as usize;
    assert!(
        one_by_one.len() <= 6 * limit,
        "{} one by one",
        one_by_one.len()
    );
    let summed: u64 = summaries
        .iter()
        .flat_map(|e| e.3["flips"].as_object().unwrap().values())
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(
        summed + one_by_one.len() as u64,
        flips,
        "every flip counted"
    );
    let first = &summaries[0].3["flips"];
    assert!(first["instance-left"].as_u64() > Some(5), "{first}");
    assert!(first["instance-restarted"].as_u64() > Some(5), "{first}");
    assert!(summaries[0].3["sinceMs"].is_i64());
}
