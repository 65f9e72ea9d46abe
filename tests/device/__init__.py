"""Tests of autotune.device."""
