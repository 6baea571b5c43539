"""The deterministic cluster simulator: seeded, replayable, shrinkable runs of weir."""
