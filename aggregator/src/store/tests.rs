//! Unit tests of the store: registrations, reports, expiry and the counters.

use std::time::{Duration, Instant};

use meshcat_common::model::{ClusterRecord, InstanceMetrics, Status, ZoneRecord, ZoneSummary};
use meshcat_common::wire::InstanceReport;

use super::read::Oracle;
use super::*;

fn zone(name: &str) -> ZoneRecord {
    ZoneRecord {
        zone_name: name.into(),
        request_cluster: "edge".into(),
        server_address: "cp:50000".into(),
        use_tls: false,
        ca_path: String::new(),
        cert_path: String::new(),
        key_path: String::new(),
    }
}

fn report(zone: &str, cluster: &str, instance: &str, req: u64, err: u64) -> InstanceReport {
    InstanceReport {
        admin_address: "127.0.0.1:9901".into(),
        reachable: true,
        start_time_ms: 1_700_000_000_000,
        server_state: "LIVE".into(),
        envoy_version: "1.40.0".into(),
        requests_total: req,
        errors_5xx_total: err,
        ..InstanceReport::unread(zone.into(), cluster.into(), instance.into())
    }
}

fn open() -> (tempfile::TempDir, Store, Instances) {
    let dir = tempfile::tempdir().unwrap();
    let (s, live) = Store::open(dir.path(), Rules::defaults()).unwrap();
    (dir, s, live)
}

fn summary(s: &Store, z: &str) -> ZoneSummary {
    s.zone_summary(z).unwrap()
}

#[test]
fn registrations_and_conflicts() {
    let (_d, s, _live) = open();
    assert!(matches!(
        s.writes().create_cluster(ClusterRecord::new("z", "a", "A")),
        Err(StoreError::Invalid(_))
    ));
    s.writes().create_zone(zone("z")).unwrap();
    assert!(matches!(
        s.writes().create_zone(zone("z")),
        Err(StoreError::Conflict(_))
    ));
    s.writes()
        .create_cluster(ClusterRecord::new("z", "a", "A"))
        .unwrap();
    assert!(matches!(
        s.writes().create_cluster(ClusterRecord::new("z", "a", "A")),
        Err(StoreError::Conflict(_))
    ));
    assert!(matches!(
        s.writes()
            .replace_cluster(ClusterRecord::new("z", "b", "B")),
        Err(StoreError::NotFound(_))
    ));
    assert_eq!(summary(&s, "z").cluster_down_count, 1);
    s.writes().delete_zone("z").unwrap();
    assert!(Oracle(&s).get_cluster("a", None, true).is_empty());
    assert!(s.zone_summary("z").is_none());
}

#[test]
fn reports_drive_status_and_counters() {
    let (_d, s, live) = open();
    s.writes().create_zone(zone("z")).unwrap();
    let mut r = ClusterRecord::new("z", "a", "A");
    r.min_instances = 2;
    r.owner = "team".into();
    s.writes().create_cluster(r).unwrap();
    let now = Instant::now();
    live.apply_report("agent-1", report("z", "a", "i1", 0, 0), now);
    let v = &Oracle(&s).get_cluster("a", None, true)[0];
    assert_eq!(v.status, Status::Warning);
    assert_eq!(v.instances.len(), 1);
    live.apply_report("agent-2", report("z", "a", "i2", 0, 0), now);
    assert_eq!(
        Oracle(&s).get_cluster("a", None, true)[0].status,
        Status::Stable
    );
    let z = summary(&s, "z");
    assert_eq!((z.cluster_stable_count, z.instance_count), (1, 2));
    assert_eq!(z.owners, vec!["team"]);

    // 10 errors out of 100 requests in the window: above 5%.
    live.apply_report("agent-1", report("z", "a", "i1", 100, 10), now);
    assert_eq!(
        Oracle(&s).get_cluster("a", None, true)[0].status,
        Status::Warning
    );
    live.apply_report("agent-1", report("z", "a", "i1", 200, 10), now);
    assert_eq!(
        Oracle(&s).get_cluster("a", None, true)[0].status,
        Status::Stable
    );

    live.agent_gone("agent-2");
    let z = summary(&s, "z");
    assert_eq!((z.cluster_warning_count, z.instance_count), (1, 1));
    assert_eq!(s.totals().live_instances, 1);

    let mut unreachable = report("z", "a", "i1", 200, 10);
    unreachable.reachable = false;
    live.apply_report("agent-1", unreachable, now);
    assert_eq!(summary(&s, "z").cluster_down_count, 1);
    assert!(
        Oracle(&s).get_cluster("a", None, true)[0]
            .instances
            .is_empty()
    );
    assert!(matches!(
        live.instance_metrics("a", None, "i1"),
        MetricsLookup::NoInstance
    ));
}

#[test]
fn expiry_drops_silent_instances() {
    let (_d, s, live) = open();
    s.writes().create_zone(zone("z")).unwrap();
    s.writes()
        .create_cluster(ClusterRecord::new("z", "a", "A"))
        .unwrap();
    let t0 = Instant::now();
    live.apply_report("agent", report("z", "a", "i1", 0, 0), t0);
    live.apply_report(
        "agent",
        report("z", "a", "i2", 0, 0),
        t0 + Duration::from_secs(10),
    );
    live.expire(t0 + Duration::from_secs(14));
    assert_eq!(s.totals().live_instances, 2);
    live.expire(t0 + Duration::from_secs(16));
    assert_eq!(s.totals().live_instances, 1);
    assert_eq!(
        Oracle(&s).get_cluster("a", None, true)[0].instances[0].name,
        "i2"
    );
    live.expire(t0 + Duration::from_secs(30));
    assert_eq!(summary(&s, "z").cluster_down_count, 1);
    assert_eq!(s.totals().live_instances, 0);
}

#[test]
fn unregistered_clusters_show_in_services() {
    let (_d, s, live) = open();
    s.writes().create_zone(zone("z")).unwrap();
    s.writes()
        .create_cluster(ClusterRecord::new("z", "a", "A"))
        .unwrap();
    live.apply_report("agent", report("z", "ghost", "i1", 0, 0), Instant::now());
    live.set_edge_clusters("z", vec!["a".into(), "backend".into(), "bad name".into()]);
    let names: Vec<(String, Status)> = s
        .services(None, true)
        .into_iter()
        .map(|v| (v.record.cluster_name, v.status))
        .collect();
    assert_eq!(
        names,
        vec![
            ("a".into(), Status::Down),
            ("backend".into(), Status::Down),
            ("ghost".into(), Status::Stable)
        ]
    );
    assert!(s.services(Some("other"), true).is_empty());
    // Unregistered clusters do not count in the zone.
    assert_eq!(summary(&s, "z").cluster_count, 1);
    assert_eq!(summary(&s, "z").instance_count, 0);
    // Registering a reported cluster picks up its instances.
    s.writes()
        .create_cluster(ClusterRecord::new("z", "ghost", "G"))
        .unwrap();
    assert_eq!(summary(&s, "z").instance_count, 1);
    assert_eq!(summary(&s, "z").cluster_stable_count, 1);
    s.writes().delete_cluster("z", "ghost").unwrap();
    assert_eq!(summary(&s, "z").instance_count, 0);
    assert_eq!(s.services(None, true).len(), 3);
}

