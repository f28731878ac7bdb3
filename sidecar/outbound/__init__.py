"""Calls loopstop makes to other systems, with their deadlines and error
mapping (STYLE 19): :mod:`sidecar.outbound.upstream`, the model gate's upstream."""
