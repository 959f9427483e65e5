use futures::StreamExt;
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::*;
use crate::changes::{Event, Subscription};

const BEAT: Duration = Duration::from_secs(15);
const GATHER: Duration = Duration::from_millis(50);

fn bounds(buffer: usize) -> Bounds {
    Bounds {
        heartbeat: BEAT,
        coalesce: GATHER,
        buffer,
    }
}

fn change(index: u64, cluster: &str) -> Arc<Change> {
    let frame = format!("event: cluster\nid: {index}\ndata: {{\"clusterName\":\"{cluster}\"}}\n\n");
    Arc::new(Change {
        index,
        events: vec![Event {
            kind: "cluster",
            zone: "z".into(),
            cluster: Some(cluster.into()),
            frame: Bytes::from(frame),
            frame_unauthorized: None,
            private: false,
        }],
    })
}

fn stream(
    buffer: usize,
    filter: Filter,
) -> (
    broadcast::Sender<Arc<Change>>,
    impl Stream<Item = Result<Bytes, Infallible>>,
) {
    let (tx, feed) = broadcast::channel(buffer);
    let sub = Subscription {
        replay: Some(Vec::new()),
        feed,
    };
    let stopping = tokio::sync::watch::channel(false).1;
    (
        tx,
        event_stream(sub, filter, true, bounds(BUFFER), stopping, None),
    )
}

fn text(b: Option<Result<Bytes, Infallible>>) -> String {
    let Ok(b) = b.expect("the stream goes on");
    String::from_utf8(b.to_vec()).unwrap()
}

/// On the paused clock: an isolated change leaves at once; changes that follow
/// within the gathering period leave together, once it is over.
#[tokio::test(start_paused = true)]
async fn a_lone_change_leaves_at_once_and_a_burst_in_one_write() {
    let (tx, s) = stream(16, Filter::default());
    let mut s = std::pin::pin!(s);
    let t0 = Instant::now();
    tx.send(change(1, "a")).unwrap();
    let first = text(s.next().await);
    assert!(
        first.contains("id: 1\n") && !first.contains("id: 2"),
        "{first}"
    );
    assert_eq!(Instant::now(), t0, "no delay for a lone change");

    for i in 2..=4 {
        tx.send(change(i, "a")).unwrap();
    }
    let burst = text(s.next().await);
    assert_eq!(burst.matches("event: cluster").count(), 3, "{burst}");
    assert_eq!(
        Instant::now(),
        t0 + GATHER,
        "gathered until the period ended"
    );

    // Long after the last write, a change leaves at once again.
    tokio::time::advance(GATHER * 2).await;
    let t1 = Instant::now();
    tx.send(change(5, "a")).unwrap();
    assert!(text(s.next().await).contains("id: 5\n"));
    assert_eq!(Instant::now(), t1);
}

#[tokio::test(start_paused = true)]
async fn a_quiet_stream_gets_a_comment_every_heartbeat_whatever_the_filter_leaves_out() {
    let filter = Filter {
        zone: None,
        cluster: Some("quiet".into()),
    };
    let (tx, s) = stream(16, filter);
    let mut s = std::pin::pin!(s);
    let t0 = Instant::now();
    tx.send(change(1, "busy")).unwrap();
    assert_eq!(text(s.next().await), ":\n\n");
    assert_eq!(Instant::now(), t0 + BEAT);
    tx.send(change(2, "quiet")).unwrap();
    assert!(text(s.next().await).contains("id: 2\n"));
    assert_eq!(text(s.next().await), ":\n\n");
    assert_eq!(Instant::now(), t0 + BEAT * 2);
}

