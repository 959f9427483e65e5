//! The OpenAPI 3 document of the catalog API, derived by utoipa from the handlers'
//! `#[utoipa::path]` annotations, their typed queries and the model's types, so it
//! cannot drift from the code. A test checks its (method, path) set against
//! [`super::ROUTES`], which the router is checked against too.

use std::sync::OnceLock;

use bytes::Bytes;
use serde_json::Value;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{RefOr, Response, ResponseBuilder, content::ContentBuilder};
use utoipa::{Modify, OpenApi};

use super::{certificates, control, diagnose, events, graph, handlers, history, logging, status};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "meshcat catalog API",
        description = "Service catalog of an Envoy service mesh: zones, clusters, their live instances, status and metrics."
    ),
    paths(
        handlers::summary,
        handlers::list_clusters,
        handlers::create_cluster,
        handlers::get_cluster,
        handlers::replace_cluster,
        handlers::delete_cluster,
        handlers::metrics_by_cluster,
        handlers::metrics_by_version,
        handlers::list_zones,
        handlers::create_zone,
        handlers::get_zone,
        handlers::replace_zone,
        handlers::delete_zone,
        handlers::zone_metadata,
        control::zone_control,
        control::sync,
        handlers::services,
        handlers::openapi,
        logging::get_instance_logging,
        logging::put_instance_logging,
        logging::put_cluster_logging,
        logging::post_debug_window,
        diagnose::diagnose,
        graph::graph,
        graph::drift,
        history::history,
        history::cluster_history,
        certificates::certificates,
        status::status,
        events::events,
    ),
    modifiers(&Shared),
    security((), ("bearer" = [])),
)]
struct Catalog;

/// What every route shares, from the layers rather than the handlers: the bearer
/// scheme, the query refusal (every route refuses parameters it does not define),
/// the API's limits, and the refusal of writes when no write token is configured.
struct Shared;

fn error(description: &str) -> RefOr<Response> {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
                    "Error",
                ))))
                .build(),
        )
        .build()
        .into()
}

impl Modify for Shared {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        for item in doc.paths.paths.values_mut() {
            for op in [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
            ]
            .into_iter()
            .flatten()
            {
                let responses = &mut op.responses.responses;
                responses
                    .entry("400".into())
                    .or_insert_with(|| error("Malformed query or path."));
                if responses.contains_key("401") {
                    responses.entry("403".into()).or_insert_with(|| {
                        error(
                            "No write token is configured and writes are disabled (writes_disabled).",
                        )
                    });
                }
                responses.entry("503".into()).or_insert_with(|| {
                    error(
                        "Too many requests in progress (overloaded) or past the time limit (timeout).",
                    )
                });
            }
        }
    }
}

/// Builds the document.
pub fn document() -> Value {
    serde_json::to_value(Catalog::openapi()).expect("the document serialises")
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
