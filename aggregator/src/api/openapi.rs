//! The OpenAPI 3 document of the catalog API, written by hand to stay true to the
//! handlers; a test checks its (method, path) set against [`super::ROUTES`].

use std::sync::OnceLock;

use bytes::Bytes;
use serde_json::{Value, json};

use super::query::CLUSTER_FILTERS;

fn err(description: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    })
}

fn ok(description: &str, schema: Value) -> Value {
    json!({"description": description, "content": {"application/json": {"schema": schema}}})
}

fn schema(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

fn array_of(name: &str) -> Value {
    json!({"type": "array", "items": schema(name)})
}

fn path_param(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "path", "required": true, "description": description, "schema": {"type": "string"}})
}

fn zone_query(required: bool) -> Value {
    json!({"name": "zoneName", "in": "query", "required": required, "schema": {"type": "string"}})
}

fn level_query() -> Value {
    json!({"name": "level", "in": "query", "required": true,
        "schema": {"type": "string", "enum": ["error", "warn", "info", "debug"]}})
}

fn body(name: &str) -> Value {
    json!({"required": true, "content": {"application/json": {"schema": schema(name)}}})
}

fn write_errors(mut responses: Value) -> Value {
    let m = responses.as_object_mut().expect("object");
    m.insert("400".into(), err("Malformed JSON, query or path."));
    m.insert(
        "401".into(),
        err("A write token is configured and the request lacks it."),
    );
    m.insert("413".into(), err("The body is over --max-body."));
    m.insert("415".into(), err("The body is not JSON."));
    m.insert("422".into(), err("Well-formed but invalid."));
    responses
}

fn filter_params() -> Vec<Value> {
    CLUSTER_FILTERS
        .iter()
        .map(|name| {
            let schema = match *name {
                "status" => json!({"type": "string", "enum": ["stable", "warning", "down"]}),
                "authorized" | "enableInstanceMetrics" | "enableHistoricalMetrics" => {
                    json!({"type": "string", "enum": ["true", "false"]})
                }
                _ => json!({"type": "string"}),
            };
            json!({
                "name": name, "in": "query", "required": false, "explode": true,
                "description": "Exact, case-sensitive; repeat the parameter to match any of several values.",
                "schema": {"type": "array", "items": schema}
            })
        })
        .collect()
}