#[tokio::test(start_paused = true)]
async fn a_stream_ends_when_the_process_stops() {
    let (tx, feed) = broadcast::channel(4);
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let sub = Subscription {
        replay: Some(Vec::new()),
        feed,
    };
    let s = event_stream(sub, Filter::default(), true, bounds(BUFFER), stopping, None);
    let mut s = std::pin::pin!(s);
    tx.send(change(1, "a")).unwrap();
    assert!(text(s.next().await).contains("id: 1\n"));
    let t0 = Instant::now();
    stop.send(true).unwrap();
    assert!(s.next().await.is_none());
    assert_eq!(
        Instant::now(),
        t0,
        "ended at once, not at the next heartbeat"
    );
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_falls_behind_while_gathering_gets_reset_and_ends() {
    let (tx, s) = stream(2, Filter::default());
    let mut s = std::pin::pin!(s);
    tx.send(change(1, "a")).unwrap();
    assert!(text(s.next().await).contains("id: 1\n"));
    // More changes than the buffer holds arrive within the gathering period.
    tx.send(change(2, "a")).unwrap();
    let next = s.next();
    let mut next = std::pin::pin!(next);
    assert!(futures::poll!(next.as_mut()).is_pending());
    for i in 3..=6 {
        tx.send(change(i, "a")).unwrap();
    }
    let last = text(next.await);
    assert!(last.contains("id: 2\n"), "{last}");
    assert!(last.ends_with("event: reset\ndata: {}\n\n"), "{last}");
    assert!(s.next().await.is_none(), "closed after reset");
}

/// A change of `n` events (a bulk write), each frame `len` bytes long.
fn bulk(index: u64, n: usize, len: usize) -> Arc<Change> {
    let events = (0..n)
        .map(|i| {
            let head = format!("event: cluster\nid: {index}\ndata: {{\"n\":{i},\"pad\":\"");
            let pad = len - head.len() - "\"}\n\n".len();
            Event {
                kind: "cluster",
                zone: "z".into(),
                cluster: Some(format!("c{i}")),
                frame: Bytes::from(format!("{head}{}\"}}\n\n", "x".repeat(pad))),
                frame_unauthorized: None,
                private: false,
            }
        })
        .collect();
    Arc::new(Change { index, events })
}

fn resumed(
    replay: Vec<Arc<Change>>,
    filter: Filter,
    buffer: usize,
) -> impl Stream<Item = Result<Bytes, Infallible>> {
    let (_tx, feed) = broadcast::channel(4);
    let sub = Subscription {
        replay: Some(replay),
        feed,
    };
    let stopping = tokio::sync::watch::channel(false).1;
    event_stream(sub, filter, true, bounds(buffer), stopping, None)
}

#[tokio::test(start_paused = true)]
async fn a_replay_within_the_buffer_is_one_chunk_and_a_larger_one_is_reset_and_the_end() {
    let window = vec![bulk(1, 10, 100), bulk(2, 10, 100)];
    let s = resumed(window.clone(), Filter::default(), 2000);
    let mut s = std::pin::pin!(s);
    let first = text(s.next().await);
    assert_eq!(first.len(), 2000);
    assert_eq!(first.matches("event: cluster").count(), 20);

    let s = resumed(window.clone(), Filter::default(), 1999);
    let mut s = std::pin::pin!(s);
    assert_eq!(text(s.next().await), "event: reset\ndata: {}\n\n");
    assert!(s.next().await.is_none(), "closed after reset");

    // What counts is what the stream shows: its filter's events only.
    let one = Filter {
        zone: None,
        cluster: Some("c3".into()),
    };
    let s = resumed(window, one, 200);
    let mut s = std::pin::pin!(s);
    let first = text(s.next().await);
    assert_eq!(first.matches("event: cluster").count(), 2, "{first}");
}

#[test]
fn a_replay_stops_measuring_at_the_first_frame_past_the_buffer() {
    let window = vec![bulk(1, 1000, 1000), bulk(2, 1000, 1000)];
    assert_eq!(
        replay(&window, &Filter::default(), true, 4096),
        Err(TooLarge)
    );
    assert_eq!(replay(&[], &Filter::default(), true, 4096), Ok(None));
    // A single frame is shared, not copied.
    let one = bulk(3, 1, 100);
    let got = replay(std::slice::from_ref(&one), &Filter::default(), true, 4096)
        .unwrap()
        .unwrap();
    assert_eq!(got.as_ptr(), one.events[0].frame.as_ptr());
}

/// A bulk write larger than the buffer goes out in chunks within it, every event
/// in order, without `reset`; a lone frame larger than the buffer goes out alone.
#[tokio::test(start_paused = true)]
async fn live_changes_are_written_in_chunks_within_the_buffer() {
    let (tx, feed) = broadcast::channel(16);
    let sub = Subscription {
        replay: Some(Vec::new()),
        feed,
    };
    let stopping = tokio::sync::watch::channel(false).1;
    let s = event_stream(sub, Filter::default(), true, bounds(350), stopping, None);
    let mut s = std::pin::pin!(s);
    tx.send(bulk(1, 10, 100)).unwrap();
    tx.send(bulk(2, 5, 100)).unwrap();
    tx.send(bulk(3, 1, 1000)).unwrap();
    tx.send(bulk(4, 1, 100)).unwrap();
    let mut chunks = Vec::new();
    while chunks
        .iter()
        .map(|c: &String| c.matches("event: cluster").count())
        .sum::<usize>()
        < 17
    {
        chunks.push(text(s.next().await));
    }
    let sizes: Vec<usize> = chunks.iter().map(String::len).collect();
    // 3 frames of 100 fit in 350: 10 + 5 events go 3, 3, 3, 3, 3; then the
    // 1000-byte frame alone, then the last.
    assert_eq!(sizes, [300, 300, 300, 300, 300, 1000, 100], "{chunks:?}");
    let ids: Vec<u64> = chunks
        .concat()
        .lines()
        .filter_map(|l| l.strip_prefix("id: "))
        .map(|v| v.parse().unwrap())
        .collect();
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    assert_eq!(ids, sorted, "in order");
    assert!(!chunks.concat().contains("reset"));
}

#[tokio::test]
async fn streams_past_the_cap_are_refused_until_one_ends() {
    let gauge = IntGauge::new("streams", "open").unwrap();
    let streams = Streams::new(2);
    let a = streams.open(&gauge).unwrap();
    let b = streams.open(&gauge).unwrap();
    assert!(streams.open(&gauge).is_none());
    assert_eq!(gauge.get(), 2);
    // The body holds the place: dropping it gives it back.
    let (_tx, feed) = broadcast::channel(1);
    let sub = Subscription {
        replay: Some(Vec::new()),
        feed,
    };
    let stopping = tokio::sync::watch::channel(false).1;
    let body = event_stream(
        sub,
        Filter::default(),
        true,
        bounds(BUFFER),
        stopping,
        Some(a),
    );
    assert!(streams.open(&gauge).is_none());
    drop(body);
    assert_eq!(gauge.get(), 1);
    let c = streams.open(&gauge).unwrap();
    drop((b, c));
    assert_eq!(gauge.get(), 0);
}

#[test]
fn resume_points_come_from_since_or_a_well_formed_header() {
    let p = |q: Option<&str>, h: Option<&[u8]>| parse_request(q, h).map(|(_, s)| s);
    assert_eq!(p(Some("since=7"), None), Ok(Some(7)));
    assert_eq!(p(Some("since=7"), Some(b"9")), Ok(Some(7)));
    assert_eq!(p(None, Some(b" 9 ")), Ok(Some(9)));
    assert_eq!(p(None, Some(b"nine")), Ok(None));
    assert_eq!(p(None, Some(b"18446744073709551616")), Ok(None));
    for bad in [
        "since=",
        "since=-1",
        "since=+1",
        "since=1&since=1",
        "since=%201",
    ] {
        assert!(p(Some(bad), None).is_err(), "{bad}");
    }
}

/// After `history` events were dropped on their way to the feed, every stream that
/// shows history gets `reset` and ends, whatever its filter; a stream without the
/// read token saw no history and goes on; no resume reaches back before it.
#[tokio::test(start_paused = true)]
async fn a_history_reset_ends_the_streams_that_show_history() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _instances) =
        crate::store::Store::open(dir.path(), crate::store::Rules::defaults()).unwrap();
    let before = store.index();
    let stopping = tokio::sync::watch::channel(false).1;
    let filtered = Filter {
        zone: Some("other".into()),
        cluster: Some("c".into()),
    };
    let reader = event_stream(
        store.changes().subscribe(None),
        filtered,
        true,
        bounds(BUFFER),
        stopping.clone(),
        None,
    );
    let anonymous = event_stream(
        store.changes().subscribe(None),
        Filter::default(),
        false,
        bounds(BUFFER),
        stopping,
        None,
    );
    store.changes().reset_private_streams();
    let mut reader = std::pin::pin!(reader);
    assert_eq!(text(reader.next().await), "event: reset\ndata: {}\n\n");
    assert!(reader.next().await.is_none(), "closed after reset");
    let mut anonymous = std::pin::pin!(anonymous);
    let t0 = Instant::now();
    assert_eq!(text(anonymous.next().await), ":\n\n");
    assert_eq!(Instant::now(), t0 + BEAT, "nothing but the heartbeat");
    assert!(store.changes().subscribe(Some(before)).replay.is_none());
    assert!(
        store
            .changes()
            .subscribe(Some(store.index()))
            .replay
            .is_some()
    );
}
