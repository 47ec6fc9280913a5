// voxline browser page: the audio-thread code (AudioWorklet processors), loaded by app.js
// with audioWorklet.addModule.
//
// "voxline-capture": mono float mic at the context's rate -> PCM16 at 24 kHz (linear
// interpolation), posted in chunks. "voxline-meter": the peak of every 20 ms block of the
// remote track, so the page knows when the reply becomes audible.
"use strict";

class VoxlineCapture extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const o = options.processorOptions;
    this.step = sampleRate / o.rate;
    this.chunk = o.chunk;
    this.t = 0;
    this.prev = 0;
    this.out = new Int16Array(this.chunk);
    this.n = 0;
  }
  emit(v) {
    v = v < -1 ? -1 : v > 1 ? 1 : v;
    this.out[this.n++] = v < 0 ? v * 32768 : v * 32767;
    if (this.n === this.chunk) {
      this.port.postMessage(this.out.buffer, [this.out.buffer]);
      this.out = new Int16Array(this.chunk);
      this.n = 0;
    }
  }
  process(inputs) {
    const x = inputs[0] && inputs[0][0];
    if (!x) return true;
    const n = x.length;
    let t = this.t;
    while (t <= n - 1) {
      const i = Math.floor(t), f = t - i;
      const a = i < 0 ? this.prev : x[i];
      const b = i + 1 < n ? x[i + 1] : a;
      this.emit(a + (b - a) * f);
      t += this.step;
    }
    this.t = t - n;
    this.prev = x[n - 1];
    return true;
  }
}
registerProcessor("voxline-capture", VoxlineCapture);

class VoxlineMeter extends AudioWorkletProcessor {
  constructor() {
    super();
    this.block = Math.round(sampleRate / 50);
    this.n = 0;
    this.peak = 0;
  }
  process(inputs) {
    const x = inputs[0] && inputs[0][0];
    if (!x) return true;
    for (let i = 0; i < x.length; i++) {
      const v = Math.abs(x[i]);
      if (v > this.peak) this.peak = v;
      if (++this.n === this.block) {
        this.port.postMessage(this.peak);
        this.n = 0;
        this.peak = 0;
      }
    }
    return true;
  }
}
registerProcessor("voxline-meter", VoxlineMeter);