#[test]
fn summary_cache_follows_generations() {
    let (_d, s, _live) = open();
    s.writes().create_zone(zone("z")).unwrap();
    let a = Oracle(&s).summary_body(true);
    let b = Oracle(&s).summary_body(true);
    assert_eq!(a.as_ptr(), b.as_ptr(), "served from the cache");
    s.writes()
        .create_cluster(ClusterRecord::new("z", "a", "A"))
        .unwrap();
    let c = Oracle(&s).summary_body(true);
    let v: serde_json::Value = serde_json::from_slice(&c).unwrap();
    assert_eq!(v["metadata"]["clusterCount"], 1);
    assert_eq!(v["zones"]["z"]["clusters"]["a"]["status"], "down");
    assert_eq!(v["meshes"], v["zones"]);
}

#[test]
fn registrations_are_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (s, _live) = Store::open(dir.path(), Rules::defaults()).unwrap();
        s.writes().create_zone(zone("z")).unwrap();
        s.writes()
            .create_cluster(ClusterRecord::new("z", "a", "A"))
            .unwrap();
        s.writes()
            .create_cluster(ClusterRecord::new("z", "b", "B"))
            .unwrap();
        s.writes().delete_cluster("z", "b").unwrap();
    }
    let (s, _live) = Store::open(dir.path(), Rules::defaults()).unwrap();
    assert_eq!(s.zones().len(), 1);
    assert_eq!(Oracle(&s).list_clusters(true, |_, _| true).len(), 1);
    assert_eq!(summary(&s, "z").cluster_down_count, 1);
}

#[test]
fn rendered_bodies_equal_serde_views() {
    let (_d, s, live) = open();
    s.writes().create_zone(zone("z")).unwrap();
    s.writes().create_zone(zone("y")).unwrap();
    let mut r = ClusterRecord::new("z", "a", "Weird \"name\" \u{e9}\n");
    r.owner = "o".into();
    r.protocols = vec!["h2".into()];
    r.external_links = vec![meshcat_common::model::ExternalLink {
        name: "n".into(),
        link: "l".into(),
    }];
    s.writes().create_cluster(r).unwrap();
    s.writes()
        .create_cluster(ClusterRecord::new("y", "a", "A"))
        .unwrap();
    s.writes()
        .create_cluster(ClusterRecord::new("z", "b", "B"))
        .unwrap();
    let now = Instant::now();
    live.apply_report("x", report("z", "a", "i2", 0, 0), now);
    live.apply_report("x", report("z", "a", "i1", 0, 0), now);
    // Identities of each shape: SPIFFE IDs to list (one that needs escaping), a
    // soonest expiry, and a state other than `none`. Each certificate is hours from
    // a change of its state, so the rendering and the oracle read the same states.
    const HOUR: i64 = 3_600_000;
    let now_ms = super::identity::now_ms();
    for (instance, zone, sans, age, life) in [
        (
            "i3",
            "z",
            vec!["spiffe://z/a", "spiffe://z/\"q\"\u{e9}"],
            1,
            720,
        ),
        // Expiring: an hour left of four.
        ("i4", "z", vec!["spiffe://z/a"], 3, 4),
        ("j1", "y", vec![], 1, 720),
    ] {
        use meshcat_common::identity::{
            CertRole, IdentityReport, ReportedCertificate, San, SanKind,
        };
        let mut r = report(zone, "a", instance, 0, 0);
        let sans = sans
            .into_iter()
            .map(|v| San::new(SanKind::Uri, v.to_owned()));
        let cert = ReportedCertificate {
            serial: format!("{instance}-1"),
            role: CertRole::Chain,
            sans: sans
                .chain([San::new(SanKind::Dns, "a.z".to_owned())])
                .collect(),
            valid_from_ms: now_ms - age * HOUR,
            expires_at_ms: now_ms + (life - age) * HOUR,
            secret: None,
        };
        r.identity = Some(IdentityReport::new(vec![cert], vec![], None));
        live.apply_report("x", r, now);
    }
    let identity = Oracle(&s).get_cluster("a", Some("z"), true)[0]
        .identity
        .clone()
        .unwrap();
    assert_eq!(identity.spiffe_ids.len(), 2);
    assert_eq!(
        identity.state,
        meshcat_common::identity::CertState::Expiring
    );
    for authorized in [false, true] {
        let rendered: serde_json::Value =
            serde_json::from_slice(&s.render_clusters(authorized, |_, _| true)).unwrap();
        let views =
            serde_json::to_value(Oracle(&s).list_clusters(authorized, |_, _| true)).unwrap();
        assert_eq!(rendered, views);
        assert_eq!(
            serde_json::to_vec(&Oracle(&s).list_clusters(authorized, |_, _| true)).unwrap(),
            s.render_clusters(authorized, |_, _| true),
            "byte for byte"
        );
        assert_eq!(
            s.render_cluster("a", None, authorized).unwrap(),
            serde_json::to_vec(&Oracle(&s).get_cluster("a", None, authorized)).unwrap(),
            "byte for byte"
        );
        let summary: serde_json::Value =
            serde_json::from_slice(&Oracle(&s).summary_body(authorized)).unwrap();
        assert_eq!(
            summary,
            serde_json::to_value(Oracle(&s).summary(authorized)).unwrap()
        );
    }
    assert!(s.render_cluster("a", Some("nope"), true).is_none());
    assert!(s.render_cluster("ghost", None, true).is_none());
}

#[test]
fn the_reporter_of_an_instance_has_one_owner() {
    let (_d, s, live) = open();
    let now = Instant::now();
    live.apply_report("agent-1", report("z", "a", "i1", 0, 0), now);
    assert_eq!(live.reporter("z", "a", "i1").as_deref(), Some("agent-1"));
    // The instance moved to another agent: the first one's departure leaves it.
    live.apply_report("agent-2", report("z", "a", "i1", 0, 0), now);
    live.agent_gone("agent-1");
    assert_eq!(live.reporter("z", "a", "i1").as_deref(), Some("agent-2"));
    live.agent_gone("agent-2");
    assert_eq!(live.reporter("z", "a", "i1"), None);
    assert_eq!(s.totals().live_instances, 0);
}

