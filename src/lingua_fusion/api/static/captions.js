// The live-captions page: pick an input and languages, get a single-use stream ticket with the key (a header,
// never a URL), open WS /v1/streams?ticket=..., send PCM16 frames (and video frames as slides), show partials,
// revisions and finals as they come, slides beside them, speak translations, copy or download SRT.
"use strict";

const $ = (id) => document.getElementById(id);
const state = {
  stream: null, source: null, speech: new SpeechQueue(), finals: [], targets: [], sourceLang: "en",
  counts: { partial: 0, revision: 0, final: 0, slide: 0, speech: 0, played: 0 }, lastPartial: "", frames: [],
};

// ---- languages ------------------------------------------------------------------------------------------------
const NAMES = {
  en: "English", es: "Spanish", ca: "Catalan", fr: "French", pt: "Portuguese", de: "German", zh: "Chinese",
  it: "Italian", ja: "Japanese", ru: "Russian", nl: "Dutch", ko: "Korean", ar: "Arabic",
};
const langName = (c) => (NAMES[c] ? `${NAMES[c]} (${c})` : c);
let PAIRS = [];

async function loadLanguages() {
  let models;
  try {
    models = await LF.request("/v1/models");
  } catch (e) {
    setStatus("error", "could not read the served languages: " + e.message);
    return;
  }
  PAIRS = (models.routes || []).map((r) => ({ source: r.pair.split("-")[0], target: r.pair.split("-")[1],
    low: r.low_confidence, route: r.route }));
  const sources = [...new Set(PAIRS.map((p) => p.source))].sort();
  const sel = $("source-lang");
  sel.replaceChildren(...sources.map((s) => LF.el("option", { value: s, text: langName(s), selected: s === "en" })));
  const tts = (models.models || []).filter((m) => m.task === "tts");
  $("speak").disabled = tts.length === 0;
  $("speak-note").textContent = tts.length ? "voices: " + tts.map((m) => m.name).join(", ") + " (first target)"
    : "this server has no speech synthesis";
  renderTargets();
}

function renderTargets() {
  const source = $("source-lang").value;
  const before = new Set([...document.querySelectorAll("#targets input:checked")].map((i) => i.value));
  const box = $("targets");
  const pairs = PAIRS.filter((p) => p.source === source).sort((a, b) => a.target.localeCompare(b.target));
  box.replaceChildren(...pairs.map((p) => LF.el("label", { class: "chip", title: p.route },
    LF.el("input", { type: "checkbox", value: p.target, name: "target",
      checked: before.size ? before.has(p.target) : p.target === "es" }),
    " " + langName(p.target) + (p.low ? " ⚠" : ""))));
  if (!box.querySelector("input:checked") && box.querySelector("input")) box.querySelector("input").checked = true;
}

async function loadMicrophones() {
  const sel = $("mic-select");
  if (!navigator.mediaDevices || !navigator.mediaDevices.enumerateDevices) return;
  const devices = (await navigator.mediaDevices.enumerateDevices()).filter((d) => d.kind === "audioinput");
  sel.replaceChildren(...devices.map((d, i) => LF.el("option", { value: d.deviceId,
    text: d.label || `microphone ${i + 1}` })));
  if (!devices.length) sel.append(LF.el("option", { value: "", text: "default microphone" }));
}

// ---- the stream ------------------------------------------------------------------------------------------------
// whether the server wants a key (GET /readyz says, with any status): asked for before the first request, so
// that starting a stream never begins with a refused request the user did not cause
async function needsKey() {
  try {
    const body = await (await fetch("/readyz")).json();
    return body.auth !== false;
  } catch (e) {
    return true;
  }
}

