//! `meshcat certs`: the mesh's workload certificates (`GET /certificates`, contract
//! section 19), soonest expiry first: a table `ZONE CLUSTER INSTANCE ROLE STATE
//! EXPIRES LEFT SOURCE SANS` (`-o wide` adds the serial, the SDS secret, the start
//! of validity and the owner), or the API's answer as is (`-o json|yaml`). Whatever
//! the format, the exit status is 1 when a listed certificate is expired,
//! rotation-overdue or expiring (by the aggregator's `--cert-warning`, or within
//! `--expiring` when given), and standard error names them.

use std::io::Write;
use std::time::Duration;

use meshcat_common::identity::{CertState, CertificateRow};

use super::{Ctx, emit};
use crate::args::{CertsArgs, CertsFormat};
use crate::client::{Call, CliError};
use crate::render::{self, Cell, Table, or_dash};

/// Certificates named in the error at most.
const NAMED: usize = 5;

pub async fn run(ctx: &Ctx, args: CertsArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let call = Call::new(&["certificates"])
        .q_opt("zoneName", args.zone.clone())
        .q_opt("clusterName", args.cluster.clone())
        .q_opt(
            "expiringWithin",
            args.expiring.map(meshcat_common::config::duration_text),
        );
    let answer = ctx.api.get(&call).await?;
    let rows: Vec<CertificateRow> = serde_json::from_value(answer.clone()).map_err(|e| {
        CliError::Failed(format!(
            "the API's certificates are not what meshcat reads: {e}"
        ))
    })?;
    let now = render::now_ms();
    let text = match args.output {
        CertsFormat::Table => table(&rows, now, false).render(ctx.width),
        CertsFormat::Wide => table(&rows, now, true).render(ctx.width),
        CertsFormat::Json => render::data(&answer, crate::args::Format::Json)?,
        CertsFormat::Yaml => render::data(&answer, crate::args::Format::Yaml)?,
    };
    emit(out, &text)?;
    verdict(&rows, args.expiring, now)
}

/// The colour of a certificate's state.
pub fn state_style(state: CertState) -> anstyle::Style {
    match state {
        CertState::Ok => render::GREEN,
        CertState::Expiring => render::YELLOW,
        CertState::Expired | CertState::RotationOverdue => render::RED,
        CertState::None => render::PLAIN,
    }
}

/// One row per certificate, in the API's order (soonest expiry first).
pub fn table(rows: &[CertificateRow], now: i64, wide: bool) -> Table {
    let mut header = vec![
        "ZONE", "CLUSTER", "INSTANCE", "ROLE", "STATE", "EXPIRES", "LEFT", "SOURCE", "SANS",
    ];
    if wide {
        header.extend(["SERIAL", "SECRET", "VALID-FROM", "OWNER"]);
    }
    let mut t = Table::new(&header);
    for r in rows {
        let left = if r.expires_at_ms <= now {
            format!("-{}", render::age(r.expires_at_ms, now))
        } else {
            render::age(now, r.expires_at_ms)
        };
        let mut cells: Vec<Cell> = vec![
            r.zone_name.as_str().into(),
            r.cluster_name.as_str().into(),
            r.instance.as_str().into(),
            r.role.as_str().into(),
            Cell::styled(r.state.as_str(), state_style(r.state)),
            render::time(r.expires_at_ms).into(),
            left.into(),
            r.source.as_str().into(),
            or_dash(&r.sans.join(",")).into(),
        ];
        if wide {
            cells.extend([
                r.serial.as_str().into(),
                or_dash(r.secret.as_deref().unwrap_or("")).into(),
                render::time(r.valid_from_ms).into(),
                or_dash(&r.owner).into(),
            ]);
        }
        t.row(cells);
    }
    t
}

/// Whether a listed certificate needs someone: expired, rotation-overdue,
/// expiring, or expiring within `window`.
fn failing(r: &CertificateRow, window: Option<Duration>, now: i64) -> bool {
    r.state.needs_action()
        || window.is_some_and(|w| {
            r.expires_at_ms < now.saturating_add(w.as_millis().min(i64::MAX as u128) as i64)
        })
}

