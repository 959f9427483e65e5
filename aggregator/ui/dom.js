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

export const fmtInt = (n) => (Number.isFinite(n) ? Math.round(n).toLocaleString("en-US") : "\u2014");

export function fmtNum(n, digits = 1) {
  return Number.isFinite(n) ? n.toLocaleString("en-US", { maximumFractionDigits: digits }) : "\u2014";
}
