//! One zone's shared state: its status (the link, the responses refused per type,
//! the versions ACKed, the counts) and its last good view, written by the zone's
//! stream task and read by [`super::Controls`]. Every change of state is sent on
//! the change feed and mirrored in the metrics under the one lock, in order; a
//! zone that was replaced or removed ([`Zone::retire`]) takes no more writes, so a
//! stream task still winding down cannot bring back what was taken away.

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::broadcast;

use super::decode::Kind;
use super::failure::Failure;
use super::metrics::{ControlMetrics, OTHER_TYPE};
use super::view::ZoneView;
use super::{ControlChange, ControlState, ControlStatus};

/// The slot of [`ZoneState::refused`] for a response of no known type.
const OTHER: usize = 4;

/// Where the zone's stream stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Link {
    /// No attempt of this configuration has succeeded or failed yet.
    Connecting,
    /// The stream has had a response.
    Up,
    /// The last attempt failed this way; retrying.
    Down(Failure),
    /// Between attempts after a refused response ended the stream.
    Idle,
}

#[derive(Debug)]
struct ZoneState {
    /// False once the zone was replaced or removed.
    live: bool,
    disabled: bool,
    link: Link,
    /// Per type (and [`OTHER`]) the reason its last response was refused, with a
    /// sequence number so the newest is the one shown.
    refused: [Option<(u64, String)>; 5],
    seq: u64,
    status: ControlStatus,
    view: Option<Arc<ZoneView>>,
}

/// One zone, shared by its stream task and the readers.
#[derive(Debug)]
pub struct Zone {
    pub name: String,
    state: Mutex<ZoneState>,
    changes: broadcast::Sender<ControlChange>,
    metrics: ControlMetrics,
}

impl Zone {
    /// A zone connecting to `server_address` (or `disabled`), starting from `view`.
    pub fn new(
        name: &str,
        server_address: &str,
        disabled: bool,
        view: Option<Arc<ZoneView>>,
        changes: broadcast::Sender<ControlChange>,
        metrics: ControlMetrics,
    ) -> Zone {
        let state = if disabled {
            ControlState::Disabled
        } else {
            ControlState::Connecting
        };
        let mut status = ControlStatus::empty(name, server_address, state);
        if let Some(v) = &view {
            set_counts(&mut status, v);
        }
        let zone = Zone {
            name: name.to_owned(),
            state: Mutex::new(ZoneState {
                live: true,
                disabled,
                link: Link::Connecting,
                refused: Default::default(),
                seq: 0,
                status,
                view,
            }),
            changes,
            metrics,
        };
        {
            let st = zone.lock();
            // A disabled zone has no connection to count: no series, so that an
            // alert on a zero cannot fire for it.
            if !disabled {
                zone.metrics.connected.with_label_values(&[name]).set(0);
            }
            zone.metrics.held(name, counts(&st.status));
        }
        zone
    }

    fn lock(&self) -> MutexGuard<'_, ZoneState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The zone's status now.
    pub fn status(&self) -> ControlStatus {
        self.lock().status.clone()
    }

    /// The last good view.
    pub fn view(&self) -> Option<Arc<ZoneView>> {
        self.lock().view.clone()
    }

    /// The state it was in; no more writes are taken.
    pub fn retire(&self) -> ControlState {
        let mut st = self.lock();
        st.live = false;
        st.status.state
    }

    /// The stream had its first response; it speaks `protocol` (`delta`, `sotw`).
    pub fn up(&self, now_ms: i64, protocol: &str) {
        self.write(|st, m, zone| {
            st.link = Link::Up;
            st.status.connected_since_ms = Some(now_ms);
            protocol.clone_into(&mut st.status.protocol);
            m.connected.with_label_values(&[zone]).set(1);
        });
    }

    /// The stream ended or could not be opened.
    pub fn down(&self, failure: Failure) {
        self.write(|st, m, zone| {
            st.status.connected_since_ms = None;
            st.status.protocol.clear();
            m.connected.with_label_values(&[zone]).set(0);
            if failure.state == ControlState::Rejected {
                m.response(zone, OTHER_TYPE, false);
                st.seq += 1;
                st.refused[OTHER] = Some((st.seq, failure.error));
                st.link = Link::Idle;
            } else {
                st.link = Link::Down(failure);
            }
        });
    }

    /// A response of `kind` was ACKed: its version, and the view it made.
    pub fn accepted(&self, kind: Kind, version: &str, view: Arc<ZoneView>, now_ms: i64) {
        let sent = self.write(|st, m, zone| {
            m.response(zone, kind.label(), true);
            *st.status.versions.slot(kind) = version.to_owned();
            st.refused[kind.index()] = None;
            st.refused[OTHER] = None;
            st.status.last_update_ms = Some(now_ms);
            set_counts(&mut st.status, &view);
            m.held(zone, counts(&st.status));
            st.view = Some(view);
        });
        if sent {
            let _ = self.changes.send(ControlChange::View {
                zone: self.name.clone(),
            });
        }
    }

    /// A response was NACKed (`kind` `None`: of no known type), for `reason`.
    pub fn refused(&self, kind: Option<Kind>, reason: String) {
        self.write(|st, m, zone| {
            m.response(zone, kind.map_or(OTHER_TYPE, Kind::label), false);
            st.seq += 1;
            st.refused[kind.map_or(OTHER, Kind::index)] = Some((st.seq, reason));
        });
    }

    /// Applies `f` to a live zone, then sets the state and error it implies, sending
    /// a [`ControlChange::State`] when the state moved. False for a retired zone.
    fn write(&self, f: impl FnOnce(&mut ZoneState, &ControlMetrics, &str)) -> bool {
        let mut st = self.lock();
        if !st.live {
            return false;
        }
        f(&mut st, &self.metrics, &self.name);
        let (state, error) = derive(&st);
        let from = st.status.state;
        st.status.state = state;
        st.status.error = error;
        if from != state {
            let _ = self.changes.send(ControlChange::State {
                zone: self.name.clone(),
                from,
                to: state,
                error: st.status.error.clone(),
            });
        }
        true
    }
}

/// The state and error a zone's link and refusals make.
fn derive(st: &ZoneState) -> (ControlState, String) {
    if st.disabled {
        return (ControlState::Disabled, String::new());
    }
    if let Link::Down(f) = &st.link {
        return (f.state, f.error.clone());
    }
    if let Some((_, reason)) = st.refused.iter().flatten().max_by_key(|(seq, _)| *seq) {
        return (ControlState::Rejected, reason.clone());
    }
    match st.link {
        Link::Up => (ControlState::Connected, String::new()),
        _ => (ControlState::Connecting, String::new()),
    }
}

fn set_counts(status: &mut ControlStatus, view: &ZoneView) {
    status.clusters = view.clusters.len();
    status.endpoints = view.endpoint_count();
    status.listeners = view.listeners;
    status.routes = view.routes;
}

fn counts(status: &ControlStatus) -> [usize; 4] {
    [
        status.clusters,
        status.endpoints,
        status.listeners,
        status.routes,
    ]
}
