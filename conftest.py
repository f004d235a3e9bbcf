"""Repository-wide pytest setup: the local control plane fixtures (cluster, namespace)."""

pytest_plugins = ["tessera_e2e.pytest_plugin"]
