//! One agent connection: handshake, hello and authentication on the control stream,
//! then commands out and replies in on that stream while each report arrives on a
//! stream of its own, validated and handed to the sink.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use meshcat_common::tls;
use meshcat_common::transport::{TransportError, code, read_frame, write_frame};
use meshcat_common::validate::{is_valid_instance, is_valid_name};
use meshcat_common::wire::{
    AgentMessage, Hello, InstanceReport, RefusedInstance, Report, STALE_BASE, ServerMessage,
    WireError,
};
use rustls_pki_types::CertificateDer;
use tokio::sync::mpsc;
use tracing::{Instrument, Span, debug, info, info_span, warn};

use super::agents::{Session, lock};
use super::auth::{ZoneGrant, cert_grant, digest};
use super::{InstanceSize, MAX_HELLO, Shared};

/// Which credential authenticated a connection: the SHA-256 of the agent certificate
/// or of the hello token. A session is keyed by its credential and agent id.
pub(super) type Credential = [u8; 32];

/// Commands queued for one agent's control stream before callers wait.
const COMMAND_QUEUE: usize = 16;

/// Counts a connection as awaiting authentication until dropped.
struct Pending<'a>(&'a Shared);

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::Relaxed);
        self.0.metrics.pending_connections.dec();
    }
}

/// Counts a connection against `max_connections` until dropped.
struct Open<'a>(&'a Shared);

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts a connection against its credential's bound until dropped.
struct CredentialConnection<'a>(&'a Shared, Credential);

impl Drop for CredentialConnection<'_> {
    fn drop(&mut self) {
        self.0.budgets.disconnect(self.1);
    }
}

/// Counts a report stream against its credential's bound until dropped.
struct CredentialStream<'a>(&'a Shared, Credential);

impl Drop for CredentialStream<'_> {
    fn drop(&mut self) {
        self.0.budgets.close_stream(self.1);
    }
}

/// Serves one incoming connection until it closes. The caller has counted it as
/// pending.
pub(super) async fn serve(incoming: quinn::Incoming, shared: Arc<Shared>) {
    let span = info_span!(
        "connection",
        remote = %incoming.remote_address(),
        agent = tracing::field::Empty
    );
    serve_inner(incoming, shared).instrument(span).await;
}

/// An agent that said a valid hello: who it is, what it may report, and its control
/// stream, still to be answered.
struct Greeted {
    hello: Hello,
    grant: ZoneGrant,
    credential: Credential,
    send: quinn::SendStream,
    recv: quinn::RecvStream,
}

/// The handshake and the hello, under one deadline; `None` when the connection was
/// refused or ended.
async fn authenticate_connection(
    incoming: quinn::Incoming,
    shared: &Shared,
) -> Option<(quinn::Connection, Greeted)> {
    let deadline = tokio::time::Instant::now() + shared.hello_timeout;
    let conn = match tokio::time::timeout_at(deadline, incoming).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => {
            debug!(error = %e, "Handshake failed.");
            shared.metrics.rejected("handshake");
            return None;
        }
        Err(_) => {
            shared.metrics.rejected("hello_timeout");
            shared.refusals.warn(|suppressed| {
                warn!(
                    reason = "hello_timeout",
                    suppressed, "Agent refused: no handshake in time."
                );
            });
            return None;
        }
    };
    let greeted = greet(&conn, shared, deadline).await?;
    Some((conn, greeted))
}