/// An agent and a replica may carry the same name: the departure of agent "peer"
/// leaves the instances replica "peer" owns, commands are never routed to a replica
/// as if it were an agent, and an agent's report takes a replica's instance over.
#[test]
fn agents_and_replicas_are_separate_reporters() {
    let (_d, _s, live) = open();
    let now = Instant::now();
    live.put_remote(remote("r1", true, 0));
    live.apply_report("peer", report("z", "a", "local", 0, 0), now);
    assert_eq!(
        live.reporter("z", "a", "r1"),
        None,
        "owned by a replica, no agent"
    );
    assert_eq!(live.live_owner("z", "a", "r1"), Some(Some("peer".into())));
    assert_eq!(live.live_owner("z", "a", "local"), Some(None));
    live.agent_gone("peer");
    assert_eq!(
        live.live_owners("z", "a"),
        vec![LiveOwner {
            instance: "r1".into(),
            owner: Some("peer".into())
        }]
    );
    // Its agent moved here: this replica's agent reports it now.
    live.apply_report("agent-2", report("z", "a", "r1", 0, 0), now);
    assert_eq!(live.reporter("z", "a", "r1").as_deref(), Some("agent-2"));
    assert_eq!(live.live_owner("z", "a", "r1"), Some(None));
    assert!(live.remote_instances().is_empty());
}

/// A steady report adds nothing to its agent's set of instances; moves, expiry and
/// reports after expiry must still leave every instance in the set of the agent
/// that reports it, or it would never expire and outlive its agent.
#[test]
fn each_instance_stays_in_its_reporters_set_through_moves_and_expiry() {
    let (_d, s, live) = open();
    let t0 = Instant::now();
    let at = |secs: u64| t0 + Duration::from_secs(secs);
    live.apply_reports("a", vec![report("z", "c", "i", 0, 0)], at(0));
    live.apply_reports("b", vec![report("z", "c", "i", 0, 0)], at(1));
    // Back to the first agent, which reports it steadily for a while.
    live.apply_reports("a", vec![report("z", "c", "i", 0, 0)], at(2));
    live.apply_reports("a", vec![report("z", "c", "i", 0, 0)], at(3));
    live.agent_gone("b");
    assert_eq!(live.reporter("z", "c", "i").as_deref(), Some("a"));
    // "a" goes on with "j" only: "i" expires from the agent's set.
    for n in 1..=4 {
        live.apply_reports("a", vec![report("z", "c", "j", 0, 0)], at(5 * n));
        live.expire(at(5 * n));
    }
    assert_eq!(live.reporter("z", "c", "i"), None);
    assert_eq!(s.totals().live_instances, 1);
    // Reported again after it expired: the agent's departure takes it again.
    live.apply_reports("a", vec![report("z", "c", "i", 0, 0)], at(21));
    live.apply_reports("a", vec![report("z", "c", "i", 0, 0)], at(22));
    assert_eq!(s.totals().live_instances, 2);
    live.agent_gone("a");
    assert_eq!(s.totals().live_instances, 0);
    // And expiry takes it again when it is reported after expiring.
    live.apply_reports("a", vec![report("z", "c", "k", 0, 0)], at(30));
    live.expire(at(46));
    assert_eq!(s.totals().live_instances, 0);
    live.apply_reports("a", vec![report("z", "c", "k", 0, 0)], at(47));
    live.apply_reports("a", vec![report("z", "c", "k", 0, 0)], at(48));
    live.expire(at(62));
    assert_eq!(s.totals().live_instances, 1, "reported within the TTL");
    live.expire(at(64));
    assert_eq!(s.totals().live_instances, 0);
    // Moved for good: the new agent's departure takes it, the old one's does not.
    live.apply_reports("a", vec![report("z", "c", "m", 0, 0)], at(70));
    live.apply_reports("b", vec![report("z", "c", "m", 0, 0)], at(71));
    live.apply_reports("b", vec![report("z", "c", "m", 0, 0)], at(72));
    live.agent_gone("a");
    assert_eq!(live.reporter("z", "c", "m").as_deref(), Some("b"));
    live.agent_gone("b");
    assert_eq!(s.totals().live_instances, 0);
}

#[test]
fn remote_changes_show_like_local_ones() {
    let (_d, s, _live) = open();
    s.apply_changes(&[
        Committed::PutZone(zone("z")),
        Committed::PutCluster(ClusterRecord::new("z", "a", "A")),
        Committed::PutCluster(ClusterRecord::new("nowhere", "b", "B")),
    ]);
    assert!(s.is_registered("z", "a"));
    assert!(!s.is_registered("nowhere", "b"), "a cluster needs its zone");
    assert_eq!(summary(&s, "z").cluster_count, 1);
    s.apply_changes(&[Committed::DeleteZone(zone("z"))]);
    assert!(!s.is_registered("z", "a"));
    assert!(s.zone_summary("z").is_none());
}

#[test]
fn bulk_creation_is_all_or_nothing() {
    let (_d, s, _live) = open();
    s.writes().create_zone(zone("z")).unwrap();
    let err = s
        .writes()
        .create_clusters(vec![
            ClusterRecord::new("z", "a", "A"),
            ClusterRecord::new("y", "b", "B"),
        ])
        .unwrap_err();
    assert_eq!(err.0, 1);
    assert!(matches!(err.1, StoreError::Invalid(_)));
    assert!(!s.is_registered("z", "a"));
    let made = s
        .writes()
        .create_clusters(vec![
            ClusterRecord::new("z", "a", "A"),
            ClusterRecord::new("z", "b", "B"),
        ])
        .unwrap();
    assert_eq!(made.len(), 2);
    assert_eq!(summary(&s, "z").cluster_count, 2);
}

#[test]
fn an_instance_left_out_of_later_reports_expires_on_time() {
    let (_d, s, live) = open();
    let t0 = Instant::now();
    live.apply_reports(
        "agent",
        vec![report("z", "a", "i1", 0, 0), report("z", "a", "i2", 0, 0)],
        t0,
    );
    // The agent goes on reporting i2 only.
    for n in 1..=4 {
        live.apply_reports(
            "agent",
            vec![report("z", "a", "i2", 0, 0)],
            t0 + Duration::from_secs(5 * n),
        );
        live.expire(t0 + Duration::from_secs(5 * n));
    }
    // 20 s after its last report i1 is gone; i2 stays.
    assert_eq!(live.reporter("z", "a", "i1"), None);
    assert_eq!(live.reporter("z", "a", "i2").as_deref(), Some("agent"));
    assert_eq!(s.totals().live_instances, 1);
    // Not yet past the TTL at 14 s, past it at 16 s.
    let (_d, s, live) = open();
    live.apply_reports("agent", vec![report("z", "b", "j", 0, 0)], t0);
    live.expire(t0 + Duration::from_secs(14));
    assert_eq!(s.totals().live_instances, 1);
    live.expire(t0 + Duration::from_secs(16));
    assert_eq!(s.totals().live_instances, 0);
}

/// The kinds and (zone, cluster) of the events of the changes after `since`, with
/// the number of changes.
fn events_after(s: &Store, since: u64) -> (usize, Vec<(String, String)>) {
    let changes: Vec<_> = s
        .changes()
        .subscribe(Some(since))
        .replay
        .expect("retained")
        .into_iter()
        .filter(|c| !c.events.is_empty())
        .collect();
    let events = changes
        .iter()
        .flat_map(|c| c.events.iter())
        .map(|e| (e.kind.to_owned(), e.cluster.clone().unwrap_or_default()))
        .collect();
    (changes.len(), events)
}

