"""Services bind the policy core to the store. They keep three jobs: building
keys (:mod:`.keys`), authorising a principal on a record (each mapper's
``authorize``), and running a decision as one transaction through the one
seam, :mod:`.records` (``update`` for one scoped record, ``run`` for a
decision composing several), with one record mapper per record type
(:mod:`.mappers`). Every rule is decided in :mod:`sidecar.core`."""