async fn serve_inner(incoming: quinn::Incoming, shared: Arc<Shared>) {
    shared.metrics.pending_connections.inc();
    let pending = Pending(&shared);
    // Boxed, here and for the refusals below: a task's memory is its largest state,
    // and the handshake's (TLS, hello deadline) would otherwise be kept for the whole
    // life of every connection.
    let Some((
        conn,
        Greeted {
            hello,
            grant,
            credential,
            send,
            recv,
        },
    )) = Box::pin(authenticate_connection(incoming, &shared)).await
    else {
        return;
    };
    drop(pending);
    // One credential holds at most its share of the connection slots.
    let replacing = shared.agents.replaces(&hello.agent_id, &credential);
    if !shared.budgets.connect(credential, replacing) {
        shared.metrics.rejected("too_many_credential_connections");
        shared.refusals.warn(|suppressed| {
            warn!(
                max_connections_per_credential = shared.budgets.limits().connections,
                suppressed, "Agent refused: its credential holds its bound of connections."
            );
        });
        Box::pin(refuse_hello(
            &conn,
            send,
            &shared,
            "too many connections with this agent credential".to_owned(),
        ))
        .await;
        return;
    }
    let _counted = CredentialConnection(&shared, credential);
    // Only authenticated connections count against the connection limit.
    if shared.open.fetch_add(1, Ordering::Relaxed) >= shared.max_connections {
        shared.open.fetch_sub(1, Ordering::Relaxed);
        shared.metrics.rejected("too_many_connections");
        shared.refusals.warn(|suppressed| {
            warn!(
                max_connections = shared.max_connections,
                suppressed, "Agent refused: too many agents."
            );
        });
        Box::pin(refuse_hello(
            &conn,
            send,
            &shared,
            "too many agents connected".to_owned(),
        ))
        .await;
        return;
    }
    let _open = Open(&shared);
    serve_agent(conn, hello, grant, credential, send, recv, &shared).await;
}

async fn serve_agent(
    conn: quinn::Connection,
    hello: Hello,
    grant: ZoneGrant,
    credential: Credential,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    shared: &Arc<Shared>,
) {
    let agent_id = hello.agent_id;
    Span::current().record("agent", agent_id.as_str());

    let (commands_tx, mut commands_rx) = mpsc::channel(COMMAND_QUEUE);
    let session = shared
        .agents
        .connect(&agent_id, credential, conn.clone(), commands_tx);
    // Authenticated: the agent may now send reports (see `tls::PRE_AUTH_STREAMS`).
    conn.set_receive_window(quinn::VarInt::MAX);
    conn.set_max_concurrent_bi_streams(tls::AGENT_STREAMS.into());
    let welcome = ServerMessage::Welcome {
        server_version: env!("CARGO_PKG_VERSION").to_owned(),
    };
    if let Err(e) = Box::pin(write_frame(&mut send, &welcome, shared.max_message)).await {
        debug!(error = %e, "Welcome not sent.");
        if shared.agents.disconnect(&session) {
            shared.sink.agent_gone(&session.key);
        }
        return;
    }
    shared.metrics.agents_connected.inc();
    info!(version = %hello.agent_version, "Agent connected.");

    let max_message = shared.max_message;
    let writer = tokio::spawn(
        async move {
            while let Some(request) = commands_rx.recv().await {
                let msg = ServerMessage::Command(*request);
                if let Err(e) = write_frame(&mut send, &msg, max_message).await {
                    debug!(error = %e, "Command not sent.");
                    break;
                }
            }
            let _ = send.finish();
        }
        .in_current_span(),
    );
    let reports = tokio::spawn(
        accept_reports(conn.clone(), shared.clone(), session.clone(), grant).in_current_span(),
    );

    // The control stream is read here alone, never raced against anything else, so a
    // frame is never abandoned half-read.
    let goodbye = loop {
        match read_frame::<AgentMessage>(&mut recv, shared.max_message).await {
            Ok(Some(AgentMessage::CommandReply(reply))) => session.resolve(reply),
            Ok(Some(AgentMessage::Goodbye)) => break true,
            Ok(Some(other)) => {
                warn!(
                    message = message_name(&other),
                    "Unexpected message on the control stream; closing."
                );
                shared.metrics.rejected("unexpected_message");
                conn.close(code::PROTOCOL.into(), b"unexpected message");
                break false;
            }
            Ok(None) => break false,
            Err(e) => {
                if matches!(e, TransportError::Wire(_) | TransportError::Truncated) {
                    warn!(error = %e, "Bad frame on the control stream; closing.");
                    shared.metrics.rejected(e.reason());
                    conn.close(code::PROTOCOL.into(), b"bad frame on the control stream");
                } else {
                    debug!(error = %e, "Control stream ended.");
                }
                break false;
            }
        }
    };
    if goodbye {
        conn.close(code::OK.into(), b"goodbye");
    }
    reports.abort();
    writer.abort();
    // Released before the connection stops counting as connected, so whoever sees
    // it gone sees its instances given back too.
    release_instances(shared, &session);
    shared.metrics.agents_connected.dec();
    if shared.agents.disconnect(&session) {
        shared.sink.agent_gone(&session.key);
    }
    info!(goodbye, "Agent disconnected.");
}

