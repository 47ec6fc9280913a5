"""The OpenAI Realtime wire: client events parsed into session commands, session events rendered back, the session object, dialects, and the client-side peer."""
