// labdist TimelineChart: one lane per replica / PS worker / parameter server, the last steps
// as bars coloured by phase (x: ms before the latest span), the mode switches as dashed lines,
// hover for a bar's phase and duration. Each kernel "snapshot" replaces the window.
import { axisTitles, fitCanvas, legend, mountChart, niceStep, tickFmt } from "./_shared.js";

function apply(s, msg) {
  if (msg.type === "snapshot") {
    s.lanes = msg.lanes;
    s.bars = msg.bars;
    s.marks = msg.marks;
  }
}

function draw(el, canvas, model, s) {
  const area = fitCanvas(canvas, model.get("height"), { l: 110, r: 12, t: 8, b: 34 });
  const { ctx, pad, w, h } = area;
  const colors = new Map(model.get("series").map((n, i) => [n, model.get("colors")[i]]));
  let lo = 0;
  for (const b of s.bars) lo = Math.min(lo, b[1]);
  const span = Math.max(-lo, 1);
  const x = (ms) => pad.l + w * (1 + ms / span);
  const lh = h / Math.max(s.lanes.length, 1);
  ctx.font = "11px sans-serif";
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  ctx.fillStyle = "#222";
  s.lanes.forEach((name, i) => ctx.fillText(name, pad.l - 6, pad.t + (i + 0.5) * lh));
  // every lane's name fits left of the plot, and lanes stay tall enough to read
  s.labelled = s.lanes.every((name) => ctx.measureText(name).width <= pad.l - 8) && lh >= 12;
  s.hits = [];
  for (const [lane, a, b, phase] of s.bars) {
    const x0 = x(a);
    const bw = Math.max(x(b) - x0, 0.5);
    const y = pad.t + lane * lh + lh * 0.15;
    ctx.fillStyle = colors.get(phase) || "#999";
    ctx.fillRect(x0, y, bw, lh * 0.7);
    s.hits.push({ x0, x1: x0 + bw, y0: y, y1: y + lh * 0.7, title: `${s.lanes[lane]}: ${phase} ${(b - a).toFixed(1)} ms` });
  }
  // the mode switches: a dashed line each, its label beside it at the top (the newest wins
  // where two would overlap; hover a line for its whole label)
  ctx.strokeStyle = "#6b2fa3";
  ctx.setLineDash([4, 3]);
  s.shownMarks = [];
  let free = pad.l + w;
  for (const [ms, label] of [...s.marks].sort((a, b) => b[0] - a[0])) {
    if (ms < lo || ms > 0) continue;
    const mx = x(ms);
    ctx.beginPath(); ctx.moveTo(mx, pad.t); ctx.lineTo(mx, pad.t + h); ctx.stroke();
    s.hits.push({ x0: mx - 3, x1: mx + 3, y0: pad.t, y1: pad.t + h, title: label });
    const text = label.length > 40 ? label.slice(0, 39) + "…" : label;
    const tw = ctx.measureText(text).width;
    const tx = mx + 3 + tw <= pad.l + w ? mx + 3 : mx - 3 - tw;
    if (tx + tw > free || tx < pad.l) continue;
    free = tx - 6;
    ctx.fillStyle = "rgba(255,255,255,0.85)";
    ctx.fillRect(tx - 1, pad.t + 1, tw + 2, 13);
    ctx.fillStyle = "#6b2fa3";
    ctx.textAlign = "left";
    ctx.textBaseline = "top";
    ctx.fillText(text, tx, pad.t + 2);
    s.shownMarks.push(label);
  }
  ctx.setLineDash([]);
  ctx.fillStyle = "#444";
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  if (s.bars.length) { // an empty chart has no time axis to label (it read "1 1 1 0 0 0")
    const step = niceStep(span, Math.max(2, Math.floor(w / 80)));
    for (let k = 0; k * step <= span; k++) ctx.fillText(tickFmt(k * step, step), x(-k * step), pad.t + h + 4);
  } else {
    ctx.textBaseline = "middle";
    ctx.fillText("no steps recorded yet", pad.l + w / 2, pad.t + h / 2);
  }
  ctx.strokeStyle = "#888";
  ctx.strokeRect(pad.l, pad.t, w, h);
  axisTitles(area, model.get("x_label"), "");
  el.dataset.bars = String(s.bars.length);
  el.dataset.lanes = String(s.lanes.length);
}

export default {
  render(view) {
    const cleanup = mountChart(view, {
      name: "timeline", state: { lanes: [], bars: [], marks: [], hits: [], shownMarks: [] },
      apply, draw,
      header: (box, model) => {
        legend(box, model, "width:10px;height:10px;margin-right:3px");
        const line = document.createElement("div");
        line.className = "labdist-timeline-note";
        line.textContent = model.get("note");
        box.append(line);
      },
    });
    const canvas = view.el.querySelector("canvas");
    canvas.addEventListener("mousemove", (ev) => {
      const r = canvas.getBoundingClientRect();
      const mx = ev.clientX - r.left;
      const my = ev.clientY - r.top;
      const hit = (view.el.labdist.hits || []).find((b) => mx >= b.x0 && mx <= b.x1 && my >= b.y0 && my <= b.y1);
      canvas.title = hit ? hit.title : "";
    });
    return cleanup;
  },
};
