// meshcat dashboard: talking to the catalog API. The bearer token (kept in
// sessionStorage, so for this tab only), JSON calls with readable errors, and the
// live catalog: a snapshot of the clusters, zones and counts, then GET /events
// (Server-Sent Events read through fetch, so the token travels in a header) or, where
// the API has no event stream, polling of the read routes. A `history` event goes
// to the cluster view's timeline. A `graph` event (the
// dependency graph changed shape) is passed on as "graph", with its zone. A `sync`
// event (a sidecar's sync with its zone's control server moved) is passed on as
// "sync", with the proxy it carries.

const TOKEN_KEY = "meshcat-token";

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(t) {
  if (t) sessionStorage.setItem(TOKEN_KEY, t);
  else sessionStorage.removeItem(TOKEN_KEY);
}

/** An answer of the API that is not 2xx, with its `{error, code}` body. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
  /** 401 or 403: a token (or a better one) would help. */
  get needsToken() {
    return this.status === 401 || this.status === 403;
  }
}

function headers(extra) {
  const h = { Accept: "application/json", ...extra };
  const t = token();
  if (t) h.Authorization = `Bearer ${t}`;
  return h;
}

/** Calls the API; resolves with `{body, index}` or throws an ApiError. */
export async function call(path, { method = "GET", text = false, signal } = {}) {
  const res = await fetch(path, { method, headers: headers(), signal, cache: "no-store" });
  const raw = await res.text();
  if (!res.ok) {
    let code = "http_" + res.status;
    let message = `The API answered ${res.status}.`;
    try {
      const b = JSON.parse(raw);
      if (b && b.error) { message = b.error; code = b.code || code; }
    } catch { /* keep the generic sentence */ }
    throw new ApiError(res.status, code, message);
  }
  const index = res.headers.get("X-Meshcat-Index");
  return { body: text ? raw : JSON.parse(raw), raw, index: index === null ? null : index };
}

export const enc = encodeURIComponent;

export function clusterKey(zone, cluster) {
  return zone + "\u0000" + cluster;
}

/** Zones over this count are summed from GET /summary rather than one call each. */
const MAX_ZONE_CALLS = 40;

/**
 * The live catalog. `onChange(what)` is called after each change with a set of what
 * moved ("clusters", "zones", "summary", "graph", "history", "sync", "mode").
 */
export class Catalog {
  constructor(onChange) {
    this.onChange = onChange;
    /** clusterKey -> cluster record as GET /clusters answers it. */
    this.clusters = new Map();
    /** zoneName -> zone record. */
    this.zones = new Map();
    /** zoneName -> {clusters, stable, warning, down, instances}. */
    this.zoneCounts = new Map();
    /** Totals over every zone. */
    this.totals = { zones: 0, clusters: 0, stable: 0, warning: 0, down: 0, instances: 0 };
    /** "connecting", "live", "polling" or "offline". */
    this.mode = "connecting";
    this.lastError = null;
    this.lastId = null;
    this.pending = new Set();
    this.zoneRefresh = new Set();
    /** Zones named by `graph` events since the views last looked. */
    this.graphZones = new Set();
    /** History entries of `history` events since the views last looked. */
    this.historyEntries = [];
    /** Proxies of `sync` events since the views last looked. */
    this.syncProxies = [];
    this.stopped = false;
    /**
     * Settles once the first snapshot's records were read (or failed): views of live
     * data wait for it, since liveHidden() cannot tell before the records are in.
     */
    this.ready = new Promise((resolve) => { this.markReady = resolve; });
  }

  emit(what) {
    for (const w of what) this.pending.add(w);
    if (this.flushQueued) return;
    this.flushQueued = true;
    requestAnimationFrame(() => {
      this.flushQueued = false;
      const p = this.pending;
      this.pending = new Set();
      this.onChange(p);
    });
  }

  setMode(mode) {
    if (this.mode !== mode) { this.mode = mode; this.emit(["mode"]); }
  }

  /** Loads everything, then follows changes for as long as the page lives. */
  async start() {
    for (let backoff = 1000; !this.stopped;) {
      let index;
      try {
        index = await this.snapshot();
        backoff = 1000;
      } catch (e) {
        this.lastError = e;
        this.markReady();
        this.setMode("offline");
        // An API that wants a token for reads: ask rather than retry in vain.
        if (e instanceof ApiError && e.needsToken && this.askToken &&
            (await this.askToken(`${e.message} Reading the catalog needs a token.`))) continue;
        await sleep(backoff);
        backoff = Math.min(backoff * 2, 15000);
        continue;
      }
      // The index header comes with the live API; without it there is no stream to open.
      const outcome = index === null ? "absent" : await this.follow(index);
      if (outcome === "absent") {
        await this.pollOnce();
      }
    }
  }

