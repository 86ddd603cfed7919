"""The cluster tests (make test-cluster): a package, so that its conftest is not taken for tests/conftest.py."""
