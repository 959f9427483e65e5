//! The baseline of the catalog read benchmark: an axum server on 127.0.0.1 answering
//! `GET /` with a fixed body, built and run like the aggregator's API (release,
//! multi-threaded tokio runtime), so `GET /clusters/{name}` can be compared with the
//! fastest answer axum gives on the same machine in the same run. The body is
//! `Hello, World!`, or the JSON in `--json` (the benchmark gives it the very answer
//! of `GET /clusters/{name}`, so both send as many bytes).

// A command-line benchmark: its report goes to stdout.
#![allow(clippy::print_stdout)]

use std::path::PathBuf;

use axum::Router;
use axum::body::Bytes;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use clap::Parser;

/// Serves `GET /` with a fixed body until killed; prints `listening on ADDR`.
#[derive(Debug, Parser)]
struct Args {
    /// Address to listen on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:0")]
    addr: std::net::SocketAddr,
    /// Serve this file's bytes as `application/json` instead of `Hello, World!`.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let app = match args.json {
        None => Router::new().route("/", get(|| async { "Hello, World!" })),
        Some(path) => {
            let body = Bytes::from(std::fs::read(&path)?);
            Router::new().route(
                "/",
                get(move || {
                    let body = body.clone();
                    async move { ([(header::CONTENT_TYPE, "application/json")], body).into_response() }
                }),
            )
        }
    };
    let listener = tokio::net::TcpListener::bind(args.addr).await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