fn remote(instance: &str, reachable: bool, requests: u64) -> RemoteInstance {
    RemoteInstance {
        owner: "peer".into(),
        zone: "z".into(),
        cluster: "a".into(),
        instance: instance.into(),
        start_time_ms: 1_700_000_000_000,
        reachable,
        window_requests: requests,
        window_errors: 0,
        config_hash: None,
        config_hashes: Default::default(),
        identity: None,
    }
}

#[test]
fn a_replay_starts_only_from_an_index_this_store_issued() {
    let (_d, s, live) = open();
    let loaded = s.index();
    s.writes().create_zone(zone("z")).unwrap();
    let first = s.index();
    // Indexes follow the clock: wait for it to pass first + 1, so the next change
    // leaves a gap.
    while crate::changes::start_index() <= first + 1 {
        std::hint::spin_loop();
    }
    s.writes()
        .create_cluster(ClusterRecord::new("z", "a", "A"))
        .unwrap();
    let second = s.index();
    assert!(second > first + 1, "{first} {second}");
    // A change only `GET /services` shows has an index, and a reader may resume
    // from it.
    live.set_edge_clusters("z", vec!["a".into()]);
    let services = s.index();
    assert!(services > second);
    s.writes().delete_cluster("z", "a").unwrap();

    let replay = |since: u64| {
        s.changes()
            .subscribe(Some(since))
            .replay
            .map(|r| r.iter().filter(|c| !c.events.is_empty()).count())
    };
    assert_eq!(replay(loaded), Some(3));
    assert_eq!(replay(first), Some(2));
    assert_eq!(replay(second), Some(1));
    assert_eq!(replay(services), Some(1));
    // Inside the range of this store's indexes, but not one it issued (another
    // replica's, say): no replay, the reader must read everything again.
    assert_eq!(replay(first + 1), None);
    assert_eq!(replay(loaded - 1), None);
    assert_eq!(replay(s.index() + 1), None);
}

#[test]
fn a_cluster_touched_by_many_instances_at_once_gets_one_event() {
    let (_d, s, live) = open();
    s.writes().create_zone(zone("z")).unwrap();
    s.writes()
        .create_cluster(ClusterRecord::new("z", "a", "A"))
        .unwrap();
    let now = Instant::now();
    let batch = |agent: &str, names: &[&str]| {
        let reports = names.iter().map(|i| report("z", "a", i, 0, 0)).collect();
        live.apply_reports(agent, reports, now);
    };
    batch("agent", &["i1", "i2", "i3"]);
    batch("other", &["j1", "j2"]);

    // The agent goes with three instances of one cluster: one cluster event.
    let i = s.index();
    live.agent_gone("agent");
    let (n, events) = events_after(&s, i);
    assert_eq!(n, 1);
    let clusters = events.iter().filter(|(k, _)| k == "cluster").count();
    assert_eq!(clusters, 1, "{events:?}");

    // Both of the other agent's instances expire in one pass: one cluster event.
    let i = s.index();
    live.expire(now + Duration::from_secs(60));
    let (_, events) = events_after(&s, i);
    let clusters = events.iter().filter(|(k, _)| k == "cluster").count();
    assert_eq!(clusters, 1, "{events:?}");
    assert_eq!(s.totals().live_instances, 0);
}

#[test]
fn every_visible_change_moves_the_index_and_metrics_alone_do_not() {
    let (_d, s, live) = open();
    s.writes().create_zone(zone("z")).unwrap();
    s.writes()
        .create_cluster(ClusterRecord::new("z", "a", "A"))
        .unwrap();
    let now = Instant::now();
    let ev = |kind: &str| (kind.to_owned(), "a".to_owned());

    // A new instance: its cluster turns stable, the summary moves.
    let i = s.index();
    live.apply_report("agent", report("z", "a", "i1", 0, 0), now);
    let (n, events) = events_after(&s, i);
    assert_eq!(n, 1);
    assert_eq!(events, [ev("cluster"), ("summary".into(), String::new())]);

    // New counters, same status: nothing a reader sees, no index.
    let i = s.index();
    live.apply_report("agent", report("z", "a", "i1", 50, 0), now);
    assert_eq!(s.index(), i);
    // A new start time (the sidecar restarted) is a change.
    let mut restarted = report("z", "a", "i1", 60, 0);
    restarted.start_time_ms += 1;
    live.apply_report("agent", restarted, now);
    assert_eq!(events_after(&s, i), (1, vec![ev("cluster")]));

    // Another replica's instance: shown, then its metrics alone move nothing, then
    // its departure is a change.
    let i = s.index();
    live.put_remote(remote("r1", true, 0));
    assert_eq!(events_after(&s, i).1[0], ev("cluster"));
    let i = s.index();
    live.put_remote(remote("r1", true, 30));
    assert_eq!(s.index(), i);
    live.drop_remote("z", "a", "r1", crate::history::LeftReason::Expired);
    assert_eq!(events_after(&s, i).1[0], ev("cluster"));

    // The same record again (a listing after a lost watch) is no change.
    let i = s.index();
    s.apply_changes(&[Committed::PutCluster(ClusterRecord::new("z", "a", "A"))]);
    assert_eq!(s.index(), i);

    // The agent goes: its cluster turns down.
    let i = s.index();
    live.agent_gone("agent");
    let (n, events) = events_after(&s, i);
    assert_eq!(n, 1);
    assert_eq!(events[0], ev("cluster"));

    // Expiry, then deletion of the zone with its cluster.
    live.apply_report("agent", report("z", "a", "i2", 0, 0), now);
    let i = s.index();
    live.expire(now + Duration::from_secs(60));
    assert_eq!(events_after(&s, i).1[0], ev("cluster"));
    let i = s.index();
    s.writes().delete_zone("z").unwrap();
    let (n, events) = events_after(&s, i);
    assert_eq!(n, 1, "one change, one index");
    assert_eq!(
        &events[..2],
        [
            ev("cluster-deleted"),
            ("zone-deleted".into(), String::new())
        ]
    );

    // An id this process never issued answers reset (no replay).
    assert!(s.changes().subscribe(Some(s.index() + 1)).replay.is_none());
}

#[test]
fn a_replaced_zone_keeps_its_clusters_and_is_one_zone_event() {
    let (_d, s, _live) = open();
    s.writes().create_zone(zone("z")).unwrap();
    s.writes()
        .create_cluster(ClusterRecord::new("z", "a", "A"))
        .unwrap();
    let moved = ZoneRecord {
        server_address: "cp:60000".into(),
        ..zone("z")
    };
    let i = s.index();
    assert_eq!(s.writes().replace_zone(moved.clone()).unwrap(), moved);
    assert_eq!(s.zone("z"), Some(moved.clone()));
    assert!(s.is_registered("z", "a"), "its clusters stay");
    let (n, events) = events_after(&s, i);
    assert_eq!(n, 1);
    assert_eq!(events, [("zone".to_owned(), String::new())]);
    // The same record again is no change.
    let i = s.index();
    s.writes().replace_zone(moved).unwrap();
    assert_eq!(s.index(), i);
    assert!(matches!(
        s.writes().replace_zone(zone("nope")),
        Err(StoreError::NotFound(_))
    ));
}