  /** Reads the clusters, zones and counts; answers the catalog index (or null). */
  async snapshot() {
    const readWith = token();
    const [clusters, zones] = await Promise.all([call("/clusters"), call("/zones")]);
    this.readWith = readWith;
    // Polling reads the same answers again and again: redraw only what moved.
    const moved = [];
    if (clusters.raw !== this.rawClusters) {
      this.rawClusters = clusters.raw;
      this.clusters = new Map(clusters.body.map((c) => [clusterKey(c.zoneName, c.clusterName), c]));
      moved.push("clusters");
    }
    this.zones = new Map(zones.body.map((z) => [z.zoneName, z]));
    // The views of live data wait for the records (liveHidden() reads them), not for
    // the zones' counts.
    this.markReady();
    const before = JSON.stringify([zones.raw, [...this.zoneCounts], this.totals]);
    await this.loadCounts();
    if (JSON.stringify([zones.raw, [...this.zoneCounts], this.totals]) !== before) moved.push("zones", "summary");
    this.lastError = null;
    if (!this.loaded) moved.push("clusters", "zones", "summary");
    this.loaded = true;
    this.emit(moved.length ? moved : ["mode"]);
    return clusters.index;
  }

  async loadCounts() {
    const names = [...this.zones.keys()];
    const counts = new Map();
    if (names.length > MAX_ZONE_CALLS) {
      const s = (await call("/summary")).body;
      for (const [z, v] of Object.entries(s.zones || {})) counts.set(z, fromSummary(v.metadata));
      this.totals = totalsFrom(s.metadata);
    } else {
      const metas = await Promise.all(names.map((z) => call(`/zones/${enc(z)}/metadata`).then(
        (r) => r.body, (e) => (e.status === 404 ? null : Promise.reject(e)))));
      metas.forEach((m, i) => m && counts.set(names[i], fromZoneMetadata(m)));
      const t = { zones: names.length, clusters: 0, stable: 0, warning: 0, down: 0, instances: 0 };
      for (const c of counts.values()) for (const k of ["clusters", "stable", "warning", "down", "instances"]) t[k] += c[k];
      this.totals = t;
    }
    this.zoneCounts = counts;
  }

  /** Without an event stream: reads again after a pause sized to the catalog. */
  async pollOnce() {
    this.setMode("polling");
    await sleep(this.pollInterval());
  }

  pollInterval() {
    return this.clusters.size > 2000 ? 10000 : 2000;
  }

  /**
   * Follows GET /events from `index`. Answers "absent" when the API has no stream,
   * "reset" when the client must read everything again.
   */
  async follow(index) {
    this.lastId = index;
    for (let backoff = 500; !this.stopped;) {
      let res;
      const ctl = new AbortController();
      this.abort = ctl;
      try {
        const h = headers({ Accept: "text/event-stream" });
        if (this.lastId !== null) h["Last-Event-ID"] = String(this.lastId);
        res = await fetch("/events", { headers: h, signal: ctl.signal, cache: "no-store" });
      } catch {
        this.setMode("offline");
        await sleep(backoff);
        backoff = Math.min(backoff * 2, 10000);
        continue;
      }
      if (res.status === 404) return "absent";
      if ((res.status === 401 || res.status === 403) && this.askToken) {
        this.setMode("offline");
        if (await this.askToken("The event stream needs a token.")) continue;
      }
      if (!res.ok || !res.body) {
        this.setMode("offline");
        await sleep(backoff);
        backoff = Math.min(backoff * 2, 10000);
        continue;
      }
      this.setMode("live");
      backoff = 500;
      const outcome = await this.read(res.body);
      if (outcome === "reset") return "reset";
      this.setMode("connecting");
      await sleep(backoff);
    }
    return "reset";
  }

