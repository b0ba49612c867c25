// labdist Histogram: counts per integer bin (the parameter servers' staleness) on a canvas.
// The kernel sends only increments ("add"), plus "event" and "reset"; a view that
// (re)connects says "hello" and gets one "snapshot".

function niceStep(span, count) {
  const raw = span / Math.max(count, 1);
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const norm = raw / mag;
  return (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
}

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
  s.updates += 1;
}

function draw(el, canvas, model, s) {
  const t0 = performance.now();
  const dpr = window.devicePixelRatio || 1;
  const width = Math.max(canvas.clientWidth, 50);
  const height = model.get("height");
  if (canvas.width !== Math.round(width * dpr) || canvas.height !== Math.round(height * dpr)) {
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(height * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, width, height);
  const pad = { l: 58, r: 12, t: 16, b: 34 };
  const w = width - pad.l - pad.r;
  const h = height - pad.t - pad.b;
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
  ctx.fillStyle = "#222";
  ctx.fillText(model.get("x_label"), pad.l + w / 2, height - 14);
  ctx.save();
  ctx.translate(12, pad.t + h / 2);
  ctx.rotate(-Math.PI / 2);
  ctx.textBaseline = "middle";
  ctx.fillText(model.get("y_label"), 0, 0);
  ctx.restore();
  if (s.events.length) { // the last switch: what these counts are since
    ctx.fillStyle = "#6b2fa3";
    ctx.textAlign = "right";
    ctx.fillText(s.events[s.events.length - 1], pad.l + w - 4, pad.t + 3);
  }
  s.draws += 1;
  s.drawMs += performance.now() - t0;
  el.dataset.total = String([...s.counts.values()].reduce((a, b) => a + b, 0));
  el.dataset.draws = String(s.draws);
}

export default {
  render({ model, el }) {
    const s = { counts: new Map(), events: [], updates: 0, draws: 0, drawMs: 0 };
    el.classList.add("labdist-chart", "labdist-histogram");
    el.style.cssText = "font:12px sans-serif;color:#222;min-width:260px";
    const title = document.createElement("div");
    title.style.cssText = "font-weight:600;margin:2px 0 2px 4px";
    const note = document.createElement("div");
    note.style.cssText = "margin:0 0 2px 4px;font-size:11px";
    const canvas = document.createElement("canvas");
    canvas.style.cssText = `width:100%;height:${model.get("height")}px;display:block`;
    el.append(title, note, canvas);
    el.labdist = s;
    let scheduled = false;
    const frame = () => { scheduled = false; draw(el, canvas, model, s); };
    const invalidate = () => { if (!scheduled) { scheduled = true; requestAnimationFrame(frame); } };
    const onMsg = (msg) => { apply(s, msg); invalidate(); };
    const onChange = () => {
      title.textContent = model.get("title");
      el.dataset.title = model.get("title");
      note.textContent = model.get("note");
      canvas.style.height = `${model.get("height")}px`;
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
    };
  },
};
