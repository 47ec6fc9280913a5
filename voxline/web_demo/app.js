// voxline browser voice chat: microphone -> WS /v1/realtime (OpenAI Realtime, GA dialect)
// -> speaker. Plain JS, no build step. Server VAD decides turns; when it hears the user
// start speaking (input_audio_buffer.speech_started) local playback stops at once
// (barge-in); the server truncates the interrupted reply itself.
"use strict";

(() => {
  const RATE = 24000;            // audio/pcm on the wire: PCM16 LE mono 24 kHz, both ways
  const CHUNK_SAMPLES = 960;     // 40 ms per input_audio_buffer.append
  const MAX_QUEUED_CHUNKS = 75;  // audio kept (3 s) while the socket is still opening
  const PLAYBACK_MARGIN_S = 0.05;  // jitter margin when playback (re)starts

  const $ = (id) => document.getElementById(id);
  const talkButton = $("talk");
  const statusEl = $("status");
  const logEl = $("log");
  const keyInput = $("apikey");

  // Read-only counters for tests and the curious (window.voxlineStats in the console).
  const stats = {
    state: "idle", connects: 0, eventsReceived: 0, chunksSent: 0, samplesSent: 0,
    deltasReceived: 0, samplesReceived: 0, samplesScheduled: 0, samplesPlayed: 0, playbackStops: 0,
    speechStarted: 0, responsesCreated: 0, responsesDone: 0, userTranscripts: 0, assistantTranscripts: 0, errors: 0,
    captureRate: 0, lastClose: null,
  };
  Object.defineProperty(window, "voxlineStats", {
    get: () => Object.freeze({ ...stats }), enumerable: true,
  });

  // Runs on the audio thread: mono float input at the context's rate -> PCM16 at 24 kHz
  // (linear interpolation when the context could not run at 24 kHz), posted in chunks.
  const CAPTURE_WORKLET = `
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
`;

  let call = null;  // the one live conversation, or null

  // ---- page helpers -------------------------------------------------------------------

  function setStatus(state, text) {
    stats.state = state;
    statusEl.dataset.state = state;
    statusEl.textContent = text;
  }

  function addEntry(kind, text, who) {
    const li = document.createElement("li");
    li.className = kind;
    if (who) {
      const label = document.createElement("span");
      label.className = "who";
      label.textContent = who;
      li.append(label);
    }
    const body = document.createElement("span");
    body.className = "text";
    body.textContent = text;
    li.append(body);
    logEl.append(li);
    li.scrollIntoView({ block: "end" });
    return li;
  }

  function setEntryText(li, text, pending = false) {
    li.querySelector(".text").textContent = text;
    li.classList.toggle("pending", pending);
  }

  function showError(message) {
    stats.errors += 1;
    addEntry("error", message, "error");
  }

  function setButton(active) {
    talkButton.textContent = active ? "Stop" : "Talk";
    talkButton.classList.toggle("active", active);
  }

  function toBase64(buffer) {
    const bytes = new Uint8Array(buffer);
    let s = "";
    for (let i = 0; i < bytes.length; i += 0x8000) {
      s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
    }
    return btoa(s);
  }

  function fromBase64(text) {
    const s = atob(text);
    const bytes = new Uint8Array(s.length);
    for (let i = 0; i < s.length; i++) bytes[i] = s.charCodeAt(i);
    return bytes;
  }

  function realtimeUrl() {
    const url = new URL("v1/realtime", location.href);
    url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
    url.search = "?model=voxline";
    return url.href;
  }

  // ---- audio --------------------------------------------------------------------------

  async function openMicrophone(c) {
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia || !window.AudioWorkletNode) {
      throw new Error("this page needs microphone access, which browsers only give to "
        + "https:// pages or http://localhost / 127.0.0.1");
    }
    c.stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
    });
    let source;
    try {
      c.ctx = new AudioContext({ sampleRate: RATE, latencyHint: "interactive" });
      source = c.ctx.createMediaStreamSource(c.stream);
    } catch (err) {
      // Some browsers cannot mix a 24 kHz context with the microphone's rate:
      // run at the device rate and resample in the worklet instead.
      if (c.ctx) c.ctx.close().catch(() => {});
      c.ctx = new AudioContext({ latencyHint: "interactive" });
      source = c.ctx.createMediaStreamSource(c.stream);
    }
    stats.captureRate = c.ctx.sampleRate;
    await c.ctx.resume();
    const url = URL.createObjectURL(new Blob([CAPTURE_WORKLET], { type: "text/javascript" }));
    try {
      await c.ctx.audioWorklet.addModule(url);
    } finally {
      URL.revokeObjectURL(url);
    }
    const capture = new AudioWorkletNode(c.ctx, "voxline-capture", {
      numberOfInputs: 1, numberOfOutputs: 1, outputChannelCount: [1],
      processorOptions: { rate: RATE, chunk: CHUNK_SAMPLES },
    });
    capture.port.onmessage = (e) => sendAudio(c, e.data);
    source.connect(capture);
    capture.connect(c.ctx.destination);  // outputs silence; keeps the node pulled
    c.nodes = [source, capture];
  }

  function sendAudio(c, buffer) {
    if (c !== call) return;
    if (!c.ready) {
      c.queued.push(buffer);
      if (c.queued.length > MAX_QUEUED_CHUNKS) c.queued.shift();
      return;
    }
    c.ws.send(JSON.stringify({ type: "input_audio_buffer.append", audio: toBase64(buffer) }));
    stats.chunksSent += 1;
    stats.samplesSent += buffer.byteLength / 2;
  }

  function playDelta(c, b64) {
    let bytes = fromBase64(b64);
    if (c.carry) {  // a delta may split a sample in two
      const joined = new Uint8Array(bytes.length + 1);
      joined[0] = c.carry[0];
      joined.set(bytes, 1);
      bytes = joined;
      c.carry = null;
    }
    if (bytes.length % 2) {
      c.carry = bytes.slice(-1);
      bytes = bytes.subarray(0, bytes.length - 1);
    }
    const n = bytes.length / 2;
    stats.samplesReceived += n;
    if (!n || !c.ctx) return;
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    const buffer = c.ctx.createBuffer(1, n, RATE);
    const samples = buffer.getChannelData(0);
    for (let i = 0; i < n; i++) samples[i] = view.getInt16(2 * i, true) / 32768;
    const node = c.ctx.createBufferSource();
    node.buffer = buffer;
    node.connect(c.ctx.destination);
    const now = c.ctx.currentTime;
    if (c.playhead < now + 0.005) c.playhead = now + PLAYBACK_MARGIN_S;
    node.start(c.playhead);
    c.playhead += buffer.duration;
    c.playing.add(node);
    node.onended = () => {
      stats.samplesPlayed += n;
      c.playing.delete(node);
      if (!c.playing.size && c === call && stats.state === "speaking") {
        setStatus("listening", "listening — speak");
      }
    };
    stats.samplesScheduled += n;
  }

  function stopPlayback(c) {
    if (!c.playing.size) return false;
    for (const node of c.playing) {
      node.onended = null;
      try { node.stop(); } catch (err) { /* already stopped */ }
    }
    c.playing.clear();
    c.playhead = 0;
    c.carry = null;
    stats.playbackStops += 1;
    return true;
  }

  // ---- conversation -------------------------------------------------------------------

  function userEntry(c, itemId) {
    let li = c.users.get(itemId);
    if (!li) {
      li = addEntry("user pending", "…", "you");
      c.users.set(itemId, li);
    }
    return li;
  }

  function assistantEntry(c, itemId) {
    let entry = c.replies.get(itemId);
    if (!entry) {
      entry = { li: addEntry("assistant pending", "", "voxline"), text: "" };
      c.replies.set(itemId, entry);
    }
    return entry;
  }

  function onEvent(c, event) {
    stats.eventsReceived += 1;
    switch (event.type) {
      case "session.created":
        setStatus("listening", "listening — speak");
        break;
      case "session.updated":
        break;
      case "input_audio_buffer.speech_started": {
        // Barge-in: silence the bot now. The server cancels the reply in progress and
        // truncates it to what was played; audio of that reply still in flight is dropped.
        stats.speechStarted += 1;
        const wasPlaying = stopPlayback(c);
        for (const id of c.activeResponses) c.interrupted.add(id);
        for (const [itemId, entry] of c.replies) {
          if (entry.live || (wasPlaying && itemId === c.lastAudioItem)) {
            entry.li.classList.add("interrupted");
          }
        }
        setStatus("hearing", "hearing you…");
        break;
      }
      case "input_audio_buffer.speech_stopped":
        setStatus("thinking", "thinking…");
        break;
      case "input_audio_buffer.committed":
        userEntry(c, event.item_id);
        break;
      case "conversation.item.input_audio_transcription.delta": {
        const li = userEntry(c, event.item_id);
        li.dataset.partial = (li.dataset.partial || "") + event.delta;
        setEntryText(li, li.dataset.partial, true);
        break;
      }
      case "conversation.item.input_audio_transcription.completed":
        stats.userTranscripts += 1;
        setEntryText(userEntry(c, event.item_id), event.transcript || "(nothing heard)");
        break;
      case "conversation.item.input_audio_transcription.failed":
        setEntryText(userEntry(c, event.item_id), "(not understood)");
        showError(`transcription failed: ${event.error && event.error.message}`);
        break;
      case "response.created":
        stats.responsesCreated += 1;
        c.activeResponses.add(event.response.id);
        break;
      case "response.output_audio.delta":
        if (c.interrupted.has(event.response_id)) break;  // stale audio of a cut-off reply
        stats.deltasReceived += 1;
        c.lastAudioItem = event.item_id;
        playDelta(c, event.delta);
        if (c.playing.size) setStatus("speaking", "speaking — talk to interrupt");
        break;
      case "response.output_audio_transcript.delta":
      case "response.output_text.delta": {
        const entry = assistantEntry(c, event.item_id);
        entry.live = true;
        entry.text += event.delta;
        setEntryText(entry.li, entry.text, true);
        break;
      }
      case "response.output_audio_transcript.done":
      case "response.output_text.done": {
        const entry = assistantEntry(c, event.item_id);
        entry.text = event.type.endsWith("transcript.done") ? event.transcript : event.text;
        entry.live = false;
        setEntryText(entry.li, entry.text);
        stats.assistantTranscripts += 1;
        break;
      }
      case "response.done": {
        const response = event.response || {};
        stats.responsesDone += 1;
        c.activeResponses.delete(response.id);
        for (const item of response.output || []) {
          const entry = c.replies.get(item.id);
          if (entry) entry.live = false;
        }
        if (response.status === "failed") {
          const detail = response.status_details && response.status_details.error;
          showError(`response failed: ${(detail && detail.message) || "no reason given"}`);
        }
        if (!c.playing.size && stats.state !== "hearing") setStatus("listening", "listening — speak");
        break;
      }
      case "error": {
        const e = event.error || {};
        showError(`${e.type || "error"}${e.code ? ` (${e.code})` : ""}: ${e.message || "unknown"}`);
        break;
      }
      default:
        break;
    }
  }

  function connect(c, key) {
    const protocols = ["realtime"];
    if (key) protocols.push(`openai-insecure-api-key.${key}`);
    c.ws = new WebSocket(realtimeUrl(), protocols);
    stats.connects += 1;
    c.ws.onopen = () => {
      c.ws.send(JSON.stringify({
        type: "session.update",
        session: {
          type: "realtime",
          audio: {
            input: {
              format: { type: "audio/pcm", rate: RATE },
              transcription: { model: "moonshine" },
              turn_detection: { type: "server_vad" },
            },
            output: { format: { type: "audio/pcm", rate: RATE } },
          },
        },
      }));
      c.ready = true;
      const queued = c.queued;
      c.queued = [];
      for (const buffer of queued) sendAudio(c, buffer);
    };
    c.ws.onmessage = (e) => {
      if (c !== call) return;
      let event;
      try {
        event = JSON.parse(e.data);
      } catch (err) {
        showError(`unreadable server message: ${String(e.data).slice(0, 200)}`);
        return;
      }
      onEvent(c, event);
    };
    c.ws.onclose = (e) => {
      stats.lastClose = { code: e.code, reason: e.reason };
      if (c !== call || c.stopping) return;
      let why = e.reason || "no reason given";
      if (e.code === 1013) why = `server busy or not ready: ${why} (try again shortly)`;
      else if (e.code === 1008) why = `refused: ${why}`;
      else if (e.code === 1006) why = "connection lost (is the server running?)";
      showError(`connection closed (${e.code}): ${why}`);
      finish(c);
      setStatus("closed", `disconnected — ${why}`);
    };
  }

  function finish(c) {
    c.stopping = true;
    c.ready = false;
    stopPlayback(c);
    if (c.ws && c.ws.readyState <= WebSocket.OPEN) c.ws.close(1000, "user stopped");
    if (c.stream) c.stream.getTracks().forEach((t) => t.stop());
    if (c.nodes) c.nodes.forEach((n) => n.disconnect());
    if (c.ctx && !c.ctxClosed) {
      c.ctxClosed = true;
      c.ctx.close().catch(() => {});
    }
    if (call === c) call = null;
    setButton(false);
  }

  async function start() {
    if (call) return;
    const c = {
      ws: null, ctx: null, stream: null, nodes: null, ready: false, stopping: false,
      queued: [], playing: new Set(), playhead: 0, carry: null, lastAudioItem: null,
      users: new Map(), replies: new Map(), activeResponses: new Set(), interrupted: new Set(),
    };
    call = c;
    setButton(true);
    setStatus("connecting", "connecting…");
    try {
      await openMicrophone(c);
      if (c !== call) return finish(c);
      connect(c, keyInput.value.trim());
    } catch (err) {
      finish(c);
      const message = err && err.name === "NotAllowedError"
        ? "microphone permission was denied" : (err && err.message) || String(err);
      showError(`could not start: ${message}`);
      setStatus("error", `could not start — ${message}`);
    }
  }

  function stop() {
    if (!call) return;
    finish(call);
    setStatus("idle", "idle — press Talk");
  }

  talkButton.addEventListener("click", () => (call ? stop() : start()));
  window.addEventListener("pagehide", stop);
  if (new URLSearchParams(location.search).get("autostart") === "1") start();
})();
