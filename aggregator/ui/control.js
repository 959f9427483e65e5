// meshcat dashboard: the zones' control servers and the sidecars' sync with them
// (contract section 17). ZoneControls reads GET /zones/{z}/control for the zones
// (when a zone comes, goes or changes, a zone named by `sync` events soon after
// them, and every 5 s while the page is visible: the control state has no event of
// its own) and fills every
// [data-testid=zone-control] element of the page in place. ClusterSync holds the
// sync states of one cluster's sidecars: GET /sync for the cluster on open, then the
// `sync` events of the stream; it reads again when the instances change, when the
// stream opens again, and every 15 s (every 5 s without the stream). Both are live
// data: without the read token they say so instead of calling.

import { ApiError, call, clusterKey, enc, token } from "./live.js";
import { h } from "./dom.js";
import { Refresher } from "./graph.js";

/** How often the zones' control states are read while the page is visible. */
const CONTROL_EVERY_MS = 5000;
/** Zones read per round: beyond this many, each round reads the next ones in turn. */
const CONTROL_CALLS = 40;
/** Calls in flight at once. */
const PARALLEL = 6;
/** How often one cluster's sync states are read again while the event stream is open. */
const SYNC_EVERY_MS = 15000;
/** The same without the event stream. */
const SYNC_POLL_MS = 5000;

/** A control state's badge class and icon. */
const CONTROL_LOOK = {
  connected: ["ok", "\u2714"],
  connecting: ["warn", "\u25B2"],
  unreachable: ["bad", "\u2716"],
  "tls-error": ["bad", "\u2716"],
  rejected: ["bad", "\u2716"],
  disabled: ["off", "\u2013"],
};

/** A sync state's badge class and icon. */
const SYNC_LOOK = {
  synced: ["ok", "\u2714"],
  stale: ["warn", "\u25B2"],
  rejected: ["bad", "\u2716"],
  disconnected: ["bad", "\u2716"],
  unknown: ["off", "?"],
};

/** Sync states whose detail is shown beside the instance, not only as its tooltip. */
const SHOW_DETAIL = new Set(["stale", "rejected", "disconnected"]);

const HIDDEN_WHY = "Live data: it needs the read token.";

function fmtClock(ms) {
  if (!Number.isFinite(ms) || ms <= 0) return "";
  const d = new Date(ms);
  return Number.isNaN(d.getTime()) ? "" : d.toLocaleString("en-GB", { hour12: false });
}

const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

/**
 * Sets a badge's state, class, icon, word and tooltip, touching the DOM only where
 * something changed (a tooltip being read stays open).
 */
function paintBadge(el, state, look, icon, word, title) {
  if (el.dataset.state !== state) el.dataset.state = state;
  const cls = `badge ${look}`;
  if (el.className !== cls) el.className = cls;
  if (el.title !== title) el.title = title;
  const label = `${word}${title ? `: ${title}` : ""}`;
  if (el.getAttribute("aria-label") !== label) el.setAttribute("aria-label", label);
  if (el.dataset.word !== word || el.dataset.icon !== icon) {
    el.dataset.word = word;
    el.dataset.icon = icon;
    el.replaceChildren(h("span", { "aria-hidden": "true" }, icon), word);
  }
}

/** Runs `fn` over `items`, at most `n` at once. */
async function pool(items, n, fn) {
  let next = 0;
  const worker = async () => {
    while (next < items.length) await fn(items[next++]);
  };
  await Promise.all(Array.from({ length: Math.min(n, items.length) }, worker));
}

/** The zones' control states, read for the whole page. */
export class ZoneControls {
  /** `catalog`: the live catalog (its zones, `ready`, `liveHidden()`). */
  constructor(catalog) {
    this.catalog = catalog;
    /** zoneName -> the answer of GET /zones/{z}/control. */
    this.states = new Map();
    /** Whether the states are hidden from this tab (no read token). */
    this.hidden = false;
    /** The token a 401 or 403 came with: no call while the tab still holds it. */
    this.deniedWith = null;
    /** Zones read first (the open cluster view's). */
    this.priority = new Set();
    this.cursor = 0;
    /** Whether the next read is a whole round rather than the zones of `dirty`. */
    this.full = true;
    /** Zones named by `sync` events since the last read. */
    this.dirty = new Set();
    /** The zone records as last seen: a read follows when they change. */
    this.seen = "";
    this.refresher = new Refresher(() => this.load());
    this.refresher.now();
    this.ticker = setInterval(() => {
      // Nothing in sight shows a zone's state (the graph view): no read.
      if (document.hidden || !document.querySelector("[data-testid=zone-control]")) return;
      this.full = true;
      this.refresher.soon(0);
    }, CONTROL_EVERY_MS);
  }

