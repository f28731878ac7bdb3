"""The policy core: every rule loopstop enforces, as pure functions.

No I/O and no clock reads here: each decision takes the state it needs,
the request, the policy and ``now`` (epoch seconds) and returns the new
state and the decision. The HTTP layer and the store only carry data in
and out.
"""
