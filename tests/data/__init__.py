"""Tests of autotune.data."""
