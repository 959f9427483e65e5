//! The baseline of the catalog read benchmark: an axum server answering a fixed
//! `Hello, World!` on 127.0.0.1, built and run like the aggregator's API (release,
//! multi-threaded tokio runtime), so `GET /clusters/{name}` can be compared with the
//! fastest answer axum gives on the same machine in the same run.

// A command-line benchmark: its report goes to stdout.
#![allow(clippy::print_stdout)]

use axum::Router;
use axum::routing::get;
use clap::Parser;

/// Serves `GET /` with a fixed body until killed; prints `listening on ADDR`.
#[derive(Debug, Parser)]
struct Args {
    /// Address to listen on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:0")]
    addr: std::net::SocketAddr,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let app = Router::new().route("/", get(|| async { "Hello, World!" }));
    let listener = tokio::net::TcpListener::bind(args.addr).await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