  /** Reads one event stream to its end. */
  async read(body) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "";
    let ev = { event: "message", data: [], id: null };
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return "closed";
        buf += value;
        let nl;
        while ((nl = buf.search(/\r\n|\n|\r/)) >= 0) {
          const line = buf.slice(0, nl);
          buf = buf.slice(nl + (buf.startsWith("\r\n", nl) ? 2 : 1));
          if (line === "") {
            if (ev.data.length) {
              if (this.apply(ev.event, ev.data.join("\n")) === "reset") {
                reader.cancel().catch(() => {});
                return "reset";
              }
            }
            if (ev.id !== null) this.lastId = ev.id;
            ev = { event: "message", data: [], id: null };
            continue;
          }
          if (line.startsWith(":")) continue;
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          let v = colon < 0 ? "" : line.slice(colon + 1);
          if (v.startsWith(" ")) v = v.slice(1);
          if (field === "event") ev.event = v;
          else if (field === "data") ev.data.push(v);
          else if (field === "id") ev.id = v;
        }
      }
    } catch {
      return "closed";
    }
  }

  /** Applies one event to the catalog. */
  apply(kind, data) {
    if (kind === "reset") return "reset";
    this.rawClusters = null;
    let d;
    try { d = JSON.parse(data); } catch { return "ignored"; }
    switch (kind) {
      case "cluster":
        this.clusters.set(clusterKey(d.zoneName, d.clusterName), d);
        this.refreshZone(d.zoneName);
        this.emit(["clusters"]);
        break;
      case "cluster-deleted":
        this.clusters.delete(clusterKey(d.zoneName, d.clusterName));
        this.refreshZone(d.zoneName);
        this.emit(["clusters"]);
        break;
      case "zone":
        this.zones.set(d.zoneName, d);
        this.refreshZone(d.zoneName);
        this.emit(["zones"]);
        break;
      case "zone-deleted":
        this.zones.delete(d.zoneName);
        this.zoneCounts.delete(d.zoneName);
        for (const [k, c] of this.clusters) if (c.zoneName === d.zoneName) this.clusters.delete(k);
        this.emit(["zones", "clusters"]);
        break;
      case "summary":
        this.totals = totalsFrom(d);
        this.emit(["summary"]);
        break;
      case "graph":
        // Who calls whom changed (an edge came, went, or changed observed or
        // declared): the graph's views read it again.
        this.graphZones.add(d.zoneName);
        this.emit(["graph"]);
        break;
      case "history":
        // A stored history entry (only for a tab holding the read token): the
        // cluster view's timeline takes it. Bounded while no view looks.
        this.historyEntries.push(d);
        if (this.historyEntries.length > 500) this.historyEntries.splice(0, 250);
        this.emit(["history"]);
        break;
      case "sync":
        // One sidecar's sync state (only for a tab holding the read token): the
        // cluster view's instances and the zones' control states take it. Bounded
        // while no view looks.
        this.syncProxies.push(d);
        if (this.syncProxies.length > 2000) this.syncProxies.splice(0, 1000);
        this.emit(["sync"]);
        break;
      default:
        return "ignored";
    }
    return "applied";
  }

  /**
   * Whether live data is hidden from this tab: the records say `authorized: false`
   * and the token is the one they were read with; or the token was just cleared,
   * until the records are read again and say whether live data needs one (a view
   * polling meanwhile would call without it). Views of live data then ask for the
   * token instead of calling (a 403 would be a console error). A token just given
   * is worth a call.
   */
  liveHidden() {
    const first = this.clusters.values().next().value;
    if (!first) return false;
    if (this.readWith !== token()) return !token();
    return first.authorized === false;
  }

  /** The entries of the `history` events since the last call. */
  takeHistory() {
    const e = this.historyEntries;
    this.historyEntries = [];
    return e;
  }

  /** The proxies of the `sync` events since the last call. */
  takeSync() {
    const p = this.syncProxies;
    this.syncProxies = [];
    return p;
  }

  /** The zones of the `graph` events since the last call. */
  takeGraphZones() {
    const z = this.graphZones;
    this.graphZones = new Set();
    return z;
  }

  /** Zone counts come from the zone's metadata; read it once changes settle. */
  refreshZone(zone) {
    this.zoneRefresh.add(zone);
    if (this.zoneTimer) return;
    this.zoneTimer = setTimeout(async () => {
      this.zoneTimer = null;
      const zones = [...this.zoneRefresh];
      this.zoneRefresh.clear();
      for (const z of zones) {
        try {
          const m = (await call(`/zones/${enc(z)}/metadata`)).body;
          this.zoneCounts.set(z, fromZoneMetadata(m));
        } catch {
          this.zoneCounts.delete(z);
        }
      }
      this.emit(["zones"]);
    }, 500);
  }
}

function fromZoneMetadata(m) {
  return {
    clusters: m.serviceCount ?? 0, stable: m.stableServiceCount ?? 0,
    warning: m.warningServiceCount ?? 0, down: m.downServiceCount ?? 0,
    instances: m.instanceCount ?? 0,
  };
}

function fromSummary(m) {
  return {
    clusters: m.clusterCount ?? 0, stable: m.clusterStableCount ?? 0,
    warning: m.clusterWarningCount ?? 0, down: m.clusterDownCount ?? 0,
    instances: m.instanceCount ?? 0,
  };
}

function totalsFrom(m) {
  return { zones: m.zoneCount ?? 0, ...fromSummary(m) };
}

export function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms));
}
