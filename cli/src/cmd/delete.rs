//! `meshcat delete cluster NAME --zone Z` and `meshcat delete zone Z`: one line per
//! deleted record, as `apply` prints them.

use std::io::Write;

use reqwest::Method;

use super::{Ctx, emit};
use crate::args::DeleteWhat;
use crate::catalog;
use crate::client::{Call, CliError};

pub async fn run(ctx: &Ctx, what: DeleteWhat, out: &mut dyn Write) -> Result<(), CliError> {
    let name = match what {
        DeleteWhat::Cluster { name, zone } => {
            let call = Call::new(&["clusters", &name]).q("zoneName", &zone);
            ctx.api.json(Method::DELETE, &call, None).await?;
            catalog::cluster_name(&zone, &name)
        }
        DeleteWhat::Zone { name } => {
            ctx.api
                .json(Method::DELETE, &Call::new(&["zones", &name]), None)
                .await?;
            catalog::zone_name(&name)
        }
    };
    emit(out, &format!("deleted {name}\n"))
}
