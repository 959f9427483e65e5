// meshcat dashboard: workload identity (contract section 19). The overview's list of
// the certificates that need someone (expired, rotation-overdue, expiring), read from
// GET /certificates and read again when the catalog moves (an identity state that
// changes with time moves it too), and each instance's identity in the cluster view.
// Certificates are live data: without the read token the list says so.

import { ApiError, call } from "./live.js";
import { fmtLeft, h, identityBadge } from "./dom.js";

/** Rows the list shows; the count says how many there are. */
const SHOWN = 20;
/** Least time between two reads of the list while the catalog keeps moving. */
const MIN_PERIOD_MS = 2000;

function fmtWhen(ms) {
  const d = new Date(ms);
  return Number.isNaN(d.getTime()) ? "\u2014" : d.toISOString().replace(".000Z", "Z");
}

/** The SANs of a certificate or an identity, as one line. */
export function sansText(sans) {
  return Array.isArray(sans) && sans.length ? sans.join(", ") : "no SAN";
}

/** The overview's list of the certificates that need action. */
export class ExpiringList {
  /** `catalog` says whether live data is hidden from this tab (`liveHidden`). */
  constructor(catalog) {
    this.catalog = catalog;
    this.list = h("ul", { class: "expiring", dataset: { testid: "expiring-list", count: "" } });
    this.note = h("p", { class: "muted" }, "Reading certificates\u2026");
    this.el = h("section", { "aria-labelledby": "certs-h", class: "certs" },
      h("h2", { id: "certs-h" }, "Certificates needing action"), this.note, this.list);
    this.last = 0;
    this.queued = false;
  }

  /** Says the certificates are hidden from this tab. */
  hidden() {
    this.list.replaceChildren();
    this.list.dataset.count = "";
    this.note.textContent = "Certificates are live data: enter the read token to see them.";
  }

  /** Reads again, at most every MIN_PERIOD_MS, once the catalog is read. */
  changed() {
    if (this.queued || !this.catalog.loaded) return;
    const wait = Math.max(0, this.last + MIN_PERIOD_MS - Date.now());
    this.queued = true;
    setTimeout(() => { this.queued = false; this.load(); }, wait);
  }

  async load() {
    this.last = Date.now();
    if (this.catalog.liveHidden()) {
      this.hidden();
      return;
    }
    let rows;
    try {
      ({ body: rows } = await call("/certificates?state=expired&state=rotation-overdue&state=expiring"));
    } catch (e) {
      if (e instanceof ApiError && e.needsToken) this.hidden();
      else {
        this.list.replaceChildren();
        this.list.dataset.count = "";
        this.note.textContent = `Certificates not read: ${e.message}`;
      }
      return;
    }
    this.list.dataset.count = String(rows.length);
    this.note.textContent = rows.length
      ? `${rows.length} certificate${rows.length === 1 ? "" : "s"} expired, overdue for rotation or expiring, soonest first.`
      : "Every certificate of the live instances is in good standing.";
    this.list.replaceChildren(...rows.slice(0, SHOWN).map((r) => h("li", {
      dataset: { testid: "expiring-cert", zone: r.zoneName, cluster: r.clusterName, instance: r.instance, state: r.state, serial: r.serial },
    },
    identityBadge(r.state), " ",
    h("a", { href: `#/c/${encodeURIComponent(r.zoneName)}/${encodeURIComponent(r.clusterName)}` }, `${r.zoneName}/${r.clusterName}`),
    ` ${r.instance} \u00b7 ${r.role} \u00b7 expires ${fmtWhen(r.expiresAtMs)} (${fmtLeft(r.expiresAtMs)})`,
    r.secret ? ` \u00b7 secret ${r.secret}` : "", ` \u00b7 ${sansText(r.sans)}`,
    r.owner ? h("span", { class: "muted" }, ` \u00b7 ${r.owner}`) : null)));
    if (rows.length > SHOWN) this.list.append(h("li", { class: "muted" }, `and ${rows.length - SHOWN} more: meshcat certs lists them all`));
  }
}

/** An instance's identity as a line of the cluster view. */
export function identityLine(instance, identity) {
  if (!identity) return null;
  const parts = [identityBadge(identity.state)];
  if (Number.isFinite(identity.expiresAtMs)) {
    parts.push(` expires ${fmtWhen(identity.expiresAtMs)} (${fmtLeft(identity.expiresAtMs)})`,
      ` \u00b7 ${identity.source === "sds" ? `SDS secret ${identity.secret || "?"}` : "file"}`,
      ` \u00b7 ${sansText(identity.sans)}`);
  } else if (identity.reason) {
    parts.push(` certificates not listed: ${identity.reason}`);
  } else {
    parts.push(" no certificate");
  }
  return h("p", { class: "inst-identity", dataset: { testid: "instance-identity", instance, state: identity.state } },
    "Identity: ", ...parts);
}