fn components() -> Value {
    let s = json!({"type": "string"});
    let i = json!({"type": "integer"});
    let b = json!({"type": "boolean"});
    let strings = json!({"type": "array", "items": {"type": "string"}});
    let mut cluster_props = serde_json::Map::new();
    for f in [
        "clusterName",
        "zoneName",
        "name",
        "version",
        "owner",
        "ownerURL",
        "capability",
        "runtime",
        "documentation",
        "description",
        "prometheusJob",
        "metricsTemplate",
        "clusterID",
        "meshID",
        "apiEndpoint",
        "apiSpecEndpoint",
        "businessImpact",
    ] {
        cluster_props.insert(f.into(), s.clone());
    }
    for f in ["minInstances", "maxInstances", "metricsPort"] {
        cluster_props.insert(f.into(), json!({"type": "integer", "minimum": 0}));
    }
    for f in ["enableInstanceMetrics", "enableHistoricalMetrics"] {
        cluster_props.insert(f.into(), b.clone());
    }
    cluster_props.insert("protocols".into(), strings.clone());
    cluster_props.insert("externalLinks".into(), array_of("ExternalLink"));
    let mut view_props = cluster_props.clone();
    view_props.insert("authorized".into(), b.clone());
    view_props.insert("instances".into(), array_of("Instance"));
    view_props.insert("status".into(), schema("Status"));

    let counts = |names: &[&str]| -> Value {
        let mut m = serde_json::Map::new();
        m.insert("zoneName".into(), s.clone());
        m.insert("owners".into(), strings.clone());
        m.insert("capabilities".into(), strings.clone());
        for n in names {
            m.insert((*n).into(), i.clone());
        }
        Value::Object(m)
    };
    let summary_counts = [
        "clusterCount",
        "clusterStableCount",
        "clusterWarningCount",
        "clusterDownCount",
        "instanceCount",
    ];
    let mut overall = counts(&summary_counts);
    overall.as_object_mut().expect("object").remove("zoneName");
    overall
        .as_object_mut()
        .expect("object")
        .insert("zoneCount".into(), i.clone());

    let mut metrics = serde_json::Map::new();
    let defaults = serde_json::to_value(meshcat_common::model::InstanceMetrics::default())
        .expect("serialises");
    for (k, v) in defaults.as_object().expect("object") {
        let t = match v {
            Value::String(_) => "string",
            Value::Number(n) if n.is_f64() => "number",
            _ => "integer",
        };
        metrics.insert(k.clone(), json!({"type": t}));
    }

    let cluster_outcome = json!({"type": "object", "properties": {
                "zoneName": s, "clusterName": s, "succeeded": i, "failed": i,
                "instances": {"type": "array", "items": {"type": "object", "properties": {
                    "instance": s, "status": i, "level": s, "error": s, "code": s,
                    "debugWindow": {"type": "object", "properties": {
                        "previous_level": s, "started_at_ms": i, "ended_at_ms": i, "restored": b,
                        "cut_short": b, "log_tailed": b, "line_count": i, "tls_lines": strings,
                        "tls_line_count": i}}}}}}});
    // The step names come from the engine's own type, so the document cannot drift.
    let step_names: Vec<&str> = meshcat_diagnose::StepName::ALL
        .iter()
        .map(|n| n.as_str())
        .collect();
    let diagnosis_report = json!({"type": "object", "required": ["cluster", "zone", "symptom", "steps", "conclusion"], "properties": {
                "cluster": s, "zone": s, "symptom": {"type": "string", "nullable": true},
                "steps": {"type": "array", "items": {"type": "object", "properties": {
                    "name": {"type": "string", "enum": step_names}, "verdict": {"type": "string", "enum": ["pass", "fail", "skipped"]},
                    "evidence": strings, "action": s}}},
                "conclusion": s}});
    json!({
        "schemas": {
            "Error": {"type": "object", "required": ["error", "code"], "properties": {"error": s, "code": s}},
            "Status": {"type": "string", "enum": ["stable", "warning", "down"]},
            "ExternalLink": {"type": "object", "properties": {"name": s, "link": s}},
            "Instance": {"type": "object", "properties": {"name": s, "startTime": {"type": "integer", "description": "ms since the epoch"}}},
            "ClusterRecord": {"type": "object", "required": ["clusterName", "zoneName", "name"], "properties": cluster_props},
            "ClusterView": {"type": "object", "properties": view_props},
            "ZoneRecord": {"type": "object", "required": ["zoneName", "serverAddress"], "properties": {
                "zoneName": s, "requestCluster": s, "serverAddress": {"type": "string", "description": "host:port"},
                "useTls": b, "caPath": s, "certPath": s, "keyPath": s}},
            "ZoneMetadata": {"type": "object", "properties": counts(&[
                "serviceCount", "stableServiceCount", "warningServiceCount", "downServiceCount", "instanceCount"])},
            "ZoneSummary": {"type": "object", "properties": counts(&summary_counts)},
            "OverallSummary": {"type": "object", "properties": overall},
            "ZoneEntry": {"type": "object", "properties": {
                "clusters": {"type": "object", "additionalProperties": schema("ClusterView")},
                "metadata": schema("ZoneSummary")}},
            "Summary": {"type": "object", "properties": {
                "zones": {"type": "object", "additionalProperties": schema("ZoneEntry")},
                "meshes": {"type": "object", "additionalProperties": schema("ZoneEntry")},
                "metadata": schema("OverallSummary")}},
            "InstanceMetrics": {"type": "object", "properties": metrics},
            "ClusterOutcome": cluster_outcome,
            "DiagnosisReport": diagnosis_report
        },
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}
    })
}

