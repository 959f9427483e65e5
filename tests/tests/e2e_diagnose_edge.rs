//! `GET /diagnose` when the first edge instance cannot answer: its agent is a real
//! QUIC reporter that never answers a command; the aggregator asks every live edge
//! instance at once, so the real Envoy's agent answers within the request's deadline,
//! and the edge checks say which instance answered.

use std::time::{Duration, Instant};

use meshcat_tests::diagnose_stack::*;
use meshcat_tests::scenario::Scenario;
use meshcat_tests::wait_for;

/// An edge instance whose name sorts before the real edge's `edge-0`, so it is
/// asked first.
const HUNG_EDGE: &str = "a-edge-hung";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_first_edge_falls_back_to_the_next_edge_instance() {
    let _turn = SERIAL.lock().await;
    let sc = Scenario::start("healthy").await.unwrap();
    let stack = Stack::start(&sc).await;
    let (stop_hung, hung_task) = hung_agent(&stack, EDGE, HUNG_EDGE, "hung-edge-agent");
    let instances = stack.agg.instances.clone();
    wait_for(
        "the hung edge instance to be live",
        Duration::from_secs(20),
        || {
            let instances = instances.clone();
            async move {
                instances
                    .live_instance(ZONE, EDGE, HUNG_EDGE)
                    .is_some()
                    .then_some(())
            }
        },
    )
    .await
    .unwrap();

    // The stack's command deadline is 5 s: both edges are asked at once and the
    // answer comes within the one deadline.
    let started = Instant::now();
    let (code, r) = stack
        .diagnose("&symptom=upstream_connect_error&path=/catalog/items")
        .await;
    let took = started.elapsed();
    assert_eq!(code, 200, "{r:#}");
    assert!(took < Duration::from_secs(6), "took {took:?}");
    assert_eq!(verdict(&r, "edge_discovery"), "pass", "{r:#}");
    assert_eq!(verdict(&r, "edge_routes"), "pass", "{r:#}");
    assert_eq!(verdict(&r, "service_discovery"), "pass", "{r:#}");
    let source = step(&r, "edge_discovery")["evidence"][0].as_str().unwrap();
    assert!(
        source.starts_with("edge evidence from instance edge-0, not from a-edge-hung: ")
            && source.contains("did not answer within"),
        "{source}"
    );
    assert_evidence(&r, "edge_routes", "edge evidence from instance edge-0");
    assert!(!has_evidence(&r, "service_discovery", "edge evidence from"));

    // With the real edge's agent gone too, every try fails: the edge checks are
    // skipped and say why for each instance.
    let mut stack = stack;
    stack.edge_agent.take().unwrap().stop().await;
    wait_for(
        "the real edge to leave the catalog",
        Duration::from_secs(20),
        || {
            let instances = instances.clone();
            async move {
                instances
                    .live_instance(ZONE, EDGE, "edge-0")
                    .is_none()
                    .then_some(())
            }
        },
    )
    .await
    .unwrap();
    let started = Instant::now();
    let (code, r) = stack.diagnose("&symptom=no_healthy_upstream").await;
    assert_eq!(code, 200, "{r:#}");
    assert!(started.elapsed() < Duration::from_secs(6));
    assert_eq!(verdict(&r, "edge_discovery"), "skipped", "{r:#}");
    assert_evidence(
        &r,
        "edge_discovery",
        "a-edge-hung: the agent did not answer",
    );
    assert_eq!(verdict(&r, "service_discovery"), "pass", "{r:#}");

    let _ = stop_hung.send(());
    let _ = tokio::time::timeout(Duration::from_secs(6), hung_task).await;
    stack.stop().await;
}