#[test]
fn a_stored_report_reads_back_whole_with_its_clusters_kept_apart() {
    let (_d, s, live) = open();
    let mut r = report("z", "a", "i1", 1200, 7);
    r.error = Some("admin slow".into());
    r.log_level = Some("debug".into());
    r.metrics = InstanceMetrics {
        mesh_metrics_version: "1".into(),
        total_requests: 1200,
        latency_avg: 4.25,
        latency_p99: 40,
        os: "linux".into(),
        memory_used_percent: 50.5,
        ..InstanceMetrics::default()
    };
    let auth = meshcat_common::wire::ReportedCluster::healthy("auth", vec!["10.0.0.1:8080".into()]);
    r.clusters = vec![auth.clone()];
    live.apply_report("agent", r.clone(), Instant::now());
    // The upstream clusters are kept apart, as digests and counts.
    let held = {
        let by_zone = s.memory.clusters.get("a").unwrap();
        by_zone.get("z").unwrap().instances["i1"].clusters().clone()
    };
    let c = held.get("auth").expect("the cluster is held");
    assert_eq!(
        (c.hosts_digest, c.host_count, c.healthy_count),
        (auth.hosts_digest, 1, 1)
    );
    r.clusters = Vec::new();
    assert_eq!(live.live_instance("z", "a", "i1").as_deref(), Some(&r));
    assert_eq!(
        live.live_instances("z", "a")
            .iter()
            .map(|i| (**i).clone())
            .collect::<Vec<_>>(),
        vec![r.clone()]
    );
    match live.instance_metrics("a", Some("z"), "i1") {
        MetricsLookup::Found(m) => assert_eq!(*m, r.metrics),
        _ => panic!("the instance's metrics are not found"),
    }
    // The window comes from the counters kept beside the packed report.
    live.apply_report("agent", report("z", "a", "i1", 1500, 10), Instant::now());
    let window = {
        let by_zone = s.memory.clusters.get("a").unwrap();
        let i = &by_zone.get("z").unwrap().instances["i1"];
        (i.window_requests, i.window_errors)
    };
    assert_eq!(window, (300, 3));
    let i = live.live_instance("z", "a", "i1").unwrap();
    assert_eq!((i.requests_total, i.errors_5xx_total), (1500, 10));
    assert_eq!(i.clusters, Vec::new());
}

#[tokio::test]
async fn a_write_whose_caller_goes_away_is_shown_and_later_writes_go_on() {
    let (_d, s, _live) = open();
    let s = Arc::new(s);
    s.writes().create_zone(zone("z")).unwrap();
    // The caller is dropped after the first poll, which hands the batch to the
    // committer: a request whose client hung up mid-write.
    let mut first = Box::pin(s.commit_async(vec![Write::CreateCluster(ClusterRecord::new(
        "z", "a", "A",
    ))]));
    let polled = std::future::poll_fn(|cx| std::task::Poll::Ready(first.as_mut().poll(cx))).await;
    assert!(
        polled.is_pending(),
        "a durable commit is not over at its first poll"
    );
    drop(first);
    // The next write is shown after the abandoned one, so it can only finish once
    // the abandoned one was shown.
    let second = s.commit_async(vec![Write::CreateCluster(ClusterRecord::new(
        "z", "b", "B",
    ))]);
    let changes = tokio::time::timeout(Duration::from_secs(30), second)
        .await
        .expect("a write after an abandoned one finishes")
        .unwrap();
    assert_eq!(changes.len(), 1);
    assert!(s.record("z", "a").is_some(), "the abandoned write is shown");
    assert!(s.record("z", "b").is_some());
}

#[tokio::test]
async fn writes_from_tasks_and_threads_are_shown_in_commit_order() {
    let (_d, s, _live) = open();
    let s = Arc::new(s);
    s.writes().create_zone(zone("z")).unwrap();
    let mut tasks = Vec::new();
    for i in 0..64 {
        let s = s.clone();
        let c = ClusterRecord::new("z", &format!("c{i:02}"), "C");
        if i % 2 == 0 {
            tasks.push(tokio::spawn(async move {
                s.commit_async(vec![Write::CreateCluster(c)]).await.unwrap();
            }));
        } else {
            tasks.push(tokio::task::spawn_blocking(move || {
                s.writes().create_cluster(c).unwrap();
            }));
        }
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .expect("every write finishes")
            .unwrap();
    }
    for i in 0..64 {
        assert!(
            s.record("z", &format!("c{i:02}")).is_some(),
            "c{i:02} shown"
        );
    }
}

/// `GET /status` counts, per zone, this replica's agents and the instances other
/// replicas' agents report, for registered zones and zones reported without one.
#[test]
fn reporters_by_zone_tell_agents_from_peer_replicas() {
    let (_d, s, live) = open();
    let now = Instant::now();
    s.apply_changes(&[
        Committed::PutZone(zone("z")),
        Committed::PutZone(zone("quiet")),
    ]);
    live.apply_reports(
        "agent-1",
        vec![report("z", "a", "a-0", 0, 0), report("z", "b", "b-0", 0, 0)],
        now,
    );
    live.apply_report("agent-2", report("z", "a", "a-1", 0, 0), now);
    live.apply_report("agent-2", report("elsewhere", "c", "c-0", 0, 0), now);
    live.put_remote(remote("a-2", true, 0));
    let by_zone = live.reporters_by_zone(true);
    let z = |name: &str| {
        by_zone
            .iter()
            .find(|z| z.zone_name == name)
            .unwrap()
            .clone()
    };
    assert_eq!(
        by_zone
            .iter()
            .map(|z| z.zone_name.as_str())
            .collect::<Vec<_>>(),
        ["elsewhere", "quiet", "z"]
    );
    assert_eq!(
        (
            z("z").registered,
            z("z").agents,
            z("z").instances,
            z("z").peer_instances
        ),
        (true, 2, 3, 1)
    );
    assert_eq!((z("quiet").agents, z("quiet").instances), (0, 0));
    assert!(z("quiet").registered);
    assert_eq!(
        (z("elsewhere").registered, z("elsewhere").agents),
        (false, 1)
    );
    // Without the right to read live data, unregistered zones are left out.
    let registered: Vec<String> = live
        .reporters_by_zone(false)
        .into_iter()
        .map(|z| z.zone_name)
        .collect();
    assert_eq!(registered, ["quiet", "z"]);
    live.agent_gone("agent-2");
    assert_eq!(
        live.reporters_by_zone(true)
            .iter()
            .find(|z| z.zone_name == "z")
            .unwrap()
            .agents,
        1
    );
}

mod history;

