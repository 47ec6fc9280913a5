"""The network edge: HTTP app, /v1/realtime WebSocket, WebRTC, telephony. Runs no models."""
