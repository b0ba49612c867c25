// labdist LineChart: series over training steps on a canvas, with event markers.
// The kernel sends only deltas ("append", "event", "reset"); a view that (re)connects says
// "hello" and gets one "snapshot". Redraws happen on animation frames, at most one per frame.
import { axisTitles, fitCanvas, fmt, legend, mountChart, placeLabels, tickFmt, ticks } from "./_shared.js";

const MAX_POINTS = 4000; // per series, kept by halving the resolution of older points

function decimate(s) {
  if (s.x.length <= MAX_POINTS) return;
  const keep = (_, i) => i % 2 === 0 || i === s.x.length - 1;
  s.x = s.x.filter(keep);
  s.y = s.y.map((ys) => ys.filter(keep));
}

function apply(s, msg) {
  if (msg.type === "snapshot") {
    s.x = msg.x.slice();
    s.y = msg.y.map((ys) => ys.slice());
    s.events = msg.events.slice();
  } else if (msg.type === "append") {
    for (const x of msg.x) s.x.push(x);
    msg.y.forEach((ys, i) => {
      s.y[i] = s.y[i] || [];
      for (const v of ys) s.y[i].push(v === null ? NaN : v);
    });
    decimate(s);
  } else if (msg.type === "event") {
    s.events.push({ x: msg.x, label: msg.label });
  } else if (msg.type === "reset") {
    s.x = [];
    s.y = [];
    s.events = [];
  }
}

// the first index with s.x[i] >= x (x is sorted)
function firstAt(xs, x) {
  let lo = 0;
  let hi = xs.length;
  while (lo < hi) { const mid = (lo + hi) >> 1; if (xs[mid] < x) lo = mid + 1; else hi = mid; }
  return lo;
}

// The y range of the values shown, robust to outliers: with enough points, a top (bottom) far
// beyond the 98th (2nd) percentile is cut there and the points past it drawn "off scale".
function yRange(vals) {
  if (!vals.length) return { y0: 0, y1: 1, clipHi: false, clipLo: false };
  vals.sort((a, b) => a - b);
  const n = vals.length;
  let y0 = vals[0];
  let y1 = vals[n - 1];
  let clipHi = false;
  let clipLo = false;
  if (n >= 20) {
    const qlo = vals[Math.floor(0.02 * (n - 1))];
    const qhi = vals[Math.ceil(0.98 * (n - 1))];
    const body = Math.max(qhi - qlo, Math.abs(qhi) * 1e-6, 1e-12);
    if (y1 > qhi + body) { y1 = qhi + 0.15 * body; clipHi = true; }
    if (y0 < qlo - body) { y0 = qlo - 0.15 * body; clipLo = true; }
  }
  return { y0, y1, clipHi, clipLo };
}

// ticks of a log axis (in log10 units) at round values: decades when it spans two or more,
// else round linear values (0.05, 0.1, 0.15 rather than 10^-1.3, 10^-1, 10^-0.8)
function logTicks(y0, y1, count) {
  if (y1 - y0 >= 2) return ticks(y0, y1, count).filter((v) => Math.abs(v - Math.round(v)) < 1e-9);
  return ticks(Math.pow(10, y0), Math.pow(10, y1), count).filter((v) => v > 0).map(Math.log10);
}

