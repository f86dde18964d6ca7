"""What each cluster can take now: reported capacity, minus what was dispatched since the report."""
