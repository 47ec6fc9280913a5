// voxline browser page: the call's generated video (the voxline Realtime extension).
// Plain JS, no build step; app.js calls the hooks of window.voxlineVideo.
//
// The panel (the <video>, its state line, Show / Stop video) stays hidden unless
// web/features.json says the server has a video model. When it has, a WebRTC call's offer
// carries a recvonly video transceiver; the server answers with its video track on it, which
// sends nothing until a response has a video. "Show" adds the prompt to the conversation as
// a user message and sends response.create with output_modalities ["audio", "video"] and
// response.video (prompt, width, height, fps, num_frames, num_inference_steps,
// guidance_scale: the video settings). The response.output_video.* events and the frames
// the <video> element presents drive the state line:
//   stopped -> rendering (started: the model makes chunks) -> playing (frames presented)
//   -> stopped (completed: once its frames have played; cancelled or failed: at once).
// "Show" while a video is still being made steers it instead (response.video.update with
// the new prompt): from its next chunk the picture morphs to the prompt, without a restart.
// "Stop video" sends response.cancel: the server ends the video at its next chunk and
// stops the track at once. Over the WebSocket there is no track, so the panel says so.
"use strict";

window.voxlineVideo = (() => {
  const QUIET_MS = 1500;  // a completed video whose frames stopped this long has played out

  const $ = (id) => document.getElementById(id);
  const panel = $("video-panel");
  const el = $("video");
  const stateEl = $("video-state");
  const form = $("video-form");
  const promptInput = $("video-prompt");
  const showButton = $("video-show");
  const stopButton = $("video-stop");
  const fields = {  // response.video field -> its input (prefilled from ?video_<field>=)
    width: $("video-width"), height: $("video-height"), fps: $("video-fps"),
    num_frames: $("video-frames"), num_inference_steps: $("video-steps"),
    guidance_scale: $("video-guidance"),
  };

  const stats = {
    available: false, featuresLoaded: false, state: "stopped", videosStarted: 0, chunks: 0, framesShown: 0,
    framesThisVideo: 0, framesAtStop: 0, steered: 0, prompt: "", lastStatus: "", videoId: null, lastError: "",
    firstFrameMs: [],  // per video: "Show" (or started, for the model's show_video) -> first frame
  };
  let hooks = null;  // { send, addEntry } of the live call, while its session is up
  let transport = "";
  let active = null;  // { videoId, frames, ending } of the video in flight or playing out
  let pendingRequest = null;  // a request waiting for the reply in progress to end
  let responses = new Set();  // responses in progress on the call
  let quietTimer = null;
  let requestedAt = null;  // when the page last asked for a video

  const params = new URLSearchParams(location.search);
  for (const [name, input] of Object.entries(fields)) {
    const value = params.get(`video_${name}`) ?? params.get(`video_${input.id.slice(6)}`);
    if (value !== null) input.value = value;
  }
  if (params.get("video_prompt")) promptInput.value = params.get("video_prompt");

  const features = fetch(new URL("web/features.json", location.href))
    .then((r) => (r.ok ? r.json() : {}))
    .catch(() => ({}))
    .then((f) => {
      stats.available = Boolean(f.video);
      stats.featuresLoaded = true;
      panel.hidden = !stats.available;  // no video model: no panel, no video buttons
      return f;
    });

  function setState(state, text) {
    stats.state = state;
    stateEl.dataset.state = state;
    stateEl.textContent = `video: ${text}`;
    stopButton.disabled = !hooks || !active || active.ending;  // a completed one just plays out
    showButton.disabled = !hooks || transport !== "webrtc";
  }

  function stopped(status) {
    clearTimeout(quietTimer);
    active = null;
    stats.framesAtStop = stats.framesShown;
    el.classList.toggle("ended", status !== "completed");
    setState(status === "failed" ? "failed" : "stopped",
      status === "completed" ? "stopped (played to the end)" : `stopped (${status})`);
  }

  // ---- frames: every frame the element presents ----------------------------------------

  function framePresented() {
    stats.framesShown += 1;
    if (!active) return;
    stats.framesThisVideo += 1;
    if (stats.framesThisVideo === 1) {
      stats.firstFrameMs.push(Math.round(performance.now() - active.since));
    }
    if (stats.state === "rendering") {
      setState("playing", `playing ${el.videoWidth}×${el.videoHeight}`);
    }
    if (active.ending) {
      clearTimeout(quietTimer);
      if (stats.framesThisVideo >= active.frames) stopped("completed");
      else quietTimer = setTimeout(() => stopped("completed"), QUIET_MS);
    }
  }

  function watchFrames() {
    if ("requestVideoFrameCallback" in HTMLVideoElement.prototype) {
      const next = () => el.requestVideoFrameCallback(() => {
        framePresented();
        next();
      });
      next();
      return;
    }
    let seen = 0;  // no per-frame callback: count what playback quality reports
    setInterval(() => {
      const total = el.getVideoPlaybackQuality().totalVideoFrames;
      for (; seen < total; seen++) framePresented();
    }, 50);
  }

  // ---- requests ---------------------------------------------------------------------------

  function videoRequest(prompt) {
    const video = { prompt };
    for (const [name, input] of Object.entries(fields)) {
      if (input.value.trim() !== "") video[name] = Number(input.value);
    }
    return video;
  }

  function sendRequest(request) {
    requestedAt = performance.now();
    hooks.addEntry("user", `Show me ${request.prompt}`, "you");
    hooks.send({ type: "conversation.item.create", item: { type: "message", role: "user",
      content: [{ type: "input_text", text: `Show me ${request.prompt}.` }] } });
    hooks.send({ type: "response.create",
      response: { output_modalities: ["audio", "video"], video: request } });
  }

  function ask(e) {
    e.preventDefault();
    const prompt = promptInput.value.trim();
    if (!hooks || !prompt) return;
    if (active && !active.ending) {  // still being made: steer it to the new prompt
      hooks.addEntry("user", `Now show ${prompt}`, "you");
      hooks.send({ type: "response.video.update", response_id: active.responseId,
        video: { prompt } });
      return;
    }
    const request = videoRequest(prompt);
    if (responses.size) {  // one response at a time: cut the reply in progress first
      pendingRequest = request;
      hooks.send({ type: "response.cancel" });
      return;
    }
    sendRequest(request);
  }

  function stop() {
    if (hooks && active && !active.ending) hooks.send({ type: "response.cancel" });
  }

  // ---- hooks app.js calls -----------------------------------------------------------------

  async function offer(pc) {
    const f = await features;
    if (f.video) pc.addTransceiver("video", { direction: "recvonly" });
  }

  function showTrack(track) {
    el.srcObject = new MediaStream([track]);
    el.play().catch((err) => { stats.lastError = `cannot play the video: ${err.message}`; });
  }

  function callReady(kind, send, addEntry) {
    transport = kind;
    hooks = { send, addEntry };
    responses = new Set();
    setState("stopped", kind === "webrtc" ? "stopped — type what to show"
      : "the video plays on WebRTC calls (switch “via” to WebRTC)");
  }

  function callEnded() {
    hooks = null;
    pendingRequest = null;
    if (active) stopped("call ended");
    else setState("stopped", "stopped");
    if (el.srcObject) el.srcObject = null;
  }

  function onEvent(event) {
    switch (event.type) {
      case "response.created":
        responses.add(event.response.id);
        break;
      case "response.done":
        responses.delete(event.response && event.response.id);
        if (pendingRequest && !responses.size && hooks) {
          const request = pendingRequest;
          pendingRequest = null;
          sendRequest(request);
        }
        break;
      case "response.output_video.started":
        clearTimeout(quietTimer);
        active = { videoId: event.video_id, responseId: event.response_id,
          frames: event.num_frames, ending: false, since: requestedAt ?? performance.now() };
        stats.prompt = event.prompt;
        requestedAt = null;
        stats.videosStarted += 1;
        stats.videoId = event.video_id;
        stats.chunks = 0;
        stats.framesThisVideo = 0;
        el.classList.remove("ended");
        setState("rendering", `rendering “${event.prompt}” (${event.width}×${event.height})`);
        break;
      case "response.output_video.chunk":
        if (!active || event.video_id !== active.videoId) break;
        stats.chunks += 1;
        if (stats.state === "rendering") {
          setState("rendering", `rendering: chunk ${event.index + 1} of ${event.total} made`);
        }
        break;
      case "response.output_video.updated":
        if (!active || event.video_id !== active.videoId) break;
        stats.steered += 1;
        stats.prompt = event.prompt;
        if (stats.state === "rendering") setState("rendering", `rendering “${event.prompt}”`);
        break;
      case "response.output_video.done":
        if (!active || event.video_id !== active.videoId) break;
        stats.lastStatus = event.status;
        if (event.status !== "completed") {
          if (event.error) stats.lastError = event.error;
          stopped(event.status);
          break;
        }
        active.ending = true;  // the track plays out what it holds
        stopButton.disabled = true;
        quietTimer = setTimeout(() => stopped("completed"), QUIET_MS);
        break;
      default:
        break;
    }
  }

  form.addEventListener("submit", ask);
  stopButton.addEventListener("click", stop);
  watchFrames();
  setState("stopped", "stopped");

  return {
    offer, showTrack, callReady, callEnded, onEvent,
    stats: () => ({ ...stats, firstFrameMs: [...stats.firstFrameMs], videoWidth: el.videoWidth,
      videoHeight: el.videoHeight, currentTime: el.currentTime, paused: el.paused }),
  };
})();
