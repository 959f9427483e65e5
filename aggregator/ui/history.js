// meshcat dashboard: a cluster's recent changes and its configuration drift, in the
// cluster view. The timeline reads GET /clusters/{c}/history (newest first) and
// follows the `history` events of its cluster; status changes are marked with the
// status they went to. The drift badge reads GET /clusters/{c}/drift, again when an
// entry says an instance or its configuration changed. Both are live data: without
// the read token they say so instead of calling.

import { ApiError, call, enc } from "./live.js";
import { STATUS_ICON, badge, h } from "./dom.js";

/** Entries the timeline shows. */
const SHOWN = 50;
/** Kinds after which the drift is read again. */
const MOVES_DRIFT = /^(config-changed|drift-|instance-)/;

const LABEL = {
  "cluster-registered": "Registered",
  "cluster-updated": "Registration edited",
  "cluster-deleted": "Deleted",
  "zone-registered": "Zone registered",
  "zone-deleted": "Zone deleted",
  "instance-joined": "Instance joined",
  "instance-left": "Instance left",
  "instance-restarted": "Instance restarted",
  "status-changed": "Status changed",
  "config-changed": "Configuration changed",
  "drift-started": "Drift started",
  "drift-ended": "Drift ended",
  "log-level-changed": "Log level changed",
  "debug-window": "Debug window",
  "diagnosed": "Diagnosed",
  "sync-changed": "Sync changed",
  "control-changed": "Control server",
  "certificate-rotated": "Certificate rotated",
  "certificate-state": "Certificate state",
  "tls-mismatch": "SAN mismatch",
  "tls-match": "SAN match again",
};

function fmtClock(ms) {
  const d = new Date(ms);
  return Number.isNaN(d.getTime()) ? "\u2014" : d.toLocaleString("en-GB", { hour12: false });
}

const short = (hash) => (typeof hash === "string" ? hash.slice(0, 8) : "unknown");
const list = (v) => (Array.isArray(v) ? v.join(", ") : "");

/** One line of what an entry's detail says, by kind. */
function said(e) {
  const d = e.detail || {};
  switch (e.kind) {
    case "cluster-updated": return `changed ${list(d.changed) || "nothing"}`;
    case "instance-joined": return `started ${fmtClock(d.startTime)}`;
    case "instance-left": return d.reason || "";
    case "instance-restarted": return `started ${fmtClock(d.startTime)}, before ${fmtClock(d.previousStartTime)}`;
    case "status-changed": return `${d.from} \u2192 ${d.to}: ${d.reason || ""}`;
    case "config-changed": return `${short(d.from)} \u2192 ${short(d.to)}${d.resources && d.resources.length ? ` (${list(d.resources)})` : ""}`;
    case "drift-started":
    case "drift-ended": {
      const n = Array.isArray(d.groups) ? d.groups.length : 0;
      return `${n} configuration${n === 1 ? "" : "s"}`;
    }
    case "log-level-changed": return `${d.from} \u2192 ${d.to}, by ${d.by}`;
    case "debug-window": return `${d.seconds} s`;
    case "diagnosed": return d.conclusion || "";
    case "sync-changed": return `${d.from} \u2192 ${d.to}${d.detail ? `: ${d.detail}` : ""}`;
    case "control-changed": return `${d.from} \u2192 ${d.to}${d.error ? `: ${d.error}` : ""}`;
    case "certificate-rotated": return `${short(d.previousSerial)} \u2192 ${short(d.serial)}, expires ${fmtClock(d.expiresAtMs)}${d.secret ? ` (${d.secret})` : ""}`;
    case "certificate-state": return `${d.from} \u2192 ${d.to}${d.expiresAtMs ? `, expires ${fmtClock(d.expiresAtMs)}` : ""}`;
    case "tls-mismatch":
    case "tls-match": return `to ${d.target}: expects ${list(d.expectedSans)}; presented ${list(d.presentedSans)}`;
    default: return "";
  }
}

/** One entry as a timeline item; a status change carries the status it went to. */
export function entryItem(e, testid = "history-entry") {
  const status = e.kind === "status-changed";
  const data = { testid, kind: e.kind, id: String(e.id), instance: e.instance || "" };
  if (status) Object.assign(data, { statusChange: "true", from: e.detail.from, to: e.detail.to });
  return h("li", { class: status ? "entry status-change" : "entry", dataset: data },
    h("time", { datetime: new Date(e.atMs).toISOString() }, fmtClock(e.atMs)),
    status ? badge(e.detail.to) : h("span", { class: "kind" }, LABEL[e.kind] || e.kind),
    h("span", { class: "what" },
      e.instance ? h("strong", {}, e.instance, " ") : null,
      status ? `${LABEL[e.kind]}: ` : null,
      said(e)));
}

