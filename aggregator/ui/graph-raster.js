// meshcat dashboard: the graph's pixels when thousands of edges and nodes are in
// sight. Chromium without a GPU (the software rasterizer, Skia on the CPU) spends
// about 100 times longer on 30,000 dashed curves and 10,000 small circles than their
// pixels need: most of it is dashing curves and scan-converting tiny arcs, not
// writing pixels. Here each is written straight into an `ImageData` (one-pixel
// lines, dashes by distance along the line, stamped discs), which costs what the
// pixels cost; graph-draw.js uses it for a crowded view and draws a sparse one
// with the canvas's own anti-aliased paths. Colours are "#rrggbb"; coordinates are
// device pixels.

/** An opaque colour, as the ImageData's bytes read as one little-endian word. */
export function rgba(hex) {
  const v = parseInt(hex.slice(1), 16);
  return (0xff000000 | ((v & 0xff) << 16) | (v & 0xff00) | ((v >> 16) & 0xff)) >>> 0;
}

/** `c` over `d` at alpha `a` (0 to 256), both opaque. */
function mix(d, c, a) {
  const rb = ((((c & 0xff00ff) * a) + ((d & 0xff00ff) * (256 - a))) >>> 8) & 0xff00ff;
  const g = ((((c & 0xff00) * a) + ((d & 0xff00) * (256 - a))) >>> 8) & 0xff00;
  return (0xff000000 | rb | g) >>> 0;
}

/**
 * Straight pieces a quadratic curve is drawn as, so that none strays more than a
 * quarter pixel from it: the curve's middle is half the control point's distance
 * from the chord's middle, and n pieces stray about that over n².
 */
export function pieces(x0, y0, cx, cy, x1, y1) {
  const mx = cx - (x0 + x1) / 2, my = cy - (y0 + y1) / 2;
  const bend = Math.sqrt(mx * mx + my * my) / 2;
  return Math.max(1, Math.min(16, Math.ceil(Math.sqrt(bend * 4))));
}

/**
 * A shape stamped at a point: the pixels it covers around its centre, each with its
 * coverage (0 to 256, from 4 x 4 samples, so its rim is smooth) and which of the
 * stamp's colours it takes (0: fill, 1: outline).
 */
export class Mask {
  /** `inside(x, y)` answers 0 (outside), 1 (fill) or 2 (outline) for a point. */
  constructor(reach, inside) {
    const dx = [], dy = [], cov = [], ink = [];
    const R = Math.ceil(reach);
    for (let y = -R; y <= R; y++) {
      for (let x = -R; x <= R; x++) {
        const n = [0, 0, 0];
        for (let sy = 0; sy < 4; sy++) {
          for (let sx = 0; sx < 4; sx++) n[inside(x + (sx + 0.5) / 4 - 0.5, y + (sy + 0.5) / 4 - 0.5)]++;
        }
        for (const which of [1, 2]) {
          if (!n[which]) continue;
          dx.push(x); dy.push(y); cov.push(n[which] * 16); ink.push(which - 1);
        }
      }
    }
    this.dx = Int32Array.from(dx);
    this.dy = Int32Array.from(dy);
    this.cov = Int32Array.from(cov);
    this.ink = Uint8Array.from(ink);
    this.reach = R;
    /** Each pixel's offset in a buffer `width` pixels wide (kept for the last width). */
    this.width = 0;
    this.offset = null;
  }

  offsets(width) {
    if (width !== this.width) {
      this.width = width;
      this.offset = this.dx.map((x, i) => this.dy[i] * width + x);
    }
    return this.offset;
  }
}

/** A filled disc of radius `r`. */
export function disc(r) {
  return new Mask(r, (x, y) => (x * x + y * y <= r * r ? 1 : 0));
}

/** A filled square of half side `r`. */
export function square(r) {
  return new Mask(r, (x, y) => (Math.abs(x) <= r && Math.abs(y) <= r ? 1 : 0));
}

/** A diamond of half diagonal `r` (fill) with an outline `line` wide around it. */
export function diamond(r, line) {
  return new Mask(r + line, (x, y) => {
    const d = Math.abs(x) + Math.abs(y);
    return d <= r ? 1 : d <= r + line * Math.SQRT2 ? 2 : 0;
  });
}

