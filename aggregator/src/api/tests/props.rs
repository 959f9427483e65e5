//! Property tests of the registration routes: any body is stored whole or refused.

use super::*;

/// Any JSON: the known fields with values of any type, and unknown fields.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        (-1i64..70_000).prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        "[a-z0-9._-]{0,12}".prop_map(Value::String),
        ".{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{1,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

const CLUSTER_FIELDS: &[&str] = &[
    "clusterName",
    "zoneName",
    "name",
    "version",
    "owner",
    "minInstances",
    "maxInstances",
    "metricsPort",
    "protocols",
    "externalLinks",
    "enableInstanceMetrics",
    "businessImpact",
];

fn cluster_body() -> impl Strategy<Value = Value> {
    let field = prop_oneof![
        prop::sample::select(CLUSTER_FIELDS).prop_map(str::to_owned),
        "[a-z]{1,5}",
    ];
    let value = prop_oneof![
        3 => "[a-z0-9]{1,6}".prop_map(Value::String),
        1 => Just(json!("z")),
        2 => any_json(),
    ];
    (
        prop::collection::btree_map(field, value, 0..10),
        any::<bool>(),
    )
        .prop_map(|(mut m, in_zone)| {
            if in_zone {
                m.insert("zoneName".into(), json!("z"));
            }
            Value::Object(m.into_iter().collect())
        })
}

const ZONE_FIELDS: &[&str] = &[
    "zoneName",
    "serverAddress",
    "requestCluster",
    "useTls",
    "caPath",
];

/// A zone body of any fields and values; with `named`, zoneName is `z`.
fn zone_body(named: bool) -> impl Strategy<Value = Value> {
    prop::collection::btree_map(
        prop_oneof![
            prop::sample::select(ZONE_FIELDS).prop_map(str::to_owned),
            "[a-z]{1,5}",
        ],
        prop_oneof![
            "[a-z0-9]{1,6}".prop_map(Value::String),
            Just(json!("cp:443")),
            Just(json!("10.0.0.1:0")),
            any_json(),
        ],
        0..6,
    )
    .prop_map(move |mut m| {
        if named {
            m.insert("zoneName".into(), json!("z"));
        }
        Value::Object(m.into_iter().collect())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn any_cluster_body_is_stored_whole_or_refused(body in cluster_body()) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let app = router(dir.path());
        rt.block_on(async {
            let zone = json!({"zoneName": "z", "serverAddress": "cp:50000"}).to_string();
            let (s, _, _) = call(&app, "POST", "/zones", Some(zone.as_bytes())).await;
            prop_assert_eq!(s, StatusCode::CREATED);
            let raw = body.to_string();
            let (status, _, answer) = call(&app, "POST", "/clusters", Some(raw.as_bytes())).await;
            if status == StatusCode::CREATED {
                let sent: ClusterRecord = serde_json::from_value(body.clone()).unwrap();
                let echoed: ClusterRecord = serde_json::from_value(answer).unwrap();
                prop_assert_eq!(&echoed, &sent);
                let uri = format!("/clusters/{}?zoneName=z", sent.cluster_name);
                let (s, _, got) = call(&app, "GET", &uri, None).await;
                prop_assert_eq!(s, StatusCode::OK);
                let views: Vec<ClusterView> = serde_json::from_value(got).unwrap();
                prop_assert_eq!(views.len(), 1);
                prop_assert_eq!(&views[0].record, &sent);
            } else {
                prop_assert!(status.is_client_error(), "{} for {}", status, raw);
                prop_assert!(is_error_body(&answer), "{}", answer);
                let (_, _, all) = call(&app, "GET", "/clusters", None).await;
                prop_assert_eq!(all, json!([]), "a refused write left something behind");
            }
            Ok(())
        })?;
    }

    #[test]
    fn any_zone_body_is_stored_whole_or_refused(body in zone_body(false)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let app = router(dir.path());
        rt.block_on(async {
            let raw = body.to_string();
            let (status, _, answer) = call(&app, "POST", "/zones", Some(raw.as_bytes())).await;
            if status == StatusCode::CREATED {
                let sent: ZoneRecord = serde_json::from_value(body.clone()).unwrap();
                let (s, _, got) = call(&app, "GET", &format!("/zones/{}", sent.zone_name), None).await;
                prop_assert_eq!(s, StatusCode::OK);
                prop_assert_eq!(serde_json::from_value::<ZoneRecord>(got).unwrap(), sent);
            } else {
                prop_assert!(status.is_client_error(), "{} for {}", status, raw);
                prop_assert!(is_error_body(&answer), "{}", answer);
                let (_, _, all) = call(&app, "GET", "/zones", None).await;
                prop_assert_eq!(all, json!([]));
            }
            Ok(())
        })?;
    }

    /// A replacement is stored whole, or refused and the zone and its clusters are
    /// as they were.
    #[test]
    fn any_zone_replacement_is_stored_whole_or_refused(
        body in prop_oneof![zone_body(true), zone_body(false)]
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let app = router(dir.path());
        rt.block_on(async {
            let zone = json!({"zoneName": "z", "serverAddress": "cp:50000", "requestCluster": "edge"});
            let raw = zone.to_string();
            let (s, _, _) = call(&app, "POST", "/zones", Some(raw.as_bytes())).await;
            prop_assert_eq!(s, StatusCode::CREATED);
            let cluster = br#"{"clusterName":"c","zoneName":"z","name":"C"}"#;
            let (s, _, _) = call(&app, "POST", "/clusters", Some(cluster)).await;
            prop_assert_eq!(s, StatusCode::CREATED);
            let raw = body.to_string();
            let (status, _, answer) = call(&app, "PUT", "/zones/z", Some(raw.as_bytes())).await;
            let (_, _, stored) = call(&app, "GET", "/zones/z", None).await;
            if status == StatusCode::OK {
                let sent: ZoneRecord = serde_json::from_value(body.clone()).unwrap();
                prop_assert_eq!(serde_json::from_value::<ZoneRecord>(answer).unwrap(), sent.clone());
                prop_assert_eq!(serde_json::from_value::<ZoneRecord>(stored).unwrap(), sent);
            } else {
                prop_assert!(status.is_client_error(), "{} for {}", status, raw);
                prop_assert!(is_error_body(&answer), "{}", answer);
                let before: ZoneRecord = serde_json::from_value(zone).unwrap();
                prop_assert_eq!(serde_json::from_value::<ZoneRecord>(stored).unwrap(), before);
            }
            let (s, _, _) = call(&app, "GET", "/clusters/c?zoneName=z", None).await;
            prop_assert_eq!(s, StatusCode::OK, "the zone's cluster stays");
            Ok(())
        })?;
    }

    #[test]
    fn any_bytes_as_body_never_fail_the_server(raw in prop::collection::vec(any::<u8>(), 0..64)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let app = router(dir.path());
        rt.block_on(async {
            for (m, uri) in [("POST", "/clusters"), ("PUT", "/clusters/x"), ("POST", "/zones"), ("PUT", "/zones/x")] {
                let (status, _, answer) = call(&app, m, uri, Some(&raw)).await;
                prop_assert!(status.is_client_error(), "{} {}: {}", m, uri, status);
                prop_assert!(is_error_body(&answer), "{}", answer);
            }
            Ok(())
        })?;
    }
}