export class ClusterHistory {
  /** `catalog` says whether live data is hidden from this tab. */
  constructor(zone, cluster, catalog) {
    this.zone = zone;
    this.cluster = cluster;
    this.catalog = catalog;
    this.entries = [];
    this.closed = false;
    this.badge = h("span", { class: "drift", dataset: { testid: "drift", drifted: "", groups: "0" } });
    this.groups = h("div", { class: "drift-groups" });
    this.note = h("p", { class: "muted" }, "Reading the recent changes\u2026");
    this.list = h("ol", { class: "timeline", dataset: { testid: "history", count: "0" } });
    this.el = h("section", { class: "card", "aria-labelledby": "hist-h" },
      h("h2", { id: "hist-h" }, "Recent changes"), this.groups, this.note, this.list);
    this.load();
  }

  close() {
    this.closed = true;
    clearTimeout(this.driftTimer);
  }

  /** Reads the timeline and the drift afresh (on open, and when the token changes). */
  async load() {
    await this.catalog.ready;
    if (this.closed) return;
    if (this.catalog.liveHidden()) {
      this.note.textContent = "The history and the drift are hidden without the read token.";
      this.showDrift(null);
      return;
    }
    try {
      const { body } = await call(`/clusters/${enc(this.cluster)}/history?zoneName=${enc(this.zone)}&limit=${SHOWN}`);
      if (this.closed) return;
      const seen = new Set(this.entries.map((e) => e.id));
      this.entries = [...this.entries, ...body.filter((e) => !seen.has(e.id))]
        .sort((a, b) => b.id - a.id).slice(0, SHOWN);
      this.render();
    } catch (e) {
      if (this.closed) return;
      if (e instanceof ApiError && e.needsToken) {
        // The drift is live data too: no second refusal to ask for.
        this.note.textContent = "The history and the drift are hidden without the read token.";
        this.showDrift(null);
        return;
      }
      this.note.textContent = e.message;
    }
    this.readDrift();
  }

  /** `history` events: those of this cluster join the timeline. */
  add(entries) {
    const seen = new Set(this.entries.map((e) => e.id));
    const mine = entries.filter((e) => e.zoneName === this.zone && e.clusterName === this.cluster && !seen.has(e.id));
    if (!mine.length || this.closed) return;
    this.entries = [...mine, ...this.entries].sort((a, b) => b.id - a.id).slice(0, SHOWN);
    this.render();
    if (mine.some((e) => MOVES_DRIFT.test(e.kind))) {
      clearTimeout(this.driftTimer);
      this.driftTimer = setTimeout(() => this.readDrift(), 300);
    }
  }

  render() {
    this.note.textContent = this.entries.length ? "" : "No change recorded.";
    this.list.dataset.count = String(this.entries.length);
    this.list.replaceChildren(...this.entries.map((e) => entryItem(e)));
  }

  async readDrift() {
    try {
      const { body } = await call(`/clusters/${enc(this.cluster)}/drift?zoneName=${enc(this.zone)}`);
      if (!this.closed) this.showDrift(body);
    } catch (e) {
      if (!this.closed) this.showDrift(null, e.status === 404 ? "no instance" : "drift unknown");
    }
  }

  /** The badge: drifted or not, and the groups of instances by configuration. */
  showDrift(d, why = "drift hidden") {
    const groups = d ? d.groups || [] : [];
    const known = groups.filter((g) => g.configHash);
    this.badge.dataset.drifted = d ? String(!!d.drifted) : "";
    this.badge.dataset.groups = String(groups.length);
    if (!d) {
      this.badge.className = "drift badge skipped";
      this.badge.replaceChildren(why);
    } else if (d.drifted) {
      this.badge.className = "drift badge warning";
      this.badge.replaceChildren(h("span", { "aria-hidden": "true" }, STATUS_ICON.warning),
        `drifted: ${known.length} configurations${d.differs && d.differs.length ? `, ${list(d.differs)} differ` : ""}`);
    } else {
      this.badge.className = "drift badge stable";
      this.badge.replaceChildren(h("span", { "aria-hidden": "true" }, STATUS_ICON.stable),
        known.length ? "one configuration" : "no configuration reported");
    }
    const items = (d && d.drifted ? groups : []).map((g) =>
      h("li", { dataset: { testid: "drift-group", configHash: g.configHash || "", instances: (g.instances || []).join(",") } },
        h("code", {}, short(g.configHash)), ` ${(g.instances || []).join(", ")}`));
    this.groups.replaceChildren(...(items.length
      ? [h("p", { class: "muted" }, "Instances by configuration:"), h("ul", {}, ...items)] : []));
  }
}
