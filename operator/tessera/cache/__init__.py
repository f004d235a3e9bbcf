"""Every replica's copy of the GPUQuotas (one watch: admission reads it, the leader's
controller listens to it).  The rules are :mod:`tessera.quota`'s; this package only reads."""