/// Takes the control stream and the hello, and authenticates the agent. Refusals are
/// answered, counted and the connection closed; the welcome is the caller's to send.
async fn greet(
    conn: &quinn::Connection,
    shared: &Shared,
    deadline: tokio::time::Instant,
) -> Option<Greeted> {
    let refuse = |reason: &'static str, why: &str| {
        shared.metrics.rejected(reason);
        shared.refusals.warn(|suppressed| {
            warn!(reason, detail = why, suppressed, "Agent refused.");
        });
    };
    let stream = tokio::time::timeout_at(deadline, conn.accept_bi()).await;
    let (send, mut recv) = match stream {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            debug!(error = %e, "Connection closed before its hello.");
            return None;
        }
        Err(_) => {
            refuse("hello_timeout", "no control stream in time");
            conn.close(code::PROTOCOL.into(), b"no hello");
            return None;
        }
    };
    // Before authentication a peer may send its hello and nothing bigger.
    let first = tokio::time::timeout_at(
        deadline,
        read_frame::<AgentMessage>(&mut recv, MAX_HELLO.min(shared.max_message)),
    )
    .await;
    let rejection = match first {
        Ok(Ok(Some(AgentMessage::Hello(hello)))) => {
            if !is_valid_name(&hello.agent_id) {
                refuse("invalid_name", "agent id is not a valid name");
                "agent id must be 1 to 253 characters of [A-Za-z0-9._-]".to_owned()
            } else {
                match authenticate(conn, shared, &hello) {
                    Some((grant, credential)) => {
                        return Some(Greeted {
                            hello,
                            grant,
                            credential,
                            send,
                            recv,
                        });
                    }
                    None => {
                        refuse("auth", "no valid agent certificate or token");
                        "authentication failed".to_owned()
                    }
                }
            }
        }
        Ok(Ok(Some(_))) => {
            refuse("unexpected_message", "the first message was not a hello");
            "the first message must be a hello".to_owned()
        }
        Ok(Ok(None)) => return None,
        Ok(Err(e)) => {
            refuse(e.reason(), &e.to_string());
            e.to_string()
        }
        Err(_) => {
            refuse("hello_timeout", "no hello in time");
            "no hello in time".to_owned()
        }
    };
    refuse_hello(conn, send, shared, rejection).await;
    None
}

/// Answers a hello with a refusal and closes the connection.
async fn refuse_hello(
    conn: &quinn::Connection,
    mut send: quinn::SendStream,
    shared: &Shared,
    reason: String,
) {
    let msg = ServerMessage::Rejected { reason };
    let _ = write_frame(&mut send, &msg, shared.max_message).await;
    let _ = send.finish();
    // Give the refusal a moment to leave before the close overtakes it.
    let _ = tokio::time::timeout(std::time::Duration::from_millis(500), send.stopped()).await;
    conn.close(code::REFUSED.into(), b"refused");
}