/// A delta applies on top of the report it names, from the same agent; any other
/// base is refused alone so that the agent sends the whole state.
#[test]
fn a_delta_applies_on_its_base_and_a_stale_one_is_refused() {
    use meshcat_common::wire::{Delta, ReportedCluster, STALE_BASE};
    let (_d, s, live) = open();
    let bounds = crate::ingest::InstanceBounds::default();
    let held = |s: &Store| {
        let by_zone = s.memory.clusters.get("a").unwrap();
        let set = by_zone.get("z").unwrap().instances["i1"].clusters().clone();
        set.iter()
            .map(|c| (c.name.to_string(), c.host_count))
            .collect::<Vec<_>>()
    };
    let now = Instant::now();
    let mut whole = report("z", "a", "i1", 10, 0);
    whole.seq = 1;
    whole.clusters = (0..3)
        .map(|i| ReportedCluster::healthy(format!("up-{i}"), vec![format!("10.0.0.{i}:80")]))
        .collect();
    assert!(
        live.apply_reports_guarded("agent", vec![whole], now, &|_| true, &bounds)
            .is_empty()
    );
    let delta = |seq, base, clusters: Vec<ReportedCluster>, removed: &[&str]| InstanceReport {
        seq,
        clusters,
        delta: Some(Delta {
            base,
            removed_clusters: removed.iter().map(|r| (*r).to_owned()).collect(),
            ..Delta::default()
        }),
        ..report("z", "a", "i1", 20, 0)
    };
    let grown = ReportedCluster::healthy("up-1", vec!["10.0.0.1:80".into(), "10.0.0.9:80".into()]);
    let refused = live.apply_reports_guarded(
        "agent",
        vec![delta(2, 1, vec![grown], &["up-2"])],
        now,
        &|_| true,
        &bounds,
    );
    assert!(refused.is_empty(), "{refused:?}");
    assert_eq!(held(&s), [("up-0".to_owned(), 1), ("up-1".to_owned(), 2)]);
    // A base the store does not hold, or another agent's delta: refused, nothing
    // changes.
    for (agent, base) in [("agent", 1), ("other", 2)] {
        let refused = live.apply_reports_guarded(
            agent,
            vec![delta(3, base, vec![], &["up-0"])],
            now,
            &|_| true,
            &bounds,
        );
        assert_eq!(refused.len(), 1);
        assert_eq!(refused[0].reason, STALE_BASE);
        assert_eq!(held(&s), [("up-0".to_owned(), 1), ("up-1".to_owned(), 2)]);
    }
    // A steady delta keeps the set as it is, shared.
    let before = {
        let by_zone = s.memory.clusters.get("a").unwrap();
        by_zone.get("z").unwrap().instances["i1"].clusters().clone()
    };
    assert!(
        live.apply_reports_guarded(
            "agent",
            vec![delta(3, 2, vec![], &[])],
            now,
            &|_| true,
            &bounds
        )
        .is_empty()
    );
    let after = {
        let by_zone = s.memory.clusters.get("a").unwrap();
        by_zone.get("z").unwrap().instances["i1"].clusters().clone()
    };
    assert!(std::sync::Arc::ptr_eq(&before, &after));
}

/// The upstreams with traffic a delta leaves are counted from the held ones and the
/// delta's; near the bound, exactly: a delta that sends two new upstreams and removes
/// two held ones keeps the count, and one that only adds passes the bound and is
/// refused, keeping what was held.
#[test]
fn upstreams_a_delta_leaves_are_counted_exactly_near_the_bound() {
    use meshcat_common::wire::{Delta, UpstreamTraffic};
    let (_d, _s, live) = open();
    let bounds = crate::ingest::InstanceBounds {
        max_upstream_clusters: 4,
        max_upstream_hosts: 100,
    };
    let upstream = |name: &str| UpstreamTraffic {
        name: name.into(),
        requests_total: 1,
        errors_total: 0,
        connect_fail_total: 0,
        p50_ms: None,
        p99_ms: None,
        tls: false,
    };
    let now = Instant::now();
    let mut whole = report("z", "a", "i1", 10, 0);
    whole.seq = 1;
    whole.upstreams = ["u0", "u1", "u2", "u3"].map(upstream).to_vec();
    let apply =
        |r: InstanceReport| live.apply_reports_guarded("agent", vec![r], now, &|_| true, &bounds);
    assert!(apply(whole).is_empty());
    let delta = |seq, base, sent: &[&str], removed: &[&str]| InstanceReport {
        seq,
        upstreams: sent.iter().map(|n| upstream(n)).collect(),
        delta: Some(Delta {
            base,
            removed_upstreams: removed.iter().map(|r| (*r).to_owned()).collect(),
            listeners_unchanged: true,
            ..Delta::default()
        }),
        ..report("z", "a", "i1", 20, 0)
    };
    let held = || {
        live.memory
            .clusters
            .get("a")
            .unwrap()
            .get("z")
            .unwrap()
            .instances["i1"]
            .held()
            .upstreams
    };
    assert!(apply(delta(2, 1, &["u4", "u5", "u0"], &["u1", "u2"])).is_empty());
    assert_eq!(held(), 4);
    let refused = apply(delta(3, 2, &["u6"], &[]));
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].reason, "too_many_upstream_clusters");
    assert!(refused[0].kept, "the instance keeps what it held");
    let over = refused[0].over.unwrap();
    assert_eq!(
        (over.set, over.count, over.limit),
        (crate::ingest::Bounded::Upstreams, 5, 4)
    );
    assert_eq!(held(), 4);
    // Another delta on the same held base is checked the same way.
    assert_eq!(apply(delta(4, 2, &["u7"], &[])).len(), 1);
    assert!(apply(delta(5, 2, &["u7"], &["u3"])).is_empty());
    assert_eq!(held(), 4);
}

/// A zone's view with `clusters`, each a list of (address, healthy).
fn declared_view(clusters: &[(&str, &[(&str, bool)])]) -> Arc<crate::control::ZoneView> {
    use crate::control::{ViewCluster, ZoneView};
    let mut v = ZoneView::default();
    for (name, endpoints) in clusters {
        v.clusters
            .insert(Arc::from(*name), Arc::new(ViewCluster::of(endpoints, 42)));
    }
    Arc::new(v)
}

