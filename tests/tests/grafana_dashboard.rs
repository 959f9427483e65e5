//! The Grafana dashboard of `deploy/kubernetes/monitoring/dashboard.json` against a
//! real Prometheus scraping a real aggregator (with `--cluster-metrics`). Its
//! variables stand in regex matchers as `${var:regex}` inside backticks: Grafana's
//! `regex` format escapes a value's regex metacharacters with single backslashes,
//! which a PromQL raw string keeps (in a double-quoted string they are escapes
//! PromQL refuses). With an owner full of metacharacters, `team.a+(b)`, and a decoy
//! owner that the unescaped value would match as a regex, every query that filters on
//! the owner selects exactly what the same query with `owner="team.a+(b)"` selects.

use std::path::Path;

use meshcat_tests::Catalog;
use meshcat_tests::monitoring::Prometheus;
use serde_json::{Value, json};

const OWNER: &str = "team.a+(b)";
/// Matched by `team.a+(b)` read as a regex, not by the owner itself.
const DECOY: &str = "teamxaab";

fn dashboard() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/kubernetes/monitoring/dashboard.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Every query of the dashboard: the panels' expressions and the variables'.
fn queries(d: &Value) -> Vec<String> {
    fn panels(ps: &Value, out: &mut Vec<String>) {
        for p in ps.as_array().into_iter().flatten() {
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    out.push(e.to_owned());
                }
            }
            panels(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&d["panels"], &mut out);
    for v in d["templating"]["list"].as_array().into_iter().flatten() {
        if let Some(q) = v["query"]["query"].as_str().or(v["query"].as_str()) {
            out.push(q.to_owned());
        }
    }
    out
}

/// What Grafana's `regex` format makes of one value (`escapeRegex` of
/// `@grafana/data`): each of `\ ^ $ * + ? . ( ) | [ ] { } /` after a backslash.
fn grafana_regex(value: &str) -> String {
    let mut out = String::new();
    for c in value.chars() {
        if "\\^$*+?.()|[]{}/".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The query as Grafana sends it: each `${name:regex}` replaced by its value, the
/// rate interval by a minute. Any other way of writing a variable is refused.
fn interpolate(expr: &str, values: &[(&str, String)]) -> String {
    let mut out = expr.replace("$__rate_interval", "1m");
    for (name, value) in values {
        out = out.replace(&format!("${{{name}:regex}}"), value);
    }
    assert!(
        !out.contains('$'),
        "a variable not written ${{var:regex}}: {expr}"
    );
    out
}

#[test]
fn variables_in_regex_matchers_use_the_regex_format_in_backticks() {
    let d = dashboard();
    let names: Vec<&str> = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["type"] == "query")
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"owner") && names.contains(&"zone"),
        "{names:?}"
    );
    let mut uses = 0;
    for q in queries(&d) {
        for name in &names {
            let plain = format!("${name}");
            let braced = format!("${{{name}");
            let formatted = format!("=~`${{{name}:regex}}`");
            let all = q.matches(&plain).count() + q.matches(&braced).count();
            let good = q.matches(&formatted).count();
            assert_eq!(all, good, "${name} not written {formatted} in: {q}");
            uses += good;
        }
    }
    assert!(uses >= 10, "{uses} uses of the variables");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_with_regex_metacharacters_selects_itself_and_nothing_else() {
    let d = dashboard();
    let catalog = Catalog::start(|c| c.ops.cluster_metrics = true)
        .await
        .unwrap();
    catalog.register_zone("shop", "edge").await.unwrap();
    for (cluster, owner) in [("a", OWNER), ("b", OWNER), ("decoy", DECOY)] {
        catalog
            .register_cluster("shop", cluster, json!({"owner": owner}))
            .await
            .unwrap();
    }
    let prometheus = Prometheus::start(&[("meshcat", catalog.config.ops_addr.to_string())]);
    prometheus
        .series(r#"count(meshcat_cluster_status{cluster=~"a|b|decoy"} == 1) == 3"#)
        .await;

    // The data tells the readings apart: the value unescaped, as a regex, selects
    // the decoy and not the owner; Grafana's escapes inside a double-quoted string do
    // not parse.
    let selected = |sel: &str| format!("meshcat_cluster_status{{{sel}}} == 1");
    let unescaped = prometheus
        .query(&selected(&format!("owner=~\"{OWNER}\"")))
        .await
        .unwrap();
    let clusters: Vec<&Value> = unescaped.iter().map(|s| &s["metric"]["cluster"]).collect();
    assert_eq!(clusters, ["decoy"], "{unescaped:?}");
    let quoted = format!("owner=~\"{}\"", grafana_regex(OWNER));
    assert_eq!(prometheus.query(&selected(&quoted)).await, None, "{quoted}");

    let zone_all = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "zone")
        .and_then(|v| v["allValue"].as_str())
        .expect("the zone variable's custom all value")
        .to_owned();
    let values = [("owner", grafana_regex(OWNER)), ("zone", zone_all.clone())];
    let mut checked = 0;
    for q in queries(&d)
        .into_iter()
        .filter(|q| q.contains("owner=~") && !q.starts_with("label_values("))
    {
        let sent = interpolate(&q, &values);
        let truth = interpolate(
            &q.replace("owner=~`${owner:regex}`", &format!("owner=\"{OWNER}\"")),
            &[("zone", zone_all.clone())],
        );
        let got = prometheus.query(&sent).await;
        let want = prometheus.query(&truth).await;
        assert!(got.is_some(), "Prometheus refuses {sent}");
        assert_eq!(samples(got), samples(want), "{sent}\nagainst {truth}");
        checked += 1;
    }
    assert!(checked >= 6, "{checked} queries filter on the owner");
    // One of them, in numbers: two clusters down, not three.
    let down = interpolate(
        r#"count(max by (zone, cluster) (meshcat_cluster_status{zone=~`${zone:regex}`, owner=~`${owner:regex}`, status="down"}) == 1)"#,
        &values,
    );
    let v = prometheus.query(&down).await.unwrap();
    assert_eq!(v[0]["value"][1], "2", "{v:?}");
}

/// The samples of an answer, without their times, in order.
fn samples(answer: Option<Vec<Value>>) -> Vec<(String, Value)> {
    let mut out: Vec<(String, Value)> = answer
        .unwrap_or_default()
        .into_iter()
        .map(|s| (s["metric"].to_string(), s["value"][1].clone()))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}