/// A verified agent certificate authenticates on its own; otherwise the hello token must
/// match one of the configured tokens. Answers the grant and the credential.
fn authenticate(
    conn: &quinn::Connection,
    shared: &Shared,
    hello: &Hello,
) -> Option<(ZoneGrant, Credential)> {
    if shared.auth.certificates {
        let cert = conn
            .peer_identity()
            .and_then(|id| id.downcast::<Vec<CertificateDer<'static>>>().ok())
            .and_then(|chain| chain.first().cloned());
        if let Some(cert) = cert {
            // rustls has verified the chain against the agent CA during the handshake.
            return cert_grant(&cert, shared.auth.any_zone_cert)
                .map(|grant| (grant, digest(cert.as_ref())));
        }
    }
    let token = hello.token.as_deref()?;
    let grant = shared.auth.token_grant(token)?;
    // Told apart from certificate digests by the prefix.
    let credential = digest(&[b"token:".as_slice(), token.as_bytes()].concat());
    Some((grant, credential))
}

async fn accept_reports(
    conn: quinn::Connection,
    shared: Arc<Shared>,
    session: Arc<Session>,
    grant: ZoneGrant,
) {
    let grant = Arc::new(grant);
    while let Ok((send, recv)) = conn.accept_bi().await {
        let (shared, session, grant) = (shared.clone(), session.clone(), grant.clone());
        tokio::spawn(
            async move { handle_report(send, recv, &shared, &session, &grant).await }
                .in_current_span(),
        );
    }
}

/// Reads one report from its own stream, answers accepted or rejected, and finishes.
async fn handle_report(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    shared: &Shared,
    session: &Arc<Session>,
    grant: &ZoneGrant,
) {
    let _stream = if shared.budgets.open_stream(session.credential) {
        CredentialStream(shared, session.credential)
    } else {
        let _ = recv.stop(code::REFUSED.into());
        let reason = "too_many_credential_streams";
        shared.metrics.rejected(reason);
        shared.refusals.warn(|suppressed| {
            warn!(
                reason,
                suppressed,
                "Report refused: its credential has its bound of report streams in flight."
            );
        });
        let reply = ServerMessage::Rejected {
            reason: "too many report streams in flight with this agent credential".to_owned(),
        };
        if write_frame(&mut send, &reply, shared.max_message)
            .await
            .is_ok()
        {
            let _ = send.finish();
        }
        return;
    };
    let outcome = match read_frame::<AgentMessage>(&mut recv, shared.max_message).await {
        Ok(Some(AgentMessage::Report(report))) => accept(report, shared, session, grant),
        Ok(Some(other)) => Err((
            "unexpected_message",
            format!("a report stream carried {}", message_name(&other)),
        )),
        Ok(None) => Err(("truncated", "the report stream was empty".to_owned())),
        Err(e) => {
            if matches!(e, TransportError::Wire(WireError::TooLarge { .. })) {
                // Do not let the agent push the rest of an oversized body.
                let _ = recv.stop(code::TOO_LARGE.into());
            }
            Err((e.reason(), e.to_string()))
        }
    };
    let reply = match outcome {
        Ok((instances, refused)) => ServerMessage::ReportAccepted { instances, refused },
        Err((reason, why)) => {
            shared.metrics.rejected(reason);
            shared.refusals.warn(|suppressed| {
                warn!(reason, error = %why, suppressed, "Report rejected.");
            });
            ServerMessage::Rejected { reason: why }
        }
    };
    if write_frame(&mut send, &reply, shared.max_message)
        .await
        .is_ok()
    {
        let _ = send.finish();
    }
}

/// Checks each instance of a report, then hands the valid ones to the sink. An
/// instance over a bound or with a bad name is refused alone, with its reason; the
/// rest of the report applies, so no sidecar, however large or hostile, takes the
/// other instances of its agent down with it.
fn accept(
    report: Report,
    shared: &Shared,
    session: &Arc<Session>,
    grant: &ZoneGrant,
) -> Result<(u32, Vec<RefusedInstance>), (&'static str, String)> {
    if report.instances.len() > shared.max_instances {
        return Err((
            "too_many_instances",
            format!(
                "{} instances is over the limit of {}",
                report.instances.len(),
                shared.max_instances
            ),
        ));
    }
    let mut refused = Vec::new();
    let mut valid = Vec::with_capacity(report.instances.len());
    for mut inst in report.instances {
        match check_instance(&inst, shared, grant) {
            Ok(()) => {
                bound_identity(&mut inst, shared);
                valid.push(inst);
            }
            Err((reason, why)) => {
                refuse_instance(shared, reason, &why);
                refused.push(RefusedInstance {
                    zone_name: inst.zone_name,
                    cluster_name: inst.cluster_name,
                    instance: inst.instance,
                    reason: reason.to_owned(),
                });
            }
        }
    }
    let applied = admit_and_apply(valid, shared, session, &mut refused)?;
    shared.metrics.reports_received.inc();
    shared.metrics.instances_reported.inc_by(applied as u64);
    Ok((applied as u32, refused))
}

/// Counts and logs (rate-limited) one refused instance.
fn refuse_instance(shared: &Shared, reason: &'static str, why: &str) {
    shared.metrics.rejected(reason);
    shared.refusals.warn(|suppressed| {
        warn!(reason, error = %why, suppressed, "Instance refused; the rest of its report applies.");
    });
}

/// Holds an instance's identity to its bounds (contract section 19): certificates
/// over a bound are refused alone, counted and logged, and the instance is kept
/// with identity `none` and the reason; the instance itself applies.
fn bound_identity(inst: &mut InstanceReport, shared: &Shared) {
    let Some(identity) = inst.identity.take() else {
        return;
    };
    let max_expectations =
        usize::try_from(shared.bounds.max_upstream_clusters).unwrap_or(usize::MAX);
    inst.identity = Some(match identity.over_bound(max_expectations) {
        None => identity,
        Some(reason) => {
            shared.metrics.rejected(reason);
            shared.refusals.warn(|suppressed| {
                warn!(reason, zone = %inst.zone_name, cluster = %inst.cluster_name, instance = %inst.instance, suppressed, "Instance certificates refused; the instance is kept with identity none.");
            });
            identity.refusing(reason, max_expectations)
        }
    });
}

/// Whether one instance of a report may be applied: its names, its zone, and its
/// size against the per-instance bounds.
fn check_instance(
    inst: &InstanceReport,
    shared: &Shared,
    grant: &ZoneGrant,
) -> Result<(), (&'static str, String)> {
    for (field, value, ok) in [
        ("zone", &inst.zone_name, is_valid_name(&inst.zone_name)),
        (
            "cluster",
            &inst.cluster_name,
            is_valid_name(&inst.cluster_name),
        ),
        (
            "instance",
            &inst.instance,
            is_valid_instance(&inst.instance),
        ),
    ] {
        if !ok {
            return Err((
                "invalid_name",
                format!("{field} name {value:?} is not valid"),
            ));
        }
    }
    if !grant.allows(&inst.zone_name) {
        return Err((
            "forbidden_zone",
            format!("this agent may not report for zone {:?}", inst.zone_name),
        ));
    }
    // A delta's parts are counted as sent here; what the instance keeps once the
    // delta is applied is held to the same bounds where it is kept.
    shared
        .bounds
        .check(&InstanceSize::sent(inst))
        .map_err(|over| {
            (
                over.reason(),
                format!("instance {:?} reports {over}", inst.instance),
            )
        })
}

/// Counts the report's instances that are new to this connection against its
/// credential's budget (how many it holds, how fast it creates them), refuses
/// those past it, and applies the rest. An instance counts from its first report
/// on the connection until it goes unreported for the instance TTL (when the
/// catalog drops it too) or the connection ends, so an agent that rotates names
/// spends its budget. Runs under the connection's count lock, so a report is never
/// applied after the connection ended and its instances were given back.
fn admit_and_apply(
    mut instances: Vec<InstanceReport>,
    shared: &Shared,
    session: &Session,
    refused: &mut Vec<RefusedInstance>,
) -> Result<usize, (&'static str, String)> {
    use std::hash::BuildHasher;
    let now = Instant::now();
    let mut reported = lock(&session.reported);
    if reported.closed {
        return Err(("closed", "the connection has ended".to_owned()));
    }
    let expired = reported.prune(now, shared.instance_ttl);
    shared.budgets.release(session.credential, expired);
    let key_of = |zone: &str, cluster: &str, instance: &str| {
        session.reported_keys.hash_one((zone, cluster, instance))
    };
    let keys: Vec<u64> = instances
        .iter()
        .map(|i| key_of(&i.zone_name, &i.cluster_name, &i.instance))
        .collect();
    let fresh: Vec<usize> = (0..keys.len())
        .filter(|&i| !reported.keys.contains_key(&keys[i]))
        .collect();
    let (granted, short) = shared.budgets.create(session.credential, fresh.len(), now);
    // The fresh instances past the grant are refused, the last first.
    let mut denied = std::collections::HashSet::new();
    if let Some(short) = short {
        denied.extend(fresh[granted..].iter().copied());
        let limits = shared.budgets.limits();
        shared.refusals.warn(|suppressed| {
            warn!(
                reason = short.reason(),
                refused = fresh.len() - granted,
                max_instances_per_credential = limits.instances,
                max_new_instances_per_minute = limits.new_per_minute,
                suppressed,
                "New instances refused: their credential is at its bound."
            );
        });
    }
    let mut kept = Vec::with_capacity(instances.len());
    for (i, inst) in instances.drain(..).enumerate() {
        if denied.contains(&i) {
            if let Some(short) = short {
                shared.metrics.rejected(short.reason());
                refused.push(RefusedInstance {
                    zone_name: inst.zone_name,
                    cluster_name: inst.cluster_name,
                    instance: inst.instance,
                    reason: short.reason().to_owned(),
                });
            }
            continue;
        }
        reported.keys.insert(keys[i], now);
        kept.push(inst);
    }
    let n = kept.len();
    let may_take = |holder: &str| shared.agents.may_take(session, holder);
    let sunk = shared
        .sink
        .apply_report(&session.key, kept, now, &may_take, &shared.bounds);
    let mut given_back = 0;
    for r in &sunk {
        // An instance that is not this connection's does not count against its
        // credential; the next report may claim it again once it is free. One the
        // catalog still holds for it, or whose delta had a stale base (the agent
        // sends the whole state next), stays counted.
        if !r.kept
            && reported
                .keys
                .remove(&key_of(&r.key.zone, &r.key.cluster, &r.key.instance))
                .is_some()
        {
            given_back += 1;
        }
        shared.metrics.rejected(r.reason);
    }
    shared.budgets.release(session.credential, given_back);
    if let Some(first) = sunk.iter().find(|r| r.reason != STALE_BASE) {
        shared.refusals.warn(|suppressed| {
            let held = first.over.map(|o| o.to_string());
            warn!(
                reason = first.reason,
                refused = sunk.len(),
                zone = %first.key.zone,
                cluster = %first.key.cluster,
                instance = %first.key.instance,
                held,
                suppressed,
                "Instances refused by the catalog."
            );
        });
    }
    let applied = n - sunk.len();
    refused.extend(sunk.into_iter().map(|r| RefusedInstance {
        zone_name: r.key.zone,
        cluster_name: r.key.cluster,
        instance: r.key.instance,
        reason: r.reason.to_owned(),
    }));
    Ok(applied)
}

/// Gives a finished connection's instances back to its credential's bound, and
/// closes it to reports still in flight.
fn release_instances(shared: &Shared, session: &Session) {
    let mut reported = lock(&session.reported);
    reported.closed = true;
    let n = std::mem::take(&mut reported.keys).len();
    shared.budgets.release(session.credential, n);
}

fn message_name(m: &AgentMessage) -> &'static str {
    match m {
        AgentMessage::Hello(_) => "hello",
        AgentMessage::Report(_) => "report",
        AgentMessage::CommandReply(_) => "command_reply",
        AgentMessage::Goodbye => "goodbye",
    }
}
