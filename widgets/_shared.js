// labdist charts: what every chart's front end shares — ticks and number formats, a canvas sized
// for the screen's pixel ratio, axis titles, a legend, and the render loop (a "hello" for a
// snapshot, deltas applied as they come, at most one redraw per animation frame).
// anywidget loads one ES module per widget: labdist/ui/stream.py puts this file in front of
// each chart's module (dropping the import line there and the `export`s here).

// a round step (1, 2 or 5 times a power of ten) giving about `count` intervals over `span`
export function niceStep(span, count) {
  const raw = span / Math.max(count, 1);
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const norm = raw / mag;
  return (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
}

export function ticks(lo, hi, count) {
  if (!(hi > lo)) return [lo];
  const step = niceStep(hi - lo, count);
  const first = Math.ceil(lo / step);
  // a span at the values' precision (a diverging run: 1e20 give or take an ulp): k + 1
  // would equal k, so no loop; the ends are all there is to say
  if (!Number.isFinite(first) || !(step > 0) || Math.abs(first) > 2 ** 50) return [lo, hi];
  const out = [];
  for (let k = first; k * step <= hi + step * 1e-9 && out.length <= 1000; k++) {
    out.push(Math.abs(k) < 1e-9 ? 0 : k * step); // k * step: no drift, and a clean 0
  }
  return out;
}

// a tick's label, as precise as the ticks' spacing needs: neighbours always read apart
// (13,050 and 13,100 after 13,000 steps, never 1.3e+4 twice)
export function tickFmt(v, step) {
  const a = Math.abs(v);
  if (a < 1e-12 * Math.max(step, 1e-300)) return "0";
  const d = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
  if (a < 1e6 && d <= 4) {
    return v.toLocaleString("en-US", { minimumFractionDigits: d, maximumFractionDigits: d });
  }
  const digits = Math.max(1, Math.floor(Math.log10(a)) - Math.floor(Math.log10(step) + 1e-9));
  return v.toExponential(Math.min(digits, 10));
}

export function fmt(v) {
  const a = Math.abs(v);
  if (a === 0) return "0";
  if (a >= 1e4 || a < 1e-3) return v.toExponential(1);
  return String(Number(v.toPrecision(3)));
}

// the canvas at the screen's resolution, cleared; the plot area inside `pad` is w x h
export function fitCanvas(canvas, height, pad) {
  const dpr = window.devicePixelRatio || 1;
  const width = Math.max(canvas.clientWidth, 50);
  if (canvas.width !== Math.round(width * dpr) || canvas.height !== Math.round(height * dpr)) {
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(height * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, width, height);
  return { ctx, width, height, pad, w: width - pad.l - pad.r, h: height - pad.t - pad.b };
}

// the x title under the plot area and the y title turned up along its left side
export function axisTitles(area, xLabel, yLabel) {
  const { ctx, pad, w, h, height } = area;
  ctx.fillStyle = "#222";
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  ctx.fillText(xLabel, pad.l + w / 2, height - 14);
  ctx.save();
  ctx.translate(12, pad.t + h / 2);
  ctx.rotate(-Math.PI / 2);
  ctx.textBaseline = "middle";
  ctx.fillText(yLabel, 0, 0);
  ctx.restore();
}

// one entry per series: a swatch (`swatch`: its CSS, less the colour) and the series' name
export function legend(box, model, swatch) {
  box.replaceChildren();
  const colors = model.get("colors");
  const hidden = new Set(model.get("hidden") || []); // series with no data yet (a quorum slot)
  model.get("series").forEach((name, i) => {
    if (hidden.has(name)) return;
    const item = document.createElement("span");
    item.style.cssText = "margin-right:10px;white-space:nowrap";
    const sw = document.createElement("span");
    sw.style.cssText = `display:inline-block;${swatch};background:${colors[i % colors.length]}`;
    item.append(sw, name);
    box.append(item);
  });
}

// the short form of an event label ("aggregation → NONE" → "agg→NONE"): drawn when the full
// text has no room; the full text stays on hover
const SHORT = [[/\baggregation\b/g, "agg"], [/\bsynchronization\b/g, "sync"],
  [/\blearning_rate\b/g, "lr"], [/\buse_locking\b/g, "lock"], [/\bsync_period\b/g, "period"],
  [/\bdelays\b/g, "delay"], [/ → /g, "→"], [/, /g, ","], [/ON_WRITE/g, "OW"], [/ON_READ/g, "OR"]];
export function abbreviate(label) {
  return SHORT.reduce((t, [re, to]) => t.replace(re, to), label);
}

// Event labels that never overlap: each label (latest first) takes the first of `lanes` rows
// where its box is free, in its full form, else abbreviated, else as a bare "…"; one that still
// finds no room is left off (its dashed line and the hover keep it). `items`: [{x, label}] in
// canvas pixels; returns the drawn boxes [{x, y, w, h, text, label}] (the tests read them).
export function placeLabels(ctx, items, area, lanes = 3) {
  const { pad, w } = area;
  const right = pad.l + w;
  const h = 12;
  const boxes = [];
  const free = (b) => boxes.every((o) => b.x + b.w + 3 <= o.x || o.x + o.w + 3 <= b.x
    || b.y + b.h <= o.y || o.y + o.h <= b.y);
  for (let i = items.length - 1; i >= 0; i--) {
    const { x, label } = items[i];
    let placed = null;
    for (const text of [label, abbreviate(label), "…"]) {
      const tw = Math.ceil(ctx.measureText(text).width) + 4;
      let left = x + 2;
      if (left + tw > right) left = x - 2 - tw; // no room on the right: the line's left
      if (left < pad.l) continue;
      for (let lane = 0; lane < lanes && !placed; lane++) {
        const b = { x: left, y: pad.t + 2 + lane * (h + 1), w: tw, h, text, label };
        if (free(b)) placed = b;
      }
      if (placed) break;
    }
    if (placed) boxes.push(placed);
  }
  return boxes;
}

// hovering an event line or its label shows the full labels there (the canvas's tooltip)
export function hoverEvents(canvas, s) {
  canvas.addEventListener("mousemove", (ev) => {
    const r = canvas.getBoundingClientRect();
    const mx = ev.clientX - r.left;
    const my = ev.clientY - r.top;
    const near = (s.eventMarks || []).filter((m) => Math.abs(m.px - mx) <= 4
      || (s.labels || []).some((b) => b.label === m.label && mx >= b.x && mx <= b.x + b.w
        && my >= b.y && my <= b.y + b.h));
    const text = near.map((m) => m.title).join("\n");
    if (canvas.title !== text) canvas.title = text;
  });
}

// A chart's view: a title, a line under it (`header(box, model)` fills it), and the canvas.
// `apply(s, msg)` folds a kernel message into the state `s`; `draw(el, canvas, model, s)` paints
// it. `el.labdist` is the state (tests and benchmarks read it: updates, draws, drawMs).
const OUT_OF_VIEW_MS = 250; // a chart out of view is drawn at most 4 times a second

export function mountChart({ model, el }, { name, state, apply, draw, header }) {
  const s = { ...state, updates: 0, draws: 0, drawMs: 0 };
  el.classList.add("labdist-chart", `labdist-${name}`);
  el.style.cssText = "font:12px sans-serif;color:#222;min-width:260px";
  const title = document.createElement("div");
  title.style.cssText = "font-weight:600;margin:2px 0 2px 4px";
  const caption = document.createElement("div"); // what the chart shows in the current mode
  caption.className = "labdist-caption";
  caption.style.cssText = "margin:0 0 2px 4px;font-size:11px;color:#555;min-height:14px";
  const box = document.createElement("div");
  box.style.cssText = "margin:0 0 2px 4px;font-size:11px";
  const canvas = document.createElement("canvas");
  canvas.style.cssText = `width:100%;height:${model.get("height")}px;display:block`;
  el.append(title, caption, box, canvas);
  hoverEvents(canvas, s);
  el.labdist = s;
  let scheduled = false;
  // a chart out of view (scrolled away, or its panel hidden) is drawn at most OUT_OF_VIEW_MS
  // apart, not with every message: the page's one main thread then has the time for the
  // kernel's messages and for the charts one sees (on 2 cores it had neither)
  let visible = true, lastDraw = -Infinity, timer = null;
  const frame = () => {
    scheduled = false;
    lastDraw = performance.now();
    const t0 = performance.now();
    draw(el, canvas, model, s);
    s.draws += 1;
    s.drawMs += performance.now() - t0;
    el.dataset.draws = String(s.draws);
  };
  const invalidate = () => {
    if (scheduled || timer !== null) return;
    const wait = visible ? 0 : OUT_OF_VIEW_MS - (performance.now() - lastDraw);
    if (wait <= 0) {
      scheduled = true;
      requestAnimationFrame(frame);
    } else {
      timer = setTimeout(() => { timer = null; invalidate(); }, wait);
    }
  };
  const seen = new IntersectionObserver((entries) => {
    visible = entries[entries.length - 1].isIntersecting;
    if (visible && timer !== null) { clearTimeout(timer); timer = null; invalidate(); }
  });
  seen.observe(canvas);
  const onMsg = (msg) => { apply(s, msg); s.updates += 1; invalidate(); };
  const onChange = () => {
    title.textContent = model.get("title");
    el.dataset.title = model.get("title");
    caption.textContent = model.get("caption");
    canvas.style.height = `${model.get("height")}px`;
    header(box, model);
    invalidate();
  };
  model.on("msg:custom", onMsg);
  model.on("change", onChange);
  const resize = new ResizeObserver(invalidate);
  resize.observe(canvas);
  onChange();
  model.send({ type: "hello" });
  return () => {
    model.off("msg:custom", onMsg);
    model.off("change", onChange);
    resize.disconnect();
    seen.disconnect();
    if (timer !== null) clearTimeout(timer);
  };
}
