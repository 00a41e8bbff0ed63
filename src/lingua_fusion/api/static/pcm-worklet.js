// Audio in the browser -> PCM16 little-endian mono 16 kHz, the stream protocol's binary frames (docs/streaming.md).
// Loaded twice: as an AudioWorklet module (registerProcessor exists) and, where AudioWorklet is not available
// (a page not served over https or localhost), as a plain script whose Pcm16Resampler a ScriptProcessor uses.
"use strict";

const TARGET_RATE = 16000;
const CHUNK = 1600; // 100 ms of 16 kHz audio per binary frame

class Pcm16Resampler {
  constructor(inputRate) {
    this.step = inputRate / TARGET_RATE; // input samples per output sample
    this.t = 0; // position of the next output sample, in input samples from the start of the next block
    this.last = 0; // the previous block's last (smoothed) sample, at position -1
    this.width = Math.max(1, Math.round(this.step)); // moving average before decimation: a crude low-pass
    this.tail = new Float32Array(0);
    this.out = new Int16Array(CHUNK);
    this.n = 0;
  }

  // channels: Float32Array[] of one render block; returns the full CHUNKs made (Int16Array each).
  push(channels) {
    const length = channels[0].length;
    const mono = new Float32Array(length);
    for (const ch of channels) for (let i = 0; i < length; i++) mono[i] += ch[i] / channels.length;
    const x = this.smooth(mono);
    const chunks = [];
    while (this.t <= length - 1) {
      const i = Math.floor(this.t), f = this.t - i;
      const s0 = i < 0 ? this.last : x[i];
      const s1 = i + 1 < length ? x[i + 1] : x[i];
      const v = Math.max(-1, Math.min(1, s0 + (s1 - s0) * f));
      this.out[this.n++] = v < 0 ? v * 0x8000 : v * 0x7fff;
      if (this.n === CHUNK) {
        chunks.push(this.out);
        this.out = new Int16Array(CHUNK);
        this.n = 0;
      }
      this.t += this.step;
    }
    this.t -= length;
    this.last = x[length - 1];
    return chunks;
  }

  smooth(x) {
    if (this.width === 1) return x;
    const joined = new Float32Array(this.tail.length + x.length);
    joined.set(this.tail);
    joined.set(x, this.tail.length);
    const y = new Float32Array(x.length);
    let sum = 0;
    for (let j = 0; j < joined.length; j++) {
      sum += joined[j];
      if (j >= this.width) sum -= joined[j - this.width];
      const i = j - this.tail.length;
      if (i >= 0) y[i] = sum / Math.min(this.width, j + 1);
    }
    this.tail = joined.slice(Math.max(0, joined.length - this.width + 1));
    return y;
  }

  flush() {
    const rest = this.out.slice(0, this.n);
    this.n = 0;
    return rest;
  }
}

if (typeof registerProcessor === "function") {
  class PcmCapture extends AudioWorkletProcessor {
    constructor() {
      super();
      this.resampler = new Pcm16Resampler(sampleRate);
      this.port.onmessage = (e) => {
        if (e.data === "flush") {
          const rest = this.resampler.flush();
          this.port.postMessage({ pcm: rest.buffer, flushed: true }, [rest.buffer]);
        }
      };
    }

    process(inputs) {
      const input = inputs[0];
      if (input && input.length && input[0].length) {
        for (const chunk of this.resampler.push(input)) this.port.postMessage({ pcm: chunk.buffer }, [chunk.buffer]);
      }
      return true;
    }
  }
  registerProcessor("pcm16-capture", PcmCapture);
} else {
  self.Pcm16Resampler = Pcm16Resampler;
}
