"""Tests of autotune.trial."""
