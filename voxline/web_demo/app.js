// voxline browser voice chat, OpenAI Realtime (GA dialect). Plain JS, no build step.
//
// Two transports, picked in the page (or with ?transport=webrtc|websocket):
// - WebRTC (default): POST /v1/realtime/calls with an SDP offer; the microphone goes up as
//   an Opus track, the reply comes back as an Opus track the server paces, and JSON events
//   travel on the "oai-events" data channel. Barge-in: the server clears its track.
// - WebSocket: WS /v1/realtime; the page sends PCM16 24 kHz chunks and plays the
//   response.output_audio.delta chunks itself, stopping them at once on barge-in.
//
// Two ways to talk: hands-free (server VAD decides turns) or press-to-talk (hold the button
// or the space bar; releasing it commits the turn and asks for a reply).
"use strict";

(() => {
  const RATE = 24000;            // audio/pcm on the WebSocket: PCM16 LE mono 24 kHz, both ways
  const CHUNK_SAMPLES = 960;     // 40 ms per input_audio_buffer.append
  const MAX_QUEUED_CHUNKS = 75;  // audio kept (3 s) while the socket is still opening
  const PLAYBACK_MARGIN_S = 0.05;  // jitter margin when playback (re)starts
  const AUDIBLE_PEAK = 0.004;    // a reply-track block louder than this (-48 dBFS) is audible
  const VOICED_PEAK = 0.02;      // a microphone block louder than this (-34 dBFS) is speech
  const PTT_TAIL_MS = 250;       // WebRTC press-to-talk: the last audio still on its way
  const RECONNECT_DELAYS_MS = [1000, 2000, 4000];  // after a live call drops

  const $ = (id) => document.getElementById(id);
  const talkButton = $("talk");
  const holdButton = $("hold");
  const transportSelect = $("transport");
  const modeSelect = $("mode");
  const statusEl = $("status");
  const latencyEl = $("latency");
  const logEl = $("log");
  const keyInput = $("apikey");
  const remoteAudio = $("remote");
  const videoPanel = window.voxlineVideo;  // the call's video (video.js)

  // Read-only counters for tests and the curious (window.voxlineStats in the console).
  const stats = {
    state: "idle", transport: "", mode: "", connects: 0, eventsReceived: 0,
    chunksSent: 0, samplesSent: 0,                                      // WebSocket mic
    deltasReceived: 0, samplesReceived: 0, samplesScheduled: 0, samplesPlayed: 0,  // WebSocket reply
    framesReceived: 0, audibleFrames: 0, iceState: "", candidatePair: null,        // WebRTC reply
    playbackStops: 0, outputStarted: 0, outputCleared: 0,
    speechStarted: 0, responsesCreated: 0, responsesDone: 0, userTranscripts: 0, assistantTranscripts: 0,
    errors: 0, reconnects: 0, captureRate: 0, lastClose: null,
    // per turn: end of speech (the mic's last voiced block) -> first audible reply, and the
    // part of it after speech_stopped (or the press-to-talk release) reached the page
    latenciesMs: [], afterStoppedMs: [],
  };
  Object.defineProperty(window, "voxlineStats", {
    get: () => Object.freeze({ ...stats, latenciesMs: [...stats.latenciesMs],
      afterStoppedMs: [...stats.afterStoppedMs], video: videoPanel.stats() }), enumerable: true,
  });


  let call = null;  // the one live conversation, or null
  let reconnectTimer = null;

  // ---- page helpers -------------------------------------------------------------------

  function setStatus(state, text) {
    stats.state = state;
    statusEl.dataset.state = state;
    statusEl.textContent = text;
  }

  function listening() {
    setStatus("listening", pushToTalk() ? "ready — hold the button (or space) to talk" : "listening — speak");
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
    holdButton.disabled = !active;
  }

  function pushToTalk() {
    return modeSelect.value === "push";
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

  // The session this page wants: transcripts of the user, and semantic VAD (the end-of-turn
  // model with the transcript rules) unless press-to-talk. /v1/realtime's own default
  // stays OpenAI's server_vad (500 ms) for other clients; this page asks for the best.
  function sessionConfig(c) {
    const input = {
      transcription: { model: "moonshine" },
      turn_detection: pushToTalk() ? null : { type: "semantic_vad", eagerness: "auto" },
    };
    const output = {};
    if (c.transport === "websocket") {  // over WebRTC the tracks carry Opus
      input.format = { type: "audio/pcm", rate: RATE };
      output.format = { type: "audio/pcm", rate: RATE };
    }
    return { type: "realtime", audio: { input, output } };
  }

  function send(c, event) {
    if (!c.ready) return;
    const text = JSON.stringify(event);
    if (c.transport === "webrtc") c.channel.send(text);
    else c.ws.send(text);
  }

  // ---- latency: end of the user's speech -> first reply audio they can hear ------------
  // The end of speech is the microphone's last voiced 20 ms block (metered on the page, so
  // on the page's clock), not speech_stopped: that arrives after the server's silence
  // window (semantic VAD's pause here; 500 ms under server_vad), part of the wait the user
  // feels. Both are shown.

  function voiceHeard(c) {
    c.lastVoiceAt = performance.now();
  }

  function turnEnded(c, signal) {
    const now = performance.now();
    c.stoppedAt = now;
    c.stopSignal = signal;
    // voiced since the previous turn ended: that is this turn's end of speech
    const voiced = c.lastVoiceAt !== null && c.lastVoiceAt > c.previousStopAt;
    c.turnEndedAt = voiced ? c.lastVoiceAt : null;
    c.previousStopAt = now;
  }

  function replyAudible(c, at) {
    if (c.stoppedAt === null) return;
    const after = Math.max(0, Math.round(at - c.stoppedAt));
    const total = c.turnEndedAt === null ? null : Math.max(0, Math.round(at - c.turnEndedAt));
    c.stoppedAt = c.turnEndedAt = null;
    const s = (ms) => `${(ms / 1000).toFixed(2)} s`;
    let text = `${c.stopSignal} → first audio: ${s(after)} (no voiced microphone level seen)`;
    if (total !== null) {
      stats.latenciesMs.push(total);
      text = `end of speech → first audio: ${s(total)} (after ${c.stopSignal}: ${s(after)})`;
    }
    stats.afterStoppedMs.push(after);
    latencyEl.textContent = `last turn: ${text}`;
    addEntry("system latency", text);
  }

  // ---- microphone -----------------------------------------------------------------------

  async function openMicrophone(c) {
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia || !window.AudioWorkletNode) {
      throw new Error("this page needs microphone access, which browsers only give to "
        + "https:// pages or http://localhost / 127.0.0.1");
    }
    c.stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
    });
    try {
      // The WebSocket sends 24 kHz: capture at that rate when the browser allows it.
      c.ctx = new AudioContext(c.transport === "websocket"
        ? { sampleRate: RATE, latencyHint: "interactive" } : { latencyHint: "interactive" });
      c.micSource = c.ctx.createMediaStreamSource(c.stream);
    } catch (err) {
      // Some browsers cannot mix a 24 kHz context with the microphone's rate:
      // run at the device rate and resample in the worklet instead.
      if (c.ctx) c.ctx.close().catch(() => {});
      c.ctx = new AudioContext({ latencyHint: "interactive" });
      c.micSource = c.ctx.createMediaStreamSource(c.stream);
    }
    stats.captureRate = c.ctx.sampleRate;
    await c.ctx.resume();
    // the processors: "voxline-capture" (mic -> PCM16 24 kHz chunks), "voxline-meter" (peaks)
    await c.ctx.audioWorklet.addModule(new URL("web/worklets.js", location.href));
    c.nodes = [c.micSource];
    const level = new AudioWorkletNode(c.ctx, "voxline-meter", { numberOfOutputs: 0 });
    level.port.onmessage = (e) => { if (c === call && e.data > VOICED_PEAK && micOn(c)) voiceHeard(c); };
    c.micSource.connect(level);
    c.nodes.push(level);
    if (c.transport !== "websocket") return;  // WebRTC sends the track itself
    const capture = new AudioWorkletNode(c.ctx, "voxline-capture", {
      numberOfInputs: 1, numberOfOutputs: 1, outputChannelCount: [1],
      processorOptions: { rate: RATE, chunk: CHUNK_SAMPLES },
    });
    capture.port.onmessage = (e) => sendAudio(c, e.data);
    c.micSource.connect(capture);
    capture.connect(c.ctx.destination);  // outputs silence; keeps the node pulled
    c.nodes.push(capture);
  }

  // Press-to-talk: the mic is live only while the button is held.
  function micOn(c) {
    return !pushToTalk() || c.holding || c.tailUntil > performance.now();
  }

  function applyMicGate(c) {
    if (c.transport === "webrtc" && c.stream) {
      c.stream.getAudioTracks().forEach((t) => { t.enabled = micOn(c); });
    }
  }

  // ---- WebSocket transport --------------------------------------------------------------

  function sendAudio(c, buffer) {
    if (c !== call || !micOn(c)) return;
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
    // The reply becomes audible when its first buffer starts playing.
    replyAudible(c, performance.now() + (c.playhead - now) * 1000);
    c.playhead += buffer.duration;
    c.playing.add(node);
    node.onended = () => {
      stats.samplesPlayed += n;
      c.playing.delete(node);
      if (!c.playing.size && c === call && stats.state === "speaking") listening();
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

  function connectWebSocket(c, key) {
    const protocols = ["realtime"];
    if (key) protocols.push(`openai-insecure-api-key.${key}`);
    c.ws = new WebSocket(realtimeUrl(), protocols);
    c.ws.onopen = () => {
      c.ready = true;
      send(c, { type: "session.update", session: sessionConfig(c) });
      const queued = c.queued;
      c.queued = [];
      for (const buffer of queued) sendAudio(c, buffer);
    };
    c.ws.onmessage = (e) => receive(c, e.data);
    c.ws.onclose = (e) => {
      stats.lastClose = { code: e.code, reason: e.reason };
      if (c !== call || c.stopping) return;
      let why = e.reason || "no reason given";
      if (e.code === 1013) why = `server busy or not ready: ${why} (try again shortly)`;
      else if (e.code === 1008) why = `refused: ${why}`;
      else if (e.code === 1006) why = "connection lost (is the server running?)";
      dropped(c, `connection closed (${e.code}): ${why}`, `disconnected — ${why}`);
    };
  }

  // ---- WebRTC transport -----------------------------------------------------------------

  async function connectWebRTC(c, key) {
    // No STUN/TURN: the page talks to the server it came from. The server's answer offers
    // its own addresses, 127.0.0.1 included, so a browser on the same machine connects
    // over loopback (whatever the browser's own candidates are, mDNS names included).
    const pc = new RTCPeerConnection();
    c.pc = pc;
    const [track] = c.stream.getAudioTracks();
    pc.addTransceiver(track, { direction: "sendrecv", streams: [c.stream] });
    await videoPanel.offer(pc);  // a recvonly video section when the server makes video
    pc.ontrack = (e) => (e.track.kind === "video" ? videoPanel.showTrack(e.track)
      : listenToReply(c, e.streams[0] || new MediaStream([e.track])));
    pc.onconnectionstatechange = () => {
      stats.iceState = pc.connectionState;
      if (c !== call || c.stopping) return;
      if (pc.connectionState === "connected") noteCandidatePair(c);
      if (pc.connectionState === "failed") {
        dropped(c, "WebRTC connection failed: the browser and the server could not reach "
          + "each other (see docs/webrtc.md on --ice-hosts / --ice-servers)", "disconnected — connection failed");
      }
    };
    c.channel = pc.createDataChannel("oai-events");
    c.channel.onopen = () => {
      c.ready = true;
      send(c, { type: "session.update", session: sessionConfig(c) });
    };
    c.channel.onmessage = (e) => receive(c, e.data);
    c.channel.onclose = () => {
      if (c !== call || c.stopping) return;
      dropped(c, "the server ended the call (events channel closed)", "disconnected — the call ended");
    };

    await pc.setLocalDescription(await pc.createOffer());
    await gatheringDone(pc, 1000);  // candidates in the offer save a round of discovery
    const headers = { "Content-Type": "application/sdp" };
    if (key) headers.Authorization = `Bearer ${key}`;
    let response;
    try {
      response = await fetch(new URL("v1/realtime/calls?model=voxline", location.href),
        { method: "POST", body: pc.localDescription.sdp, headers });
    } catch (err) {
      throw new Error("cannot reach the server (is it running?)");
    }
    const body = await response.text();
    if (response.status !== 201) throw new Error(refusal(response.status, body));
    c.callUrl = new URL(response.headers.get("Location") || "", location.href).href;
    if (c !== call) return;
    await pc.setRemoteDescription({ type: "answer", sdp: body });
  }

  function refusal(status, body) {
    let message = body.slice(0, 300);
    try {
      const e = JSON.parse(body).error || {};
      message = e.message || message;
    } catch (err) { /* not JSON */ }
    if (status === 503) return `server busy or not ready: ${message}`;
    if (status === 401) return `refused (${status}): ${message} — set the API key`;
    return `the server refused the call (${status}): ${message}`;
  }

  function gatheringDone(pc, timeoutMs) {
    if (pc.iceGatheringState === "complete") return Promise.resolve();
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, timeoutMs);
      pc.addEventListener("icegatheringstatechange", () => {
        if (pc.iceGatheringState === "complete") {
          clearTimeout(timer);
          resolve();
        }
      });
    });
  }

  async function noteCandidatePair(c) {
    // Which addresses the call runs on (shown to tests and in the console).
    const report = await c.pc.getStats();
    report.forEach((s) => {
      if (s.type !== "transport" || !s.selectedCandidatePairId) return;
      const pair = report.get(s.selectedCandidatePairId);
      const local = pair && report.get(pair.localCandidateId);
      const remote = pair && report.get(pair.remoteCandidateId);
      if (local && remote) {
        stats.candidatePair = { local: `${local.address}:${local.port}`, localType: local.candidateType,
          remote: `${remote.address}:${remote.port}`, remoteType: remote.candidateType };
      }
    });
  }

  // Play the reply track, and meter it to know when the reply is audible.
  function listenToReply(c, stream) {
    if (c.remoteStream === stream) return;
    c.remoteStream = stream;
    remoteAudio.srcObject = stream;  // Chromium feeds a remote track to Web Audio only while an element plays it
    remoteAudio.play().catch((err) => showError(`cannot play the reply: ${err.message}`));
    const source = c.ctx.createMediaStreamSource(stream);
    const meter = new AudioWorkletNode(c.ctx, "voxline-meter", { numberOfOutputs: 0 });
    meter.port.onmessage = (e) => {
      if (c !== call) return;
      stats.framesReceived += 1;
      const audible = e.data > AUDIBLE_PEAK;
      if (!audible) return;
      stats.audibleFrames += 1;
      replyAudible(c, performance.now());
      // (the track's tail, still in the browser's jitter buffer after output_audio_buffer
      // .stopped, is not a new reply)
      if (stats.state === "thinking" || (stats.state === "listening" && c.outputPlaying)) {
        setStatus("speaking", "speaking — talk to interrupt");
      }
    };
    source.connect(meter);
    c.nodes.push(source, meter);
  }

  // ---- conversation -------------------------------------------------------------------

  function receive(c, data) {
    if (c !== call) return;
    let event;
    try {
      event = JSON.parse(data);
    } catch (err) {
      showError(`unreadable server message: ${String(data).slice(0, 200)}`);
      return;
    }
    onEvent(c, event);
  }

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

  // The reply in progress was cut off: mark it in the transcript.
  function markInterrupted(c, wasPlaying) {
    for (const id of c.activeResponses) c.interrupted.add(id);
    for (const [itemId, entry] of c.replies) {
      if (entry.live || (wasPlaying && itemId === c.lastAudioItem)) entry.li.classList.add("interrupted");
    }
  }

  function onEvent(c, event) {
    stats.eventsReceived += 1;
    videoPanel.onEvent(event);
    switch (event.type) {
      case "session.created":
        c.live = true;
        c.retries = 0;
        videoPanel.callReady(c.transport, (e) => send(c, e), addEntry);
        listening();
        break;
      case "session.updated":
        break;
      case "input_audio_buffer.speech_started": {
        // Barge-in. Over the WebSocket the page silences its own playback now; over WebRTC
        // the server clears its track (output_audio_buffer.cleared follows).
        stats.speechStarted += 1;
        c.stoppedAt = c.turnEndedAt = null;
        markInterrupted(c, stopPlayback(c) || c.outputPlaying);
        setStatus("hearing", "hearing you…");
        break;
      }
      case "input_audio_buffer.speech_stopped":
        turnEnded(c, "speech_stopped");
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
      case "response.output_audio.delta":  // WebSocket only
        if (c.interrupted.has(event.response_id)) break;  // stale audio of a cut-off reply
        stats.deltasReceived += 1;
        c.lastAudioItem = event.item_id;
        playDelta(c, event.delta);
        if (c.playing.size) setStatus("speaking", "speaking — talk to interrupt");
        break;
      case "output_audio_buffer.started":
        stats.outputStarted += 1;
        c.outputPlaying = true;
        if (event.response_id) c.lastAudioResponse = event.response_id;
        break;
      case "output_audio_buffer.stopped":
        c.outputPlaying = false;
        if (c.transport === "webrtc" && stats.state === "speaking") listening();
        break;
      case "output_audio_buffer.cleared":
        // The server dropped the rest of the reply's audio (barge-in or cancel).
        stats.outputCleared += 1;
        if (c.transport === "webrtc" && c.outputPlaying) {
          stats.playbackStops += 1;
          markInterrupted(c, true);
        }
        c.outputPlaying = false;
        break;
      case "response.output_item.added":
        if (event.item && event.item.type === "message") c.lastAudioItem = event.item.id;
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
        const busy = c.playing.size || c.outputPlaying;
        if (!busy && stats.state !== "hearing") listening();
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

  // ---- press-to-talk ----------------------------------------------------------------------

  function pressTalk() {
    const c = call;
    if (!c || !c.ready || !pushToTalk() || c.holding) return;
    c.holding = true;
    c.heldAt = performance.now();
    holdButton.classList.add("active");
    // Talking over the bot interrupts it, as in hands-free mode.
    if (c.activeResponses.size || c.outputPlaying || c.playing.size) {
      markInterrupted(c, stopPlayback(c) || c.outputPlaying);
      if (c.activeResponses.size) send(c, { type: "response.cancel" });
      if (c.transport === "webrtc") send(c, { type: "output_audio_buffer.clear" });
    }
    send(c, { type: "input_audio_buffer.clear" });  // what the muted mic sent meanwhile
    applyMicGate(c);
    setStatus("hearing", "hearing you… release to send");
  }

  function releaseTalk() {
    const c = call;
    if (!c || !c.holding) return;
    c.holding = false;
    holdButton.classList.remove("active");
    if (performance.now() - c.heldAt < 200) {  // a tap, not a turn
      applyMicGate(c);
      send(c, { type: "input_audio_buffer.clear" });
      listening();
      return;
    }
    turnEnded(c, "release");
    setStatus("thinking", "thinking…");
    // Over WebRTC the last words are still in flight on the track: keep the mic open a
    // moment, then commit. Over the WebSocket they were sent in order before this.
    const tail = c.transport === "webrtc" ? PTT_TAIL_MS : 0;
    c.tailUntil = performance.now() + tail;
    setTimeout(() => {
      if (c !== call || c.holding) return;
      applyMicGate(c);
      send(c, { type: "input_audio_buffer.commit" });
      send(c, { type: "response.create" });
    }, tail);
  }

  // ---- lifecycle ----------------------------------------------------------------------

  // A call that ends without the user asking: say why, and reconnect if it had been live.
  function dropped(c, message, statusText) {
    showError(message);
    const retry = c.live && c.retries < RECONNECT_DELAYS_MS.length;
    const retries = c.retries;
    finish(c);
    if (!retry) {
      setStatus("closed", statusText);
      return;
    }
    const delay = RECONNECT_DELAYS_MS[retries];
    setStatus("closed", `${statusText} — reconnecting in ${delay / 1000} s`);
    reconnectTimer = setTimeout(() => {
      reconnectTimer = null;
      stats.reconnects += 1;
      addEntry("system", "reconnecting (a new conversation)…");
      start(retries + 1);
    }, delay);
  }

  function finish(c) {
    c.stopping = true;
    c.ready = false;
    stopPlayback(c);
    if (c.ws && c.ws.readyState <= WebSocket.OPEN) c.ws.close(1000, "user stopped");
    if (c.pc) {
      // Tell the server at once; closing the peer connection alone ends the call only
      // when the server notices.
      if (c.callUrl && c.live) {
        const headers = {};
        if (c.key) headers.Authorization = `Bearer ${c.key}`;
        fetch(`${c.callUrl}/hangup`, { method: "POST", headers, keepalive: true }).catch(() => {});
      }
      c.pc.close();
    }
    if (c.stream) c.stream.getTracks().forEach((t) => t.stop());
    if (c.nodes) c.nodes.forEach((n) => n.disconnect());
    if (c.ctx && !c.ctxClosed) {
      c.ctxClosed = true;
      c.ctx.close().catch(() => {});
    }
    if (remoteAudio.srcObject === c.remoteStream) remoteAudio.srcObject = null;
    videoPanel.callEnded();
    if (call === c) call = null;
    holdButton.classList.remove("active");
    setButton(false);
  }

  async function start(retries = 0) {
    if (call) return;
    const c = {
      transport: transportSelect.value, key: keyInput.value.trim(), retries,
      ws: null, pc: null, channel: null, callUrl: null, ctx: null, stream: null, micSource: null,
      nodes: null, remoteStream: null, ready: false, live: false, stopping: false,
      queued: [], playing: new Set(), playhead: 0, carry: null, lastAudioItem: null, outputPlaying: false,
      users: new Map(), replies: new Map(), activeResponses: new Set(), interrupted: new Set(),
      holding: false, heldAt: 0, tailUntil: 0, turnEndedAt: null, stoppedAt: null, stopSignal: "",
      lastVoiceAt: null, previousStopAt: -Infinity,
    };
    call = c;
    stats.transport = c.transport;
    stats.mode = modeSelect.value;
    stats.connects += 1;
    setButton(true);
    setStatus("connecting", `connecting (${c.transport === "webrtc" ? "WebRTC" : "WebSocket"})…`);
    try {
      await openMicrophone(c);
      if (c !== call) return finish(c);
      applyMicGate(c);
      if (c.transport === "webrtc") await connectWebRTC(c, c.key);
      else connectWebSocket(c, c.key);
    } catch (err) {
      if (c !== call) return;
      finish(c);
      let message = (err && err.message) || String(err);
      if (err && err.name === "NotAllowedError") {
        message = "microphone permission was denied (allow it in the address bar, then press Talk)";
      } else if (err && err.name === "NotFoundError") {
        message = "no microphone found";
      } else if (err && err.name === "NotReadableError") {
        message = "the microphone is in use by another program or cannot be opened";
      }
      showError(`could not start: ${message}`);
      setStatus("error", `could not start — ${message}`);
    }
  }

  function stop() {
    if (reconnectTimer) {
      clearTimeout(reconnectTimer);
      reconnectTimer = null;
    }
    if (!call) return;
    finish(call);
    setStatus("idle", "idle — press Talk");
  }

  // ---- controls -------------------------------------------------------------------------

  const params = new URLSearchParams(location.search);
  if (params.get("transport") === "websocket") transportSelect.value = "websocket";
  if (params.get("mode") === "push") modeSelect.value = "push";
  holdButton.hidden = !pushToTalk();

  talkButton.addEventListener("click", () => (call || reconnectTimer ? stop() : start()));
  transportSelect.addEventListener("change", () => {
    if (call) {  // a new call on the other transport
      stop();
      start();
    }
  });
  modeSelect.addEventListener("change", () => {
    holdButton.hidden = !pushToTalk();
    stats.mode = modeSelect.value;
    if (!call) return;
    call.holding = false;
    applyMicGate(call);
    send(call, { type: "session.update", session: sessionConfig(call) });
    if (call.ready) listening();
  });
  holdButton.addEventListener("pointerdown", pressTalk);
  holdButton.addEventListener("pointerup", releaseTalk);
  holdButton.addEventListener("pointerleave", releaseTalk);
  // Space is the talk key in press-to-talk mode (not while typing the API key).
  const isTalkKey = (e) => e.code === "Space" && pushToTalk()
    && !["INPUT", "SELECT", "TEXTAREA"].includes(e.target.tagName);
  window.addEventListener("keydown", (e) => {
    if (!isTalkKey(e)) return;
    e.preventDefault();  // nor does it press a focused button
    if (!e.repeat) pressTalk();
  });
  window.addEventListener("keyup", (e) => {
    if (!isTalkKey(e)) return;
    e.preventDefault();
    releaseTalk();
  });
  window.addEventListener("pagehide", stop);
  if (params.get("autostart") === "1") start();
})();
