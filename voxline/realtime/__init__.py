"""The network edge; runs no models and holds no conversation logic.

Rooms by role: ``openai/`` (the OpenAI Realtime wire: parse client events, render server
events, the session object, dialects, the client-side peer), ``transports/`` (the
``/v1/realtime`` WebSocket, WebRTC calls, Twilio), ``http/`` (audio, video and voice APIs,
the demo page), ``auth/`` (API keys, client secrets) and ``ops/`` (health, metrics). At the
top: ``app`` (the composition root), ``server`` (``voxline serve``), ``state`` (what the
routes share) and ``session_host`` (the one host every transport serves its sessions
through). A new transport is one adapter module in ``transports/`` and one router in
``app``.
"""
