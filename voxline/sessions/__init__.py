"""Session actors: conversation state, turn detection, response lifecycle. Transport-agnostic."""
