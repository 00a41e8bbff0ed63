// Where a stream's audio and slides come from: the microphone, or a file (audio or video) played as a live stream
// through a media element. Either way the sound goes through WebAudio to pcm-worklet.js, which hands back
// 100 ms PCM16 16 kHz chunks; a video's frames are sent every FRAME_EVERY_MS of playback as `frame` messages
// (the server detects slide changes and reads and translates each new slide once).
"use strict";

const FRAME_EVERY_MS = 250; // the server judges a slide settled after ~0.45 s unchanged: a few frames
const FRAME_WIDTH = 960; // frames are sent at most this wide (JPEG)

class CaptureSource {
  // sink: { pcm(ArrayBuffer), frame(base64 jpeg, ts, thumbnail dataUrl), ended() }
  constructor(sink) {
    this.sink = sink;
    this.ctx = null;
    this.node = null;
    this.stream = null;
    this.player = null;
    this.frameTimer = null;
    this.stopped = false;
  }

  async openContext() {
    const Ctx = window.AudioContext || window.webkitAudioContext;
    try {
      this.ctx = new Ctx({ sampleRate: 16000, latencyHint: "interactive" });
    } catch (e) {
      this.ctx = new Ctx(); // the worklet resamples whatever rate this is
    }
    if (this.ctx.audioWorklet) {
      await this.ctx.audioWorklet.addModule("/static/pcm-worklet.js");
      this.node = new AudioWorkletNode(this.ctx, "pcm16-capture", { numberOfOutputs: 1, outputChannelCount: [1] });
      this.node.port.onmessage = (e) => {
        if (e.data.pcm.byteLength) this.sink.pcm(e.data.pcm);
        if (e.data.flushed && this.onFlushed) this.onFlushed();
      };
    } else { // no AudioWorklet (an insecure context): a ScriptProcessor with the same resampler
      const resampler = new self.Pcm16Resampler(this.ctx.sampleRate);
      this.node = this.ctx.createScriptProcessor(4096, 1, 1);
      this.node.onaudioprocess = (e) => {
        const chans = [];
        for (let c = 0; c < e.inputBuffer.numberOfChannels; c++) chans.push(e.inputBuffer.getChannelData(c));
        for (const chunk of resampler.push(chans)) this.sink.pcm(chunk.buffer);
      };
      this.flushNow = () => {
        const rest = resampler.flush();
        if (rest.length) this.sink.pcm(rest.buffer);
        if (this.onFlushed) this.onFlushed();
      };
    }
    // the capture node must reach the destination to be pulled; it outputs silence
    const mute = this.ctx.createGain();
    mute.gain.value = 0;
    this.node.connect(mute).connect(this.ctx.destination);
    if (this.ctx.state === "suspended") await this.ctx.resume();
  }

  async startMicrophone(deviceId) {
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
      throw new Error("this page cannot use the microphone here (it needs https or localhost)");
    }
    this.stream = await navigator.mediaDevices.getUserMedia({
      audio: { deviceId: deviceId ? { exact: deviceId } : undefined, channelCount: 1, echoCancellation: true },
    });
    await this.openContext();
    this.ctx.createMediaStreamSource(this.stream).connect(this.node);
  }

  // a file played as a live stream: it is heard (and seen) at normal speed while its audio is sent
  async startFile(file, player, sendFrames) {
    this.player = player;
    player.src = URL.createObjectURL(file);
    player.hidden = !file.type.startsWith("video/");
    await this.openContext();
    const source = this.ctx.createMediaElementSource(player);
    source.connect(this.node);
    source.connect(this.ctx.destination);
    player.onended = () => this.finish();
    this.sendFrames = sendFrames;
    await player.play();
    if (sendFrames) this.frameTimer = setInterval(() => this.checkFrame(), FRAME_EVERY_MS);
  }

  // one frame of the playing video, sent as a `frame` message: the server finds slide changes (video/slides.py)
  checkFrame() {
    const p = this.player;
    if (!this.sendFrames || !p || !p.videoWidth || p.paused || p.ended || this.stopped) return;
    const scale = Math.min(1, FRAME_WIDTH / p.videoWidth);
    const full = document.createElement("canvas");
    full.width = Math.round(p.videoWidth * scale);
    full.height = Math.round(p.videoHeight * scale);
    full.getContext("2d").drawImage(p, 0, 0, full.width, full.height);
    const dataUrl = full.toDataURL("image/jpeg", 0.85);
    const thumb = document.createElement("canvas");
    thumb.width = 320;
    thumb.height = Math.round(320 * full.height / full.width);
    thumb.getContext("2d").drawImage(full, 0, 0, thumb.width, thumb.height);
    this.sink.frame(dataUrl.slice(dataUrl.indexOf(",") + 1), p.currentTime, thumb.toDataURL("image/jpeg", 0.7));
  }

  // the file ended: send what the resampler holds, then tell the sink
  finish() {
    if (this.finishing) return;
    this.finishing = true;
    clearInterval(this.frameTimer);
    this.onFlushed = () => this.sink.ended();
    if (this.node && this.node.port) this.node.port.postMessage("flush");
    else if (this.flushNow) this.flushNow();
    else this.sink.ended();
  }

  stop() {
    this.stopped = true;
    clearInterval(this.frameTimer);
    if (this.player) {
      this.player.pause();
      this.player.onended = null;
    }
    if (this.stream) for (const t of this.stream.getTracks()) t.stop();
    if (this.ctx) this.ctx.close().catch(() => {});
  }
}

// Speech events (WAV in base64) played one after the other, in the order they arrive.
class SpeechQueue {
  constructor() {
    this.ctx = null;
    this.at = 0;
  }

  unlock() { // called from the Start click: browsers let a page play sound after a user gesture
    if (!this.ctx) this.ctx = new (window.AudioContext || window.webkitAudioContext)();
    if (this.ctx.state === "suspended") this.ctx.resume();
  }

  async play(base64) {
    this.unlock();
    const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
    const buffer = await this.ctx.decodeAudioData(bytes.buffer);
    const src = this.ctx.createBufferSource();
    src.buffer = buffer;
    src.connect(this.ctx.destination);
    this.at = Math.max(this.at, this.ctx.currentTime);
    src.start(this.at);
    this.at += buffer.duration;
    return buffer.duration;
  }
}
