"""autotune's tests: a package per subpackage of autotune, shared helpers in tests/helpers.py,
shared fixtures in tests/conftest.py."""
