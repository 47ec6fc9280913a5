"""Transports: the `/v1/realtime` WebSocket, WebRTC calls (ICE, the video track), Twilio Media Streams. Each parses and renders its wire; the session host serves the session."""
