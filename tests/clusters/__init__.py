"""Real (not simulated) clusters that tests can start on this one machine."""
