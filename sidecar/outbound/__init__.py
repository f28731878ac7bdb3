"""Calls loopstop makes to other systems, with their deadlines and error
mapping (STYLE 19); nothing else in ``sidecar`` opens a connection to them.

- :mod:`sidecar.outbound.check_runner`: a check's requests to the system of record;
- :mod:`sidecar.outbound.n8n_api`: n8n's public REST API (stops);
- :mod:`sidecar.outbound.upstream`: the model gate's upstream;
- :mod:`sidecar.outbound.bounded_read`: the one reader of their answers (one
  total deadline, a size bound counted decompressed).
"""