/// Done when no listed certificate needs someone; else the error that counts and
/// names them (exit status 1).
pub fn verdict(
    rows: &[CertificateRow],
    window: Option<Duration>,
    now: i64,
) -> Result<(), CliError> {
    let bad: Vec<&CertificateRow> = rows.iter().filter(|r| failing(r, window, now)).collect();
    if bad.is_empty() {
        return Ok(());
    }
    let count = |s: CertState| bad.iter().filter(|r| r.state == s).count();
    let mut names: Vec<String> = bad
        .iter()
        .take(NAMED)
        .map(|r| {
            format!(
                "{}/{}/{} {} ({}, {})",
                r.zone_name,
                r.cluster_name,
                r.instance,
                r.role.as_str(),
                r.state,
                render::time(r.expires_at_ms)
            )
        })
        .collect();
    if bad.len() > NAMED {
        names.push(format!("and {} more", bad.len() - NAMED));
    }
    Err(CliError::Failed(format!(
        "{} of {} certificate{} need{} action ({} expired, {} rotation-overdue, {} expiring): {}",
        bad.len(),
        rows.len(),
        if rows.len() == 1 { "" } else { "s" },
        if bad.len() == 1 { "s" } else { "" },
        count(CertState::Expired),
        count(CertState::RotationOverdue),
        bad.len() - count(CertState::Expired) - count(CertState::RotationOverdue),
        names.join(", ")
    )))
}

#[cfg(test)]
mod tests {
    use meshcat_common::identity::{CertRole, CertSource};

    use super::*;
    use crate::client::{EXIT_FAILED, EXIT_OK};

    const NOW: i64 = 1_796_000_000_000;
    const DAY: i64 = 86_400_000;

    fn row(instance: &str, state: CertState, expires: i64) -> CertificateRow {
        CertificateRow {
            zone_name: "shop".into(),
            cluster_name: "orders".into(),
            instance: instance.into(),
            owner: "orders-team".into(),
            role: CertRole::Chain,
            serial: "0a1b".into(),
            sans: vec!["orders.shop".into(), "spiffe://shop/sa/orders".into()],
            valid_from_ms: expires - 30 * DAY,
            expires_at_ms: expires,
            source: CertSource::Sds,
            secret: Some("default".into()),
            state,
        }
    }

    fn code(r: &Result<(), CliError>) -> u8 {
        r.as_ref().map_or_else(CliError::exit_code, |()| EXIT_OK)
    }

    #[test]
    fn rows_with_what_is_left() {
        let rows = [
            row("orders-1", CertState::Expired, NOW - 3 * DAY),
            row("orders-2", CertState::Ok, NOW + 40 * DAY),
        ];
        let text = anstream::adapter::strip_str(&table(&rows, NOW, false).render(None)).to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("ZONE   CLUSTER   INSTANCE   ROLE    STATE"),
            "{text}"
        );
        assert!(
            lines[1].contains("expired") && lines[1].contains(" -3d "),
            "{text}"
        );
        assert!(
            lines[2].contains(" 40d ") && lines[2].contains("sds"),
            "{text}"
        );
        let wide = table(&rows, NOW, true).render(None);
        assert!(
            wide.contains("SERIAL") && wide.contains("orders-team") && wide.contains("default")
        );
    }

    #[test]
    fn what_needs_action_exits_1_and_is_named() {
        let ok = [row("orders-1", CertState::Ok, NOW + 40 * DAY)];
        assert_eq!(code(&verdict(&ok, None, NOW)), EXIT_OK);
        assert_eq!(code(&verdict(&[], None, NOW)), EXIT_OK);
        // Within the window asked for, an ok certificate needs action too.
        assert_eq!(
            code(&verdict(&ok, Some(Duration::from_secs(45 * 86_400)), NOW)),
            EXIT_FAILED
        );
        for state in [
            CertState::Expired,
            CertState::RotationOverdue,
            CertState::Expiring,
        ] {
            let rows = [row("orders-1", state, NOW + DAY), ok[0].clone()];
            let e = verdict(&rows, None, NOW).unwrap_err();
            assert_eq!(e.exit_code(), EXIT_FAILED);
            assert!(
                e.to_string()
                    .starts_with("1 of 2 certificates needs action"),
                "{e}"
            );
            assert!(
                e.to_string()
                    .contains(&format!("shop/orders/orders-1 chain ({state}")),
                "{e}"
            );
        }
    }
}
