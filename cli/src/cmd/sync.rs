//! `meshcat sync`: each sidecar's sync with its zone's control server
//! (`GET /sync`, contract section 17), in the manner of `istioctl proxy-status`: a
//! table `ZONE CLUSTER INSTANCE STATE SINCE DETAIL`, or the API's answer as is
//! (`-o json|yaml`). Whatever the format, the exit status is 1 when a sidecar listed
//! is stale or rejected, and standard error names them.

use std::io::Write;

use super::{Ctx, emit};
use crate::args::{Format, SyncArgs, SyncStateArg};
use crate::client::CliError;
use crate::control::{self, Proxy};
use crate::render::{self, Cell, Table, or_dash};

/// Sidecars named in the error at most.
const NAMED: usize = 5;

pub async fn run(ctx: &Ctx, args: SyncArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let answer = control::read_sync(
        &ctx.api,
        args.zone.as_deref(),
        args.cluster.as_deref(),
        args.state.map(SyncStateArg::as_str),
    )
    .await?;
    let sync = control::sync_answer(&answer)?;
    let text = match args.output.output {
        Format::Table => table(&sync.proxies).render(ctx.width),
        f => render::data(&answer, f)?,
    };
    emit(out, &text)?;
    verdict(&sync.proxies)
}

/// `ZONE CLUSTER INSTANCE STATE SINCE DETAIL`, one row per sidecar in the API's
/// order; the detail is the API's one line in words (`-` when it has none).
pub fn table(proxies: &[Proxy]) -> Table {
    let mut t = Table::new(&["ZONE", "CLUSTER", "INSTANCE", "STATE", "SINCE", "DETAIL"]);
    for p in proxies {
        t.row(vec![
            p.zone_name.as_str().into(),
            p.cluster_name.as_str().into(),
            p.instance.as_str().into(),
            Cell::styled(p.state.as_str(), render::sync_style(&p.state)),
            render::time(p.since_ms).into(),
            or_dash(&p.detail.text).into(),
        ]);
    }
    t
}

/// Done when no sidecar listed is stale or rejected; else the error that counts and
/// names them (exit status 1).
pub fn verdict(proxies: &[Proxy]) -> Result<(), CliError> {
    let failing: Vec<&Proxy> = proxies.iter().filter(|p| p.failing()).collect();
    if failing.is_empty() {
        return Ok(());
    }
    Err(CliError::Failed(format!(
        "{} of {} sidecar{} out of sync: {}",
        failing.len(),
        proxies.len(),
        if proxies.len() == 1 { "" } else { "s" },
        summary(&failing)
    )))
}

/// `2 stale, 1 rejected: shop/orders/orders-1 (stale), ...`, the first few named.
pub fn summary(failing: &[&Proxy]) -> String {
    let count = |state: &str| failing.iter().filter(|p| p.state == state).count();
    let mut names: Vec<String> = failing
        .iter()
        .take(NAMED)
        .map(|p| format!("{} ({})", p.place(), p.state))
        .collect();
    if failing.len() > NAMED {
        names.push(format!("and {} more", failing.len() - NAMED));
    }
    format!(
        "{} stale, {} rejected: {}",
        count("stale"),
        count("rejected"),
        names.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::client::{EXIT_FAILED, EXIT_OK};

    fn answer() -> Vec<Proxy> {
        control::sync_answer(&json!({"index": 12, "proxies": [
            {"zoneName": "shop", "clusterName": "orders", "instance": "orders-1",
             "state": "synced", "sinceMs": 1_700_000_000_000i64, "detail": {"text": ""}},
            {"zoneName": "shop", "clusterName": "orders", "instance": "orders-2",
             "state": "stale", "sinceMs": 1_700_000_060_000i64,
             "detail": {"text": "cluster payments: 1 missing (10.0.0.7:8080), 0 extra, since 22:14:20",
                        "clusters": [{"cluster": "payments", "sinceMs": 1_700_000_060_000i64,
                                      "missing": ["10.0.0.7:8080"], "missingCount": 1,
                                      "extra": [], "extraCount": 0, "removed": false}]}},
            {"zoneName": "shop", "clusterName": "payments", "instance": "payments-1",
             "state": "rejected", "sinceMs": 1_700_000_120_000i64,
             "detail": {"text": "clusters rejected: Proto constraint validation failed (\u{1b}[2J\nx)",
                        "rejections": [{"kind": "clusters", "resource": "", "reason": "Proto constraint validation failed",
                                        "sinceMs": 1_700_000_120_000i64}]}},
            {"zoneName": "shop", "clusterName": "payments", "instance": "payments-2",
             "state": "disconnected", "sinceMs": 0, "detail": {"text": "not connected to its control plane"}},
        ]}))
        .unwrap()
        .proxies
    }

    fn code(r: &Result<(), CliError>) -> u8 {
        r.as_ref().map_or_else(CliError::exit_code, |()| EXIT_OK)
    }

    #[test]
    fn rows_in_the_manner_of_proxy_status() {
        let text = anstream::adapter::strip_str(&table(&answer()).render(None)).to_string();
        assert_eq!(
            text,
            "ZONE   CLUSTER    INSTANCE     STATE          SINCE                  DETAIL\n\
             shop   orders     orders-1     synced         2023-11-14T22:13:20Z   -\n\
             shop   orders     orders-2     stale          2023-11-14T22:14:20Z   cluster payments: 1 missing (10.0.0.7:8080), 0 extra, since 22:14:20\n\
             shop   payments   payments-1   rejected       2023-11-14T22:15:20Z   clusters rejected: Proto constraint validation failed (\\u{1b}[2J\\nx)\n\
             shop   payments   payments-2   disconnected   -                      not connected to its control plane\n"
        );
        let coloured = table(&answer()).render(None);
        assert!(
            coloured.contains("\u{1b}[31mrejected\u{1b}[0m"),
            "{coloured:?}"
        );
        assert!(
            coloured.contains("\u{1b}[32msynced\u{1b}[0m"),
            "{coloured:?}"
        );
        assert!(!coloured.contains("\u{1b}[2J"), "{coloured:?}");
    }

    #[test]
    fn stale_or_rejected_exit_1_and_are_named() {
        let all = answer();
        let r = verdict(&all);
        assert_eq!(code(&r), EXIT_FAILED);
        assert_eq!(
            r.unwrap_err().to_string(),
            "2 of 4 sidecars out of sync: 1 stale, 1 rejected: shop/orders/orders-2 (stale), shop/payments/payments-1 (rejected)"
        );
        // Synced, disconnected and unknown sidecars pass; so does an empty list.
        let mut passing: Vec<Proxy> = all.into_iter().filter(|p| !p.failing()).collect();
        passing.push(Proxy {
            state: "unknown".into(),
            ..Proxy::default()
        });
        assert_eq!(code(&verdict(&passing)), EXIT_OK);
        assert_eq!(code(&verdict(&[])), EXIT_OK);
        let many: Vec<Proxy> = (0..7)
            .map(|i| Proxy {
                zone_name: "z".into(),
                cluster_name: "c".into(),
                instance: format!("i{i}"),
                state: "stale".into(),
                ..Proxy::default()
            })
            .collect();
        let e = verdict(&many).unwrap_err().to_string();
        assert!(
            e.starts_with("7 of 7 sidecars out of sync: 7 stale, 0 rejected: z/c/i0 (stale), ")
        );
        assert!(e.ends_with("z/c/i4 (stale), and 2 more"), "{e}");
    }
}