async function ticket() {
  if (!LF.key() && await needsKey()) {
    await LF.askKey($("key-dialog"), LF.keyName, "this server needs an API key (sk_...)");
    showKeyState();
    if (!LF.key()) throw new Error("no API key");
  }
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      return (await LF.request("/v1/stream-tickets", { method: "POST" })).ticket;
    } catch (e) {
      if ((e.status === 401 || e.status === 403) && attempt === 0) {
        const key = await LF.askKey($("key-dialog"), LF.keyName, e.message);
        showKeyState();
        if (key) continue;
      }
      throw e;
    }
  }
  throw new Error("no API key");
}

async function start() {
  const mode = document.querySelector("input[name=input]:checked").value;
  const file = $("file-input").files[0];
  const targets = [...document.querySelectorAll("#targets input:checked")].map((i) => i.value);
  if (mode === "file" && !file) return setStatus("error", "choose an audio or video file first");
  if (!targets.length) return setStatus("error", "choose at least one target language");
  state.speech.unlock();
  resetCaptions(targets);
  if (state.stream) state.stream.abandon();
  $("start").disabled = true;
  setStatus("connecting", "asking for a stream ticket…");
  const video = mode === "file" && file.type.startsWith("video/");
  const inputs = video && $("send-frames").checked ? ["audio", "video"] : ["audio"];
  const stream = new LiveStream({ type: "start", source_lang: state.sourceLang, target_langs: targets,
    slo: $("slo").value, speech: $("speak").checked, partials: true, audio_format: "pcm16", inputs }, {
    ticket,
    event: onEvent,
    status: setStatus,
    ended: onEnded,
  });
  state.stream = stream;
  try {
    await stream.open();
  } catch (e) {
    $("start").disabled = false;
    return setStatus("error", e.message + (state.lastError ? ": " + state.lastError : ""));
  }
  $("stop").disabled = false;
  state.source = new CaptureSource({
    pcm: (buf) => stream.sendPcm(buf),
    frame: (b64, ts, thumb) => sendFrame(b64, ts, thumb),
    ended: () => endInput(),
  });
  try {
    if (mode === "mic") await state.source.startMicrophone($("mic-select").value);
    else await state.source.startFile(file, $("player"), $("send-frames").checked);
    setStatus("live", mode === "mic" ? "listening" : "playing " + file.name + " as a live stream");
  } catch (e) {
    setStatus("error", "could not start the input: " + e.message);
    stop();
  }
}

const KEEP_FRAMES = 40; // thumbnails of the frames sent last, to show beside the slide the server finds in them

function sendFrame(b64, ts, thumb) {
  state.stream.sendFrame(b64, ts);
  state.frames.push({ ts, thumb });
  if (state.frames.length > KEEP_FRAMES) state.frames.shift();
}

function endInput() {
  state.stream.end();
  if ($("status").dataset.state !== "reconnecting") setStatus("ending", "input ended; waiting for the last captions");
}

function stop() {
  if (state.source) state.source.stop();
  if (state.stream) state.stream.end();
  $("stop").disabled = true;
}

function onEnded(e) {
  if (state.source) state.source.stop();
  $("start").disabled = false;
  $("stop").disabled = true;
  const st = $("status").dataset.state;
  if (e.code === 1000 && st === "closed") return;
  if (e.code !== 1000) setStatus("error", `stream closed (${e.code}${e.reason ? " " + e.reason : ""})` +
    (e.error ? ": " + e.error : state.lastError ? ": " + state.lastError : ""));
  else if (st !== "error") setStatus("closed", `closed: ${plural(state.finals.length, "caption")}`);
}

// ---- events ------------------------------------------------------------------------------------------------------
function onEvent(ev) {
  const handler = HANDLERS[ev.type] || (ev.type && ev.type.startsWith("slide") ? HANDLERS.slide : null);
  if (handler) handler(ev);
}

