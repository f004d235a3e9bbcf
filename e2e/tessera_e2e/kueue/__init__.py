"""Kueue on the test bed: its manifests rendered from the pinned module's own config/
(:mod:`.manifests`), its controller-manager run as a local process against the test bed's
API server (:mod:`.manager`), started for a ``with`` block and read by the tests
(:mod:`.running`), and the queue objects of tessera's recipe built for them
(:mod:`.objects`). The binary is built by
:func:`tessera_e2e.controlplane.build.ensure_kueue` (the ``kueue_binary`` fixture)."""