  /** The catalog moved: `what` as Catalog emits it, `proxies` those of `sync` events. */
  changed(what, proxies) {
    if (what.has("zones")) {
      const seen = JSON.stringify([...this.catalog.zones.values()]);
      if (seen !== this.seen) {
        this.seen = seen;
        this.full = true;
        this.refresher.soon(300);
        return;
      }
    }
    if (proxies.length) {
      for (const p of proxies) this.dirty.add(p.zoneName);
      this.refresher.soon(1000);
    }
  }

  /** The token changed: read at once. */
  now() {
    this.deniedWith = null;
    this.full = true;
    this.refresher.now();
  }

  /** Reads `zone` first while `on`. */
  prefer(zone, on) {
    if (on) this.priority.add(zone);
    else this.priority.delete(zone);
    if (on) this.refresher.soon(0);
  }

  async load() {
    await this.catalog.ready;
    const known = this.catalog.zones;
    for (const z of [...this.states.keys()]) if (!known.has(z)) this.states.delete(z);
    if (this.catalog.liveHidden() || (this.deniedWith !== null && this.deniedWith === token())) {
      this.hidden = true;
      this.paint();
      return;
    }
    const zones = [...known.keys()].sort();
    const full = this.full || this.hidden;
    const dirty = this.dirty;
    this.full = false;
    this.dirty = new Set();
    let pick = zones;
    if (!full) {
      pick = zones.filter((z) => dirty.has(z) || this.priority.has(z)).slice(0, CONTROL_CALLS);
    } else if (zones.length > CONTROL_CALLS) {
      const first = [...this.priority].filter((z) => known.has(z));
      const rest = [];
      for (let k = 0; k < zones.length && first.length + rest.length < CONTROL_CALLS; k++) {
        const z = zones[(this.cursor + k) % zones.length];
        if (!this.priority.has(z)) rest.push(z);
      }
      this.cursor = (this.cursor + rest.length) % zones.length;
      pick = [...first, ...rest];
    }
    const asked = token();
    let denied = false;
    const read = async (z) => {
      if (denied) return;
      try {
        const { body } = await call(`/zones/${enc(z)}/control`);
        this.states.set(z, body);
      } catch (e) {
        if (e instanceof ApiError && e.needsToken) denied = true;
        else if (e instanceof ApiError && e.status === 404) this.states.delete(z);
        // Otherwise the API itself is not answering (the header says so): the last
        // state read stays.
      }
    };
    // One call first: a refusal then costs one call, not one per zone.
    await pool(pick.slice(0, 1), 1, read);
    await pool(pick.slice(1), PARALLEL, read);
    if (denied) this.deniedWith = asked;
    this.hidden = denied;
    this.paint();
  }

  /** A badge of `zone`'s control state: `[data-testid=zone-control]`. */
  element(zone) {
    const el = h("span", { class: "badge off", dataset: { testid: "zone-control", zone, state: "" } });
    this.fill(el);
    // Back from a view that showed none: read now rather than at the next round.
    if (Date.now() - this.refresher.last > CONTROL_EVERY_MS) {
      this.full = true;
      this.refresher.soon(0);
    }
    return el;
  }

  /** `zone`'s control server in words: its address, the error, the view's counts. */
  detail(zone) {
    const el = h("span", { class: "ctl-detail", dataset: { controlDetail: zone } });
    this.fillDetail(el);
    return el;
  }

  /** Fills every element of the page that shows a zone's control state. */
  paint() {
    for (const el of document.querySelectorAll("[data-testid=zone-control]")) this.fill(el);
    for (const el of document.querySelectorAll("[data-control-detail]")) this.fillDetail(el);
  }

  fill(el) {
    const s = this.states.get(el.dataset.zone);
    if (this.hidden) {
      paintBadge(el, "", "off", "?", "hidden", `The control server's state: ${HIDDEN_WHY}`);
    } else if (!s) {
      paintBadge(el, "", "off", "\u2026", "reading", "Reading the control server's state");
    } else {
      const [look, icon] = CONTROL_LOOK[s.state] || ["off", "?"];
      const parts = [s.serverAddress || ""];
      if (s.error) parts.push(s.error);
      if (s.state === "connected" && s.connectedSinceMs) parts.push(`connected since ${fmtClock(s.connectedSinceMs)}`);
      else if (s.lastUpdateMs) parts.push(`last update ${fmtClock(s.lastUpdateMs)}`);
      paintBadge(el, s.state, look, icon, s.state, parts.filter(Boolean).join(" \u00b7 "));
    }
  }

  fillDetail(el) {
    const s = this.states.get(el.dataset.controlDetail);
    let text = "";
    if (this.hidden) text = HIDDEN_WHY;
    else if (s) {
      const view = `${plural(s.clusters ?? 0, "cluster")}, ${plural(s.endpoints ?? 0, "endpoint")}, ` +
        `${plural(s.listeners ?? 0, "listener")}, ${plural(s.routes ?? 0, "route configuration")}`;
      text = [s.serverAddress, s.error, `its view: ${view}`].filter(Boolean).join(" \u00b7 ");
    }
    if (el.textContent !== text) el.textContent = text;
  }
}