/** A square of half side `r` (fill) with an outline `line` wide around it. */
export function framedSquare(r, line) {
  return new Mask(r + line, (x, y) => {
    const d = Math.max(Math.abs(x), Math.abs(y));
    return d <= r ? 1 : d <= r + line ? 2 : 0;
  });
}

/** A ring of radius `r`, `width` wide, dashed `on` then `off` along its length. */
export function dashedRing(r, width, on, off) {
  return new Mask(r + width, (x, y) => {
    const d = Math.hypot(x, y);
    if (Math.abs(d - r) > width / 2) return 0;
    const along = (Math.atan2(y, x) + Math.PI) * r;
    return along % (on + off) < on ? 1 : 0;
  });
}

/** A canvas-sized buffer of opaque pixels, put on the canvas once drawn. */
export class Raster {
  constructor() {
    this.w = 0;
    this.h = 0;
  }

  /** Sizes the buffer to the canvas's device pixels and fills it with `colour`. */
  begin(w, h, colour) {
    if (w !== this.w || h !== this.h) {
      this.w = w;
      this.h = h;
      this.image = new ImageData(w, h);
      this.px = new Uint32Array(this.image.data.buffer);
    }
    this.px.fill(colour);
  }

  /** Puts the pixels on the canvas (its transform does not apply). */
  end(ctx) {
    ctx.putImageData(this.image, 0, 0);
  }

  /** A rectangle filled with `fill` inside a one-pixel border of `stroke`. */
  rect(x0, y0, x1, y1, fill, stroke) {
    const { w, h, px } = this;
    const l = Math.max(0, Math.round(x0)), r = Math.min(w, Math.round(x1));
    const t = Math.max(0, Math.round(y0)), b = Math.min(h, Math.round(y1));
    if (l >= r || t >= b) return;
    for (let y = t; y < b; y++) px.fill(fill, y * w + l, y * w + r);
    if (Math.round(y0) === t) px.fill(stroke, t * w + l, t * w + r);
    if (Math.round(y1) === b) px.fill(stroke, (b - 1) * w + l, (b - 1) * w + r);
    for (let y = t; y < b; y++) {
      if (Math.round(x0) === l) px[y * w + l] = stroke;
      if (Math.round(x1) === r) px[y * w + r - 1] = stroke;
    }
  }

  /**
   * A straight line `width` pixels wide in `colour` at alpha `a` (0 to 256), dashed
   * by `dash` ([on, off] in pixels, or null) from `phase` pixels into the pattern.
   * Answers the phase at its end, so pieces of one curve dash as one line.
   */
  line(x0, y0, x1, y1, colour, a, width, dash, phase) {
    const dx = x1 - x0, dy = y1 - y0;
    const len = Math.sqrt(dx * dx + dy * dy);
    const period = dash ? dash[0] + dash[1] : 0;
    const next = period ? (phase + len) % period : 0;
    if (len < 1e-9) return next;
    const { w, h, px } = this;
    // Walk the major axis (p) one pixel centre at a time; the minor axis (q) follows.
    const shallow = Math.abs(dx) >= Math.abs(dy);
    const p0 = shallow ? x0 : y0, p1 = shallow ? x1 : y1, q0 = shallow ? y0 : x0;
    const d = shallow ? dx : dy, dq = shallow ? dy : dx;
    const pLim = shallow ? w : h, qLim = shallow ? h : w;
    const pStep = shallow ? 1 : w, qStep = shallow ? w : 1;
    // Across the line, in pixels of the minor axis: `width` measured square to it.
    const across = Math.max(1, Math.round(width * len / Math.abs(d)));
    const lift = (across - 1) >> 1;
    let lo = Math.max(0, Math.ceil(Math.min(p0, p1) - 0.5));
    let hi = Math.min(pLim - 1, Math.floor(Math.max(p0, p1) - 0.5));
    const slope = dq / d;
    // Where the minor axis leaves the buffer, the walk stops too.
    if (slope !== 0) {
      const qa = p0 - 0.5 + (-1 - lift - q0) / slope, qb = p0 - 0.5 + (qLim + 1 + lift - q0) / slope;
      lo = Math.max(lo, Math.floor(Math.min(qa, qb)));
      hi = Math.min(hi, Math.ceil(Math.max(qa, qb)));
    } else if (q0 < -lift - 1 || q0 > qLim + lift + 1) {
      return next;
    }
    if (lo > hi) return next;
    // Dashes are measured from (x0, y0), whichever way the axis runs.
    const perPixel = len / Math.abs(d);
    const on = dash ? dash[0] : 0;
    let along = period ? (phase + Math.abs(lo + 0.5 - p0) * perPixel) % period : 0;
    const alongStep = d > 0 ? perPixel : -perPixel;
    let q = q0 + (lo + 0.5 - p0) * slope - lift;
    for (let i = lo; i <= hi; i++, q += slope) {
      if (period) {
        const drawn = along < on;
        along += alongStep;
        if (along >= period) along -= period;
        else if (along < 0) along += period;
        if (!drawn) continue;
      }
      const j0 = Math.floor(q);
      if (across === 1 && a >= 256) {
        if (j0 >= 0 && j0 < qLim) px[i * pStep + j0 * qStep] = colour;
        continue;
      }
      for (let j = Math.max(0, j0); j < Math.min(qLim, j0 + across); j++) {
        const o = i * pStep + j * qStep;
        px[o] = a >= 256 ? colour : mix(px[o], colour, a);
      }
    }
    return next;
  }