function draw(el, canvas, model, s) {
  s.frameTimes.push(performance.now());
  if (s.frameTimes.length > 240) s.frameTimes.shift();
  const area = fitCanvas(canvas, model.get("height"), { l: 58, r: 12, t: 16, b: 34 });
  const { ctx, pad, w, h } = area;
  const logY = model.get("log_y");
  const ty = (v) => (logY ? Math.log10(v) : v);
  // the visible window: the last `window` steps (0: all of them)
  const span = model.get("window");
  let x1 = s.x.length ? s.x[s.x.length - 1] : 1;
  for (const e of s.events) x1 = Math.max(x1, e.x);
  let x0 = s.x.length ? s.x[0] : 0;
  if (span > 0) x0 = Math.max(x0, x1 - span);
  if (x1 <= x0) x1 = x0 + 1;
  const from = firstAt(s.x, x0);
  const vals = [];
  for (const ys of s.y) {
    for (let k = from; k < ys.length; k++) {
      const v = ys[k];
      if (Number.isFinite(v) && (!logY || v > 0)) vals.push(ty(v));
    }
  }
  let { y0, y1, clipHi, clipLo } = yRange(vals); // sorts vals
  const dataLo = vals.length ? vals[0] : null;
  const dataHi = vals.length ? vals[vals.length - 1] : null;
  if (y1 - y0 < 1e-12) { const c = y0; y0 = c - (Math.abs(c) * 0.1 || 0.5); y1 = c + (Math.abs(c) * 0.1 || 0.5); }
  if (model.get("zero_y")) { y0 = Math.min(y0, 0); y1 = Math.max(y1, 0); } // e.g. throughput
  const m = (y1 - y0) * 0.06;
  y0 = model.get("zero_y") && y0 === 0 ? 0 : y0 - m; y1 += m;
  const px = (x) => pad.l + ((x - x0) / (x1 - x0)) * w;
  const py = (v) => pad.t + h - ((ty(v) - y0) / (y1 - y0)) * h;
  // what is drawn, in data units (log10 for a log axis): the tests compare it with the data
  s.view = { x0, x1, y0, y1, dataLo, dataHi, clipHi, clipLo, log: logY };

  ctx.font = "11px sans-serif";
  ctx.strokeStyle = "#e3e3e3";
  ctx.fillStyle = "#444";
  ctx.lineWidth = 1;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  const yTicks = logY ? logTicks(y0, y1, Math.max(2, Math.floor(h / 40)))
    : ticks(y0, y1, Math.max(2, Math.floor(h / 40)));
  const yStep = yTicks.length > 1 ? yTicks[1] - yTicks[0] : Math.abs(y1 - y0) || 1;
  for (const v of yTicks) {
    const y = pad.t + h - ((v - y0) / (y1 - y0)) * h;
    ctx.beginPath(); ctx.moveTo(pad.l, y); ctx.lineTo(pad.l + w, y); ctx.stroke();
    ctx.fillText(logY ? fmt(Math.pow(10, v)) : tickFmt(v, yStep), pad.l - 6, y);
  }
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  const xTicks = ticks(x0, x1, Math.max(2, Math.floor(w / 80)));
  const xStep = xTicks.length > 1 ? xTicks[1] - xTicks[0] : 1;
  s.xTickLabels = [];
  for (const v of xTicks) {
    const x = px(v);
    ctx.beginPath(); ctx.moveTo(x, pad.t); ctx.lineTo(x, pad.t + h); ctx.stroke();
    const label = tickFmt(v, xStep);
    s.xTickLabels.push(label);
    // a label at the right edge would be cut by the canvas ("25,80" for 25,800): end it there
    const half = ctx.measureText(label).width / 2;
    const right = pad.l + w + pad.r;
    ctx.textAlign = x + half > right ? "right" : "center";
    ctx.fillText(label, x + half > right ? right : x, pad.t + h + 4);
  }
  ctx.textAlign = "center";
  ctx.strokeStyle = "#888";
  ctx.strokeRect(pad.l, pad.t, w, h);
  axisTitles(area, model.get("x_label"), model.get("y_label") + (logY ? " (log)" : ""));

  ctx.save();
  ctx.beginPath(); ctx.rect(pad.l, pad.t, w, h); ctx.clip();
  const colors = model.get("colors");
  const yTop = pad.t;
  const yBottom = pad.t + h;
  s.y.forEach((ys, i) => {
    ctx.strokeStyle = colors[i % colors.length];
    ctx.lineWidth = i === model.get("emphasis") ? 2.2 : 1.4;
    ctx.beginPath();
    let pen = false;
    for (let k = Math.max(0, from - 1); k < ys.length; k++) {
      const v = ys[k];
      if (!Number.isFinite(v) || (logY && v <= 0)) { pen = false; continue; }
      const X = px(s.x[k]);
      const Y = Math.min(Math.max(py(v), yTop), yBottom); // off scale: drawn at the edge
      if (pen) ctx.lineTo(X, Y); else { ctx.moveTo(X, Y); pen = true; }
    }
    ctx.stroke();
  });
  ctx.restore();
  ctx.fillStyle = "#c92a2a";
  ctx.font = "10px sans-serif";
  ctx.textAlign = "right";
  if (clipHi) { // the top is cut at the 98th percentile: say how far the rest went
    ctx.textBaseline = "top";
    ctx.fillText(`▲ off scale (max ${fmt(logY ? Math.pow(10, dataHi) : dataHi)})`, pad.l + w - 3, pad.t + h - 26);
  }
  if (clipLo) {
    ctx.textBaseline = "bottom";
    ctx.fillText(`▼ off scale (min ${fmt(logY ? Math.pow(10, dataLo) : dataLo)})`, pad.l + w - 3, pad.t + h - 3);
  }

  // event markers: a dashed line each, labels in lanes that never overlap (full text on hover)
  ctx.save();
  ctx.font = "11px sans-serif";
  ctx.setLineDash([4, 3]);
  ctx.strokeStyle = "#9a4dd8";
  const shown = s.events.filter((e) => e.x >= x0 && e.x <= x1);
  s.eventMarks = shown.map((e) => ({ px: px(e.x), label: e.label, title: `step ${fmt(e.x)}: ${e.label}` }));
  for (const e of s.eventMarks) {
    ctx.beginPath(); ctx.moveTo(e.px, pad.t); ctx.lineTo(e.px, pad.t + h); ctx.stroke();
  }
  s.labels = placeLabels(ctx, s.eventMarks.map((e) => ({ x: e.px, label: e.label })), area);
  ctx.setLineDash([]);
  ctx.textAlign = "left";
  ctx.textBaseline = "top";
  for (const b of s.labels) {
    ctx.fillStyle = "rgba(255,255,255,0.85)";
    ctx.fillRect(b.x, b.y, b.w, b.h);
    ctx.fillStyle = "#6b2fa3";
    ctx.fillText(b.text, b.x + 2, b.y + 1);
  }
  ctx.restore();

  el.dataset.points = String(s.x.length);
  el.dataset.events = String(s.events.length);
  el.dataset.labels = JSON.stringify(s.labels.map((b) => [b.x, b.y, b.w, b.h]));
}

export default {
  render(view) {
    return mountChart(view, {
      name: "line-chart", state: { x: [], y: [], events: [], frameTimes: [] }, apply, draw,
      header: (box, model) => legend(box, model, "width:14px;height:3px;margin:0 4px 3px 0"),
    });
  },
};
