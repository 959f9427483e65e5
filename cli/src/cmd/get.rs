//! `meshcat get clusters|zones|cluster`: the API's lists as tables, or as the API
//! answers them (`-o json|yaml`). The zones' table adds each zone's control state,
//! read from `GET /zones/{z}/control` (contract section 17) a few zones at a time.

use std::collections::HashMap;
use std::io::Write;

use serde_json::Value;

use super::{Ctx, emit};
use crate::args::{Format, GetWhat};
use crate::client::{Call, CliError};
use crate::control;
use crate::render::{self, Cell, Table, or_dash, s};

pub async fn run(ctx: &Ctx, what: GetWhat, out: &mut dyn Write) -> Result<(), CliError> {
    let (answer, format, clusters) = match what {
        GetWhat::Clusters {
            zone,
            status,
            owner,
            output,
        } => {
            let call = Call::new(&["clusters"])
                .q_opt("zoneName", zone)
                .q_opt("status", status.map(|s| s.as_str()))
                .q_opt("owner", owner);
            (ctx.api.get(&call).await?, output.output, true)
        }
        GetWhat::Zones { output } => (
            ctx.api.get(&Call::new(&["zones"])).await?,
            output.output,
            false,
        ),
        GetWhat::Cluster { name, zone, output } => {
            let call = Call::new(&["clusters", &name]).q_opt("zoneName", zone);
            (ctx.api.get(&call).await?, output.output, true)
        }
    };
    let text = match format {
        Format::Table if clusters => clusters_table(&answer).render(ctx.width),
        Format::Table => zones_table(&answer, &controls(ctx, &answer).await).render(ctx.width),
        f => render::data(&answer, f)?,
    };
    emit(out, &text)
}

/// Each listed zone's control state, by zone name. A zone whose state cannot be read
/// is left out (its cell shows `-`): an aggregator without the route answers 404,
/// a caller without the read token gets 403 (live data) or 401 (a token it does not
/// know), and a zone deleted since the list was read is unknown. Another failure is said on standard error.
async fn controls(ctx: &Ctx, zones: &Value) -> HashMap<String, String> {
    let names: Vec<String> = zones
        .as_array()
        .into_iter()
        .flatten()
        .map(|z| s(z, "zoneName").to_owned())
        .collect();
    let answers = control::read_controls(&ctx.api, &names).await;
    let mut states = HashMap::new();
    for (zone, answer) in names.into_iter().zip(answers) {
        match answer {
            Ok(c) => {
                states.insert(zone, c.state);
            }
            Err(e) if matches!(e.status(), Some(401 | 403 | 404 | 405)) => {}
            Err(e) => eprintln!(
                "meshcat: the control state of zone {}: {}",
                render::clean(&zone),
                render::clean(&e.to_string())
            ),
        }
    }
    states
}

/// `ZONE CLUSTER OWNER STATUS INSTANCES VERSION`, one row per cluster view. A
/// caller who may not see live data gets `-` for the instances, not a false 0.
pub fn clusters_table(list: &Value) -> Table {
    let mut t = Table::new(&["ZONE", "CLUSTER", "OWNER", "STATUS", "INSTANCES", "VERSION"]);
    for c in list.as_array().into_iter().flatten() {
        let status = s(c, "status");
        let instances = if c["authorized"] == Value::Bool(false) {
            "-".to_owned()
        } else {
            c["instances"].as_array().map_or(0, Vec::len).to_string()
        };
        t.row(vec![
            s(c, "zoneName").into(),
            s(c, "clusterName").into(),
            or_dash(s(c, "owner")).into(),
            Cell::styled(status, render::status_style(status)),
            instances.into(),
            or_dash(s(c, "version")).into(),
        ]);
    }
    t
}

/// `ZONE SERVER-ADDRESS REQUEST-CLUSTER TLS CONTROL`: `CONTROL` is the zone's
/// control state from `control` (zone name to state), `-` for a zone without one.
pub fn zones_table(list: &Value, control: &HashMap<String, String>) -> Table {
    let mut t = Table::new(&[
        "ZONE",
        "SERVER-ADDRESS",
        "REQUEST-CLUSTER",
        "TLS",
        "CONTROL",
    ]);
    for z in list.as_array().into_iter().flatten() {
        let state = control.get(s(z, "zoneName")).map_or("-", String::as_str);
        t.row(vec![
            s(z, "zoneName").into(),
            s(z, "serverAddress").into(),
            or_dash(s(z, "requestCluster")).into(),
            if z["useTls"] == Value::Bool(true) {
                "yes"
            } else {
                "no"
            }
            .into(),
            Cell::styled(or_dash(state), render::control_style(state)),
        ]);
    }
    t
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn plain(t: &Table) -> String {
        anstream::adapter::strip_str(&t.render(None)).to_string()
    }

    #[test]
    fn cluster_rows() {
        let list = json!([
            {"zoneName": "local", "clusterName": "catalog", "owner": "team-catalog",
             "status": "stable", "authorized": true, "version": "1.4.2",
             "instances": [{"name": "catalog-0", "startTime": 1}]},
            {"zoneName": "local", "clusterName": "ledger", "owner": "",
             "status": "down", "authorized": false, "version": "", "instances": []},
        ]);
        assert_eq!(
            plain(&clusters_table(&list)),
            "ZONE    CLUSTER   OWNER          STATUS   INSTANCES   VERSION\n\
             local   catalog   team-catalog   stable   1           1.4.2\n\
             local   ledger    -              down     -           -\n"
        );
    }

    #[test]
    fn zone_rows() {
        let list = json!([
            {"zoneName": "local", "serverAddress": "cp:50000", "requestCluster": "edge", "useTls": false},
            {"zoneName": "west", "serverAddress": "istiod.west:15010", "requestCluster": "", "useTls": true},
            {"zoneName": "old", "serverAddress": "cp.old:50000", "requestCluster": "", "useTls": false},
        ]);
        let states = HashMap::from([
            ("local".to_owned(), "connected".to_owned()),
            ("west".to_owned(), "tls-error".to_owned()),
        ]);
        assert_eq!(
            plain(&zones_table(&list, &states)),
            "ZONE    SERVER-ADDRESS      REQUEST-CLUSTER   TLS   CONTROL\n\
             local   cp:50000            edge              no    connected\n\
             west    istiod.west:15010   -                 yes   tls-error\n\
             old     cp.old:50000        -                 no    -\n"
        );
        let coloured = zones_table(&list, &states).render(None);
        assert!(coloured.contains("\u{1b}[31mtls-error"), "{coloured:?}");
        assert!(coloured.contains("\u{1b}[32mconnected"), "{coloured:?}");
    }
}
