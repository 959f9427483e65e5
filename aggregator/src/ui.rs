//! The dashboard (contract section 12): the single-page UI under `/ui/`, its files
//! built into the binary (no CDN, no network at run time, no build step). The files
//! live in `aggregator/ui/` as plain ES modules; this module serves them with their
//! content types, an ETag, gzip when the browser takes it, and a Content-Security-
//! Policy that keeps the page to its own origin. The UI routes need no token: the
//! data calls the page makes carry it.

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::sync::OnceLock;

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

use crate::api::ApiError;

/// One file of the dashboard.
#[derive(Debug)]
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

/// The file `$name` of `aggregator/ui/`, served as `$content_type`.
macro_rules! asset {
    ($name:literal, $content_type:expr) => {
        Asset {
            name: $name,
            content_type: $content_type,
            body: include_bytes!(concat!("../ui/", $name)),
        }
    };
}

/// The content type of the page's ES modules.
const JAVASCRIPT: &str = "text/javascript; charset=utf-8";

/// Every file the page loads. Adding a file here is all it takes to serve it.
const ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("app.js", JAVASCRIPT),
    asset!("live.js", JAVASCRIPT),
    asset!("dom.js", JAVASCRIPT),
    asset!("graph.js", JAVASCRIPT),
    asset!("graph-layout.js", JAVASCRIPT),
    asset!("graph-draw.js", JAVASCRIPT),
    asset!("graph-raster.js", JAVASCRIPT),
    asset!("history.js", JAVASCRIPT),
    asset!("control.js", JAVASCRIPT),
    asset!("identity.js", JAVASCRIPT),
    asset!("style.css", "text/css; charset=utf-8"),
    asset!("favicon.svg", "image/svg+xml"),
];

/// The page may load and call only its own origin; nothing inline.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
     connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'";

/// What is computed once per file: its gzip form and its validator.
#[derive(Debug)]
struct Prepared {
    gzip: Vec<u8>,
    etag: HeaderValue,
}

fn prepared() -> &'static [Prepared] {
    static PREPARED: OnceLock<Vec<Prepared>> = OnceLock::new();
    PREPARED.get_or_init(|| {
        ASSETS
            .iter()
            .map(|a| {
                let mut enc =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
                // Writing into a Vec cannot fail.
                let gzip = enc
                    .write_all(a.body)
                    .and_then(|()| enc.finish())
                    .unwrap_or_default();
                // A fixed-key hash: the same binary gives the same ETag on every replica.
                let mut h = std::hash::DefaultHasher::new();
                a.body.hash(&mut h);
                let etag = HeaderValue::from_str(&format!("\"{:016x}\"", h.finish()))
                    .unwrap_or(HeaderValue::from_static("\"0\""));
                Prepared { gzip, etag }
            })
            .collect()
    })
}

/// The dashboard's routes: `/` and `/ui` redirect to `/ui/`, which serves the page;
/// `/ui/{file}` serves its files; `/favicon.ico` answers the icon for browsers that
/// ask for it before reading the page.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(|| async { Redirect::temporary("/ui/") }))
        .route("/ui", get(|| async { Redirect::temporary("/ui/") }))
        .route(
            "/ui/",
            get(|headers: HeaderMap| async move { serve("index.html", &headers) }),
        )
        .route(
            "/ui/{file}",
            get(|Path(file): Path<String>, headers: HeaderMap| async move {
                serve(&file, &headers)
            }),
        )
        .route(
            "/favicon.ico",
            get(|headers: HeaderMap| async move { serve("favicon.svg", &headers) }),
        )
}

/// Total size of the dashboard's files, raw and gzip-compressed, in bytes.
pub fn sizes() -> (usize, usize) {
    let raw = ASSETS.iter().map(|a| a.body.len()).sum();
    let gzip = prepared().iter().map(|p| p.gzip.len()).sum();
    (raw, gzip)
}

fn serve(name: &str, headers: &HeaderMap) -> Response {
    let Some(i) = ASSETS.iter().position(|a| a.name == name) else {
        return ApiError::not_found(format!("No dashboard file {name}.")).into_response();
    };
    let asset = &ASSETS[i];
    let prep = &prepared()[i];
    let mut res = if headers
        .get(header::IF_NONE_MATCH)
        .is_some_and(|v| v.as_bytes() == prep.etag.as_bytes())
    {
        StatusCode::NOT_MODIFIED.into_response()
    } else if meshcat_common::http::accepts_gzip(headers) {
        let mut r = prep.gzip.clone().into_response();
        r.headers_mut()
            .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        r
    } else {
        asset.body.into_response()
    };
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    h.insert(header::ETAG, prep.etag.clone());
    // Names carry no version: the browser revalidates each time, cheaply with the ETag.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if asset.name == "index.html" {
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        );
    }
    res
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;

    async fn get(uri: &str, headers: &[(&str, &str)]) -> Response {
        let mut req = Request::builder().uri(uri);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        router::<()>()
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn root_redirects_to_the_page() {
        for uri in ["/", "/ui"] {
            let res = get(uri, &[]).await;
            assert_eq!(res.status(), StatusCode::TEMPORARY_REDIRECT);
            assert_eq!(res.headers()[header::LOCATION], "/ui/");
        }
    }

    #[tokio::test]
    async fn files_have_types_validators_and_gzip() {
        let res = get("/ui/", &[]).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(
            res.headers()[header::CONTENT_TYPE],
            "text/html; charset=utf-8"
        );
        assert!(res.headers().contains_key(header::CONTENT_SECURITY_POLICY));
        let etag = res.headers()[header::ETAG].clone();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert!(body.starts_with(b"<!doctype html>"));

        let res = get("/ui/", &[("if-none-match", etag.to_str().unwrap())]).await;
        assert_eq!(res.status(), StatusCode::NOT_MODIFIED);

        let res = get("/ui/app.js", &[("accept-encoding", "br, gzip")]).await;
        assert_eq!(res.headers()[header::CONTENT_ENCODING], "gzip");
        assert_eq!(
            res.headers()[header::CONTENT_TYPE],
            "text/javascript; charset=utf-8"
        );
        let gz = res.into_body().collect().await.unwrap().to_bytes();
        let mut plain = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut plain).unwrap();
        assert_eq!(plain, include_bytes!("../ui/app.js"));

        let res = get("/ui/app.js", &[("accept-encoding", "gzip;q=0")]).await;
        assert!(!res.headers().contains_key(header::CONTENT_ENCODING));

        let res = get("/favicon.ico", &[]).await;
        assert_eq!(res.headers()[header::CONTENT_TYPE], "image/svg+xml");
    }

    #[tokio::test]
    async fn unknown_files_answer_the_json_404() {
        let res = get("/ui/secret.txt", &[]).await;
        assert_eq!(res.status(), StatusCode::NOT_FOUND);
        let body = res.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["code"], "not_found");
    }

    #[test]
    fn the_page_stays_small() {
        let (_, gzip) = sizes();
        assert!(gzip < 150 * 1024, "dashboard is {gzip} bytes compressed");
    }
}
