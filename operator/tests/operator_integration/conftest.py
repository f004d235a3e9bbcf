"""The operator's tests against the real API server: the `cluster`, `namespace`, `operators`
and `ops` fixtures come from the test bed's plugin (:mod:`tessera_e2e.pytest_plugin`)."""

from __future__ import annotations

from tessera_e2e.operator.replicas import LocalOperators

Operators = LocalOperators