const HANDLERS = {
  ready(ev) {
    $("stream-id").textContent = ev.stream_id;
    if (ev.resumed) notice(`resumed after a break (${plural(ev.last_seq, "caption")} already here)`);
  },
  partial(ev) { showPartial(ev, false); },
  revision(ev) { showPartial(ev, true); },
  final(ev) { addFinal(ev); },
  metrics(ev) {
    const c = ev.latency_ms && ev.latency_ms.caption;
    if (c !== undefined) $("latency").textContent = (c / 1000).toFixed(2) + " s";
  },
  slide(ev) { addSlide(ev); },
  speech(ev) {
    count("speech");
    state.speech.play(ev.audio_base64).then(() => count("played"))
      .catch((e) => notice("speech could not be played: " + e.message));
  },
  degraded(ev) { notice(`the ${ev.slo} class is degraded (${ev.step}): the server is busy`); },
  restored(ev) { notice(`the ${ev.slo} class is back to level ${ev.level}`); },
  not_durable(ev) { notice(ev.message); },
  durable() { notice("captions are crash-safe again"); },
  error(ev) {
    state.lastError = `${ev.code}: ${ev.message}`;
    notice(`error [${ev.code}]: ${ev.message}`);
  },
  closed(ev) {
    $("partial").replaceChildren();
    setStatus("closed", `closed: ${plural(ev.finals, "caption")} (${ev.reason})`);
  },
};

const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

function count(kind) {
  state.counts[kind] += 1;
  document.body.dataset[kind] = state.counts[kind];
  const node = $("count-" + kind);
  if (node) node.textContent = state.counts[kind];
}

function showPartial(ev, revised) {
  count(revised ? "revision" : "partial");
  const box = $("partial");
  const stable = ev.stable_text || "";
  const rest = ev.source_text.startsWith(stable) ? ev.source_text.slice(stable.length) : ev.source_text;
  const parts = [LF.el("span", { class: "time", text: LF.clock(ev.start) }),
    LF.el("span", { class: "stable", text: ev.source_text.startsWith(stable) ? stable : "" }),
    LF.el("span", { class: "unstable", text: rest })];
  if (revised && state.lastPartial) {
    parts.push(LF.el("span", { class: "badge", text: "revised ×" + ev.revision }),
      LF.el("del", { class: "was", text: state.lastPartial }));
  }
  const line = LF.el("p", { class: "src" }, ...parts);
  const tr = ev.text ? LF.el("p", { class: "tr" }, LF.el("span", { class: "lang", text: state.targets[0] }),
    ev.text) : null;
  box.replaceChildren(line, tr || "");
  box.classList.toggle("revised", revised);
  state.lastPartial = ev.source_text;
}

function addFinal(ev) {
  count("final");
  state.finals.push(ev);
  state.lastPartial = "";
  $("partial").replaceChildren();
  const li = LF.el("li", { class: "final" + (ev.gated || ev.failed ? " flagged" : ""), "data-seq": ev.seq },
    LF.el("div", { class: "meta" }, LF.el("span", { class: "seq", text: "#" + ev.seq }),
      LF.el("span", { class: "time", text: `${LF.clock(ev.start)}–${LF.clock(ev.end)}` })),
    LF.el("p", { class: "src", text: ev.source_text || (ev.note ? "(" + ev.note + ")" : "") }));
  for (const t of state.targets) {
    const text = (ev.translations || {})[t];
    if (text === undefined) continue;
    const low = (ev.low_confidence || []).includes(t);
    li.append(LF.el("p", { class: "tr" + (low ? " low" : ""), title: low ? "low-confidence route: check it" : "" },
      LF.el("span", { class: "lang", text: t }), text));
  }
  if (ev.slide_terms && ev.slide_terms.length) {
    li.append(LF.el("p", { class: "terms", text: "from the slides: " + ev.slide_terms.join(", ") }));
  }
  $("captions").append(li);
  li.scrollIntoView({ block: "nearest" });
}

