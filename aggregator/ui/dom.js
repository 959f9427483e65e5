// meshcat dashboard: building DOM and formatting figures, shared by the views. DOM is
// built with createElement, never from strings, so nothing a record holds can run.

export const STATUS_ICON = { stable: "\u2714", warning: "\u25B2", down: "\u2716" };

/** Builds an element: h("span", {class: "x", dataset: {a: 1}}, child, "text"). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "dataset") Object.assign(el.dataset, v);
    else if (k === "on") for (const [ev, fn] of Object.entries(v)) el.addEventListener(ev, fn);
    else if (k === "class") el.className = v;
    else if (k in el && k !== "list" && typeof v !== "string") el[k] = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** A status as a coloured badge with its icon and its word. */
export function badge(status) {
  const s = ["stable", "warning", "down"].includes(status) ? status : "down";
  return h("span", { class: `badge ${s}` }, h("span", { "aria-hidden": "true" }, STATUS_ICON[s]), s);
}

/** The badge class of an identity state (docs/identity.md). */
const IDENTITY_CLASS = { ok: "ok", expiring: "warn", "rotation-overdue": "bad", expired: "bad", none: "off" };
const IDENTITY_ICON = { ok: "\u2714", expiring: "\u25B2", "rotation-overdue": "\u21BB", expired: "\u2716", none: "\u2013" };

/** An identity state as a coloured badge with its icon and its word. */
export function identityBadge(state) {
  const s = state in IDENTITY_CLASS ? state : "none";
  return h("span", { class: `badge ${IDENTITY_CLASS[s]}`, dataset: { identity: s } },
    h("span", { "aria-hidden": "true" }, IDENTITY_ICON[s]), s);
}

/** How long until `ms` (since the epoch), or how long ago when past: `3d`, `-5h`. */
export function fmtLeft(ms) {
  if (!Number.isFinite(ms)) return "\u2014";
  const s = Math.round((ms - Date.now()) / 1000);
  const a = Math.abs(s);
  const v = a < 120 ? `${a}s` : a < 7200 ? `${Math.floor(a / 60)}m` : a < 172800 ? `${Math.floor(a / 3600)}h` : `${Math.floor(a / 86400)}d`;
  return s < 0 ? `-${v}` : v;
}

export const fmtInt = (n) => (Number.isFinite(n) ? Math.round(n).toLocaleString("en-US") : "\u2014");

export function fmtNum(n, digits = 1) {
  return Number.isFinite(n) ? n.toLocaleString("en-US", { maximumFractionDigits: digits }) : "\u2014";
}
