"""Tests of autotune.cli."""
