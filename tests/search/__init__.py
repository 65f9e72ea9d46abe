"""Tests of autotune.search."""
