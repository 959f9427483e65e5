//! `meshcat graph`: who calls whom (`GET /graph`, contract section 14) as two tables
//! (nodes, then edges), the API's JSON, or Graphviz dot; and the words for one edge
//! that `describe` shares.

use std::fmt::Write as _;
use std::io::Write;

use serde_json::Value;

use super::{Ctx, emit};
use crate::args::{Format, GraphArgs, GraphFormat};
use crate::client::{Call, CliError};
use crate::render::{self, Cell, Table, or_dash, s};

/// Whether an edge of the graph answer `graph` is failing: its error ratio is above
/// the aggregator's `--error-ratio-warning`, which every graph answer carries
/// (`errorRatioWarning`), by the rule a cluster's status follows. An answer without it
/// marks no edge.
pub fn failing(graph: &Value, edge: &Value) -> bool {
    let ratio = edge["errorRatio"].as_f64().unwrap_or(0.0);
    tls_mismatch(edge)
        || graph["errorRatioWarning"]
            .as_f64()
            .is_some_and(|warning| ratio > warning)
}

/// Whether the edge's caller requires SANs its target does not present: a
/// predicted mTLS failure (contract section 19).
pub fn tls_mismatch(edge: &Value) -> bool {
    edge["tlsIdentity"]["match"] == Value::Bool(false)
}

pub async fn run(ctx: &Ctx, args: GraphArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let call = Call::new(&["graph"])
        .q_opt("zoneName", args.zone)
        .q_opt("clusterName", args.cluster)
        .q_opt("depth", args.depth.map(|d| d.to_string()));
    let graph = ctx.api.get(&call).await?;
    let text = match args.output {
        GraphFormat::Json => render::data(&graph, Format::Json)?,
        GraphFormat::Dot => dot(&graph),
        GraphFormat::Table => tables(&graph, ctx.width),
    };
    emit(out, &text)
}

