"""Runs on disk: checkpoints, run directories, what a run is (info), and its loss curves (plot)."""
