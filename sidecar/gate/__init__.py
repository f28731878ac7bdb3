"""The model gate's pure parts: the ``loopstop-*`` task lines (:mod:`sidecar.gate.lines`)
and one adapter per wire format (:mod:`sidecar.gate.wire`)."""