#[test]
fn declared_clusters_show_their_endpoints_until_an_agent_reports() {
    let (_d, s, live) = open();
    s.writes().create_zone(zone("z")).unwrap();
    s.writes()
        .create_cluster(ClusterRecord::new("z", "payments", "Payments"))
        .unwrap();
    let index = s.index();
    live.apply_declared(
        "z",
        Some(declared_view(&[
            ("payments", &[("10.0.0.1:80", true), ("10.0.0.2:80", false)]),
            (
                "outbound|9080||orders.default.svc.cluster.local",
                &[("10.0.1.1:9080", true)],
            ),
            (
                "outbound|9080|v2|orders.default.svc.cluster.local",
                &[("10.0.1.2:9080", true)],
            ),
        ])),
    );
    assert!(s.index() > index, "a registered cluster's figures moved");
    let v = &Oracle(&s).get_cluster("payments", Some("z"), true)[0];
    assert_eq!(
        v.control_plane,
        meshcat_common::model::ControlPlane {
            declared: true,
            endpoints: 2,
            healthy_endpoints: 1
        }
    );
    assert_eq!(v.instances.len(), 1);
    assert_eq!(v.instances[0].name, "10.0.0.1:80");
    assert_eq!(
        v.instances[0].source,
        meshcat_common::model::InstanceSource::ControlServer
    );
    assert_eq!(v.instances[0].start_time, 42);
    assert_eq!(v.status, Status::Stable);
    // The rendered answer is the typed one.
    let rendered: serde_json::Value =
        serde_json::from_slice(&s.render_cluster("payments", Some("z"), true).unwrap()).unwrap();
    assert_eq!(
        rendered,
        serde_json::json!([serde_json::to_value(v).unwrap()])
    );

    // Istio's subsets of one host are one unregistered service.
    let services = s.services(Some("z"), true);
    let orders = services
        .iter()
        .find(|c| c.record.cluster_name == "orders")
        .expect("declared, unregistered");
    assert_eq!(orders.control_plane.endpoints, 2);
    assert_eq!(orders.instances.len(), 2);

    // Once an agent reports, only reported instances count.
    live.apply_report(
        "agent-1",
        report("z", "payments", "pod-1", 0, 0),
        Instant::now(),
    );
    let v = &Oracle(&s).get_cluster("payments", Some("z"), true)[0];
    assert_eq!(v.instances.len(), 1);
    assert_eq!(v.instances[0].name, "pod-1");
    assert_eq!(
        v.instances[0].source,
        meshcat_common::model::InstanceSource::Agent
    );
    assert!(v.control_plane.declared);

    // No view: nothing declared, the unregistered service gone.
    live.apply_declared("z", None);
    let v = &Oracle(&s).get_cluster("payments", Some("z"), true)[0];
    assert!(!v.control_plane.declared);
    assert!(
        !s.services(Some("z"), true)
            .iter()
            .any(|c| c.record.cluster_name == "orders")
    );
}

/// Once a zone's view is shown, what maps it marks the zone due to be mapped
/// again: a cluster registered in it or deleted, a listener address of its
/// sidecars come or gone. Mapped again, the view follows; a zone without a view,
/// and a report that moves no address, mark nothing.
#[test]
fn a_zone_is_due_to_be_mapped_again_when_its_clusters_or_listener_addresses_change() {
    use meshcat_common::wire::ListenerRoutes;
    let (_d, s, live) = open();
    s.writes().create_zone(zone("z")).unwrap();
    s.writes().create_zone(zone("w")).unwrap();
    let due = || live.remaps().take().into_iter().collect::<Vec<_>>();
    let listening = |cluster: &str, instance: &str, host: &str| {
        let mut r = report("z", cluster, instance, 0, 0);
        r.admin_address = format!("{host}:15000");
        r.listeners = vec![ListenerRoutes {
            address: format!("{host}:8080"),
            clusters: vec![format!("inbound-{cluster}")],
        }];
        r
    };
    // No view yet: nothing is due.
    s.writes()
        .create_cluster(ClusterRecord::new("z", "payments", "Payments"))
        .unwrap();
    assert!(due().is_empty());
    let view = declared_view(&[("payments-v2", &[("10.0.0.5:8080", true)])]);
    live.apply_declared("z", Some(view.clone()));
    assert!(due().is_empty(), "mapping marks nothing");
    assert_eq!(s.declared_names("z", "payments-v2"), ["payments-v2"]);

    // A payments sidecar listening at the endpoint: due, and mapped again the view's
    // cluster stands for payments.
    let now = Instant::now();
    live.apply_report("agent-1", listening("payments", "pay-1", "10.0.0.5"), now);
    assert_eq!(due(), ["z"]);
    live.apply_declared("z", Some(view.clone()));
    assert_eq!(s.declared_names("z", "payments"), ["payments-v2"]);
    // The same listener again moves nothing.
    live.apply_report("agent-1", listening("payments", "pay-1", "10.0.0.5"), now);
    assert!(due().is_empty());

    // The view's own name registered: due, and it stands for itself.
    s.writes()
        .create_cluster(ClusterRecord::new("z", "payments-v2", "Payments v2"))
        .unwrap();
    assert_eq!(due(), ["z"]);
    live.apply_declared("z", Some(view.clone()));
    assert_eq!(s.declared_names("z", "payments-v2"), ["payments-v2"]);
    assert!(s.declared_names("z", "payments").is_empty());
    // Deleted: due, and the address rule finds payments again.
    s.writes().delete_cluster("z", "payments-v2").unwrap();
    assert_eq!(due(), ["z"]);
    live.apply_declared("z", Some(view.clone()));
    assert_eq!(s.declared_names("z", "payments"), ["payments-v2"]);

    // The sidecar gone: due.
    live.agent_gone("agent-1");
    assert_eq!(due(), ["z"]);
    // Another zone, without a view: never due.
    s.writes()
        .create_cluster(ClusterRecord::new("w", "ledger", "Ledger"))
        .unwrap();
    assert!(due().is_empty());
    // A zone whose view is gone is not watched any more.
    live.apply_declared("z", None);
    s.writes()
        .create_cluster(ClusterRecord::new("z", "orders", "Orders"))
        .unwrap();
    assert!(due().is_empty());
}

#[test]
fn a_declared_cluster_maps_to_the_cluster_whose_sidecars_listen_at_its_endpoints() {
    use meshcat_common::wire::ListenerRoutes;
    let (_d, s, live) = open();
    s.writes().create_zone(zone("z")).unwrap();
    s.writes()
        .create_cluster(ClusterRecord::new("z", "payments", "Payments"))
        .unwrap();
    s.writes()
        .create_cluster(ClusterRecord::new("z", "ledger", "Ledger"))
        .unwrap();
    let listening = |cluster: &str, instance: &str, host: &str, port: u16| {
        let mut r = report("z", cluster, instance, 0, 0);
        r.admin_address = format!("{host}:15000");
        r.listeners = vec![ListenerRoutes {
            address: format!("{host}:{port}"),
            clusters: vec![format!("inbound-{cluster}")],
        }];
        r
    };
    let now = Instant::now();
    live.apply_report(
        "agent-1",
        listening("payments", "pay-1", "10.0.0.5", 8080),
        now,
    );
    // Two clusters' sidecars claim 10.0.0.9:80: it names neither.
    live.apply_report(
        "agent-1",
        listening("payments", "pay-2", "10.0.0.9", 80),
        now,
    );
    live.apply_report("agent-2", listening("ledger", "led-1", "10.0.0.9", 80), now);
    live.apply_declared(
        "z",
        Some(declared_view(&[
            // Under another name, at a payments sidecar's listener.
            ("payments-v2", &[("10.0.0.5:8080", true)]),
            ("shared", &[("10.0.0.9:80", true)]),
        ])),
    );
    let v = &Oracle(&s).get_cluster("payments", Some("z"), true)[0];
    assert!(v.control_plane.declared, "{:?}", v.control_plane);
    assert_eq!(v.control_plane.endpoints, 1);
    assert_eq!(s.declared_names("z", "payments"), ["payments-v2"]);
    assert!(s.declared_names("z", "ledger").is_empty());
    assert!(
        !Oracle(&s).get_cluster("ledger", Some("z"), true)[0]
            .control_plane
            .declared
    );
    let names: Vec<String> = s
        .services(Some("z"), true)
        .into_iter()
        .map(|c| c.record.cluster_name)
        .collect();
    assert!(names.contains(&"shared".to_owned()), "{names:?}");
    assert!(!names.contains(&"payments-v2".to_owned()), "{names:?}");
}

