// labdist Histogram: counts per integer bin (the parameter servers' staleness) on a canvas.
// The kernel sends only increments ("add"), plus "event" and "reset"; a view that
// (re)connects says "hello" and gets one "snapshot".
import { axisTitles, fitCanvas, mountChart, niceStep } from "./_shared.js";

function apply(s, msg) {
  if (msg.type === "snapshot") {
    s.counts = new Map(Object.entries(msg.counts).map(([k, v]) => [Number(k), v]));
    s.events = msg.events.slice();
  } else if (msg.type === "add") {
    for (const [k, v] of Object.entries(msg.counts)) {
      s.counts.set(Number(k), (s.counts.get(Number(k)) || 0) + v);
    }
  } else if (msg.type === "event") {
    s.events.push(msg.label);
  } else if (msg.type === "reset") {
    s.counts = new Map();
    s.events = [];
  }
}

function draw(el, canvas, model, s) {
  const area = fitCanvas(canvas, model.get("height"), { l: 58, r: 12, t: 16, b: 34 });
  const { ctx, pad, w, h } = area;
  const keys = [...s.counts.keys()];
  const maxBin = Math.max(4, ...keys);
  let top = 1;
  for (const v of s.counts.values()) top = Math.max(top, v);
  top *= 1.08;
  const bw = w / (maxBin + 1);
  ctx.font = "11px sans-serif";
  ctx.lineWidth = 1;
  ctx.strokeStyle = "#e3e3e3";
  ctx.fillStyle = "#444";
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  const step = Math.max(1, niceStep(top, Math.max(2, Math.floor(h / 40))));
  for (let v = 0; v <= top; v += step) {
    const y = pad.t + h - (v / top) * h;
    ctx.beginPath(); ctx.moveTo(pad.l, y); ctx.lineTo(pad.l + w, y); ctx.stroke();
    ctx.fillText(String(Math.round(v)), pad.l - 6, y);
  }
  ctx.fillStyle = model.get("color");
  for (const [k, v] of s.counts) {
    const y = pad.t + h - (v / top) * h;
    ctx.fillRect(pad.l + k * bw + bw * 0.1, y, bw * 0.8, pad.t + h - y);
  }
  ctx.fillStyle = "#444";
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  const every = Math.max(1, Math.ceil((maxBin + 1) / Math.max(1, Math.floor(w / 28))));
  for (let k = 0; k <= maxBin; k += every) ctx.fillText(String(k), pad.l + (k + 0.5) * bw, pad.t + h + 4);
  ctx.strokeStyle = "#888";
  ctx.strokeRect(pad.l, pad.t, w, h);
  axisTitles(area, model.get("x_label"), model.get("y_label"));
  if (s.events.length) { // the last switch: what these counts are since
    ctx.fillStyle = "#6b2fa3";
    ctx.textAlign = "right";
    ctx.fillText(s.events[s.events.length - 1], pad.l + w - 4, pad.t + 3);
  }
  el.dataset.total = String([...s.counts.values()].reduce((a, b) => a + b, 0));
}

export default {
  render(view) {
    return mountChart(view, {
      name: "histogram", state: { counts: new Map(), events: [] }, apply, draw,
      header: (note, model) => { note.textContent = model.get("note"); },
    });
  },
};
