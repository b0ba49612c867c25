// labdist ParameterPlane: each replica's path through a two-parameter model's plane, drawn
// over the loss surface (shaded, with contour lines). The kernel sends only deltas: new points
// ("append"), "event" markers, a new surface ("contours") when the data or the view changes,
// and "reset"; a view that (re)connects says "hello" and gets one "snapshot".

import { abbreviate, axisTitles, fitCanvas, fmt, legend, mountChart, ticks } from "./_shared.js";

const MAX_POINTS = 3000; // per replica; older points thinned by half

// pale blue (low loss) to pale yellow (high), so the paths on top stay readable
const STOPS = [[222, 235, 247], [198, 219, 239], [224, 236, 214], [252, 241, 200], [253, 219, 180]];
function shade(t) {
  const x = Math.min(Math.max(t, 0), 1) * (STOPS.length - 1);
  const i = Math.min(Math.floor(x), STOPS.length - 2);
  const f = x - i;
  return STOPS[i].map((c, k) => Math.round(c + (STOPS[i + 1][k] - c) * f));
}

// contour segments of a grid (row-major, ny rows of nx) at one level, in grid coordinates
function marching(z, nx, ny, level, out) {
  const at = (i, j) => z[j * nx + i];
  const cross = (a, b, va, vb) => a + ((level - va) / (vb - va)) * (b - a);
  for (let j = 0; j < ny - 1; j++) {
    for (let i = 0; i < nx - 1; i++) {
      const v = [at(i, j), at(i + 1, j), at(i + 1, j + 1), at(i, j + 1)];
      const pts = [];
      const edges = [[0, 1, [i, j], [i + 1, j]], [1, 2, [i + 1, j], [i + 1, j + 1]],
        [2, 3, [i + 1, j + 1], [i, j + 1]], [3, 0, [i, j + 1], [i, j]]];
      for (const [a, b, pa, pb] of edges) {
        if ((v[a] < level) !== (v[b] < level)) {
          pts.push([cross(pa[0], pb[0], v[a], v[b]), cross(pa[1], pb[1], v[a], v[b])]);
        }
      }
      if (pts.length === 2) out.push(pts[0], pts[1]);
      else if (pts.length === 4) out.push(pts[0], pts[1], pts[2], pts[3]);
    }
  }
}

function surface(s, c) {
  const lz = c.z.map((v) => Math.log10(Math.max(v, 1e-12)));
  let lo = Infinity;
  let hi = -Infinity;
  for (const v of lz) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  const img = new ImageData(c.nx, c.ny);
  for (let j = 0; j < c.ny; j++) {
    for (let i = 0; i < c.nx; i++) {
      const [r, g, b] = shade((lz[j * c.nx + i] - lo) / (hi - lo || 1));
      const k = ((c.ny - 1 - j) * c.nx + i) * 4; // row 0 is the lowest b: the image's bottom
      img.data[k] = r; img.data[k + 1] = g; img.data[k + 2] = b; img.data[k + 3] = 255;
    }
  }
  const off = document.createElement("canvas");
  off.width = c.nx;
  off.height = c.ny;
  off.getContext("2d").putImageData(img, 0, 0);
  const segs = [];
  const levels = 12;
  for (let q = 1; q < levels; q++) marching(lz, c.nx, c.ny, lo + ((hi - lo) * q) / levels, segs);
  s.surface = { c, image: off, segs };
}

function apply(s, msg) {
  if (msg.type === "snapshot") {
    s.paths = msg.paths.map((p) => p.slice());
    s.events = msg.events.slice();
    s.surface = null;
    if (msg.contours) surface(s, msg.contours);
  } else if (msg.type === "append") {
    for (const step of msg.points) {
      step.forEach((p, r) => { (s.paths[r] = s.paths[r] || []).push(p); });
    }
    for (let r = 0; r < s.paths.length; r++) {
      if (s.paths[r].length > MAX_POINTS) {
        s.paths[r] = s.paths[r].filter((_, i, a) => i % 2 === 0 || i === a.length - 1);
        s.events = s.events.map((e) => ({ ...e, index: Math.floor(e.index / 2) }));
      }
    }
  } else if (msg.type === "event") {
    s.events.push({ index: msg.index, label: msg.label });
  } else if (msg.type === "contours") {
    surface(s, msg.contours);
  } else if (msg.type === "reset") {
    s.paths = [];
    s.events = [];
  }
}