/// Builds the document.
pub fn document() -> Value {
    let cluster = path_param("clusterName", "The cluster's clusterName.");
    let zone = path_param("zoneName", "The zone's zoneName.");
    let instance = path_param("instanceId", "The instance name.");
    let r404 = err("Unknown resource.");
    let r400 = err("Malformed query or path.");
    let metrics_responses = json!({
        "200": ok("The instance's latest metrics (seed 2.6).", schema("InstanceMetrics")),
        "400": r400, "403": err("A read token is configured and the request lacks it."), "404": r404
    });
    let instance_logging = json!({
        "get": {"summary": "The sidecar log level of one instance, through its agent.",
            "parameters": [zone, cluster, instance],
            "responses": {"200": {"description": "The level as text: error, warn, info, debug (or Envoy's trace, critical, off).",
                "content": {"text/plain": {"schema": {"type": "string"}}}},
                "400": r400, "403": err("A read token is configured and the request lacks it."), "404": err("Unknown zone or no live instance of that name."),
                "502": err("The sidecar failed the command."), "503": err("The instance's agent is gone, hung past the deadline, busy, or ingest is off.")}},
        "put": {"summary": "Set the sidecar log level of one instance (warn is sent to Envoy as warning).",
            "parameters": [zone, cluster, instance, level_query()],
            "responses": {"200": {"description": "The level now, as text.", "content": {"text/plain": {"schema": {"type": "string"}}}},
                "400": err("Missing or bad level."), "401": err("A write token is configured and the request lacks it."),
                "404": err("Unknown zone or no live instance of that name."),
                "502": err("The sidecar failed the command."), "503": err("The instance's agent is gone, hung past the deadline, busy, or ingest is off.")}}
    });
    let cluster_logging = json!({"put": {"summary": "Set the sidecar log level of every live instance of a cluster at once.",
                "parameters": [zone, cluster, level_query()],
                "responses": {"200": ok("Per instance, the outcome (each instance has its own deadline).", schema("ClusterOutcome")),
                    "400": err("Missing or bad level."), "401": err("A write token is configured and the request lacks it."), "404": r404}}});
    let debug_window = json!({"post": {"summary": "Run a timed debug window on the cluster's sidecars: debug for N seconds, then the previous level; answers the window's TLS lines.",
                "parameters": [zone, cluster,
                    {"name": "seconds", "in": "query", "required": true, "schema": {"type": "integer", "minimum": 1, "maximum": 300}},
                    {"name": "instance", "in": "query", "required": false, "description": "Limit to these instances (repeatable); default every live instance.",
                        "schema": {"type": "array", "items": {"type": "string"}}, "style": "form", "explode": true}],
                "responses": {"200": ok("Per instance, the outcome and the window's report.", schema("ClusterOutcome")),
                    "400": err("Missing or bad seconds."), "401": err("A write token is configured and the request lacks it."), "404": r404,
                    "503": err("Agent ingest is off.")}}});
    let diagnose = json!({"get": {"summary": "Run the mesh troubleshooting playbook for a cluster (contract section 5).",
                "parameters": [cluster, zone_query(true),
                    {"name": "symptom", "in": "query", "required": false,
                        "schema": {"type": "string", "enum": ["upstream_connect_error", "no_healthy_upstream", "ingress_502_503", "missing_metrics"]}},
                    {"name": "path", "in": "query", "required": false, "description": "Path of the failing request; access lines are filtered on it.", "schema": {"type": "string"}},
                    {"name": "debugSeconds", "in": "query", "required": false, "description": "Run a debug window of that many seconds on every sidecar read before collecting.",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 300}}],
                "responses": {"200": ok("The diagnosis report.", schema("DiagnosisReport")),
                    "400": err("Malformed query, unknown symptom, or zoneName missing."),
                    "401": err("debugSeconds is given, a write token is configured and the request lacks it."),
                    "403": err("A read token is configured and the request lacks it, or debugSeconds is given and writes are disabled."), "404": r404}}});
    let mut doc = json!({
        "openapi": "3.0.3",
        "info": {
            "title": "meshcat catalog API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Service catalog of an Envoy service mesh: zones, clusters, their live instances, status and metrics."
        },
        "security": [{}, {"bearer": []}],
        "paths": {
            "/summary": {"get": {"summary": "Summary of every zone (seed 2.5).",
                "responses": {"200": ok("The summary.", schema("Summary")), "400": r400}}},
            "/clusters": {
                "get": {"summary": "List registered clusters.", "parameters": filter_params(),
                    "responses": {"200": ok("Matching clusters sorted by (zoneName, clusterName).", array_of("ClusterView")), "400": r400}},
                "post": {"summary": "Register a cluster, or an array of 1 to 1000 clusters all or nothing (one durable commit; a refusal names the record's index and stores nothing).",
                    "requestBody": {"required": true, "content": {"application/json": {"schema":
                        {"oneOf": [schema("ClusterRecord"), {"type": "array", "minItems": 1, "maxItems": 1000, "items": schema("ClusterRecord")}]}}}},
                    "responses": write_errors(json!({"201": ok("The stored record, or the stored records in the order sent.",
                        json!({"oneOf": [schema("ClusterRecord"), array_of("ClusterRecord")]})),
                        "409": err("The cluster exists in that zone (or twice in the array).")}))}
            },
            "/clusters/{clusterName}": {
                "get": {"summary": "A cluster, one record per zone that has it.", "parameters": [cluster, zone_query(false)],
                    "responses": {"200": ok("The records.", array_of("ClusterView")), "400": r400, "404": r404}},
                "put": {"summary": "Replace a cluster; the zone is the body's zoneName.", "parameters": [cluster, zone_query(false)],
                    "requestBody": body("ClusterRecord"),
                    "responses": write_errors(json!({"200": ok("The stored record.", schema("ClusterRecord")), "404": r404}))},
                "delete": {"summary": "Delete a cluster from a zone.", "parameters": [cluster, zone_query(true)],
                    "responses": write_errors(json!({"200": ok("The deleted record.", schema("ClusterRecord")), "404": r404}))}
            },
            "/metrics/{clusterName}/{instanceId}": {"get": {"summary": "Latest metrics of a live instance.",
                "parameters": [cluster, instance, zone_query(false)], "responses": metrics_responses}},
            "/metrics/{name}/{version}/{instanceId}": {"get": {"summary": "Latest metrics of a live instance of the cluster with that name and version.",
                "parameters": [path_param("name", "The cluster's name field."), path_param("version", "The cluster's version field."), instance],
                "responses": metrics_responses}},
            "/zones": {
                "get": {"summary": "List zones.", "responses": {"200": ok("Zones sorted by zoneName.", array_of("ZoneRecord")), "400": r400}},
                "post": {"summary": "Register a zone.", "requestBody": body("ZoneRecord"),
                    "responses": write_errors(json!({"201": ok("The stored zone.", schema("ZoneRecord")), "409": err("The zone exists.")}))}
            },
            "/zones/{zoneName}": {
                "get": {"summary": "A zone.", "parameters": [zone],
                    "responses": {"200": ok("The zone.", schema("ZoneRecord")), "400": r400, "404": r404}},
                "delete": {"summary": "Delete a zone and its clusters.", "parameters": [zone],
                    "responses": write_errors(json!({"200": ok("The deleted zone.", schema("ZoneRecord")), "404": r404}))}
            },
            "/zones/{zoneName}/metadata": {"get": {"summary": "Counts over the zone's clusters (seed 2.4).", "parameters": [zone],
                "responses": {"200": ok("The zone metadata.", schema("ZoneMetadata")), "400": r400, "404": r404}}},
            "/services": {"get": {"summary": "Every cluster that should be in the mesh, registered or only seen by agents and edge sidecars.",
                "parameters": [zone_query(false)],
                "responses": {"200": ok("Clusters sorted by (zoneName, clusterName).", array_of("ClusterView")), "400": r400}}},
            "/openapi.json": {"get": {"summary": "This document.", "responses": {"200": {"description": "OpenAPI 3 document."}}}}
        },
        "components": components()
    });
    let paths = doc["paths"].as_object_mut().expect("paths is an object");
    paths.insert(
        "/zones/{zoneName}/clusters/{clusterName}/instances/{instanceId}/logging".into(),
        instance_logging,
    );
    paths.insert(
        "/zones/{zoneName}/clusters/{clusterName}/logging".into(),
        cluster_logging,
    );
    paths.insert(
        "/zones/{zoneName}/clusters/{clusterName}/debug-window".into(),
        debug_window,
    );
    paths.insert("/diagnose/{clusterName}".into(), diagnose);
    paths.insert("/events".into(), events());
    // The read routes of the live catalog: the index header and blocking queries.
    for route in super::events::INDEXED {
        let get = &mut paths[*route]["get"];
        let params = get
            .as_object_mut()
            .expect("operation")
            .entry("parameters")
            .or_insert_with(|| json!([]));
        params
            .as_array_mut()
            .expect("array")
            .extend(blocking_params());
        if let Some(ok) = get["responses"]["200"].as_object_mut() {
            ok.insert(
                "headers".into(),
                json!({"X-Meshcat-Index": {
                "description": "The catalog index the answer was read at.",
                "schema": {"type": "integer", "minimum": 0}}}),
            );
        }
    }
    // Every write can be refused because no write token is configured.
    for item in paths.values_mut() {
        for op in item
            .as_object_mut()
            .into_iter()
            .flat_map(|o| o.values_mut())
        {
            let Some(responses) = op["responses"].as_object_mut() else {
                continue;
            };
            if responses.contains_key("401") {
                responses.entry("403").or_insert_with(|| {
                    err("No write token is configured and writes are disabled (writes_disabled).")
                });
            }
            // Any request may meet the API's limits.
            responses.entry("503").or_insert_with(|| {
                err("Too many requests in progress (overloaded) or past the time limit (timeout).")
            });
        }
    }
    doc
}

