"""Tests of autotune.measure."""
