"""loopstop: a sidecar for n8n that makes automation loops stop for good.

Docstrings cite the design and HTTP contract, ``docs/design.md``, as
``DESIGN §n`` (its numbered section n) or ``DESIGN "Name"`` (a section by
its title); that page also says which module decides each rule.
"""

__version__ = "0.1.0"