function addSlide(ev) {
  count("slide");
  const t = typeof ev.t === "number" ? ev.t : 0;
  // the picture: the last frame sent at or before the moment the server read the slide (settled_t)
  const at = typeof ev.settled_t === "number" ? ev.settled_t : t;
  const seen = state.frames.filter((f) => f.ts <= at + 0.05);
  const img = seen.length ? seen[seen.length - 1].thumb : null;
  const li = LF.el("li", { class: "slide", "data-t": t },
    LF.el("div", { class: "meta" }, LF.el("span", { class: "time", text: LF.clock(t) })),
    img ? LF.el("img", { src: img, alt: "slide at " + LF.clock(t) }) : null,
    LF.el("p", { class: "src", text: ev.source_text || "" }));
  for (const [lang, text] of Object.entries(ev.translations || {})) {
    li.append(LF.el("p", { class: "tr" }, LF.el("span", { class: "lang", text: lang }), text));
  }
  $("slides").prepend(li);
}

function resetCaptions(targets) {
  state.targets = targets;
  state.sourceLang = $("source-lang").value;
  state.finals = [];
  state.frames = [];
  state.lastError = "";
  for (const k of Object.keys(state.counts)) {
    state.counts[k] = 0;
    document.body.dataset[k] = 0;
    const node = $("count-" + k);
    if (node) node.textContent = 0;
  }
  $("captions").replaceChildren();
  $("slides").replaceChildren();
  $("partial").replaceChildren();
  $("notices").replaceChildren();
  const view = $("export-lang");
  view.replaceChildren(LF.el("option", { value: "source", text: "spoken (" + state.sourceLang + ")" }),
    ...targets.map((t, i) => LF.el("option", { value: t, text: langName(t), selected: i === 0 })));
}

function notice(text) {
  const box = $("notices");
  box.prepend(LF.el("li", { text }));
  while (box.children.length > 5) box.lastChild.remove();
}

function setStatus(kind, text) {
  const s = $("status");
  s.dataset.state = kind;
  s.textContent = text;
}

// ---- copy / SRT ------------------------------------------------------------------------------------------------
function lines(lang) {
  return state.finals.map((f) => (lang === "source" ? f.source_text : (f.translations || {})[lang] || ""))
    .map((s) => s.trim());
}

function toSrt(lang) {
  const texts = lines(lang);
  return state.finals.map((f, i) => `${i + 1}\n${LF.fmtTime(f.start)} --> ${LF.fmtTime(f.end)}\n${texts[i]}\n`)
    .join("\n");
}

async function copyText() {
  const text = lines($("export-lang").value).filter(Boolean).join("\n");
  try {
    await navigator.clipboard.writeText(text);
  } catch (e) { // no async clipboard (an insecure context): the old way
    const area = LF.el("textarea", { value: text });
    document.body.append(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }
  notice(`copied ${plural(state.finals.length, "caption")}`);
}

function downloadSrt() {
  const lang = $("export-lang").value;
  const blob = new Blob([toSrt(lang)], { type: "application/x-subrip" });
  const a = LF.el("a", { href: URL.createObjectURL(blob), download: `captions-${lang}.srt` });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10000);
}

// ---- page ----------------------------------------------------------------------------------------------------
function showKeyState() {
  $("key-state").textContent = LF.key() ? "key set for this tab" : "no key";
}

function showInput() {
  const mode = document.querySelector("input[name=input]:checked").value;
  $("mic-row").hidden = mode !== "mic";
  $("file-row").hidden = mode !== "file";
  if (mode === "mic") loadMicrophones().catch(() => {});
}

window.addEventListener("DOMContentLoaded", () => {
  showKeyState();
  $("key-change").onclick = async () => { await LF.askKey($("key-dialog"), LF.keyName, ""); showKeyState(); };
  for (const r of document.querySelectorAll("input[name=input]")) r.onchange = showInput;
  $("source-lang").onchange = renderTargets;
  $("start").onclick = () => start();
  $("stop").onclick = () => stop();
  $("copy").onclick = () => copyText();
  $("download-srt").onclick = () => downloadSrt();
  showInput();
  loadLanguages();
});