fn blocking_params() -> [Value; 2] {
    [
        json!({"name": "index", "in": "query", "required": false,
            "description": "Blocking query: answer once the catalog index exceeds this (or after wait).",
            "schema": {"type": "integer", "minimum": 0}}),
        json!({"name": "wait", "in": "query", "required": false,
            "description": "Longest wait of a blocking query, such as 500ms, 5s or 2m (default 5m, at most 10m).",
            "schema": {"type": "string", "pattern": "^[0-9]{1,12}(ms|s|m|h)?$"}}),
    ]
}

fn events() -> Value {
    let name = |n: &str| json!({"name": n, "in": "query", "required": false, "schema": {"type": "string"}});
    json!({"get": {
        "summary": "Server-Sent Events stream of catalog changes: cluster, cluster-deleted, zone, zone-deleted, summary and reset events, each with the change's index as id.",
        "parameters": [
            name("zoneName"), name("clusterName"),
            {"name": "since", "in": "query", "required": false,
                "description": "Replay the changes after this index (like Last-Event-ID).",
                "schema": {"type": "integer", "minimum": 0}},
            {"name": "Last-Event-ID", "in": "header", "required": false, "schema": {"type": "string"}}
        ],
        "responses": {
            "200": {"description": "The event stream. Each event (described by the schema) has a name, a JSON data line and, except `reset`, the index of its change as id; comment lines keep an idle stream open.",
                "content": {"text/event-stream": {"schema": {
                    "type": "object",
                    "required": ["event", "data"],
                    "properties": {
                        "event": {"type": "string", "enum": ["cluster", "cluster-deleted", "zone", "zone-deleted", "summary", "reset"]},
                        "data": {"type": "string", "description": "JSON: a cluster as in GET /clusters, {clusterName, zoneName}, a zone record, {zoneName}, the summary's metadata, or {} for reset."},
                        "id": {"type": "string", "pattern": "^[0-9]+$"}
                    }
                }}}},
            "400": err("Malformed query.")
        }
    }})
}

/// The document, serialized once.
pub fn document_bytes() -> Bytes {
    static DOC: OnceLock<Bytes> = OnceLock::new();
    DOC.get_or_init(|| Bytes::from(serde_json::to_vec(&document()).expect("serialises")))
        .clone()
}

/// The (METHOD, path) pairs the document describes.
pub fn operations(doc: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().into_iter().flatten() {
        for method in item.as_object().into_iter().flatten().map(|(m, _)| m) {
            out.push((method.to_uppercase(), path.clone()));
        }
    }
    out.sort();
    out
}
