// labdist LineChart: series over training steps on a canvas, with event markers.
// The kernel sends only deltas ("append", "event", "reset"); a view that (re)connects says
// "hello" and gets one "snapshot". Redraws happen on animation frames, at most one per frame.
import { axisTitles, fitCanvas, fmt, legend, mountChart, ticks } from "./_shared.js";

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

function draw(el, canvas, model, s) {
  s.frameTimes.push(performance.now());
  if (s.frameTimes.length > 240) s.frameTimes.shift();
  const area = fitCanvas(canvas, model.get("height"), { l: 58, r: 12, t: 16, b: 34 });
  const { ctx, pad, w, h } = area;
  const logY = model.get("log_y");
  const ty = (v) => (logY ? Math.log10(v) : v);
  let x0 = s.x.length ? s.x[0] : 0;
  let x1 = s.x.length ? s.x[s.x.length - 1] : 1;
  for (const e of s.events) { x0 = Math.min(x0, e.x); x1 = Math.max(x1, e.x); }
  if (x1 <= x0) x1 = x0 + 1;
  let y0 = Infinity;
  let y1 = -Infinity;
  for (const ys of s.y) {
    for (const v of ys) {
      if (Number.isFinite(v) && (!logY || v > 0)) {
        y0 = Math.min(y0, ty(v));
        y1 = Math.max(y1, ty(v));
      }
    }
  }
  if (!Number.isFinite(y0)) { y0 = 0; y1 = 1; }
  if (y1 - y0 < 1e-12) { const c = y0; y0 = c - (Math.abs(c) * 0.1 || 0.5); y1 = c + (Math.abs(c) * 0.1 || 0.5); }
  const m = (y1 - y0) * 0.06;
  y0 -= m; y1 += m;
  const px = (x) => pad.l + ((x - x0) / (x1 - x0)) * w;
  const py = (v) => pad.t + h - ((ty(v) - y0) / (y1 - y0)) * h;

  ctx.font = "11px sans-serif";
  ctx.strokeStyle = "#e3e3e3";
  ctx.fillStyle = "#444";
  ctx.lineWidth = 1;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (const v of ticks(y0, y1, Math.max(2, Math.floor(h / 40)))) {
    const y = pad.t + h - ((v - y0) / (y1 - y0)) * h;
    ctx.beginPath(); ctx.moveTo(pad.l, y); ctx.lineTo(pad.l + w, y); ctx.stroke();
    ctx.fillText(logY ? fmt(Math.pow(10, v)) : fmt(v), pad.l - 6, y);
  }
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  for (const v of ticks(x0, x1, Math.max(2, Math.floor(w / 80)))) {
    const x = px(v);
    ctx.beginPath(); ctx.moveTo(x, pad.t); ctx.lineTo(x, pad.t + h); ctx.stroke();
    ctx.fillText(fmt(v), x, pad.t + h + 4);
  }
  ctx.strokeStyle = "#888";
  ctx.strokeRect(pad.l, pad.t, w, h);
  axisTitles(area, model.get("x_label"), model.get("y_label") + (logY ? " (log)" : ""));

  // event markers: a dashed line and a short label, staggered so neighbours stay readable
  ctx.save();
  ctx.setLineDash([4, 3]);
  ctx.strokeStyle = "#9a4dd8";
  ctx.fillStyle = "#6b2fa3";
  ctx.textAlign = "left";
  ctx.textBaseline = "top";
  s.events.forEach((e, i) => {
    const x = px(e.x);
    ctx.beginPath(); ctx.moveTo(x, pad.t); ctx.lineTo(x, pad.t + h); ctx.stroke();
    ctx.fillText(e.label, Math.min(x + 3, pad.l + w - 60), pad.t + 2 + (i % 3) * 12);
  });
  ctx.restore();

  ctx.save();
  ctx.beginPath(); ctx.rect(pad.l, pad.t, w, h); ctx.clip();
  const colors = model.get("colors");
  s.y.forEach((ys, i) => {
    ctx.strokeStyle = colors[i % colors.length];
    ctx.lineWidth = i === model.get("emphasis") ? 2.2 : 1.4;
    ctx.beginPath();
    let pen = false;
    for (let k = 0; k < ys.length; k++) {
      const v = ys[k];
      if (!Number.isFinite(v) || (logY && v <= 0)) { pen = false; continue; }
      const X = px(s.x[k]);
      const Y = py(v);
      if (pen) ctx.lineTo(X, Y); else { ctx.moveTo(X, Y); pen = true; }
    }
    ctx.stroke();
  });
  ctx.restore();

  el.dataset.points = String(s.x.length);
  el.dataset.events = String(s.events.length);
}

export default {
  render(view) {
    return mountChart(view, {
      name: "line-chart", state: { x: [], y: [], events: [], frameTimes: [] }, apply, draw,
      header: (box, model) => legend(box, model, "width:14px;height:3px;margin:0 4px 3px 0"),
    });
  },
};
