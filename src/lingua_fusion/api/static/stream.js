// One live stream over WS /v1/streams (docs/streaming.md), as the page uses it: opened with a single-use ticket
// (POST /v1/stream-tickets with the key in a header: the key never goes in a URL), audio sent as timestamped
// `audio` messages and kept for BUFFER_S seconds, so that when the connection breaks (a server restart, a drain,
// a network blip) the stream reconnects with a new ticket, resumes (stream id, token, last final seen), re-sends
// the audio the server had not committed, and every final reaches the page exactly once, in order. Like the
// SDK's RemoteStream (sdk/stream.py).
"use strict";

const BUFFER_S = 120; // audio kept for a resume
const RESEND_CHUNK_S = 2; // kept audio re-sent in pieces this long (the server limits messages per second)
const RECONNECT_FOR_S = 120; // give up after this long without a connection

function pcmToBase64(int16) {
  const bytes = new Uint8Array(int16.buffer, int16.byteOffset, int16.byteLength);
  let bin = "";
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(bin);
}

class LiveStream {
  // hooks: { ticket(): Promise<string>, event(ev), status(kind, text), ended({code, reason, error}) }
  constructor(startMessage, hooks) {
    this.startMessage = startMessage;
    this.hooks = hooks;
    this.ws = null;
    this.ready = null; // the first ready event: stream id and resume token
    this.lastSeq = 0;
    this.duplicates = 0;
    this.reconnects = 0;
    this.nextTs = 0;
    this.kept = []; // [{ts, pcm: Int16Array}] the last BUFFER_S seconds of audio
    this.inputEnded = false;
    this.closedSeen = false; // the server said `closed`: the stream is over
    this.gaveUp = false;
    this.live = false; // the server said ready (and a resume's re-send is done): new audio may go out
  }

  open() {
    return this.connect(false);
  }

  async connect(resume) {
    const ticket = await this.hooks.ticket();
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const ws = new WebSocket(`${scheme}://${location.host}/v1/streams?ticket=${encodeURIComponent(ticket)}`,
      ["linguafusion"]);
    this.ws = ws;
    // nothing new goes out before `ready`: audio sent ahead of a resume's re-send would land seconds after the
    // resume point, and the re-sent audio would then fall outside the server's reorder window and be dropped
    this.live = false;
    return new Promise((resolve, reject) => {
      let greeted = false;
      ws.onopen = () => {
        const start = Object.assign({}, this.startMessage);
        if (resume) {
          start.resume = { stream_id: this.ready.stream_id, resume_token: this.ready.resume_token,
            last_seq: this.lastSeq };
        }
        ws.send(JSON.stringify(start));
      };
      ws.onmessage = (m) => {
        const ev = JSON.parse(m.data);
        if (!greeted) {
          greeted = true;
          if (ev.type !== "ready") { // refused: the error event says why, the close follows
            this.hooks.event(ev);
            return;
          }
          if (resume) this.resend(ev);
          else this.ready = ev;
          this.live = true;
          this.hooks.event(ev);
          resolve(ev);
          return;
        }
        if (ev.type === "final" && typeof ev.seq === "number") {
          if (ev.seq <= this.lastSeq) { // sent again after a resume: already shown
            this.duplicates += 1;
            return;
          }
          this.lastSeq = ev.seq;
        }
        if (ev.type === "closed") this.closedSeen = true;
        this.hooks.event(ev);
      };
      ws.onclose = (e) => {
        if (ws !== this.ws) return;
        if (!greeted) reject(Object.assign(new Error(`stream refused (${e.code} ${e.reason || ""})`),
          { code: e.code, reason: e.reason }));
        else this.onClose(e);
      };
      ws.onerror = () => {};
    });
  }

  // after a resume: the audio the server had not committed, in RESEND_CHUNK_S pieces, then `end` if it was sent
  resend(ready) {
    const since = typeof ready.resume_from_ts === "number" ? ready.resume_from_ts : 0;
    const pending = this.kept.filter((k) => k.ts + k.pcm.length / 16000 > since);
    for (let i = 0; i < pending.length;) {
      const ts = pending[i].ts;
      const parts = [];
      let n = 0;
      while (i < pending.length && n < RESEND_CHUNK_S * 16000) {
        parts.push(pending[i].pcm);
        n += pending[i].pcm.length;
        i += 1;
      }
      const pcm = new Int16Array(n);
      let at = 0;
      for (const p of parts) {
        pcm.set(p, at);
        at += p.length;
      }
      this.ws.send(JSON.stringify({ type: "audio", ts, data: pcmToBase64(pcm) }));
    }
    if (this.inputEnded) this.ws.send(JSON.stringify({ type: "end" }));
  }

  onClose(e) {
    const refused = e.code >= 4000 && e.code < 5000; // the server's verdict (its error event came first)
    if (this.closedSeen || refused || this.gaveUp) {
      this.hooks.ended({ code: e.code, reason: e.reason });
      return;
    }
    this.reconnect(); // 1006 (gone), 1012 (draining), 1011, ...: resume
  }

  async reconnect() {
    const deadline = Date.now() + RECONNECT_FOR_S * 1000;
    let delay = 250;
    while (!this.gaveUp) {
      this.hooks.status("reconnecting", "connection lost: reconnecting…");
      try {
        await this.connect(true);
        this.reconnects += 1;
        this.hooks.status("live", `reconnected and resumed (captions from #${this.lastSeq + 1})`);
        return;
      } catch (err) {
        if ((err.code >= 4000 && err.code < 5000 && err.code !== 4429) || Date.now() + delay > deadline) {
          this.gaveUp = true;
          this.hooks.ended({ code: err.code || 1006, reason: err.reason || "", error: err.message });
          return;
        }
        await new Promise((r) => setTimeout(r, delay));
        delay = Math.min(4000, delay * 2);
      }
    }
  }

  get open_() {
    return this.live && this.ws && this.ws.readyState === WebSocket.OPEN;
  }

  sendPcm(buffer) {
    const pcm = new Int16Array(buffer);
    const ts = this.nextTs;
    this.nextTs += pcm.length / 16000;
    this.kept.push({ ts, pcm });
    while (this.kept.length && this.kept[0].ts < this.nextTs - BUFFER_S) this.kept.shift();
    if (this.open_) this.ws.send(JSON.stringify({ type: "audio", ts, data: pcmToBase64(pcm) }));
  }

  sendFrame(b64, ts) { // not kept: a slide missed during a break is read again at the next change
    if (this.open_) this.ws.send(JSON.stringify({ type: "frame", data: b64, ts }));
  }

  end() {
    this.inputEnded = true;
    if (this.open_) this.ws.send(JSON.stringify({ type: "end" }));
  }

  abandon() { // the page gives up (a new stream replaces this one)
    this.gaveUp = true;
    if (this.ws) this.ws.close();
  }
}