  /** A quadratic curve, as `line` (drawn as straight pieces). */
  quad(x0, y0, cx, cy, x1, y1, colour, a, width, dash) {
    const n = pieces(x0, y0, cx, cy, x1, y1);
    let ax = x0, ay = y0, phase = 0;
    for (let s = 1; s <= n; s++) {
      const t = s / n, u = 1 - t;
      const bx = u * u * x0 + 2 * u * t * cx + t * t * x1;
      const by = u * u * y0 + 2 * u * t * cy + t * t * y1;
      phase = this.line(ax, ay, bx, by, colour, a, width, dash, phase);
      ax = bx; ay = by;
    }
  }

  /** A filled triangle: the pixels whose centres are inside it. */
  triangle(ax, ay, bx, by, cx, cy, colour, a) {
    const { w, h, px } = this;
    const l = Math.max(0, Math.floor(Math.min(ax, bx, cx))), r = Math.min(w - 1, Math.ceil(Math.max(ax, bx, cx)));
    const t = Math.max(0, Math.floor(Math.min(ay, by, cy))), b = Math.min(h - 1, Math.ceil(Math.max(ay, by, cy)));
    const area = (bx - ax) * (cy - ay) - (by - ay) * (cx - ax);
    if (!area) return;
    const s = area > 0 ? 1 : -1;
    for (let y = t; y <= b; y++) {
      const py = y + 0.5;
      for (let x = l; x <= r; x++) {
        const qx = x + 0.5;
        if (s * ((bx - ax) * (py - ay) - (by - ay) * (qx - ax)) < 0) continue;
        if (s * ((cx - bx) * (py - by) - (cy - by) * (qx - bx)) < 0) continue;
        if (s * ((ax - cx) * (py - cy) - (ay - cy) * (qx - cx)) < 0) continue;
        const o = y * w + x;
        px[o] = a >= 256 ? colour : mix(px[o], colour, a);
      }
    }
  }

  /** `mask` centred on the pixel under (x, y), in `fill` (and `outline`). */
  stamp(mask, x, y, fill, outline = fill) {
    const { w, h, px } = this;
    const cx = Math.floor(x), cy = Math.floor(y);
    const R = mask.reach;
    const inside = cx - R >= 0 && cy - R >= 0 && cx + R < w && cy + R < h;
    if (!inside && (cx + R < 0 || cy + R < 0 || cx - R >= w || cy - R >= h)) return;
    const { dx, dy, cov, ink } = mask;
    if (inside) {
      const offset = mask.offsets(w);
      const at = cy * w + cx;
      for (let i = 0; i < offset.length; i++) {
        const o = at + offset[i];
        const c = ink[i] ? outline : fill;
        px[o] = cov[i] >= 256 ? c : mix(px[o], c, cov[i]);
      }
      return;
    }
    for (let i = 0; i < dx.length; i++) {
      const X = cx + dx[i], Y = cy + dy[i];
      if (X < 0 || Y < 0 || X >= w || Y >= h) continue;
      const o = Y * w + X;
      const c = ink[i] ? outline : fill;
      px[o] = cov[i] >= 256 ? c : mix(px[o], c, cov[i]);
    }
  }
}
