"""GPUQuota usage as the API server holds it: every replica's quota cache, reservations and
releases written with resourceVersion preconditions and group-committed per quota
(:mod:`.store`), and reservations handed to the leader (:mod:`.forwarding`).  The rules
(what fits, in which order) are :mod:`tessera.quota`'s; this package only does the I/O."""
