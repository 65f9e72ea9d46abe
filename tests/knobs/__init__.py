"""Tests of autotune.knobs."""