/// The keys handed on are those of the instances stored, each once, in the report's
/// order; an instance refused is not among them, and a held one keeps its name.
#[test]
fn applied_instances_are_handed_on_by_key() {
    let (_d, s, live) = open();
    let now = Instant::now();
    let bounds = crate::ingest::InstanceBounds::default();
    let apply = |agent: &str, reports: Vec<InstanceReport>| {
        let mut keys = Vec::new();
        let refused =
            live.apply_reports_noting(agent, reports, now, &|_| false, &bounds, &mut |k| {
                keys.push(k)
            });
        (keys, refused)
    };
    let (keys, refused) = apply(
        "one",
        vec![report("z", "a", "i1", 1, 0), report("z", "b", "i2", 1, 0)],
    );
    assert!(refused.is_empty(), "{refused:?}");
    assert_eq!(
        keys,
        [
            InstanceKey::new("z", "a", "i1"),
            InstanceKey::new("z", "b", "i2")
        ]
    );
    // Another agent may not take i1 over: only its own i3 is handed on.
    let (keys, refused) = apply(
        "two",
        vec![report("z", "a", "i1", 2, 0), report("z", "a", "i3", 2, 0)],
    );
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].key, InstanceKey::new("z", "a", "i1"));
    assert_eq!(keys, [InstanceKey::new("z", "a", "i3")]);
    // A steady report again: the same key, and the entry still holds the instance.
    let (keys, _) = apply("one", vec![report("z", "a", "i1", 3, 0)]);
    assert_eq!(keys, [InstanceKey::new("z", "a", "i1")]);
    let by_zone = s.memory.clusters.get("a").unwrap();
    let names: Vec<&String> = by_zone.get("z").unwrap().instances.keys().collect();
    assert_eq!(names, ["i1", "i3"]);
}

#[test]
fn a_certificate_listing_passes_only_clusters_without_a_row_it_asks_for() {
    use super::identity::{CertBounds, CertificateQuery};
    use meshcat_common::identity::{
        CertRole, CertState, IdentityReport, ReportedCertificate, San, SanKind, SdsSecret,
    };
    const DAY: i64 = 86_400_000;
    const BASE: i64 = 1_800_000_000_000;
    let (_d, _s, live) = open();
    let mut draw = crate::TestRng(0x9e37_79b9_7f4a_7c15);
    // Certificates of every kind around BASE: expired, expiring, overdue and fine, of
    // one day to a year; sidecars without any; instances that stop reporting and
    // expire, so a cluster's bounds outlive what they were made of.
    let t0 = Instant::now();
    for round in 0..8u64 {
        let at = t0 + Duration::from_secs(10 * round);
        for c in 0..30u64 {
            for i in 0..1 + draw.below(4) {
                if draw.below(4) == 0 {
                    continue;
                }
                let mut r = report(
                    &format!("z{}", c % 3),
                    &format!("c{c}"),
                    &format!("c{c}-{i}"),
                    0,
                    0,
                );
                if draw.below(6) > 0 {
                    let certs = (0..draw.below(4))
                        .map(|n| {
                            let life = [1, 2, 5, 30, 365][draw.below(5) as usize] * DAY;
                            let valid_from =
                                BASE - life + (draw.below(4 * 80) as i64 - 160) * DAY / 4;
                            ReportedCertificate {
                                serial: format!("{round}-{c}-{i}-{n}"),
                                role: if n == 0 {
                                    CertRole::Chain
                                } else {
                                    CertRole::Ca
                                },
                                sans: vec![San::new(SanKind::Uri, format!("spiffe://z/c{c}"))],
                                valid_from_ms: valid_from,
                                expires_at_ms: valid_from + life,
                                secret: (draw.below(2) == 0).then(|| SdsSecret {
                                    name: "default".into(),
                                    version: round.to_string(),
                                    last_updated_ms: valid_from,
                                }),
                            }
                        })
                        .collect();
                    r.identity = Some(IdentityReport::new(certs, vec![], None));
                }
                live.apply_report("agent", r, at);
            }
        }
        live.expire(at);
    }

    let states = [
        vec![],
        vec![CertState::Ok],
        vec![CertState::Expiring],
        vec![CertState::Expired],
        vec![
            CertState::Expired,
            CertState::RotationOverdue,
            CertState::Expiring,
        ],
        vec![CertState::RotationOverdue, CertState::Ok],
    ];
    let within = [
        None,
        Some(Duration::ZERO),
        Some(Duration::from_secs(7 * 86_400)),
        Some(Duration::from_secs(90 * 86_400)),
    ];
    let identities = live.identities();
    let mut passed = 0;
    for step in -60..=60i64 {
        let now = BASE + step * DAY / 2;
        let all = identities.certificates_at(&CertificateQuery::default(), now);
        for (states, within) in states
            .iter()
            .flat_map(|s| within.iter().map(move |w| (s, w)))
        {
            for (zone, cluster) in [(None, None), (Some("z1"), None), (None, Some("c4"))] {
                let q = CertificateQuery {
                    zone: zone.map(str::to_owned),
                    cluster: cluster.map(str::to_owned),
                    states: states.clone(),
                    expiring_within: *within,
                };
                let want: Vec<_> = all
                    .iter()
                    .filter(|r| zone.is_none_or(|z| r.zone_name == z))
                    .filter(|r| cluster.is_none_or(|c| r.cluster_name == c))
                    .filter(|r| states.is_empty() || states.contains(&r.state))
                    .filter(|r| within.is_none_or(|w| r.expires_at_ms < now + w.as_millis() as i64))
                    .cloned()
                    .collect();
                assert_eq!(identities.certificates_at(&q, now), want, "{q:?} at {now}");
            }
        }
        // The bounds are what makes the listing of certificates that need action
        // cheap: some clusters are passed without reading their instances.
        passed += live
            .memory
            .clusters
            .iter()
            .flat_map(|by_zone| by_zone.iter().map(|(_, e)| e.certs).collect::<Vec<_>>())
            .filter(|b| *b != CertBounds::NONE && now < b.ok_until_ms)
            .count();
    }
    assert!(passed > 0, "no cluster was ever passed");
}
