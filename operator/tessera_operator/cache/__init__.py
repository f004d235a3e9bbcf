"""Every replica's copy of the GPUQuotas and of the ResourceQuotas they manage (one watch
each: admission reads them, the leader's controller listens to them).  The rules are
:mod:`tessera_operator.quota`'s; this package only reads."""