/// The nodes' table, a blank line, and the edges' table.
pub fn tables(graph: &Value, width: Option<usize>) -> String {
    let mut nodes = Table::new(&["NODE", "KIND", "STATUS", "OWNER", "INSTANCES", "DRIFTED"]);
    for n in graph["nodes"].as_array().into_iter().flatten() {
        let status = n["status"].as_str().unwrap_or("-");
        let kind = if n["registered"] == Value::Bool(false) && s(n, "kind") == "cluster" {
            "unregistered"
        } else {
            s(n, "kind")
        };
        nodes.row(vec![
            s(n, "id").into(),
            kind.into(),
            Cell::styled(status, render::status_style(status)),
            or_dash(s(n, "owner")).into(),
            n["instances"].as_u64().unwrap_or(0).to_string().into(),
            yes_no(n["drifted"].as_bool().unwrap_or(false)).into(),
        ]);
    }
    let mut edges = Table::new(&[
        "SOURCE", "TARGET", "REQUESTS", "RPS", "ERRORS", "ERROR%", "P50", "P99", "TLS", "OBSERVED",
        "DECLARED",
    ]);
    for e in graph["edges"].as_array().into_iter().flatten() {
        let ratio = e["errorRatio"].as_f64().unwrap_or(0.0);
        let style = if failing(graph, e) {
            render::RED
        } else {
            render::PLAIN
        };
        edges.row(vec![
            s(e, "source").into(),
            s(e, "target").into(),
            e["requests"].as_u64().unwrap_or(0).to_string().into(),
            format!("{:.1}", e["rps"].as_f64().unwrap_or(0.0)).into(),
            e["errors"].as_u64().unwrap_or(0).to_string().into(),
            Cell::styled(format!("{:.1}", ratio * 100.0), style),
            ms(&e["p50Ms"]).into(),
            ms(&e["p99Ms"]).into(),
            if tls_mismatch(e) {
                // A predicted handshake failure, with or without traffic yet.
                Cell::styled("SAN mismatch", render::RED)
            } else {
                tls_said(e).1.into()
            },
            yes_no(e["observed"].as_bool().unwrap_or(false)).into(),
            yes_no(e["declared"].as_bool().unwrap_or(false)).into(),
        ]);
    }
    let mut out = nodes.render(width);
    out.push('\n');
    if edges.is_empty() {
        out.push_str("No edges: no traffic within the window and no declared dependency.\n");
    } else {
        out.push_str(&edges.render(width));
    }
    out
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// A latency in ms, `-` when unknown.
fn ms(v: &Value) -> String {
    v.as_f64()
        .map_or_else(|| "-".to_owned(), |m| format!("{m:.0}ms"))
}

/// One edge in words, for `describe`: `12 requests (0.2/s), 1 error (8.3%), p50 2ms,
/// p99 9ms, TLS, observed, declared`.
pub fn edge_words(e: &Value, window_seconds: u64) -> String {
    let requests = e["requests"].as_u64().unwrap_or(0);
    let errors = e["errors"].as_u64().unwrap_or(0);
    let mut w = format!(
        "{requests} request{} ({:.1}/s), {errors} error{} ({:.1}%)",
        plural(requests),
        e["rps"].as_f64().unwrap_or(0.0),
        plural(errors),
        e["errorRatio"].as_f64().unwrap_or(0.0) * 100.0
    );
    for (label, key) in [("p50", "p50Ms"), ("p99", "p99Ms")] {
        if e[key].is_number() {
            let _ = write!(w, ", {label} {}", ms(&e[key]));
        }
    }
    w.push_str(tls_said(e).0);
    if tls_mismatch(e) {
        let sans = |key: &str| {
            e["tlsIdentity"][key]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default()
        };
        let _ = write!(
            w,
            ", SAN mismatch (expects {}, presented {})",
            sans("expectedSans"),
            sans("presentedSans")
        );
    }
    if e["observed"] == Value::Bool(true) {
        w.push_str(", observed");
    } else {
        let _ = write!(w, ", no traffic in the last {window_seconds}s");
    }
    w.push_str(if e["declared"] == Value::Bool(true) {
        ", declared"
    } else {
        ", not declared"
    });
    w
}

/// What an edge says of TLS, in `describe`'s words and as the table's cell. Only
/// traffic tells whether connections use it: an edge without traffic in the window
/// (declared only) says nothing, unless the caller's sidecar checks the target's
/// SANs, which it does only over mTLS.
fn tls_said(e: &Value) -> (&'static str, &'static str) {
    if e["observed"] == Value::Bool(true) {
        if e["tls"] == Value::Bool(true) {
            (", TLS", "yes")
        } else {
            (", plaintext", "no")
        }
    } else if e["tlsIdentity"].is_object() {
        (", mTLS configured", "configured")
    } else {
        ("", "-")
    }
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// Graphviz input: nodes coloured by status (externals as boxes), edges labelled
/// with their requests and error ratio, red above 5% errors, dashed when no traffic
/// was seen in the window, dotted when observed but not declared.
pub fn dot(graph: &Value) -> String {
    let mut out = String::from(
        "digraph meshcat {\n  rankdir=LR;\n  node [shape=ellipse, style=filled, fillcolor=white];\n",
    );
    for n in graph["nodes"].as_array().into_iter().flatten() {
        let id = s(n, "id");
        let external = s(n, "kind") == "external";
        let color = match n["status"].as_str() {
            Some("stable") => "palegreen",
            Some("warning") => "gold",
            Some("down") => "salmon",
            _ => "lightgrey",
        };
        let mut label = if external {
            id.split_once('/').map_or(id, |(_, u)| u).to_owned()
        } else {
            format!(
                "{}\\n{}",
                quote(s(n, "clusterName")),
                quote(s(n, "zoneName"))
            )
        };
        if !external {
            let _ = write!(
                label,
                "\\n{} {}",
                n["status"].as_str().unwrap_or("-"),
                n["instances"].as_u64().unwrap_or(0)
            );
        }
        let _ = writeln!(
            out,
            "  \"{}\" [label=\"{}\", fillcolor={color}{}];",
            quote(id),
            if external { quote(&label) } else { label },
            if external { ", shape=box" } else { "" }
        );
    }
    for e in graph["edges"].as_array().into_iter().flatten() {
        let ratio = e["errorRatio"].as_f64().unwrap_or(0.0);
        let mut attrs = format!(
            "label=\"{} req, {:.1}% err\"",
            e["requests"].as_u64().unwrap_or(0),
            ratio * 100.0
        );
        if tls_mismatch(e) {
            attrs.insert_str(attrs.len() - 1, ", SAN mismatch");
        }
        if failing(graph, e) {
            attrs.push_str(", color=red, fontcolor=red");
        }
        if e["observed"] != Value::Bool(true) {
            attrs.push_str(", style=dashed");
        } else if e["declared"] != Value::Bool(true) {
            attrs.push_str(", style=dotted");
        }
        let _ = writeln!(
            out,
            "  \"{}\" -> \"{}\" [{attrs}];",
            quote(s(e, "source")),
            quote(s(e, "target"))
        );
    }
    out.push_str("}\n");
    out
}

/// Text inside a dot double-quoted string, its control characters escaped.
fn quote(s: &str) -> String {
    render::clean(s).replace('\\', "\\\\").replace('"', "\\\"")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A graph as `GET /graph` answers it (contract section 14).
    fn sample() -> Value {
        json!({"index": 5, "windowSeconds": 60, "errorRatioWarning": 0.05,
            "nodes": [
                {"id": "local/catalog", "kind": "cluster", "zoneName": "local", "clusterName": "catalog",
                 "registered": true, "status": "stable", "owner": "team-catalog", "instances": 2, "drifted": false},
                {"id": "local/edge", "kind": "cluster", "zoneName": "local", "clusterName": "edge",
                 "registered": true, "status": "warning", "owner": "", "instances": 1, "drifted": true},
                {"id": "local/external:payments.example", "kind": "external", "zoneName": "local",
                 "clusterName": "payments.example", "registered": false, "status": null, "owner": "",
                 "instances": 0, "drifted": false}],
            "edges": [
                {"source": "local/catalog", "target": "local/external:payments.example", "requests": 0,
                 "rps": 0.0, "errors": 0, "errorRatio": 0.0, "p50Ms": null, "p99Ms": null, "tls": false,
                 "observed": false, "declared": true, "lastSeenMs": null},
                {"source": "local/edge", "target": "local/catalog", "requests": 120, "rps": 2.0,
                 "errors": 12, "errorRatio": 0.1, "p50Ms": 2.0, "p99Ms": 9.5, "tls": true,
                 "observed": true, "declared": false, "lastSeenMs": 1_700_000_000_000i64}]})
    }

    #[test]
    fn tables_of_nodes_and_edges() {
        let text = anstream::adapter::strip_str(&tables(&sample(), None)).to_string();
        assert!(text.starts_with("NODE "), "{text}");
        assert!(
            text.contains("local/edge                        cluster    warning"),
            "{text}"
        );
        assert!(text.contains("external"), "{text}");
        assert!(text.contains("\n\nSOURCE "), "{text}");
        assert!(
            text.contains("local/edge      local/catalog                     120        2.0   12       10.0     2ms   10ms   yes   yes        no"),
            "{text}"
        );
    }

    #[test]
    fn a_san_mismatch_is_named_in_the_table_and_the_dot() {
        let mut g = sample();
        g["edges"][0]["tlsIdentity"] = json!({"expectedSans": ["spiffe://x/ns/shop/sa/p"],
            "presentedSans": ["payments.example"], "match": false});
        g["edges"][1]["tlsIdentity"] = json!({"expectedSans": ["catalog"],
            "presentedSans": ["catalog"], "match": true});
        let text = anstream::adapter::strip_str(&tables(&g, None)).to_string();
        let row = |target: &str| {
            text.lines()
                .find(|l| l.contains(&format!(" {target} ")))
                .unwrap_or_default()
                .to_owned()
        };
        assert!(
            row("local/external:payments.example").contains("SAN mismatch"),
            "{text}"
        );
        assert!(!row("local/catalog").contains("SAN mismatch"), "{text}");
        let d = dot(&g);
        assert!(
            d.contains(
                "[label=\"0 req, 0.0% err, SAN mismatch\", color=red, fontcolor=red, style=dashed];"
            ),
            "{d}"
        );
        assert!(
            d.contains("[label=\"120 req, 10.0% err\", color=red"),
            "{d}"
        );
    }

    #[test]
    fn dot_is_graphviz_input() {
        let d = dot(&sample());
        assert!(d.starts_with("digraph meshcat {\n"), "{d}");
        assert!(d.ends_with("}\n"), "{d}");
        assert!(
            d.contains(
                "\"local/catalog\" [label=\"catalog\\nlocal\\nstable 2\", fillcolor=palegreen];"
            ),
            "{d}"
        );
        assert!(d.contains("\"local/external:payments.example\" [label=\"external:payments.example\", fillcolor=lightgrey, shape=box];"), "{d}");
        assert!(d.contains("\"local/edge\" -> \"local/catalog\" [label=\"120 req, 10.0% err\", color=red, fontcolor=red, style=dotted];"), "{d}");
        assert!(d.contains("style=dashed"), "{d}");
        assert_eq!(quote("a\"b\\c"), "a\\\"b\\\\c");
    }

    #[test]
    fn failing_is_above_the_aggregators_threshold() {
        let mut g = sample();
        let edge = g["edges"][1].clone();
        assert!(failing(&g, &edge));
        // The operator's threshold, as the answer carries it: at it is not above it.
        g["errorRatioWarning"] = json!(0.1);
        assert!(!failing(&g, &edge));
        assert!(!dot(&g).contains("color=red"), "{}", dot(&g));
        g["errorRatioWarning"] = json!(0.099);
        assert!(failing(&g, &edge));
        // An answer that does not say marks nothing.
        g.as_object_mut().unwrap().remove("errorRatioWarning");
        assert!(!failing(&g, &edge));
    }

    #[test]
    fn an_edge_in_words() {
        let g = sample();
        assert_eq!(
            edge_words(&g["edges"][1], 60),
            "120 requests (2.0/s), 12 errors (10.0%), p50 2ms, p99 10ms, TLS, observed, not declared"
        );
        assert_eq!(
            edge_words(&g["edges"][0], 60),
            "0 requests (0.0/s), 0 errors (0.0%), no traffic in the last 60s, declared"
        );
    }

    #[test]
    fn tls_is_told_by_traffic_or_by_the_callers_san_checks() {
        let mut e = sample()["edges"][0].clone();
        // Declared, no traffic, tls false: nothing is known of TLS.
        assert_eq!(tls_said(&e), ("", "-"));
        // The caller checks the target's SANs: its sidecar calls it over mTLS.
        e["tlsIdentity"] = serde_json::json!({
            "match": true, "expectedSans": ["spiffe://a"], "presentedSans": ["spiffe://a"]
        });
        assert_eq!(tls_said(&e), (", mTLS configured", "configured"));
        // Traffic tells, whatever the configuration.
        e["observed"] = Value::Bool(true);
        assert_eq!(tls_said(&e), (", plaintext", "no"));
        e["tls"] = Value::Bool(true);
        assert_eq!(tls_said(&e), (", TLS", "yes"));
    }
}
