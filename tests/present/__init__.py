"""Tests of autotune.present."""