/** The sync states of one cluster's sidecars, for the cluster view. */
export class ClusterSync {
  /**
   * `catalog`: the live catalog (`ready`, `liveHidden()`, `mode`); `onChange()` is
   * called after the states moved.
   */
  constructor(zone, cluster, catalog, onChange) {
    this.zone = zone;
    this.cluster = cluster;
    this.catalog = catalog;
    this.onChange = onChange;
    /** instance -> proxy object as GET /sync lists it. */
    this.proxies = new Map();
    this.loaded = false;
    this.hidden = false;
    this.error = null;
    this.deniedWith = null;
    this.closed = false;
    /** Proxies of events that came while a read was in flight: newer than its answer. */
    this.during = null;
    this.wasLive = catalog.mode === "live";
    /** The cluster's instance names as last seen: a read follows when they change. */
    this.names = this.instanceNames();
    this.refresher = new Refresher(() => this.load());
    this.refresher.now();
    this.ticker = setInterval(() => {
      if (document.hidden) return;
      const every = this.catalog.mode === "live" ? SYNC_EVERY_MS : SYNC_POLL_MS;
      if (Date.now() - this.refresher.last >= every - 100) this.refresher.soon(0);
    }, SYNC_POLL_MS);
  }

  close() {
    this.closed = true;
    clearInterval(this.ticker);
    this.refresher.stop();
  }

  /** The token changed: read at once. */
  now() {
    this.deniedWith = null;
    this.refresher.now();
  }

  /** The catalog moved: `what` as Catalog emits it, `proxies` those of `sync` events. */
  changed(what, proxies) {
    let moved = false;
    for (const p of proxies) {
      if (p.zoneName !== this.zone || p.clusterName !== this.cluster) continue;
      this.proxies.set(p.instance, p);
      if (this.during) this.during.push(p);
      moved = true;
    }
    if (moved && !this.hidden) this.onChange();
    const live = this.catalog.mode === "live";
    if (live && !this.wasLive) this.refresher.soon(300);
    if (what.has("clusters")) {
      const names = this.instanceNames();
      if (names !== this.names) { this.names = names; this.refresher.soon(300); }
    }
    this.wasLive = live;
  }

  instanceNames() {
    const c = this.catalog.clusters.get(clusterKey(this.zone, this.cluster));
    return c ? (c.instances || []).map((i) => i.name).join("\u0000") : "";
  }

  async load() {
    await this.catalog.ready;
    if (this.closed) return;
    if (this.catalog.liveHidden() || (this.deniedWith !== null && this.deniedWith === token())) {
      this.hidden = true;
      this.onChange();
      return;
    }
    const asked = token();
    this.during = [];
    try {
      const q = new URLSearchParams({ zoneName: this.zone, clusterName: this.cluster });
      const { body } = await call(`/sync?${q}`);
      if (this.closed) return;
      this.proxies = new Map((body.proxies || []).map((p) => [p.instance, p]));
      for (const p of this.during) this.proxies.set(p.instance, p);
      this.loaded = true;
      this.hidden = false;
      this.error = null;
    } catch (e) {
      if (e instanceof ApiError && e.needsToken) {
        this.deniedWith = asked;
        this.hidden = true;
      } else {
        this.error = e.message;
      }
    } finally {
      this.during = null;
    }
    if (!this.closed) this.onChange();
  }

  /**
   * Shows `instance`'s sync state in `badge` (`[data-testid=instance-sync]`) and, for
   * the states that need a look, its detail in `detailEl`.
   */
  fill(instance, badge, detailEl) {
    const p = this.proxies.get(instance);
    let detail = "";
    if (this.hidden) {
      paintBadge(badge, "", "off", "?", "hidden", `The sync state: ${HIDDEN_WHY}`);
    } else if (!p) {
      const why = this.error ? `The sync state could not be read: ${this.error}`
        : this.loaded ? "No sync state for this sidecar yet." : "Reading the sync state";
      paintBadge(badge, "", "off", "\u2026", this.loaded ? "no state" : "reading", why);
    } else {
      const [look, icon] = SYNC_LOOK[p.state] || ["off", "?"];
      const text = (p.detail && p.detail.text) || "";
      const since = fmtClock(p.sinceMs);
      paintBadge(badge, p.state, look, icon, p.state, [text, since && `since ${since}`].filter(Boolean).join(" \u00b7 "));
      if (SHOW_DETAIL.has(p.state)) detail = [text || p.state, since && `(since ${since})`].filter(Boolean).join(" ");
    }
    if (detailEl.textContent !== detail) detailEl.textContent = detail;
    detailEl.hidden = !detail;
  }
}