// Where the paths run, on a grid of `cell` px (each segment sampled every half cell, each
// sample marking its cell and the eight around it, so no crossing slips between samples): a
// label is placed only where it covers none of them.
function occupancy(paths, px, py, width, height, cell = 4) {
  const cols = Math.ceil(width / cell) + 1;
  const rows = Math.ceil(height / cell) + 1;
  const grid = new Uint8Array(cols * rows);
  const mark = (x, y) => {
    const c = Math.floor(x / cell);
    const r = Math.floor(y / cell);
    if (!(c >= -1 && r >= -1 && c <= cols && r <= rows)) return; // off the canvas (or NaN)
    for (let i = r - 1; i <= r + 1; i++) {
      for (let j = c - 1; j <= c + 1; j++) {
        if (j >= 0 && i >= 0 && j < cols && i < rows) grid[i * cols + j] = 1;
      }
    }
  };
  for (const path of paths) {
    let prev = null;
    for (const p of path) {
      const X = px(p[0]);
      const Y = py(p[1]);
      if (prev) {
        const n = Math.min(Math.ceil((2 * Math.hypot(X - prev[0], Y - prev[1])) / cell), 400);
        for (let i = 1; i <= n; i++) mark(prev[0] + ((X - prev[0]) * i) / n, prev[1] + ((Y - prev[1]) * i) / n);
      } else mark(X, Y);
      prev = [X, Y];
    }
  }
  return (b) => {
    for (let r = Math.floor(b.y / cell); r <= Math.floor((b.y + b.h) / cell); r++) {
      for (let c = Math.floor(b.x / cell); c <= Math.floor((b.x + b.w) / cell); c++) {
        if (r >= 0 && c >= 0 && r < rows && c < cols && grid[r * cols + c]) return false;
      }
    }
    return true;
  };
}

// whether segment (x0, y0)-(x1, y1) crosses box b (exact: what the tests check against)
function crosses(b, x0, y0, x1, y1) {
  let t0 = 0;
  let t1 = 1;
  const dx = x1 - x0;
  const dy = y1 - y0;
  for (const [p, q] of [[-dx, x0 - b.x], [dx, b.x + b.w - x0], [-dy, y0 - b.y], [dy, b.y + b.h - y0]]) {
    if (p === 0) { if (q < 0) return false; continue; }
    const t = q / p;
    if (p < 0) { if (t > t1) return false; if (t > t0) t0 = t; } else { if (t < t0) return false; if (t < t1) t1 = t; }
  }
  return true;
}

