"""The staleness lab's figures, each registering itself on import."""
