"""tessera's operator on the test bed: its replicas behind a loopback Service (``replicas``,
``service``), a second webhook beside it, pods created while it changes, GPUQuotas that
admit, and a namespace user to attack it as."""