function draw(el, canvas, model, s) {
  const area = fitCanvas(canvas, model.get("height"), { l: 58, r: 12, t: 12, b: 34 });
  const { ctx, pad, w, h } = area;
  const c = s.surface && s.surface.c;
  let [a0, a1, b0, b1] = c ? c.bounds : [-1, 1, -1, 1];
  if (!c) {
    for (const p of s.paths.flat()) {
      a0 = Math.min(a0, p[0]); a1 = Math.max(a1, p[0]); b0 = Math.min(b0, p[1]); b1 = Math.max(b1, p[1]);
    }
  }
  const px = (a) => pad.l + ((a - a0) / (a1 - a0)) * w;
  const py = (b) => pad.t + h - ((b - b0) / (b1 - b0)) * h;
  ctx.save();
  ctx.beginPath(); ctx.rect(pad.l, pad.t, w, h); ctx.clip();
  if (c) {
    ctx.imageSmoothingEnabled = true;
    ctx.drawImage(s.surface.image, pad.l, pad.t, w, h);
    ctx.strokeStyle = "rgba(70,90,120,0.45)";
    ctx.lineWidth = 1;
    ctx.beginPath();
    const gx = (i) => pad.l + (i / (c.nx - 1)) * w;
    const gy = (j) => pad.t + h - (j / (c.ny - 1)) * h;
    const segs = s.surface.segs;
    for (let k = 0; k + 1 < segs.length; k += 2) {
      ctx.moveTo(gx(segs[k][0]), gy(segs[k][1]));
      ctx.lineTo(gx(segs[k + 1][0]), gy(segs[k + 1][1]));
    }
    ctx.stroke();
  }
  const colors = model.get("colors");
  s.paths.forEach((path, r) => {
    if (!path.length) return;
    ctx.strokeStyle = colors[r % colors.length];
    ctx.lineWidth = 1.6;
    ctx.beginPath();
    path.forEach((p, i) => (i ? ctx.lineTo(px(p[0]), py(p[1])) : ctx.moveTo(px(p[0]), py(p[1]))));
    ctx.stroke();
    const last = path[path.length - 1];
    ctx.fillStyle = colors[r % colors.length];
    ctx.beginPath(); ctx.arc(px(last[0]), py(last[1]), 4, 0, 2 * Math.PI); ctx.fill();
  });
  ctx.strokeStyle = "#6b2fa3";
  ctx.fillStyle = "#6b2fa3";
  ctx.font = "11px sans-serif";
  s.events.forEach((e) => {
    s.paths.forEach((path) => {
      const p = path[Math.min(e.index, path.length - 1)];
      if (!p) return;
      ctx.beginPath(); ctx.arc(px(p[0]), py(p[1]), 6, 0, 2 * Math.PI); ctx.stroke();
    });
  });
  // labels, latest first, each near its circle where it covers neither another label nor a
  // path (else not drawn: the circle stays, its full text on hover)
  s.labels = [];
  s.eventMarks = [];
  ctx.textAlign = "left"; // the context keeps the last frame's alignment otherwise
  ctx.textBaseline = "top";
  const offPaths = occupancy(s.paths, px, py, pad.l + w + pad.r, pad.t + h + pad.b);
  for (let k = s.events.length - 1; k >= 0; k--) {
    const e = s.events[k];
    const p0 = s.paths[0] && s.paths[0][Math.min(e.index, s.paths[0].length - 1)];
    if (!p0) continue;
    const X = px(p0[0]);
    const Y = py(p0[1]);
    s.eventMarks.push({ px: X, label: e.label, title: e.label });
    let placed = null;
    for (const text of [e.label, abbreviate(e.label)]) {
      const bw = Math.ceil(ctx.measureText(text).width) + 4;
      for (const [dx, dy] of [[8, -20], [8, 8], [-8 - bw, -20], [-8 - bw, 8], [8, -36], [8, 24],
        [-8 - bw, -36], [-8 - bw, 24], [-bw / 2, -52], [-bw / 2, 40]]) {
        const b = { x: Math.max(pad.l, Math.min(X + dx, pad.l + w - bw)),
          y: Math.max(pad.t, Math.min(Y + dy, pad.t + h - 12)), w: bw, h: 12, text, label: e.label };
        const free = s.labels.every((o) => b.x + b.w <= o.x || o.x + o.w <= b.x
          || b.y + b.h <= o.y || o.y + o.h <= b.y);
        if (free && offPaths(b)) { placed = b; break; }
      }
      if (placed) break;
    }
    if (!placed) continue;
    s.labels.push(placed);
    ctx.fillStyle = "rgba(255,255,255,0.8)";
    ctx.fillRect(placed.x, placed.y, placed.w, placed.h);
    ctx.fillStyle = "#6b2fa3";
    ctx.fillText(placed.text, placed.x + 2, placed.y + 1);
  }
  // what the labels cover of the paths, checked exactly (0 by construction)
  s.labelsOnPaths = s.labels.filter((b) => s.paths.some((path) => path.some((p, i) => i > 0
    && crosses(b, px(path[i - 1][0]), py(path[i - 1][1]), px(p[0]), py(p[1]))))).length;
  el.dataset.labels = JSON.stringify(s.labels.map((b) => [b.x, b.y, b.w, b.h]));
  ctx.restore();

  ctx.font = "11px sans-serif";
  ctx.fillStyle = "#444";
  ctx.strokeStyle = "#888";
  ctx.strokeRect(pad.l, pad.t, w, h);
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (const v of ticks(b0, b1, Math.max(2, Math.floor(h / 40)))) ctx.fillText(fmt(v), pad.l - 6, py(v));
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  for (const v of ticks(a0, a1, Math.max(2, Math.floor(w / 80)))) ctx.fillText(fmt(v), px(v), pad.t + h + 4);
  axisTitles(area, model.get("x_label"), model.get("y_label"));
  el.dataset.points = String(s.paths.length ? s.paths[0].length : 0);
}

export default {
  render(view) {
    return mountChart(view, {
      name: "parameter-plane", state: { paths: [], events: [], surface: null }, apply, draw,
      header: (box, model) =>
        legend(box, model, "width:8px;height:8px;border-radius:4px;margin-right:4px"),
    });
  },
};
